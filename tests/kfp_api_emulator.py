"""A local HTTP server that implements the few Kubeflow Pipelines REST endpoints ``fourm-kfp submit`` uses.

Emulated (``/apis/v2beta1``): healthz; pipelines list (with the ``display_name`` EQUALS filter kfp.Client sends),
upload and upload_version (multipart, the file must be a compiled pipeline spec), version list and get (with its
spec); experiments list (by name filter) and create; runs create, get and list (by experiment, paged,
newest first with ``sort_by=created_at desc``); recurring runs create. Every JSON request
body is validated against the ``kfp-server-api`` models of the same version the client uses: an unknown field
anywhere, a value the model rejects (e.g. an enum), a run parameter the uploaded pipeline does not declare, or one
whose JSON kind is not the declared ``parameterType`` (``validatePipelineJobInputs``: a number for a STRING
parameter) is answered with HTTP 400. A recurring run's cron is parsed as the server's robfig/cron v1.2 does
(seconds first; a bad expression is a 400, a 5-field one is accepted with its seconds-first meaning), and
``max_concurrency`` must be 1-10.

Not emulated: execution. A created run moves through the ``frames`` the test gives (one per ``get``: the run's state
and its stages' states), answered as real-shaped task details (:func:`argo_task_details`: the Argo workflow's
nodes, named by DAG task key, with driver and executor nodes); ``on_run_created`` lets the test do what the
pipeline would have done (e.g. record the evaluate stage's MLflow run); ``run_faults`` injects errors on run reads.
No auth beyond recording the ``Authorization`` header, except ``reject_tokens``: a bearer token the server no longer
accepts (an expired static token) is answered 401 on every request after the run was created.

``tls=True`` serves HTTPS with a certificate for 127.0.0.1 signed by a throwaway CA (``ca_path``, for the client's
``ssl_ca_cert``); :meth:`KfpApiEmulator.rotate_certificate` makes later connections present a certificate no client
trusts (a certificate renewed by another CA, an intercepting proxy), so every later request fails its TLS handshake.

``/healthz`` answers as the server's ``newHealthzResponse`` (backend/src/apiserver/main.go, KFP 2.17): ``commit_sha``
and ``tag_name`` (the ``COMMIT_SHA``/``TAG_NAME`` build args of the API server image, ``unknown`` when built without
them; a release image carries its version, e.g. ``2.17.0``), ``multi_user`` and ``pipeline_store``.

Lists are paged as the server pages them (``page_size`` default 20, capped at ``max_page_size``, which a test can
make small; an opaque ``next_page_token``). A pipeline name is unique per namespace and a version name per
pipeline (HTTP 409 otherwise). ``multi_user=True`` keeps pipelines and experiments per namespace (the ``namespace``
query; "" = shared); with ``require_namespace`` (REQUIRE_NAMESPACE_FOR_PIPELINES) a namespace-less pipeline upload,
version upload or list is a 400. Not emulated: namespace authorization (SubjectAccessReview), runs listed by
namespace.
"""

from __future__ import annotations

import base64
import datetime as dt
import email.policy
import io
import ipaddress
import json
import re
import socket
import ssl
import struct
import tempfile
import threading
import uuid
from email.parser import BytesParser
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable
from urllib.parse import parse_qs, urlparse

import kfp_server_api
import yaml

API = "/apis/v2beta1"


def model_errors(data: Any, klass: str, path: str = "") -> list[str]:
    """Fields of ``data`` that ``kfp_server_api.models.<klass>`` does not have, recursively, plus what the model
    itself rejects when built from ``data`` (client-side validation: enums, required fields)."""
    model = getattr(kfp_server_api.models, klass)
    if not isinstance(data, dict):
        return [f"{path or klass}: expected an object"]
    errors = []
    by_json = {json_key: attr for attr, json_key in model.attribute_map.items()}
    for key, value in data.items():
        if key not in by_json:
            errors.append(f"{path}{key}: not a field of {klass}")
            continue
        kind = model.openapi_types[by_json[key]]
        inner = re.fullmatch(r"list\[(V2beta1\w+|Protobuf\w+)\]", kind)
        if kind.startswith(("V2beta1", "Protobuf")):
            errors += model_errors(value, kind, f"{path}{key}.")
        elif inner and isinstance(value, list):
            for i, item in enumerate(value):
                errors += model_errors(item, inner.group(1), f"{path}{key}[{i}].")
    if not path and not errors:
        try:
            kfp_server_api.ApiClient()._ApiClient__deserialize(data, klass)
        except ValueError as exc:
            errors.append(f"{klass}: {exc}")
    return errors


