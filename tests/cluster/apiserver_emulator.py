"""The API server of the emulated cluster (:mod:`tests.cluster.kube_emulator`): kmock's ``KubernetesEmulator`` with
what the launcher relies on done as the real kube-apiserver does it. Upstream sources are kubernetes/kubernetes
(``staging/src/k8s.io/apiserver`` shortened to ``apiserver/``):

- **identity and RBAC**: a request's bearer token names its user (the launcher's ServiceAccount, or an admin for the
  test's controllers). Each request is mapped to (API group, resource[/subresource], verb) as ``RequestInfo`` does
  (``apiserver/pkg/endpoints/request/requestinfo.go``: GET on a name = get, on a collection = list, or watch with
  ``?watch=true``; POST = create, PUT = update, PATCH = patch, DELETE = delete or deletecollection;
  ``pods/<name>/log`` = get on ``pods/log``), and the launcher's requests are checked against the Role of
  ``manifests/base/rbac.yaml`` (bound to its ServiceAccount by the RoleBinding there): not granted, it is answered
  403 with the Status the API server writes (``apiserver/pkg/endpoints/handlers/responsewriters/errors.go``,
  ``forbiddenMessage``; ``apimachinery/pkg/api/errors``, ``NewForbidden``);
- **resourceVersion**: one counter for every write, as etcd's revision; every object carries the version of its last
  write, a list the current one;
- **watch** (``apiserver/pkg/endpoints/handlers/watch.go``, ``storage/cacher``): ``resourceVersion`` unset or "0"
  starts with an ADDED event per object, a given version with the changes after it, a version older than the
  history kept (:meth:`ApiServer.compact`) gets an ERROR event with the Status 410 Expired "too old resource
  version"; label and field selectors apply to each change (an object that stops matching is DELETED for the
  watcher, one that starts matching ADDED); ``timeoutSeconds`` ends the stream cleanly;
- **field selectors**: only the field labels the API server knows for the resource (events:
  ``pkg/apis/core/v1/conversion.go``, ``AddFieldLabelConversionsForEvent``, with ``reportingComponent``; pods: its
  ``AddFieldLabelConversionsForPod``; custom resources: ``metadata.name`` and ``metadata.namespace``), any other is
  a 400 "field label not supported: <label>" (``apiserver/pkg/endpoints/handlers/get.go``);
- **/version** (also ``/version/``, as ``apiserver/pkg/server/routes/version.go`` installs it) after
  authentication: a bad token is a 401 there too;
- **pods/log** served from the :class:`~tests.cluster.kubelet_emulator.Kubelet`, 404 when the pod does not exist;
- **custom resources** are served only through their CRD (``customresourcedefinitions``, ``apiextensions.k8s.io/v1``,
  held as objects; :meth:`ApiServer.setup` installs those of the served schemas from ``tests/schemas``, Established):
  no CRD named ``<plural>.<group>``, a request whose scope differs from the CRD's, a version the CRD does not
  serve, or a CRD neither NamesAccepted nor Established is a 404 "the server could not find the requested
  resource" (``apiextensions-apiserver/pkg/apiserver/customresource_handler.go``, ``crdHandler.ServeHTTP``, which
  hands those to the delegate's NotFound);
- **SelfSubjectAccessReview** (``authorization.k8s.io/v1``): any authenticated user may create one (the
  ``system:basic-user`` ClusterRole bound to ``system:authenticated``,
  ``plugin/pkg/auth/authorizer/rbac/bootstrappolicy/policy.go``); exactly one of ``resourceAttributes`` and
  ``nonResourceAttributes`` (``pkg/apis/authorization/validation/validation.go``, else 422 Invalid); answered for
  the requesting user from the RBAC objects the emulator holds (:func:`rbac_rules`: ClusterRoleBindings, and the
  RoleBindings of the namespace to a Role there or a ClusterRole, as ``pkg/registry/rbac/validation/rule.go``
  ``VisitRulesFor`` walks them; a ServiceAccount subject without a namespace is the binding's, ``appliesToUser``)
  and :func:`allowed` (``RuleAllows``), never stored;
- **impersonation** (``apiserver/pkg/endpoints/filters/impersonation.go``): ``Impersonate-User:
  system:serviceaccount:<ns>:<name>`` needs ``impersonate`` on ``serviceaccounts`` <name> in <ns> (the admin may),
  else 403; the request then runs as that account, with the groups ``system:serviceaccounts``,
  ``system:serviceaccounts:<ns>`` and ``system:authenticated``;
- **faults** on the launcher's requests (:class:`Fault`): 429 with ``Retry-After`` and the text the API server's
  max-in-flight and priority-and-fairness filters answer (``apiserver/pkg/server/filters/maxinflight.go``,
  ``tooManyRequests``), 503 with a Status, or the connection reset before the request is served or after (the
  answer lost); an outage resets every request and open stream until it ends.

Not done: label selectors beyond equality, field selectors beyond ``=`` (refused with a 400 rather than answered
wrongly), bookmarks, admission, resourceVersion preconditions on writes; the launcher's own requests are checked
against its Role's rules directly (``setup``'s ``rules``), not through the RBAC objects; SubjectAccessReview,
aggregated ClusterRoles, non-resource rules and impersonating users other than ServiceAccounts.
"""

