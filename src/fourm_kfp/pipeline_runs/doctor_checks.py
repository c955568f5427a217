"""What a ``fourm-kfp doctor`` check is (:mod:`.doctor`): its request (:class:`DoctorRequest`, what the run will
use) and its result (:class:`Check`, one line each), shared by the checks of :mod:`.doctor_cluster` and
:mod:`.doctor_services`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

OK, WARN, SKIPPED, FAIL = "ok", "warn", "skipped", "FAIL"


@dataclass
class Check:
    """One check's result: its ``name``, ``state`` (:data:`OK`, :data:`WARN`, :data:`SKIPPED`, :data:`FAIL`), what
    was found (``detail``) and, for a failure, the command that fixes it (``fix``)."""

    name: str
    state: str
    detail: str
    fix: str = ""

    def line(self) -> str:
        text = f"{self.state:7s} {self.name:16s} {self.detail}"
        return text + (f"\n{'':8s}{'':16s} fix: {self.fix}" if self.fix else "")


@dataclass
class DoctorRequest:
    """What the run will use: its Kubernetes ``namespace``, the ``service_account`` its pods run as ("" = check the
    caller's own rights), its pipeline ``parameters`` (the compiled defaults with the given ones over them:
    :func:`run_parameters`), the KFP ``host`` ("" = no version check), and the S3 endpoint and MLflow tracking URI
    to reach from here ("" = the environment's, else the settings ConfigMap's)."""

    namespace: str = ""
    service_account: str = ""
    parameters: dict[str, Any] = field(default_factory=dict)
    host: str = ""
    s3_endpoint: str = ""
    tracking_uri: str = ""
