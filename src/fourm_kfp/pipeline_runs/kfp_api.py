"""The KFP API server as ``fourm-kfp submit`` meets it: the client and its credentials, the errors it answers
(one line each, and which are worth another try), and the rules the server applies to what it is sent, checked
here first with a clear error: run parameters typed as the compiled pipeline declares them
(``validatePipelineJobInputs``), cron read as robfig/cron v1.2 reads it (seconds first), pipelines and versions
found across every page of a list and uploaded into a profile's namespace; and the server's version, which must be
at least :data:`KFP_VERSION_FLOOR` (:func:`check_server_version`).

Authentication is what ``kfp.Client`` users expect: a bearer token from ``KFP_TOKEN`` (e.g. a CI secret), else
the service-account token file KFP mounts in a pod (``KF_PIPELINES_SA_TOKEN_PATH``, else kfp's default path), passed
as ``ServiceAccountTokenVolumeCredentials`` even with an explicit host (kfp itself would not try it then), else none.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any, Callable

from fourm_kfp.errors import UserError

#: While following, API answers worth another try (the server or a proxy in front of it hiccuped).
TRANSIENT_STATUS = {429, 500, 502, 503, 504}

#: The oldest KFP backend that runs the pipeline as compiled, and why.
KFP_VERSION_FLOOR = (2, 15, 0)
KFP_FLOOR_REASON = ("its steps' Secret and ConfigMap environment variables are `optional: true`, which the KFP driver "
                    "passes to the pod from 2.15 on (an older one makes them required: every step fails with "
                    "CreateContainerConfigError when the Secret or a key is missing), and the namespace rule of "
                    "multi-user uploads that --namespace follows (REQUIRE_NAMESPACE_FOR_PIPELINES) is 2.15's")
#: A release's ``tag_name`` (the API server image's TAG_NAME build arg: ``2.17.0``, a release candidate
#: ``2.15.0-rc.1``); builds from source answer ``unknown`` (no TAG_NAME), ``master``, ``1.0-dev`` ...
RELEASE_TAG = re.compile(r"v?([0-9]+)\.([0-9]+)\.([0-9]+)(?:-rc\.?[0-9]+)?")


def service_account_token_path() -> str:
    """Where KFP mounts a pod's service-account token for the API: ``KF_PIPELINES_SA_TOKEN_PATH``, else kfp's
    default (``/var/run/secrets/kubeflow/pipelines/token``)."""
    from kfp import client as kfp_client

    return os.environ.get(kfp_client.KF_PIPELINES_SA_TOKEN_ENV) or kfp_client.KF_PIPELINES_SA_TOKEN_PATH


def make_client(host: str, namespace: str = ""):
    """A ``kfp.Client`` for ``host``: the bearer token from ``KFP_TOKEN``, else the service-account token file KFP
    mounts in a pod (:func:`service_account_token_path`; re-read for every request, so the kubelet's rotation is
    seen), else no credentials. kfp's own config loading never tries the token file once a host is given."""
    import logging
    import warnings

    import kfp
    from kfp.client import ServiceAccountTokenVolumeCredentials

    kwargs: dict[str, Any] = {"host": host}
    if namespace:
        kwargs["namespace"] = namespace
    if os.environ.get("KFP_TOKEN"):
        kwargs["existing_token"] = os.environ["KFP_TOKEN"]
    elif os.path.isfile(service_account_token_path()):
        kwargs["credentials"] = ServiceAccountTokenVolumeCredentials(service_account_token_path())
    # urllib3 logs each of its own connection retries: the error that ends them says it once.
    logging.getLogger("urllib3.connectionpool").setLevel(logging.ERROR)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "This client only works with Kubeflow Pipeline v2", FutureWarning)
        return kfp.Client(**kwargs)


def _api_message(exc) -> str:
    """The server's one-line message from a ``kfp_server_api.ApiException`` (its JSON body), else its reason."""
    try:
        body = json.loads(exc.body or "{}")
        message = body.get("message") or body.get("error") if isinstance(body, dict) else None
    except (TypeError, ValueError):
        message = None
    return " ".join(str(message or exc.reason or exc.body or "").split())


def _connection_reason(exc) -> str:
    """What went wrong under a urllib3 error: connection refused, a DNS failure, a reset, a TLS failure."""
    reason = getattr(exc, "reason", None) or exc
    return " ".join(str(reason).split())