from __future__ import annotations

import asyncio
import bisect
import copy
import json
import math
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import gzip

import aiohttp.web
import kmock
import yaml

RBAC = Path(__file__).resolve().parents[2] / "manifests" / "base" / "rbac.yaml"
SCHEMA_DIR = Path(__file__).resolve().parents[1] / "schemas"
#: The API groups the kube-apiserver serves itself; any other is served through a CRD (or not at all).
BUILTIN_GROUPS = frozenset({"", "apps", "batch", "rbac.authorization.k8s.io", "apiextensions.k8s.io",
                            "authorization.k8s.io", "events.k8s.io", "coordination.k8s.io", "policy"})
CRDS = kmock.resource("apiextensions.k8s.io", "v1", "customresourcedefinitions")
RBAC_GROUP = "rbac.authorization.k8s.io"
#: Built-in resources known before their first object (an empty list, not a 404).
BUILTIN_RESOURCES = ("v1/configmaps", "v1/secrets", "v1/serviceaccounts", f"{RBAC_GROUP}/v1/roles",
                     f"{RBAC_GROUP}/v1/rolebindings", f"{RBAC_GROUP}/v1/clusterroles",
                     f"{RBAC_GROUP}/v1/clusterrolebindings", "apiextensions.k8s.io/v1/customresourcedefinitions")
NOT_FOUND = "the server could not find the requested resource"
#: ``/version`` (and ``/version/``, the path the Python client asks: the web service's root route,
#: ``apiserver/pkg/server/routes/version.go``), a ``version.Info``; authentication comes first, as everywhere.
SERVER_VERSION = {"major": "1", "minor": "31", "gitVersion": "v1.31.0", "platform": "linux/amd64"}
ADMIN_TOKEN, LAUNCHER_TOKEN = "emulated-admin-token", "emulated-launcher-token"
ADMIN = "system:admin"

_EVENT_FIELDS = {label: label for label in (
    "involvedObject.kind", "involvedObject.namespace", "involvedObject.name", "involvedObject.uid",
    "involvedObject.apiVersion", "involvedObject.resourceVersion", "involvedObject.fieldPath", "reason",
    "reportingComponent", "type", "metadata.namespace", "metadata.name")} | {"source": "source.component"}
_POD_FIELDS = {label: label for label in (
    "metadata.name", "metadata.namespace", "spec.nodeName", "spec.restartPolicy", "spec.schedulerName",
    "spec.serviceAccountName", "spec.hostNetwork", "status.phase", "status.podIP", "status.podIPs",
    "status.nominatedNodeName")}
#: The field labels each resource supports (label -> the field it selects); the rest: custom resources'.
FIELD_LABELS = {("", "events"): _EVENT_FIELDS, ("", "pods"): _POD_FIELDS}
CUSTOM_FIELDS = {"metadata.name": "metadata.name", "metadata.namespace": "metadata.namespace"}


def launcher_role(path: Path = RBAC) -> tuple[str, list[dict]]:
    """The launcher's user (its ServiceAccount, as the RoleBinding binds it) and the rules of its Role."""
    docs = {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(path.read_text()) if d}
    [binding] = [d for (kind, _), d in docs.items() if kind == "RoleBinding"]
    [subject] = binding["subjects"]
    role = docs["Role", binding["roleRef"]["name"]]
    return f"system:serviceaccount:{{namespace}}:{subject['name']}", role["rules"]