#: ``validatePipelineJobInputs`` (backend/src/apiserver/template/v2_template.go): the JSON kind each declared
#: ``parameterType`` accepts for a run's parameter value (a protobuf ``Value``: numbers are one kind, int or not).
_KINDS = {"NUMBER_DOUBLE": ("double or integer", (int, float)), "NUMBER_INTEGER": ("double or integer", (int, float)),
          "STRING": ("string", (str,)), "BOOLEAN": ("bool", (bool,)), "LIST": ("list", (list,)),
          "STRUCT": ("struct", (dict,))}


def parameter_type_error(name: str, value: Any, parameter_type: str) -> str | None:
    """The server's message when ``value`` does not have the kind ``parameter_type`` requires, else None."""
    if parameter_type not in _KINDS:
        return f"input parameter {name} requires type {parameter_type or 'unspecified'}, which a run cannot be given"
    word, kinds = _KINDS[parameter_type]
    is_bool = isinstance(value, bool)
    if isinstance(value, kinds) and (is_bool == (parameter_type == "BOOLEAN")):
        return None
    return f"input parameter {name} requires type {word}, but the input parameter is not of {word} value type"


_CRON_BOUNDS = ((0, 59, {}), (0, 59, {}), (0, 23, {}), (1, 31, {}),
                ((1, 12, {m: i + 1 for i, m in enumerate("jan feb mar apr may jun jul aug sep oct nov dec".split())})),
                (0, 6, {d: i for i, d in enumerate("sun mon tue wed thu fri sat".split())}))
_GO_DURATION = re.compile(r"[-+]?([0-9]*(\.[0-9]*)?(ns|us|µs|ms|s|m|h))+|0")


def robfig_cron_parse(spec: str) -> list[set[int]] | None:
    """robfig/cron v1.2 ``cron.Parse`` (parser.go), which the API server calls on a recurring run's cron: seconds
    first, 5 to 6 fields (day-of-week optional), or a descriptor. Returns the seconds, minutes, hours, days, months
    and weekdays it matches (``None`` for a descriptor); ``ValueError`` with the library's message otherwise."""
    if not spec:
        raise ValueError("Empty spec string")
    if spec[0] == "@":
        if spec in ("@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight", "@hourly"):
            return None
        if spec.startswith("@every ") and _GO_DURATION.fullmatch(spec[len("@every "):]):
            return None
        raise ValueError(f"Unrecognized descriptor: {spec}")
    fields = spec.split()
    if not 5 <= len(fields) <= 6:
        raise ValueError(f"Expected 5 to 6 fields, found {len(fields)}: {spec}")
    fields = fields + ["*"] * (6 - len(fields))

    def number(text: str, names: dict) -> int:
        if text.lower() in names:
            return names[text.lower()]
        if not re.fullmatch(r"[+-]?[0-9]+", text):  # strconv.Atoi
            raise ValueError(f"Failed to parse int from {text}")
        value = int(text)
        if value < 0:
            raise ValueError(f"Negative number ({value}) not allowed: {text}")
        return value

    matched = []
    for text, (low, high, names) in zip(fields, _CRON_BOUNDS):
        bits: set[int] = set()
        for expr in filter(None, text.split(",")):
            range_and_step = expr.split("/")
            low_and_high = range_and_step[0].split("-")
            if low_and_high[0] in ("*", "?"):
                start, end = low, high
            else:
                start = number(low_and_high[0], names)
                if len(low_and_high) > 2:
                    raise ValueError(f"Too many hyphens: {expr}")
                end = number(low_and_high[1], names) if len(low_and_high) == 2 else start
            if len(range_and_step) > 2:
                raise ValueError(f"Too many slashes: {expr}")
            step = number(range_and_step[1], {}) if len(range_and_step) == 2 else 1
            if len(range_and_step) == 2 and len(low_and_high) == 1:
                end = high  # "N/step" means "N-max/step"
            if start < low:
                raise ValueError(f"Beginning of range ({start}) below minimum ({low}): {expr}")
            if end > high:
                raise ValueError(f"End of range ({end}) above maximum ({high}): {expr}")
            if start > end:
                raise ValueError(f"Beginning of range ({start}) beyond end of range ({end}): {expr}")
            if step == 0:
                raise ValueError(f"Step of range should be a positive number: {expr}")
            bits |= set(range(start, end + 1, step))
        matched.append(bits)
    return matched


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat().replace("+00:00", "Z")