@contextlib.contextmanager
def kfp_api_errors(host: str):
    """Talking to the KFP API before anything is followed: an unreachable host or a refused request is a
    :class:`UserError` (exit 2) in one line, naming the host."""
    import kfp_server_api
    import urllib3

    try:
        yield
    except urllib3.exceptions.HTTPError as exc:
        raise UserError(f"--host {host}: cannot reach the KFP API: {_connection_reason(exc)}") from None
    except kfp_server_api.ApiException as exc:
        if exc.status == 0:  # kfp-server-api's wrapping of a urllib3 SSLError (a TLS failure): no answer at all
            raise UserError(f"--host {host}: cannot reach the KFP API: {_connection_reason(exc)}") from None
        hint = " (set KFP_TOKEN, or run where the KFP service-account token is mounted)" \
            if exc.status in (401, 403) else ""
        if "Namespace is required" in _api_message(exc):
            hint = " (give --namespace: your Kubeflow profile's namespace)"
        raise UserError(f"--host {host}: the KFP API answered {exc.status} {exc.reason}: {_api_message(exc)}"
                        f"{hint}") from None
    except TimeoutError as exc:  # kfp.Client's healthz check gives up after 5 tries
        raise UserError(f"--host {host}: the KFP API did not answer: {exc}") from None


def server_version(client) -> str:
    """The KFP API server's ``tag_name``, from ``/apis/v2beta1/healthz`` (``commit_sha``, ``tag_name``,
    ``multi_user``, ``pipeline_store``; kfp-server-api's response model drops the first two, so the JSON is read)."""
    answer = client.healthzs.healthz_service_get_healthz(_preload_content=False)
    try:
        body = json.loads(answer.data or b"{}")
    except ValueError:
        body = {}
    return str(body.get("tag_name") or "") if isinstance(body, dict) else ""


def check_server_version(client, host: str, out: Callable[[str], None]) -> str:
    """The server's version (:func:`server_version`); a :class:`UserError` naming the floor and why when it is a
    release below :data:`KFP_VERSION_FLOOR`. A server that names no release (built from source) is accepted with a
    warning line, since its version cannot be told."""
    tag = server_version(client)
    floor = ".".join(map(str, KFP_VERSION_FLOOR))
    match = RELEASE_TAG.fullmatch(tag)
    if match is None:
        out(f"warning: the KFP server names no release version (healthz tag_name {tag!r}: built from source?), so "
            f"fourm-kfp cannot check that it is KFP >= {floor}, which it needs: {KFP_FLOOR_REASON}")
        return tag
    if tuple(int(part) for part in match.groups()) < KFP_VERSION_FLOOR:
        raise UserError(f"--host {host}: the KFP server is {tag.removeprefix('v')}; fourm-kfp needs KFP >= {floor}: "
                        f"{KFP_FLOOR_REASON}. Upgrade Kubeflow Pipelines (manifests/README.md, Prerequisites)")
    return tag


def transient_error(exc: BaseException, client) -> str | None:
    """Why ``exc``, from ``client``, is worth retrying while following (``None``: it is not). A 401 is retried only
    when the client re-reads its token for each request (a service-account token file the kubelet rotates)."""
    import kfp_server_api
    import urllib3

    if isinstance(exc, urllib3.exceptions.HTTPError):
        return _connection_reason(exc)
    if isinstance(exc, kfp_server_api.ApiException):
        if exc.status in TRANSIENT_STATUS or (exc.status == 401 and _token_refreshes(client)):
            return f"{exc.status} {exc.reason}"
    return None


def _token_refreshes(client) -> bool:
    """Whether the client re-reads its token for every request (kfp's credentials hook)."""
    config = getattr(client, "_existing_config", None)
    return getattr(config, "refresh_api_key_hook", None) is not None


#: The KFP server parses a recurring run's cron with robfig/cron v1.2 ``cron.Parse``: seconds first, 6 fields (a
#: 5-field expression is read as second minute hour day month, so ``0 3 * * 1`` = minute 3 of every hour in
#: January), or a descriptor (``@daily``, ``@every 6h``).
CRON_FIELDS = (("second", 0, 59, {}), ("minute", 0, 59, {}), ("hour", 0, 23, {}), ("day-of-month", 1, 31, {}),
               ("month", 1, 12, {m: i + 1 for i, m in enumerate("jan feb mar apr may jun jul aug sep oct nov dec"
                                                              .split())}),
               ("day-of-week", 0, 6, {d: i for i, d in enumerate("sun mon tue wed thu fri sat".split())}))