@dataclass
class RequestInfo:
    verb: str
    group: str
    resource: str  # with its subresource: pods/log
    namespace: str
    name: str


def request_info(request) -> RequestInfo | None:
    """A resource request's attributes as the API server's RequestInfo has them (None: not a resource request)."""
    resource = request.resource
    if resource is None or not resource.plural:
        return None
    method, name = request.method.value.upper(), request.name or ""
    if method in ("GET", "HEAD"):
        verb = "get" if name else ("watch" if is_true(request.params.get("watch")) else "list")
        if not name:  # a watch or list of one object by field selector authorizes as that name
            for term in (request.params.get("fieldSelector") or "").split(","):
                if term.startswith("metadata.name="):
                    name = term.partition("=")[2]
    else:
        verb = {"POST": "create", "PUT": "update", "PATCH": "patch",
                "DELETE": "delete" if name else "deletecollection"}.get(method, method.lower())
    plural = resource.plural + (f"/{request.subresource}" if request.subresource else "")
    return RequestInfo(verb, resource.group or "", plural, request.namespace or "", name)


def is_true(value: str | None) -> bool:
    """A boolean query parameter as the API server parses it (``strconv.ParseBool``)."""
    return (value or "") in ("1", "t", "T", "true", "TRUE", "True")


def allowed(rules: list[dict], info: RequestInfo) -> bool:
    """Whether an RBAC rule grants the request (``plugin/pkg/auth/authorizer/rbac/rbac.go``, ``RuleAllows``, with
    ``pkg/apis/rbac/v1/evaluation_helpers.go``: ``*`` matches any verb, group or resource, ``*/<subresource>`` any
    resource's subresource)."""
    def has(values, value):
        return "*" in values or value in values

    def resource_matches(resources):
        sub = info.resource.partition("/")[2]
        return has(resources, info.resource) or (sub and f"*/{sub}" in resources)

    return any(has(rule.get("apiGroups", []), info.group) and resource_matches(rule.get("resources", []))
               and has(rule.get("verbs", []), info.verb)
               and (not rule.get("resourceNames") or info.name in rule["resourceNames"]) for rule in rules)


def service_account_groups(user: str) -> list[str]:
    """The groups of a ServiceAccount user (``system:serviceaccount:<ns>:<name>``), as its token authenticates."""
    if not user.startswith("system:serviceaccount:"):
        return ["system:authenticated"]
    namespace = user.split(":")[2]
    return ["system:serviceaccounts", f"system:serviceaccounts:{namespace}", "system:authenticated"]


def _applies(subject: dict, user: str, groups: list[str], binding_namespace: str) -> bool:
    """``appliesToUser`` (``pkg/registry/rbac/validation/rule.go``)."""
    kind = subject.get("kind")
    if kind == "User":
        return subject.get("name") == user
    if kind == "Group":
        return subject.get("name") in groups
    if kind == "ServiceAccount":
        namespace = subject.get("namespace") or binding_namespace
        return user == f"system:serviceaccount:{namespace}:{subject.get('name')}"
    return False


def rbac_rules(objects: dict, user: str, groups: list[str], namespace: str) -> list[dict]:
    """The rules granting ``user`` anything in ``namespace``, from the RBAC objects held (``VisitRulesFor``):
    ClusterRoleBindings to ClusterRoles, and the namespace's RoleBindings to a Role of the namespace or a
    ClusterRole; a binding to a missing role grants nothing."""
    def held(plural: str, ns: str | None, name: str | None = None) -> list[dict]:
        return [obj.raw for (resource, obj_ns, obj_name), obj in objects.items()
                if resource.group == RBAC_GROUP and resource.plural == plural and not obj.deleted
                and (ns is None or obj_ns == ns) and (name is None or obj_name == name)]

    rules: list[dict] = []
    for binding in held("clusterrolebindings", None):
        if any(_applies(s, user, groups, "") for s in binding.get("subjects") or []):
            for role in held("clusterroles", None, binding["roleRef"]["name"]):
                rules += role.get("rules") or []
    for binding in held("rolebindings", namespace):
        if any(_applies(s, user, groups, namespace) for s in binding.get("subjects") or []):
            ref = binding["roleRef"]
            roles = held("roles", namespace, ref["name"]) if ref.get("kind") == "Role" else \
                held("clusterroles", None, ref["name"])
            for role in roles:
                rules += role.get("rules") or []
    return rules