class KfpApiEmulator:
    """The server and its in-memory state; ``url`` is the host to give ``kfp.Client``."""

    def __init__(self, frames: list[tuple[str, dict[str, str]]] | None = None,
                 on_run_created: Callable[[dict[str, Any]], None] | None = None,
                 run_faults: list[int | str] | None = None, multi_user: bool = False,
                 require_namespace: bool = False, max_page_size: int = 200, branches: dict[str, str] | None = None,
                 tag_name: str = "2.17.0", commit_sha: str = "0f6b1e7d", tls: bool = False):
        self.frames = frames or [("SUCCEEDED", {})]
        self.tag_name, self.commit_sha = tag_name, commit_sha  # the API server image's TAG_NAME and COMMIT_SHA
        self.reject_tokens: set[str] = set()  # bearer tokens answered 401 once a run exists (expired)
        self.multi_user = multi_user
        # REQUIRE_NAMESPACE_FOR_PIPELINES (KFP >= 2.15, multi-user only): a namespace-less pipeline call is a 400.
        self.require_namespace = require_namespace and multi_user
        self.max_page_size = max_page_size  # the server's is 200 (list.go maxPageSize), 20 when none is asked
        self.branches = branches  # which task key runs each stage (see argo_task_details)
        self.on_run_created = on_run_created
        # What the next run reads (GET /runs/{id}) meet instead of an answer, one each: an HTTP status (e.g. 503
        # from a proxy, 401 from an expired token) or "reset" (the connection is closed without an answer).
        self.run_faults = list(run_faults or [])
        self.pipelines: dict[str, dict] = {}
        self.versions: dict[str, list[dict]] = {}
        self.specs: dict[str, dict] = {}  # version id -> pipeline spec
        self.experiments: dict[str, dict] = {}
        self.runs: dict[str, dict] = {}
        self.recurring_runs: dict[str, dict] = {}
        self.polls: dict[str, int] = {}
        self.requests: list[tuple[str, str, str | None]] = []  # (method, path, Authorization header)
        self.rejected: list[str] = []
        emulator = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def do_GET(self):
                emulator._dispatch(self, "GET")

            def do_POST(self):
                emulator._dispatch(self, "POST")

        class Server(ThreadingHTTPServer):
            def handle_error(self, request, client_address):  # a "reset" fault's closed socket: expected
                pass

            def get_request(self):  # with tls, each connection's handshake (in its own thread) is with the current cert
                sock, address = super().get_request()
                if emulator._tls is None:
                    return sock, address
                return emulator._tls.wrap_socket(sock, server_side=True, do_handshake_on_connect=False), address

        self._tmp = tempfile.TemporaryDirectory(prefix="kfp-emulator-") if tls else None
        self._tls: ssl.SSLContext | None = None
        self.ca_path = ""
        if self._tmp:
            self.ca_path, self._tls = _tls_context(self._tmp.name, "trusted")
        self.server = Server(("127.0.0.1", 0), Handler)
        self.url = f"{'https' if tls else 'http'}://127.0.0.1:{self.server.server_address[1]}"
        # serve_forever notices a shutdown at its next poll: the default 0.5 s cost every test half a second to close
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        if self._tmp:
            self._tmp.cleanup()

    def rotate_certificate(self) -> None:
        """From now on present a certificate signed by a CA no client trusts (``tls=True`` only)."""
        assert self._tmp, "rotate_certificate needs KfpApiEmulator(tls=True)"
        self._tls = _tls_context(self._tmp.name, "untrusted")[1]

    # ------------------------------------------------------------------------------------------ plumbing

    def _dispatch(self, handler: BaseHTTPRequestHandler, method: str) -> None:
        url = urlparse(handler.path)
        query = {k: v[0] for k, v in parse_qs(url.query).items()}
        authorization = handler.headers.get("Authorization")
        self.requests.append((method, url.path, authorization))
        if self.runs and authorization and authorization.removeprefix("Bearer ") in self.reject_tokens:
            # auth/authenticator_token_review.go: a token TokenReview no longer authenticates (codes.Unauthenticated)
            message = ("Authentication failure: Review.Status.Authenticated is false. Error token has expired: Failed "
                       "to authenticate token review")
            self._send(handler, 401, {"error": message, "code": 16, "message": message})
            return
        if method == "GET" and re.fullmatch(rf"{API}/runs/[^/:]+", url.path) and self.run_faults:
            fault = self.run_faults.pop(0)
            if fault == "reset":
                handler.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                handler.connection.close()
                handler.close_connection = True
                return
            self._send(handler, int(fault), {"error": "injected", "code": 14, "message": f"injected {fault}"})
            return
        try:
            status, body = self._route(method, url.path, query, handler)
        except BadRequest as exc:
            self.rejected.append(str(exc))
            status, body = 400, {"error": str(exc), "code": 3, "message": str(exc)}
        self._send(handler, status, body)

    @staticmethod
    def _send(handler: BaseHTTPRequestHandler, status: int, body: Any) -> None:
        data = json.dumps(body).encode()
        handler.send_response(status)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        handler.wfile.write(data)

    @staticmethod
    def _json(handler: BaseHTTPRequestHandler, klass: str) -> dict:
        length = int(handler.headers.get("Content-Length") or 0)
        body = json.loads(handler.rfile.read(length) or b"{}")
        errors = model_errors(body, klass)
        if errors:
            raise BadRequest("; ".join(errors))
        return body

    @staticmethod
    def _upload(handler: BaseHTTPRequestHandler) -> dict:
        raw = handler.rfile.read(int(handler.headers.get("Content-Length") or 0))
        message = BytesParser(policy=email.policy.default).parsebytes(
            f"Content-Type: {handler.headers['Content-Type']}\r\n\r\n".encode() + raw)
        files = [part.get_payload(decode=True) for part in message.iter_parts()
                 if part.get_param("name", header="content-disposition") == "uploadfile"]
        if not files:
            raise BadRequest("multipart field uploadfile missing")
        loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml where PyYAML has it: 10x the Python loader
        spec = next(yaml.load_all(io.BytesIO(files[0]), Loader=loader))
        if not isinstance(spec, dict) or "pipelineInfo" not in spec or "root" not in spec:
            raise BadRequest("uploadfile is not a compiled pipeline spec")
        return spec

    def _page(self, items: list[dict], query: dict, key: str) -> dict:
        """One page of ``items`` as the server pages a list: ``page_size`` (default 20, at most the emulator's
        limit) from the offset an opaque ``page_token`` carries; ``next_page_token`` when more remain."""
        size = min(int(query.get("page_size") or 20), self.max_page_size)
        try:
            start = int(base64.urlsafe_b64decode(query["page_token"]).decode()) if query.get("page_token") else 0
        except ValueError:
            raise BadRequest(f"Invalid page token {query['page_token']!r}") from None
        page = items[start:start + size]
        if not page:
            return {}
        body = {key: page, "total_size": len(items)}
        if start + size < len(items):
            body["next_page_token"] = base64.urlsafe_b64encode(str(start + size).encode()).decode()
        return body

    def _check_namespace(self, namespace: str) -> None:
        """validation.ValidateNamespaceRequired."""
        if self.require_namespace and not namespace:
            raise BadRequest("Namespace is required for pipeline operations")

    @staticmethod
    def _name_filter(query: dict) -> str | None:
        if "filter" not in query:
            return None
        predicates = json.loads(query["filter"]).get("predicates", [])
        return next((p.get("stringValue") or p.get("string_value") for p in predicates
                     if p.get("key") in ("display_name", "name")), None)

    # ---------------------------------------------------------------------------------------------- routes

    def _route(self, method: str, path: str, query: dict, handler) -> tuple[int, Any]:
        if not path.startswith(API):
            return 404, {"error": "not found"}
        path = path[len(API):]
        if (method, path) == ("GET", "/healthz"):
            return 200, {"commit_sha": self.commit_sha, "tag_name": self.tag_name, "multi_user": self.multi_user,
                         "pipeline_store": "database"}
        namespace = query.get("namespace", "") if self.multi_user else ""  # single-user: everything is shared
        if (method, path) == ("GET", "/pipelines"):
            self._check_namespace(namespace)
            name = self._name_filter(query)
            found = [p for p in self.pipelines.values() if (name is None or p["display_name"] == name)
                     and p.get("namespace", "") == namespace]
            return 200, self._page(found, query, "pipelines")
        if (method, path) == ("POST", "/pipelines/upload"):
            spec = self._upload(handler)
            self._check_namespace(namespace)
            name = query.get("name") or query.get("display_name") or spec["pipelineInfo"]["name"]
            if any(p["display_name"] == name and p.get("namespace", "") == namespace
                   for p in self.pipelines.values()):
                return self._conflict(f"Failed to create a new pipeline. The name {name} already exist. Please "
                                      "specify a new name")
            pipeline = {"pipeline_id": str(uuid.uuid4()), "display_name": name, "name": name, "created_at": _now(),
                        "description": query.get("description", ""), **({"namespace": namespace} if namespace else {})}
            self.pipelines[pipeline["pipeline_id"]] = pipeline
            self._add_version(pipeline["pipeline_id"], name, spec)
            return 200, pipeline
        if (method, path) == ("POST", "/pipelines/upload_version"):
            spec = self._upload(handler)
            pipeline_id = query.get("pipelineid", "")
            if pipeline_id not in self.pipelines:
                raise BadRequest(f"no pipeline {pipeline_id!r}")
            self._check_namespace(self.pipelines[pipeline_id].get("namespace", ""))
            name = query.get("name") or query.get("display_name")
            if any(v["display_name"] == name for v in self.versions[pipeline_id]):
                return self._conflict(f"Failed to create a new pipeline version. The name {name} already exist. "
                                      "Specify a new name")
            return 200, self._add_version(pipeline_id, name, spec)
        match = re.fullmatch(r"/pipelines/([^/]+)/versions/([^/]+)", path)
        if method == "GET" and match:
            version = next((v for v in self.versions.get(match.group(1), [])
                            if v["pipeline_version_id"] == match.group(2)), None)
            if version is None:
                return 404, {"error": "not found", "code": 5, "message": f"pipeline version {match.group(2)} not found"}
            return 200, {**version, "pipeline_spec": self.specs[match.group(2)]}
        match = re.fullmatch(r"/pipelines/([^/]+)/versions", path)
        if method == "GET" and match:
            return 200, self._page(self.versions.get(match.group(1), []), query, "pipeline_versions")
        if (method, path) == ("GET", "/experiments"):
            name = self._name_filter(query)
            found = [e for e in self.experiments.values() if (name is None or e["display_name"] == name)
                     and e.get("namespace", "") == namespace]
            return 200, self._page(found, query, "experiments")
        if (method, path) == ("POST", "/experiments"):
            body = self._json(handler, "V2beta1Experiment")
            experiment = {**body, "experiment_id": str(uuid.uuid4()), "created_at": _now(),
                          "storage_state": "AVAILABLE"}
            if not self.multi_user:
                experiment.pop("namespace", None)
            self.experiments[experiment["experiment_id"]] = experiment
            return 200, experiment
        if (method, path) == ("POST", "/runs"):
            body = self._json(handler, "V2beta1Run")
            self._check_run(body)
            run = {**body, "run_id": str(uuid.uuid4()), "state": "PENDING", "created_at": _now()}
            self.runs[run["run_id"]] = run
            self.polls[run["run_id"]] = 0
            if self.on_run_created:
                self.on_run_created(run)
            return 200, run
        if (method, path) == ("GET", "/runs"):  # newest first with sort_by "created_at desc", as kfp.Client asks
            found = [r for r in self.runs.values() if r.get("experiment_id") == query.get("experiment_id")
                     or not query.get("experiment_id")]
            found.sort(key=lambda r: r["created_at"], reverse=query.get("sort_by", "").endswith(" desc"))
            return 200, self._page(found, query, "runs")
        match = re.fullmatch(r"/runs/([^/:]+)", path)
        if method == "GET" and match:
            return 200, self._advance(match.group(1))
        if (method, path) == ("POST", "/recurringruns"):
            body = self._json(handler, "V2beta1RecurringRun")
            self._check_run(body)
            self._check_schedule(body)
            recurring = {**body, "recurring_run_id": str(uuid.uuid4()), "status": "ENABLED", "created_at": _now()}
            self.recurring_runs[recurring["recurring_run_id"]] = recurring
            return 200, recurring
        return 404, {"error": f"{method} {path} is not emulated"}

    def _conflict(self, message: str) -> tuple[int, dict]:
        """codes.AlreadyExists, which the server answers as HTTP 409."""
        self.rejected.append(message)
        return 409, {"error": message, "code": 6, "message": message}

    def _add_version(self, pipeline_id: str, name: str, spec: dict) -> dict:
        version = {"pipeline_id": pipeline_id, "pipeline_version_id": str(uuid.uuid4()), "display_name": name,
                   "name": name, "created_at": _now()}
        self.versions.setdefault(pipeline_id, []).append(version)
        self.specs[version["pipeline_version_id"]] = spec
        return version

    def _check_run(self, body: dict) -> None:
        reference = body.get("pipeline_version_reference") or {}
        spec = self.specs.get(reference.get("pipeline_version_id", ""))
        if spec is None or reference.get("pipeline_id") not in self.pipelines:
            raise BadRequest(f"unknown pipeline version {reference}")
        declared = spec["root"].get("inputDefinitions", {}).get("parameters", {})
        given = (body.get("runtime_config") or {}).get("parameters") or {}
        if set(given) - set(declared):
            extra = sorted(set(given) - set(declared))
            raise BadRequest(f"parameter(s) provided are not required by pipeline: {', '.join(extra)}")
        for name, param in declared.items():
            if name not in given:
                if not param.get("isOptional") and "defaultValue" not in param:
                    raise BadRequest(f"parameter {name} is not optional, yet has neither default value nor user "
                                     "provided value")
                continue
            error = parameter_type_error(name, given[name], param.get("parameterType", ""))
            if error:
                raise BadRequest(error)
        if body.get("experiment_id") and body["experiment_id"] not in self.experiments:
            raise BadRequest(f"unknown experiment {body['experiment_id']}")

    @staticmethod
    def _check_schedule(body: dict) -> None:
        """api_converter.go toModelJob: max_concurrency 1-10, the cron parsed by robfig/cron v1.2."""
        if not 1 <= int(body.get("max_concurrency") or 0) <= 10:
            raise BadRequest("Max concurrency of a recurring run must be at least 1 and at most 10. Received "
                             f"{body.get('max_concurrency')}")
        cron = ((body.get("trigger") or {}).get("cron_schedule") or {}).get("cron")
        if cron is not None:
            try:
                robfig_cron_parse(cron)
            except ValueError as exc:
                raise BadRequest("Schedule cron is not a supported format(https://godoc.org/github.com/robfig/cron). "
                                 f"Error: {exc}") from None

    def _advance(self, run_id: str) -> dict:
        run = self.runs[run_id]
        frame = self.frames[min(self.polls[run_id], len(self.frames) - 1)]
        self.polls[run_id] += 1
        state, stages = frame
        run["state"] = state
        spec = self.specs[run["pipeline_version_reference"]["pipeline_version_id"]]
        run["run_details"] = {"task_details": argo_task_details(run_id, run["display_name"], state, stages, spec,
                                                                self.branches)}
        if state == "FAILED":
            run["error"] = {"code": 2, "message": "task pretrain failed"}
        if state in ("SUCCEEDED", "FAILED", "CANCELED", "SKIPPED"):
            run.setdefault("finished_at", _now())
        return run


