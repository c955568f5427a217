"""The doctor's checks of the services a run talks to (:mod:`.doctor`): the KFP server's version, the S3 store and the
MLflow tracking server.

- **KFP**: the API server's ``tag_name`` from ``/apis/v2beta1/healthz`` (kubeflow/pipelines
  ``backend/src/apiserver/main.go``, ``newHealthzResponse``: the image's ``TAG_NAME``; read by
  :func:`fourm_kfp.pipeline_runs.kfp_api.server_version`) against :data:`SUPPORTED_KFP`: older fails, newer or a
  build without a release tag is a warning (it cannot be told whether it works).
- **S3**: one object written under ``<store_uri>/.fourm-doctor/`` and deleted, through :mod:`fourm_kfp.storage` with
  this machine's credentials (the standard chain of :mod:`fourm_kfp.storage.credentials`: environment, ``~/.aws``
  profile, web identity token, instance role; skipped when it finds none, naming what it tried: the pods' are the
  S3 Secret's or their service account's role) and a short retry budget.
- **MLflow**: ``GET <uri>/api/2.0/mlflow/experiments/search?max_results=1`` of the tracking server's REST API.

The endpoint and the tracking URI are the ones given (``--s3-endpoint``, ``--mlflow-tracking-uri``, the run's
``s3_endpoint`` / ``mlflow_tracking_uri`` parameters), else this environment's (``AWS_ENDPOINT_URL``,
``MLFLOW_TRACKING_URI``), else the settings ConfigMap's, which the pods read. A ConfigMap address that names a
cluster-internal service (``minio``, ``mlflow.ns.svc``) and does not resolve here is skipped, with how to reach it
(``kubectl port-forward``): the pods can, this machine cannot tell.
"""

from __future__ import annotations

import os
import socket
import uuid
from typing import Any
from urllib.parse import urlparse

from fourm_kfp.pipeline_runs.doctor_checks import FAIL, OK, SKIPPED, WARN, Check, DoctorRequest

#: The KFP releases fourm-kfp is tested against (major, minor): the driver emulator's 2.15.0, 2.16.0, 2.16.1 and
#: 2.17.0 (manifests/README.md, Prerequisites).
SUPPORTED_KFP = ((2, 15), (2, 16), (2, 17))
#: Seconds the MLflow request may take.
MLFLOW_TIMEOUT_S = 10.0


def check_kfp_version(client, host: str, error: str = "") -> Check:
    from fourm_kfp.pipeline_runs.kfp_api import (KFP_FLOOR_REASON, KFP_VERSION_FLOOR, RELEASE_TAG, kfp_api_errors,
                                                 server_version)
    from fourm_kfp.errors import UserError

    if error:
        return Check("kfp version", FAIL, error, "check --host and KFP_TOKEN")
    if client is None:
        return Check("kfp version", SKIPPED, "no --host (or $KFP_HOST) to ask")
    supported = ", ".join(f"{major}.{minor}" for major, minor in SUPPORTED_KFP)
    try:
        with kfp_api_errors(host):
            tag = server_version(client)
    except UserError as exc:
        return Check("kfp version", FAIL, str(exc), "check --host and KFP_TOKEN")
    match = RELEASE_TAG.fullmatch(tag)
    if match is None:
        return Check("kfp version", WARN, f"the server names no release (healthz tag_name {tag!r}): cannot tell "
                                          f"whether it is one of {supported}")
    version = tuple(int(part) for part in match.groups())
    if version < KFP_VERSION_FLOOR:
        return Check("kfp version", FAIL, f"KFP {tag.removeprefix('v')} is older than {supported}: "
                                          f"{KFP_FLOOR_REASON}",
                     "upgrade Kubeflow Pipelines (manifests/README.md, Prerequisites)")
    if version[:2] not in SUPPORTED_KFP:
        return Check("kfp version", WARN, f"KFP {tag.removeprefix('v')} is newer than the versions tested "
                                          f"({supported})")
    return Check("kfp version", OK, f"KFP {tag.removeprefix('v')} (supported: {supported})")


def _address(given: str, env_name: str, settings: dict[str, str]) -> tuple[str, str]:
    """The address to check and where it came from."""
    if given:
        return given, "given"
    if os.environ.get(env_name):
        return os.environ[env_name], f"${env_name}"
    if settings.get(env_name):
        return settings[env_name], "the settings ConfigMap"
    return "", ""


def _unresolvable_here(url: str) -> bool:
    """Whether ``url``'s host does not resolve from this machine."""
    host = urlparse(url).hostname or ""
    try:
        socket.getaddrinfo(host, None)
        return False
    except OSError:
        return True


def _cluster_only(url: str, source: str) -> bool:
    """A ConfigMap address of a cluster-internal service that this machine cannot resolve."""
    host = urlparse(url).hostname or ""
    internal = "." not in host or host.endswith((".svc", ".svc.cluster.local", ".cluster.local"))
    return source == "the settings ConfigMap" and internal and _unresolvable_here(url)