def load_crd(key: str) -> dict:
    """The CRD kept in ``tests/schemas`` for ``group/version/plural``, as its operator's controllers leave it once
    accepted (NamesAccepted and Established)."""
    group, _, plural = key.split("/")
    crd = yaml.load(gzip.decompress((SCHEMA_DIR / f"{group}_{plural}.yaml.gz").read_bytes()).decode(),
                    Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    crd["status"] = {"conditions": [{"type": "NamesAccepted", "status": "True"},
                                    {"type": "Established", "status": "True"}]}
    return crd


def status_response(code: int, reason: str, message: str, details: dict | None = None,
                    headers: dict | None = None) -> aiohttp.web.Response:
    """A ``metav1.Status`` answer, as the API server writes its errors."""
    body = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message,
            "reason": reason, "details": details or {}, "code": code}
    return aiohttp.web.json_response(body, status=code, headers=headers)


def forbidden(user: str, info: RequestInfo) -> aiohttp.web.Response:
    group_resource = info.resource.split("/")[0] + (f".{info.group}" if info.group else "")
    why = (f'User "{user}" cannot {info.verb} resource "{info.resource}" in API group "{info.group}" in the '
           f'namespace "{info.namespace}"')
    message = f'{group_resource} "{info.name}" is forbidden: {why}' if info.name else \
        f"{group_resource} is forbidden: {why}"
    return status_response(403, "Forbidden", message, {"name": info.name, "group": info.group,
                                                        "kind": info.resource.split("/")[0]})


def selected(obj: dict, selector: str, fields: dict[str, str] | None) -> bool:
    """Whether ``obj`` matches an equality selector: labels (``fields`` None), or field labels mapped to fields."""
    for term in filter(None, selector.split(",")):
        key, op, value = term.partition("=")
        if not op or key.endswith("!") or value.startswith("=") or " in " in term:
            raise kmock.KubernetesError(status=400, reason="BadRequest", details={},
                                        message=f"the emulator handles equality selectors only: {selector!r}")
        if fields is not None:
            found: object = obj
            for part in fields[key].split("."):
                found = found.get(part) if isinstance(found, dict) else None
        else:
            found = (obj.get("metadata", {}).get("labels") or {}).get(key)
        if ("" if found is None else str(found)) != value:
            return False
    return True


def unsupported_field(resource, selector: str) -> str | None:
    """The first field label of ``selector`` the API server does not support for ``resource``."""
    labels = FIELD_LABELS.get((resource.group or "", resource.plural), CUSTOM_FIELDS)
    for term in filter(None, selector.split(",")):
        label = term.partition("=")[0].rstrip("!")
        if label not in labels:
            return label
    return None


@dataclass
class Fault:
    """How the next ``count`` requests of the launcher (``method``: only those) are answered: ``status`` (429 with
    ``retry_after``, 503, …), or ``reset`` the connection "before" serving them or "after" (the answer lost)."""

    count: float
    status: int | None = None
    retry_after: int | None = None
    reset: str | None = None
    method: str | None = None

    def response(self) -> aiohttp.web.Response:
        headers = {"Retry-After": str(self.retry_after)} if self.retry_after is not None else None
        if self.status == 429:
            return aiohttp.web.Response(status=429, text="Too many requests, please try again later.\n",
                                        headers=headers)
        return status_response(self.status, "ServiceUnavailable", "the server is currently unable to handle the "
                               "request", headers=headers)