def _tls_context(folder: str, name: str) -> tuple[str, ssl.SSLContext]:
    """A server context for 127.0.0.1 whose certificate a fresh CA signed; returns the CA's PEM path and it."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = dt.datetime.now(dt.timezone.utc)

    def certificate(subject: str, key, issuer: str, issuer_key, ca: bool) -> x509.Certificate:
        builder = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
                   .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer)]))
                   .public_key(key.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=1))
                   .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
        if ca:
            builder = builder.add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False),
                                            critical=True)
        else:
            builder = builder.add_extension(x509.SubjectAlternativeName([x509.IPAddress(
                ipaddress.ip_address("127.0.0.1"))]), critical=False)
        return builder.sign(issuer_key, hashes.SHA256())

    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca = certificate(f"emulator CA {name}", ca_key, f"emulator CA {name}", ca_key, True)
    leaf = certificate("127.0.0.1", key, f"emulator CA {name}", ca_key, False)
    pem = serialization.Encoding.PEM
    paths = {part: f"{folder}/{name}-{part}.pem" for part in ("ca", "cert", "key")}
    Path(paths["ca"]).write_bytes(ca.public_bytes(pem))
    Path(paths["cert"]).write_bytes(leaf.public_bytes(pem) + ca.public_bytes(pem))
    Path(paths["key"]).write_bytes(key.private_bytes(pem, serialization.PrivateFormat.PKCS8,
                                                     serialization.NoEncryption()))
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(paths["cert"], paths["key"])
    return paths["ca"], context


_ZERO_TIME = "0001-01-01T00:00:00Z"  # a node that has not finished: Argo's zero FinishedAt, as the server sends it


def argo_task_details(run_id: str, run_name: str, run_state: str, stages: dict[str, str], spec: dict,
                      branches: dict[str, str] | None = None) -> list[dict]:
    """A v2 run's ``run_details.task_details`` as the API server builds them from the Argo workflow's nodes
    (api_converter.go toModelTasks: one task per node, ``display_name`` = the node's DisplayName, sorted by node
    name): the workflow node, ``root-driver`` and ``root``, and for each started task of the pipeline spec its
    ``<key>-driver`` pod, its ``<key>`` node (the DAG task key, e.g. ``pretrain-3``: not the stage's name) and the
    ``executor`` pod under it, inside the driver/DAG nodes of the conditions, branches and exit handler around it;
    a condition whose branch did not run is a SKIPPED node with nothing under it.

    ``stages``: the frame's ``{stage name: state}`` (PENDING and SKIPPED stages have no nodes yet: Argo creates a
    node when it schedules it). ``branches``: which task key runs each stage (default: the last one in the spec,
    e.g. ``pretrain-3``), found through the tasks' ``taskInfo.name``."""
    parent_of: dict[str, str] = {}  # task key -> the key of the DAG task it sits in ("" = root)
    tasks: dict[str, dict] = {}
    dag_task_of = {task["componentRef"]["name"]: key for comp in [spec["root"], *spec["components"].values()]
                   for key, task in (comp.get("dag") or {}).get("tasks", {}).items()}
    for name, comp in [("root", spec["root"]), *spec["components"].items()]:
        for key, task in (comp.get("dag") or {}).get("tasks", {}).items():
            tasks[key] = task
            parent_of[key] = dag_task_of.get(name, "")
    chosen = dict(branches or {})
    for key in sorted(tasks):
        name = tasks[key]["taskInfo"]["name"]
        if name in stages and "dag" not in spec["components"][tasks[key]["componentRef"]["name"]]:
            chosen.setdefault(name, max((k for k in tasks if tasks[k]["taskInfo"]["name"] == name),
                                        key=lambda k: (len(k), k)))
    started = {chosen[name]: state for name, state in stages.items() if state not in ("PENDING", "SKIPPED")}
    if started:
        started.setdefault("open-lineage-run", "SUCCEEDED")  # a task of the pipeline that is not a stage

    def ancestors(key: str) -> list[str]:
        chain = []
        while parent_of.get(key):
            key = parent_of[key]
            chain.append(key)
        return chain

    def summary(states: list[str]) -> str:
        return next((s for s in ("FAILED", "RUNNING") if s in states), "SUCCEEDED")

    nodes: dict[str, tuple[str, str, bool]] = {}  # node name -> (display name, state, finished)
    for key, state in started.items():
        chain = ancestors(key)
        for dag in chain:
            inside = [s for k, s in started.items() if dag in ancestors(k)]
            path = ".".join(reversed([dag, *ancestors(dag)]))
            nodes[f"root.{path}-driver"] = (f"{dag}-driver", "SUCCEEDED", True)
            nodes[f"root.{path}"] = (dag, summary(inside), summary(inside) != "RUNNING")
            for sibling in (k for k, p in parent_of.items() if p == dag and tasks[k]["componentRef"]["name"] in
                            spec["components"] and "dag" in spec["components"][tasks[k]["componentRef"]["name"]]):
                if sibling not in chain and dag.startswith("condition-branches") and not any(
                        sibling in ancestors(k) for k in started):
                    nodes[f"root.{path}.{sibling}-driver"] = (f"{sibling}-driver", "SUCCEEDED", True)
                    nodes[f"root.{path}.{sibling}"] = (sibling, "SKIPPED", True)
        path = ".".join(reversed([key, *chain]))
        finished = state not in ("RUNNING", "PENDING")
        nodes[f"root.{path}-driver"] = (f"{key}-driver", "SUCCEEDED", True)
        nodes[f"root.{path}"] = (key, state, finished)
        nodes[f"root.{path}.executor"] = ("executor", state, finished)
    if nodes:
        nodes["root-driver"] = ("root-driver", "SUCCEEDED", True)
        nodes["root"] = ("root", run_state, run_state in ("SUCCEEDED", "FAILED", "CANCELED"))
    nodes[""] = (run_name, run_state, run_state in ("SUCCEEDED", "FAILED", "CANCELED"))
    details = []
    for i, name in enumerate(sorted(nodes)):
        display, state, finished = nodes[name]
        detail = {"run_id": run_id, "task_id": str(uuid.uuid5(uuid.NAMESPACE_URL, f"{run_id}/{name}")),
                  "display_name": display, "state": state, "create_time": "2026-11-23T10:00:00Z",
                  "start_time": "2026-11-23T10:00:00Z", "end_time": "2026-11-23T10:00:42Z" if finished else _ZERO_TIME}
        children = [n for n in nodes if n.startswith(name + ".") and n.count(".") == name.count(".") + 1]
        if children:
            detail["child_tasks"] = [{"pod_name": f"{run_name}-{uuid.uuid5(uuid.NAMESPACE_URL, c).int % 10**10}"}
                                     for c in children]
        details.append(detail)
    return details


class BadRequest(Exception):
    pass
