"""``fourm-kfp doctor``: a preflight check of the cluster a run will use, before any GPU is held.

It creates nothing in the cluster (its one write is a test object in the S3 store, deleted at once) and checks, in
the run's namespace, each thing a run needs and that fails it only hours later when missing:

- the KFP server's version against the versions fourm-kfp supports (:mod:`.doctor_services`);
- the PyTorchJob / TrainJob CRDs of the job kinds the run uses, serving the version the launcher renders; the
  launcher's RBAC, asked with ``SelfSubjectAccessReview`` for every verb the Role of ``manifests/base/rbac.yaml``
  grants (as the runs' service account, by impersonation, when one is named); the S3 Secret, the settings
  ConfigMap and the image pull secret (present, or absent with what goes missing); the runtime a TrainJob names;
  for ``scheduler=kueue:<queue>`` the LocalQueue and Kueue's integration of the job kinds used
  (:mod:`.doctor_cluster`);
- the S3 store (one object written and deleted) and the MLflow tracking server's REST API
  (:mod:`.doctor_services`).

Each result is a :class:`Check`: ``ok``, ``warn`` (works, with a consequence said), ``skipped`` (with why) or
``FAIL`` with the object named and the command that fixes it. :func:`exit_code` follows ``submit``'s codes: 0 when
nothing failed, 2 (a user error, nothing was started) otherwise. ``fourm-kfp submit`` runs the same checks before
it uploads anything (``--no-doctor`` skips them).
"""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any, Callable

from fourm_kfp.pipeline_runs.doctor_checks import FAIL, OK, SKIPPED, WARN, Check, DoctorRequest

__all__ = ["FAIL", "OK", "SKIPPED", "WARN", "Check", "DoctorRequest", "run_doctor", "run_parameters", "report",
           "exit_code", "connect", "preflight"]


def run_parameters(given: dict[str, Any], package=None) -> dict[str, Any]:
    """The parameters a run gets: each default of the compiled pipeline (``package``; default the committed one),
    with ``given`` over them."""
    from fourm_kfp.pipeline_runs.kfp_api import package_spec
    from fourm_kfp.pipeline_runs.submit import pipeline_package

    spec = package_spec(package if package is not None else pipeline_package())
    declared = spec["root"]["inputDefinitions"]["parameters"]
    return {**{name: item["defaultValue"] for name, item in declared.items() if "defaultValue" in item}, **given}


def run_doctor(request: DoctorRequest, kube=None, kfp_client=None, kube_error: str = "",
               kfp_error: str = "") -> list[Check]:
    """Every check of the module docstring, in order. ``kube``: a :class:`~fourm_kfp.cluster.kube.KubeApi` in the
    run's namespace (None with ``kube_error``: why there is no cluster to ask); ``kfp_client``: a ``kfp.Client``
    for ``request.host`` (None with ``kfp_error``: why it could not be made)."""
    from fourm_kfp.pipeline_runs import doctor_cluster, doctor_services

    checks = [doctor_services.check_kfp_version(kfp_client, request.host, kfp_error)]
    settings: dict[str, str] = {}
    if kube is None:
        # Skipped, not failed: a submitter that reaches only the KFP API (a CI job) still gets the other checks.
        checks.append(Check("kubernetes", SKIPPED, f"no cluster to check (CRDs, RBAC, Secrets, runtime, Kueue not "
                                                   f"checked): {kube_error}"))
    else:
        reached = doctor_cluster.check_api_server(kube)
        checks.append(reached)
        if reached.state == OK:
            cluster_checks, settings = doctor_cluster.cluster_checks(kube, request)
            checks += cluster_checks
    checks.append(doctor_services.check_s3(request, settings))
    checks.append(doctor_services.check_mlflow(request, settings))
    return checks


def failures(checks: list[Check]) -> list[Check]:
    return [check for check in checks if check.state == FAIL]


def exit_code(checks: list[Check]) -> int:
    """0 when no check failed, else ``submit``'s user-error code (nothing was started)."""
    from fourm_kfp.pipeline_runs.run_outcome import EXIT_SUCCEEDED, EXIT_USER_ERROR

    return EXIT_USER_ERROR if failures(checks) else EXIT_SUCCEEDED


def report(checks: list[Check], out: Callable[[str], None] = print, as_json: bool = False) -> None:
    """One line per check (its fix under a failure) and a closing count; or the checks as a JSON list."""
    if as_json:
        out(json.dumps([asdict(check) for check in checks], indent=2))
        return
    for check in checks:
        out(check.line())
    failed = failures(checks)
    out(f"doctor: {len(failed)} of {len(checks)} checks failed" if failed else
        f"doctor: no check failed ({sum(c.state == OK for c in checks)} ok, "
        f"{sum(c.state == WARN for c in checks)} warnings, {sum(c.state == SKIPPED for c in checks)} skipped)")


def connect(namespace: str = ""):
    """The Kubernetes client doctor uses (the kubeconfig, or a pod's service account) and "", or None and why not.
    Few retries: a dead API server is a failed check in seconds, not minutes."""
    from fourm_kfp.cluster.kube import KubeApi, api_retries
    from fourm_kfp.errors import UserError

    try:
        return KubeApi.from_environment(namespace, retries=api_retries(attempts=1)), ""
    except UserError as exc:
        return None, str(exc)


def preflight(request: DoctorRequest, kfp_client, out: Callable[[str], None] = print, kube=None,
              kube_error: str = "") -> None:
    """``submit``'s preflight: run the checks (``kube``, ``kube_error`` as :func:`connect` gives them) and print
    them; a :class:`~fourm_kfp.errors.UserError` when any failed (nothing is created then)."""
    from fourm_kfp.errors import UserError

    checks = run_doctor(request, kube, kfp_client, kube_error)
    report(checks, out)
    failed = failures(checks)
    if failed:
        raise UserError(f"preflight (fourm-kfp doctor): {', '.join(c.name for c in failed)} failed (above); nothing "
                        "was created. Fix them, or pass --no-doctor to submit anyway")