def check_s3(request: DoctorRequest, settings: dict[str, str]) -> Check:
    from fourm_kfp.storage import S3Store, StorageError, credential_chain, is_s3_uri, shared_client

    store_uri = str(request.parameters.get("store_uri", ""))
    if not is_s3_uri(store_uri):
        return Check("s3", SKIPPED, f"store_uri {store_uri!r} is not s3://")
    endpoint, source = _address(request.s3_endpoint or str(request.parameters.get("s3_endpoint", "")),
                                "AWS_ENDPOINT_URL", settings)
    if endpoint and _cluster_only(endpoint, source):
        return Check("s3", SKIPPED, f"{endpoint} (from {source}) is a cluster-internal address this machine cannot "
                                    "resolve; to check it from here: kubectl -n <ns> port-forward svc/<s3 service> "
                                    "9000, then --s3-endpoint http://127.0.0.1:9000")
    try:
        _credentials, source = credential_chain()
    except StorageError as exc:
        return Check("s3", SKIPPED, f"{exc}: nothing on this machine to write with; the pods' come from the S3 "
                                    "Secret or their service account's role (IRSA)")
    shown = endpoint or "AWS S3"
    try:
        store = S3Store(store_uri, shared_client(endpoint or None), retries=2, backoff_s=0.2)
        key = f".fourm-doctor/{uuid.uuid4().hex}"
        store.put_bytes(key, b"fourm-kfp doctor: safe to delete\n")
        store.delete(key)
    except (StorageError, ValueError) as exc:
        return Check("s3", FAIL, f"cannot write and delete an object under {store_uri} at {shown}: {exc}",
                     "check the endpoint (--s3-endpoint, $AWS_ENDPOINT_URL, the settings ConfigMap), the credentials "
                     f"(here: {source}; the pods': the S3 Secret or their role) and that the bucket exists")
    return Check("s3", OK, f"wrote and deleted one object under {store_uri} at {shown} (credentials: {source})")


def _mlflow_headers() -> dict[str, Any]:
    import base64

    if os.environ.get("MLFLOW_TRACKING_TOKEN"):
        return {"Authorization": f"Bearer {os.environ['MLFLOW_TRACKING_TOKEN']}"}
    if os.environ.get("MLFLOW_TRACKING_USERNAME"):
        pair = f"{os.environ['MLFLOW_TRACKING_USERNAME']}:{os.environ.get('MLFLOW_TRACKING_PASSWORD', '')}"
        return {"Authorization": "Basic " + base64.b64encode(pair.encode()).decode()}
    return {}


def check_mlflow(request: DoctorRequest, settings: dict[str, str]) -> Check:
    import json
    import urllib.error
    import urllib.request

    from fourm_kfp.pipeline_runs.submit import shown_uri

    uri, source = _address(request.tracking_uri or str(request.parameters.get("mlflow_tracking_uri", "")),
                           "MLFLOW_TRACKING_URI", settings)
    if not uri:
        return Check("mlflow", WARN, "no tracking URI (none given, no $MLFLOW_TRACKING_URI, none in the settings "
                                     "ConfigMap): the run records no lineage and no model gate")
    if uri == "none":
        return Check("mlflow", SKIPPED, f"lineage is switched off (tracking URI 'none', from {source})")
    scheme = urlparse(uri).scheme
    if scheme not in ("http", "https"):
        return Check("mlflow", FAIL, f"{shown_uri(uri)} (from {source}) is a local store: the cluster's pods cannot "
                                     "write there", "give --mlflow-tracking-uri http(s)://<the MLflow server>")
    if _cluster_only(uri, source):
        return Check("mlflow", SKIPPED, f"{uri} (from {source}) is a cluster-internal address this machine cannot "
                                        "resolve; to check it from here: kubectl -n <ns> port-forward svc/mlflow "
                                        "5000, then --mlflow-tracking-uri http://127.0.0.1:5000")
    url = uri.rstrip("/") + "/api/2.0/mlflow/experiments/search?max_results=1"
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=_mlflow_headers()),
                                    timeout=MLFLOW_TIMEOUT_S) as answer:
            body = json.loads(answer.read() or b"{}")
        if not isinstance(body, dict):
            raise ValueError("the answer is not an MLflow JSON object")
    except urllib.error.HTTPError as exc:
        return Check("mlflow", FAIL, f"the MLflow REST API at {shown_uri(uri)} (from {source}) answered {exc.code} "
                                     f"{exc.reason}", "check the tracking URI and MLFLOW_TRACKING_TOKEN")
    except (OSError, ValueError) as exc:
        return Check("mlflow", FAIL, f"cannot reach the MLflow REST API at {shown_uri(uri)} (from {source}): "
                                     f"{getattr(exc, 'reason', exc)}",
                     "check the tracking URI (--mlflow-tracking-uri, $MLFLOW_TRACKING_URI, the settings ConfigMap) "
                     "and that the server runs")
    return Check("mlflow", OK, f"the MLflow REST API answers at {shown_uri(uri)} (from {source})")