CRON_DESCRIPTORS = ("@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight", "@hourly")


def _cron_number(text: str, names: dict[str, int]) -> int:
    if text.lower() in names:
        return names[text.lower()]
    if not re.fullmatch(r"[0-9]+", text):
        raise ValueError(f"{text!r} is not a number")
    return int(text)


def _check_cron_field(text: str, name: str, low: int, high: int, names: dict[str, int]) -> None:
    """One field: a comma-separated list of ``*``/``?``, ``N``, ``N-M``, each with an optional ``/step``."""
    for item in text.split(","):
        span, _, step = item.partition("/")
        if span in ("*", "?"):
            start, end = low, high
        else:
            first, dash, last = span.partition("-")
            start = _cron_number(first, names)
            end = _cron_number(last, names) if dash else (high if step else start)
        if step and (not step.isdigit() or int(step) == 0):
            raise ValueError(f"{name} {item!r}: the step must be a positive number")
        if not low <= start <= end <= high:
            raise ValueError(f"{name} {item!r}: outside {low}-{high} (or the range runs backwards)")


def check_cron(expression: str) -> str:
    """``--schedule`` as the KFP server will read it (see :data:`CRON_FIELDS`); a 5-field expression is refused with
    its 6-field form, since the server would silently give it another meaning."""
    fields = expression.split()
    if expression.startswith("@"):
        every = re.fullmatch(r"@every ((?:[0-9.]+(?:ns|us|µs|ms|s|m|h))+)", expression.strip())
        if expression.strip() in CRON_DESCRIPTORS or every:
            return expression.strip()
        raise UserError(f"--schedule {expression!r}: not a descriptor KFP knows ({', '.join(CRON_DESCRIPTORS)}, "
                        "@every <duration>)")
    form = "second minute hour day-of-month month day-of-week"
    if len(fields) == 5:
        read = ", ".join(f"{name} {text}" for text, (name, *_) in zip(fields, CRON_FIELDS))
        raise UserError(f"--schedule {expression!r}: KFP reads cron with seconds first ({form}), so it would read "
                        f"these 5 fields as {read}. For the usual minute-first meaning write the 6 fields "
                        f"'0 {' '.join(fields)}'")
    if len(fields) != 6:
        raise UserError(f"--schedule {expression!r}: KFP cron has 6 fields ({form}), e.g. '0 0 3 * * 1' for "
                        f"Mondays 03:00; found {len(fields)}")
    try:
        for text, (name, low, high, names) in zip(fields, CRON_FIELDS):
            _check_cron_field(text, name, low, high, names)
    except ValueError as exc:
        raise UserError(f"--schedule {expression!r}: {exc} ({form})") from None
    return " ".join(fields)


def package_spec(package: Path) -> dict:
    """The pipeline spec in a compiled pipeline YAML (its first document), read with libyaml's safe loader where
    PyYAML has it (0.013 s where the pure-Python one took 0.12 s over the 3,900-line spec: every submit and doctor)."""
    import yaml

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    return next(yaml.load_all(package.read_text(), Loader=loader))


def pipeline_parameter_types(package: Path) -> dict[str, str]:
    """The compiled pipeline's parameters and their declared ``parameterType`` (``STRING``, ``NUMBER_INTEGER``, ...)."""
    spec = package_spec(package)
    return {name: str(declared.get("parameterType", ""))
            for name, declared in spec["root"]["inputDefinitions"]["parameters"].items()}


_TYPE_WORDS = {"STRING": "a string", "NUMBER_INTEGER": "an integer", "NUMBER_DOUBLE": "a number",
               "BOOLEAN": "true or false", "LIST": "a JSON list, e.g. [\"a\", \"b\"]",
               "STRUCT": "a JSON object, e.g. {\"key\": \"value\"}"}