class ApiServer(kmock.KubernetesEmulator):
    """See the module docstring; :meth:`setup` before serving."""

    def setup(self, namespace: str, schemas: dict, kubelet, rules: list[dict] | None = None) -> None:
        user, role = launcher_role()
        self.namespace, self.schemas, self.kubelet = namespace, schemas, kubelet
        self.launcher_user = user.format(namespace=namespace)
        self.rules = role if rules is None else rules
        self.users = {f"Bearer {ADMIN_TOKEN}": ADMIN, f"Bearer {LAUNCHER_TOKEN}": self.launcher_user}
        self.faults: list[Fault] = []
        self.seen: list[tuple[RequestInfo, dict]] = []  # the launcher's resource requests, with their parameters
        self.version, self.compacted, self.expired = 0, 0, 0  # expired: watches answered 410
        self.history: list[tuple[int, object, str, str, dict, dict | None]] = []  # rv, resource, ns, type, obj, prev
        self.changed = asyncio.Condition()
        self.writes = asyncio.Lock()
        self.streams: set = set()  # transports of open watch and log streams
        for resource in BUILTIN_RESOURCES:
            self.resources[resource] = {}
        for key in schemas:
            crd = load_crd(key)
            self._objects[(CRDS, None, crd["metadata"]["name"])] = crd

    # ------------------------------------------------------------------------------------------ requests

    def _fault(self, request) -> Fault | None:
        for fault in self.faults:
            if fault.count > 0 and (fault.method is None or fault.method == request.method.value.upper()):
                fault.count -= 1
                return fault
        return None

    async def _handle(self, request):
        user = self.users.get(request.headers.get("Authorization", ""))
        if user is None:
            return status_response(401, "Unauthorized", "Unauthorized")
        info = request_info(request)
        if request.method.value.upper() == "GET" and request.url.path.rstrip("/") == "/version":
            return aiohttp.web.json_response(SERVER_VERSION)
        impersonated = request.headers.get("Impersonate-User")
        if impersonated and info is not None:
            refused = self._impersonation_refused(user, impersonated, info)
            if refused is not None:
                return refused
            user = impersonated
        if info is not None and (info.group, info.resource) == ("authorization.k8s.io", "selfsubjectaccessreviews"):
            return self._self_subject_access_review(user, request.data)
        missing = self._unserved(request) if info is not None else None
        if missing is not None:
            return missing
        fault = self._fault(request) if user != ADMIN else None
        if fault is not None and fault.reset == "before":
            request._raw_request.transport.abort()
            return aiohttp.web.Response(status=500)
        if fault is not None and fault.status:
            return fault.response()
        if info is not None and user != ADMIN:
            self.seen.append((info, dict(request.params)))
            if not allowed(self.rules, info):
                return forbidden(user, info)
        if info is not None and info.verb in ("list", "watch"):
            label = unsupported_field(request.resource, request.params.get("fieldSelector", ""))
            if label is not None:
                return status_response(400, "BadRequest", f"field label not supported: {label}")
        if info is not None and info.verb == "watch":
            return await self._stream(request, self._watch(request))
        if info is not None and info.resource == "pods/log":
            response = await self._log(request)
        else:
            response = await self._write(request)
        if fault is not None and fault.reset == "after":
            request._raw_request.transport.abort()
        return response

    def _impersonation_refused(self, user: str, impersonated: str, info: RequestInfo):
        """403 unless ``user`` may impersonate the ServiceAccount ``impersonated`` (see the module docstring)."""
        parts = impersonated.split(":")
        if len(parts) != 4 or parts[:2] != ["system", "serviceaccount"]:
            return status_response(403, "Forbidden", f"the emulator impersonates ServiceAccounts only: {impersonated}")
        check = RequestInfo("impersonate", "", "serviceaccounts", parts[2], parts[3])
        if user == ADMIN or allowed(rbac_rules(self._objects, user, service_account_groups(user), parts[2]), check):
            return None
        return forbidden(user, check)

    def _self_subject_access_review(self, user: str, body: dict | None) -> aiohttp.web.Response:
        spec = (body or {}).get("spec") or {}
        if bool(spec.get("resourceAttributes")) == bool(spec.get("nonResourceAttributes")):
            return status_response(422, "Invalid", 'SelfSubjectAccessReview.authorization.k8s.io "" is invalid: '
                                   "spec.resourceAttributes: Invalid value: ...: exactly one of "
                                   "nonResourceAttributes or resourceAttributes must be specified")
        if spec.get("nonResourceAttributes"):
            granted, reason = False, ""  # not emulated: no non-resource rules are held
        else:
            attributes = spec["resourceAttributes"]
            resource = attributes.get("resource", "") + (f"/{attributes['subresource']}"
                                                         if attributes.get("subresource") else "")
            check = RequestInfo(attributes.get("verb", ""), attributes.get("group", ""), resource,
                                attributes.get("namespace", ""), attributes.get("name", ""))
            granted = user == ADMIN or allowed(rbac_rules(self._objects, user, service_account_groups(user),
                                                          check.namespace), check)
            reason = "RBAC: allowed" if granted else ""
        answer = {"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
                  "metadata": {"creationTimestamp": None}, "spec": spec,
                  "status": {"allowed": granted, **({"reason": reason} if reason else {})}}
        return aiohttp.web.json_response(answer, status=201)

    def _unserved(self, request) -> aiohttp.web.Response | None:
        """The 404 of a custom resource no Established CRD serves at that version and scope (see the module
        docstring), else None."""
        resource = request.resource
        if (resource.group or "") in BUILTIN_GROUPS:
            return None
        key = (CRDS, None, f"{resource.plural}.{resource.group}")
        crd = self._objects[key].raw if key in self._objects and not self._objects[key].deleted else None
        if crd is not None:
            spec = crd.get("spec") or {}
            namespaced = spec.get("scope") == "Namespaced"
            scope_ok = (namespaced or not request.namespace) and (not namespaced or request.namespace
                                                                  or request.name is None)
            served = any(v.get("name") == resource.version and v.get("served") for v in spec.get("versions") or [])
            accepted = {c.get("type") for c in (crd.get("status") or {}).get("conditions") or []
                        if c.get("status") == "True"} & {"NamesAccepted", "Established"}
            if scope_ok and served and accepted:
                return None
        return status_response(404, "NotFound", NOT_FOUND)

    async def _stream(self, request, chunks) -> aiohttp.web.StreamResponse:
        """Send ``chunks`` (an async iterator of bytes) as a chunked answer, droppable by :meth:`drop_streams`."""
        response = aiohttp.web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request._raw_request)
        transport = request._raw_request.transport
        self.streams.add(transport)
        try:
            async for chunk in chunks:
                await response.write(chunk)
            await response.write_eof()
        except (ConnectionError, RuntimeError):  # dropped: by the client, or by drop_streams()
            pass
        finally:
            self.streams.discard(transport)
        return response

    async def _log(self, request):
        key = (kmock.resource("", "v1", "pods"), request.namespace, request.name)
        if key not in self._objects or self._objects[key].deleted:
            return status_response(404, "NotFound", f'pods "{request.name}" not found',
                                   {"name": request.name, "kind": "pods"})
        if "sinceSeconds" in request.params and "sinceTime" in request.params:
            return status_response(400, "BadRequest", "at most one of `sinceTime` or `sinceSeconds` may be specified")
        if self.kubelet.take_failure():
            return status_response(500, "InternalError", "Get \"https://node:10250/containerLogs\": connection "
                                   "reset by peer (injected)")
        if not is_true(request.params.get("follow")):
            return aiohttp.web.Response(text=self.kubelet.read(request.name, request.params))
        queue: asyncio.Queue = asyncio.Queue()

        async def chunks():
            task = asyncio.ensure_future(self.kubelet.follow(request.name, request.params, queue.put))
            task.add_done_callback(lambda _: queue.put_nowait(None))
            try:
                while (chunk := await queue.get()) is not None:
                    yield chunk
            finally:
                task.cancel()

        return await self._stream(request, chunks())

    # ---------------------------------------------------------------------------- writes and versions

    async def _write(self, request):
        """Serve a request through kmock, stamping what the API server stamps and recording the change."""
        action = request.action
        if action not in (kmock.action.CREATE, kmock.action.UPDATE, kmock.action.DELETE) \
                or not isinstance(request.data, (dict, type(None))):
            return await super()._handle(request)
        async with self.writes:
            version = self.version + 1
            name = request.name
            if action == kmock.action.CREATE:
                self._check_create(request)
                meta = request.data.setdefault("metadata", {})
                name = meta.get("name")
                meta.update(uid=str(uuid.uuid4()), creationTimestamp=metav1_time(time.time()),
                            namespace=request.namespace, resourceVersion=str(version))
            elif action == kmock.action.UPDATE:
                request.data.setdefault("metadata", {})["resourceVersion"] = str(version)
            key = (request.resource, request.namespace, name)
            before = self._objects[key] if key in self._objects else None
            prev = copy.deepcopy(before.raw) if before is not None and not before.deleted else None
            response = await super()._handle(request)
            if response.status >= 300:
                return response
            self.version = version
            stored = self._objects[key]
            obj = copy.deepcopy(stored.last.raw)
            obj.setdefault("metadata", {})["resourceVersion"] = str(version)
            change = "DELETED" if stored.deleted else ("MODIFIED" if prev is not None else "ADDED")
            self.history.append((version, request.resource, request.namespace, change, obj, prev))
        async with self.changed:
            self.changed.notify_all()
        return response

    def _check_create(self, request) -> None:
        """Unknown fields of a custom resource: a 400 with ``fieldValidation=Strict``, else pruned silently."""
        from tests.k8s_schemas import unknown_fields

        resource = request.resource
        key = f"{resource.group + '/' if resource.group else ''}{resource.version}/{resource.plural}"
        if key not in self.schemas:
            return
        strict = request.params.get("fieldValidation") == "Strict"
        unknown = unknown_fields(self.schemas[key], request.data, prune=not strict)
        if unknown and strict:
            kind = request.data.get("kind", resource.plural)
            raise kmock.KubernetesError(
                status=400, reason="BadRequest", details={},
                message=f"{kind} in version \"{resource.version}\" cannot be handled as a {kind}: strict decoding "
                        "error: " + ", ".join(f'unknown field "{field}"' for field in unknown))

    async def _serve_list(self, request):
        listed = await super()._serve_list(request)
        labels, fields_ = request.params.get("labelSelector", ""), request.params.get("fieldSelector", "")
        field_labels = FIELD_LABELS.get((request.resource.group or "", request.resource.plural), CUSTOM_FIELDS)
        listed["items"] = [item for item in listed["items"]
                           if selected(item, labels, None) and selected(item, fields_, field_labels)]
        listed["metadata"] = {"resourceVersion": str(self.version)}
        return listed

    # ---------------------------------------------------------------------------------------------- watch

    def _current(self, request) -> list[dict]:
        return [copy.deepcopy(obj.raw) for (resource, namespace, _), obj in self._objects.items()
                if resource == request.resource and not obj.deleted
                and (request.namespace is None or namespace == request.namespace)]

    async def _watch(self, request):
        """The watch stream's events as JSON lines (see the module docstring)."""
        params = request.params
        field_labels = FIELD_LABELS.get((request.resource.group or "", request.resource.plural), CUSTOM_FIELDS)

        def matches(obj):
            return obj is not None and selected(obj, params.get("labelSelector", ""), None) \
                and selected(obj, params.get("fieldSelector", ""), field_labels)

        def line(change, obj):
            return json.dumps({"type": change, "object": obj}).encode() + b"\n"

        start = params.get("resourceVersion", "")
        if start in ("", "0"):
            cursor = self.version
            for obj in self._current(request):
                if matches(obj):
                    yield line("ADDED", obj)
        elif int(start) < self.compacted:
            self.expired += 1
            yield line("ERROR", {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                                 "message": f"too old resource version: {start} ({self.compacted})",
                                 "reason": "Expired", "code": 410})
            return
        else:
            cursor = int(start)
        timeout = float(params["timeoutSeconds"]) if params.get("timeoutSeconds") else math.inf
        ends = asyncio.get_running_loop().time() + timeout
        while True:
            at = bisect.bisect_right([entry[0] for entry in self.history], cursor)
            for version, resource, namespace, change, obj, prev in self.history[at:]:
                cursor = version
                if resource != request.resource or (request.namespace and namespace != request.namespace):
                    continue
                was, now = matches(prev), change != "DELETED" and matches(obj)
                if was or now:
                    yield line("MODIFIED" if was and now else ("ADDED" if now else "DELETED"), obj)
            left = ends - asyncio.get_running_loop().time()
            transport = request._raw_request.transport
            if left <= 0 or transport is None or transport.is_closing():
                return
            async with self.changed:
                try:
                    await asyncio.wait_for(self.changed.wait(), min(left, 1.0))
                except asyncio.TimeoutError:
                    pass

    # ----------------------------------------------------------------------------------- test controls

    def compact(self) -> None:
        """Forget the history so far, as etcd's compaction and the watch cache's window do."""
        self.compacted = self.version
        self.history.clear()

    def drop_streams(self) -> None:
        """Reset every open watch and log stream."""
        for transport in list(self.streams):
            transport.abort()


def metav1_time(seconds: float) -> str:
    """A ``metav1.Time`` as the API server serializes it: RFC 3339 in whole seconds."""
    import datetime as dt

    return dt.datetime.fromtimestamp(int(seconds), dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