def coerce_parameter(name: str, value: Any, parameter_type: str) -> Any:
    """``value`` (the text after ``--param NAME=``, or a Python value) as the JSON type KFP's run creation accepts
    for ``parameter_type`` (it rejects e.g. a number for a STRING parameter); a :class:`UserError` otherwise."""
    text = value if isinstance(value, str) else None
    decoded: Any = value
    if text is not None and parameter_type != "STRING":
        try:
            decoded = json.loads(text)
        except json.JSONDecodeError:
            decoded = text
    coerced: Any = None
    if parameter_type == "STRING":
        if isinstance(value, str):
            coerced = value
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            coerced = json.dumps(value)
    elif parameter_type == "NUMBER_INTEGER":
        if isinstance(decoded, (int, float)) and not isinstance(decoded, bool) and float(decoded).is_integer():
            coerced = int(decoded)
    elif parameter_type == "NUMBER_DOUBLE":
        if isinstance(decoded, (int, float)) and not isinstance(decoded, bool):
            coerced = float(decoded)
    elif parameter_type == "BOOLEAN":
        if isinstance(decoded, bool):
            coerced = decoded
        elif isinstance(decoded, str) and decoded.lower() in ("true", "false"):
            coerced = decoded.lower() == "true"
    elif parameter_type == "LIST":
        coerced = decoded if isinstance(decoded, list) else None
    elif parameter_type == "STRUCT":
        coerced = decoded if isinstance(decoded, dict) else None
    else:
        raise UserError(f"--param {name}: the compiled pipeline declares it {parameter_type or 'without a type'}, "
                        "which a run cannot be given")
    if coerced is None:
        shown = text if text is not None else json.dumps(value)
        raise UserError(f"--param {name}={shown}: the pipeline declares {name} {parameter_type}; expected "
                        f"{_TYPE_WORDS[parameter_type]}")
    return coerced


def coerce_parameters(parameters: dict[str, Any], declared: dict[str, str]) -> dict[str, Any]:
    """Every parameter checked against the pipeline (unknown names and mistyped values are user errors)."""
    unknown = sorted(set(parameters) - set(declared))
    if unknown:
        raise UserError(f"--param {', '.join(unknown)}: not a parameter of the pipeline; it has "
                        f"{', '.join(sorted(declared))}")
    return {name: coerce_parameter(name, value, declared[name]) for name, value in parameters.items()}


def _find(list_page: Callable[[str], Any], items: str, id_field: str, display_name: str) -> str | None:
    """The id of the item named ``display_name`` across every page of a KFP list (following next_page_token)."""
    token = ""
    while True:
        page = list_page(token)
        found = next((item for item in getattr(page, items) or [] if item.display_name == display_name), None)
        if found is not None:
            return getattr(found, id_field)
        token = page.next_page_token or ""
        if not token:
            return None


def upload(client, package: Path, name: str, namespace: str = "") -> tuple[str, str]:
    """Upload ``package`` as pipeline ``name`` (or as a version of it, named by content); returns the ids.

    With ``namespace`` (a multi-user install's profile) the pipeline lives in that namespace, where only its members
    can add versions (KFP >= 2.15 with REQUIRE_NAMESPACE_FOR_PIPELINES refuses shared uploads), else it is shared.
    Existing pipelines and versions are looked up across all pages, so a re-submitted older YAML finds its version.
    """
    digest = hashlib.sha256(package.read_bytes()).hexdigest()[:12]
    version_name = f"{name}-{digest}"
    name_filter = json.dumps({"predicates": [{"operation": "EQUALS", "key": "display_name", "stringValue": name}]})
    pipeline_id = _find(lambda token: client.list_pipelines(page_token=token, page_size=100, filter=name_filter,
                                                            namespace=namespace or None),
                        "pipelines", "pipeline_id", name)
    if pipeline_id is None:
        pipeline = client.upload_pipeline(str(package), pipeline_name=name, namespace=namespace or None,
                                          description="fourm-kfp: pre-train a 4M-style multimodal model")
        pipeline_id = pipeline.pipeline_id
    version_id = _find(lambda token: client.list_pipeline_versions(pipeline_id, page_token=token, page_size=100),
                       "pipeline_versions", "pipeline_version_id", version_name)
    if version_id is not None:
        return pipeline_id, version_id
    version = client.upload_pipeline_version(str(package), pipeline_version_name=version_name,
                                             pipeline_id=pipeline_id)
    return pipeline_id, version.pipeline_version_id
