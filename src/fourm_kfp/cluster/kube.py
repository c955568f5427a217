"""The few Kubernetes API calls the job launcher makes, in one namespace, with errors a user can act on.

:class:`KubeApi` wraps the official client (``kubernetes``, installed with kfp): create / get / delete a custom
object (the job) and list them by label (the exit handler), list and **watch** the job and its pods (a list gives the
``resourceVersion`` a watch starts from, :class:`Expired` when the server no longer has it), read the launcher's own
pod (its owner), list Warning events by a server-side field selector (``involvedObject.uid=…``: the caller names
the objects, :mod:`.job_events`), read a container's log or **follow** it as a stream (with timestamps, so a reader
can resume where it stopped). Jobs are created with ``fieldValidation=Strict``: a field the installed operator's CRD
does not know (an older Trainer without ``runtimePatches``) fails the create with the field named, where the
server's default would drop it silently (tolerations, volumes, the deadline).

Transient failures are retried by the client itself (:func:`api_retries`: urllib3's ``Retry`` as
``Configuration.retries``): HTTP 429, 500, 502, 503 and 504 (honouring ``Retry-After``), refused and reset
connections and read timeouts, for every method, POST included (a create whose answer was lost comes back 409, and
the launcher adopts its own job). Every request has a timeout, so a silent server is an error, not a hang. What
still fails after the retries is raised as it came (``ApiException``, urllib3's ``MaxRetryError``): following a
job, the launcher logs it and tries again up to its outage limit (:mod:`.job_watch`).

Objects come back as plain dicts (camelCase, as served). It needs the RBAC of ``manifests/base/rbac.yaml`` and
nothing more; a 403 or a missing CRD raises a :class:`~fourm_kfp.errors.UserError` that says which (events
excepted: without them the launcher only waits longer).
"""

from __future__ import annotations

import json
import logging
import os
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from fourm_kfp.errors import UserError

log = logging.getLogger(__name__)

SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
#: HTTP answers worth another try: too many requests (the API server's max-in-flight or priority-and-fairness
#: filter, with ``Retry-After``) and the server or a proxy in front of it failing or restarting.
RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
#: (connect, read) timeout of a request, in seconds.
TIMEOUT = (10.0, 120.0)


@dataclass(frozen=True)
class Resource:
    """A resource type: ``group/version``, ``plural`` and ``kind`` (group "" is the core API: pods)."""

    group: str
    version: str
    plural: str
    kind: str

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version


PODS = Resource("", "v1", "pods", "Pod")


class JobConflict(UserError):
    """A job of that name exists and is not this launcher's to adopt."""


class Expired(Exception):
    """The resourceVersion a watch was to start from is gone from the server's history (HTTP 410): list again."""


def api_retries(attempts: int = 8, backoff_s: float = 0.5, backoff_max_s: float = 30.0):
    """The client's retries (urllib3 ``Retry``, see the module docstring): ``attempts`` tries more of a request, the
    waits doubling from ``backoff_s`` up to ``backoff_max_s`` (or what ``Retry-After`` says)."""
    from urllib3.util.retry import Retry

    return Retry(total=attempts, connect=attempts, read=attempts, status=attempts, other=0,
                 allowed_methods=None, status_forcelist=RETRY_STATUSES, backoff_factor=backoff_s,
                 backoff_max=backoff_max_s, respect_retry_after_header=True, raise_on_status=False)


def current_namespace(explicit: str = "") -> str:
    """The namespace to work in: given, else the pod's (downward API or service account), else kubeconfig's."""
    if explicit:
        return explicit
    if os.environ.get("FOURM_POD_NAMESPACE"):
        return os.environ["FOURM_POD_NAMESPACE"]
    if SERVICE_ACCOUNT_NAMESPACE.is_file():
        return SERVICE_ACCOUNT_NAMESPACE.read_text().strip()
    try:
        from kubernetes import config

        _, context = config.list_kube_config_contexts()
        return (context or {}).get("context", {}).get("namespace") or "default"
    except Exception:  # no kubeconfig: the client will say so when it connects
        return "default"


def _status_message(exc) -> str:
    """The ``message`` of the Status the API server answered with, else the raw body."""
    try:
        return json.loads(exc.body).get("message") or str(exc.body)
    except (TypeError, ValueError, AttributeError):
        return str(getattr(exc, "body", "") or exc)


class KubeApi:
    """Create, read, watch and delete objects and read pods' logs in ``namespace``."""

    def __init__(self, api_client, namespace: str):
        from kubernetes import client

        self.api_client = api_client
        self.namespace = namespace
        self.custom = client.CustomObjectsApi(api_client)
        self.core = client.CoreV1Api(api_client)
        self._said_no_events = False

    @classmethod
    def connect(cls, configuration, namespace: str, retries=None) -> "KubeApi":
        """A client for ``configuration`` (host, credentials) with the retries of :func:`api_retries`."""
        from kubernetes import client

        configuration.retries = retries if retries is not None else api_retries()
        return cls(client.ApiClient(configuration), namespace)

    @classmethod
    def from_environment(cls, namespace: str = "", retries=None) -> "KubeApi":
        """In a pod: its service account; elsewhere: the kubeconfig (``$KUBECONFIG`` or ``~/.kube/config``);
        ``retries`` as for :meth:`connect`."""
        from kubernetes import client, config

        try:
            if os.environ.get("KUBERNETES_SERVICE_HOST"):
                config.load_incluster_config()
            else:
                config.load_kube_config()
        except config.ConfigException as exc:
            raise UserError(f"no Kubernetes cluster to launch the job in ({exc}); run inside a cluster or set "
                            "KUBECONFIG, or use pretrain_launcher=in-pod") from exc
        return cls.connect(client.Configuration.get_default_copy(), current_namespace(namespace), retries)

    # --------------------------------------------------------------------------------------------- errors

    def _explain(self, exc, verb: str, what: str) -> Exception:
        status = getattr(exc, "status", None)
        if status == 403:
            return UserError(f"the service account may not {verb} {what} in namespace {self.namespace!r} "
                             f"({_status_message(exc)}): bind the Role fourm-pipeline-runner of "
                             "manifests/base/rbac.yaml to the account the pipeline runs as, and apply its current "
                             "version (manifests/README.md)")
        if status == 404 and verb == "create":
            return UserError(f"the API server does not know {what} in namespace {self.namespace!r}: is the "
                             "operator installed (its CRD applied)? See manifests/README.md")
        return exc

    def _list_call(self, resource: Resource):
        """The client's list function of ``resource`` (also its watch) and its positional arguments."""
        if resource == PODS:
            return self.core.list_namespaced_pod, (self.namespace,)
        return self.custom.list_namespaced_custom_object, (resource.group, resource.version, self.namespace,
                                                           resource.plural)

    # ------------------------------------------------------------------------------------ custom objects

    def create(self, resource: Resource, body: dict[str, Any]) -> dict[str, Any]:
        """Create ``body``; raises :class:`JobConflict` when the name is taken (HTTP 409)."""
        from kubernetes.client.exceptions import ApiException

        try:
            return self.custom.create_namespaced_custom_object(resource.group, resource.version, self.namespace,
                                                               resource.plural, body, field_validation="Strict",
                                                               _request_timeout=TIMEOUT)
        except ApiException as exc:
            if exc.status == 409:
                raise JobConflict(f"{resource.kind} {body['metadata']['name']!r} already exists in namespace "
                                  f"{self.namespace!r}") from exc
            if exc.status in (400, 422):
                raise UserError(f"the API server rejected {resource.kind} {body['metadata']['name']!r}: "
                                f"{_status_message(exc)}. An unknown field means the installed operator is older "
                                f"than the job's template (Trainer >= v2.2.0, Training Operator >= v1.9: see "
                                "manifests/README.md)") from exc
            raise self._explain(exc, "create", resource.plural) from exc

    def get(self, resource: Resource, name: str) -> dict[str, Any] | None:
        """The object, or None when there is none."""
        from kubernetes.client.exceptions import ApiException

        try:
            return self.custom.get_namespaced_custom_object(resource.group, resource.version, self.namespace,
                                                            resource.plural, name, _request_timeout=TIMEOUT)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise self._explain(exc, "get", resource.plural) from exc

    def list(self, resource: Resource, selector: str) -> list[dict[str, Any]]:
        """The objects matching the label selector; [] when the resource is not installed (no such CRD)."""
        from kubernetes.client.exceptions import ApiException

        try:
            return self.snapshot(resource, labels=selector)[0]
        except ApiException as exc:
            if exc.status == 404:
                return []
            raise

    def delete(self, resource: Resource, name: str) -> bool:
        """Delete the object and, in the background, what it owns (pods, services); False when it was gone."""
        from kubernetes.client.exceptions import ApiException

        try:
            self.custom.delete_namespaced_custom_object(resource.group, resource.version, self.namespace,
                                                        resource.plural, name, propagation_policy="Background",
                                                        _request_timeout=TIMEOUT)
            return True
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise self._explain(exc, "delete", resource.plural) from exc

    # ------------------------------------------------------------------------------------- list and watch

    def snapshot(self, resource: Resource, *, labels: str = "", fields: str = "") -> tuple[list[dict], str]:
        """The objects matching the selectors and the list's ``resourceVersion`` (where a watch of them starts)."""
        from kubernetes.client.exceptions import ApiException

        call, args = self._list_call(resource)
        selectors = {k: v for k, v in (("label_selector", labels), ("field_selector", fields)) if v}
        try:  # the JSON as served: no client model in between to reject a field it does not know
            response = call(*args, **selectors, _preload_content=False, _request_timeout=TIMEOUT)
        except ApiException as exc:
            if exc.status == 404 and resource != PODS:
                raise  # no such CRD: the caller decides
            raise self._explain(exc, "list", resource.plural) from exc
        found = json.loads(response.data)
        return found.get("items") or [], str((found.get("metadata") or {}).get("resourceVersion") or "")

    def watch(self, resource: Resource, resource_version: str, timeout_s: int, *, labels: str = "",
              fields: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
        """(type, object) of each change after ``resource_version`` until the server ends the watch (after
        ``timeout_s``); raises :class:`Expired` when that version is no longer in the server's history."""
        from kubernetes import watch
        from kubernetes.client.exceptions import ApiException

        call, args = self._list_call(resource)
        selectors = {k: v for k, v in (("label_selector", labels), ("field_selector", fields)) if v}
        stream = watch.Watch(return_type="object").stream(
            call, *args, **selectors, resource_version=resource_version, timeout_seconds=int(timeout_s),
            _request_timeout=(TIMEOUT[0], timeout_s + TIMEOUT[0]))
        try:
            for event in stream:
                yield event["type"], event["raw_object"]
        except ApiException as exc:
            if exc.status == 410:
                raise Expired(str(exc.reason)) from exc
            raise self._explain(exc, "watch", resource.plural) from exc

    # ------------------------------------------------------------------------------------- pods, events

    def pods(self, selector: str) -> list[dict[str, Any]]:
        """Pods matching the label selector, as plain dicts (camelCase keys, as the API serves them)."""
        return self.snapshot(PODS, labels=selector)[0]

    def pod(self, name: str) -> dict[str, Any] | None:
        """The pod ``name`` as served (camelCase keys), or None when there is none."""
        from kubernetes.client.exceptions import ApiException

        try:
            response = self.core.read_namespaced_pod(name, self.namespace, _preload_content=False,
                                                     _request_timeout=TIMEOUT)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise self._explain(exc, "get", "pods") from exc
        return json.loads(response.data)

    def events(self, field_selector: str) -> list[dict[str, Any]]:
        """The events matching a server-side field selector (``involvedObject.uid=…,type=Warning``); [] when the Role
        may not read events (said once in the log)."""
        from kubernetes.client.exceptions import ApiException

        try:
            response = self.core.list_namespaced_event(self.namespace, field_selector=field_selector,
                                                       _preload_content=False, _request_timeout=TIMEOUT)
        except ApiException as exc:
            if exc.status == 403 and not self._said_no_events:
                self._said_no_events = True
                log.warning("%s", self._explain(exc, "list", "events"))
            if exc.status == 403:
                return []
            raise self._explain(exc, "list", "events") from exc
        return json.loads(response.data).get("items") or []

    # ------------------------------------------------------------------------------------------------ logs

    @staticmethod
    def _log_args(container: str, since_seconds: int | None, tail_lines: int | None) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"container": container, "timestamps": True}
        if since_seconds is not None:
            kwargs["since_seconds"] = since_seconds
        if tail_lines is not None:
            kwargs["tail_lines"] = tail_lines
        return kwargs

    def log(self, pod: str, container: str, *, since_seconds: int | None = None, previous: bool = False,
            tail_lines: int | None = None) -> str:
        """A container's log, each line prefixed by its RFC 3339 timestamp; "" when it cannot be read (yet)."""
        from kubernetes.client.exceptions import ApiException

        try:
            return self.core.read_namespaced_pod_log(pod, self.namespace, previous=previous,
                                                     **self._log_args(container, since_seconds, tail_lines),
                                                     _request_timeout=TIMEOUT) or ""
        except ApiException as exc:
            if exc.status in (400, 404):  # container not started yet / no previous instance / pod gone
                return ""
            raise self._explain(exc, "read the log of", f"pod {pod}") from exc

    def follow_log(self, pod: str, container: str, *, since_seconds: int | None = None,
                   tail_lines: int | None = None, idle_s: float = 300.0) -> Iterator[str]:
        """The running container's log lines (timestamped) as the kubelet writes them, until the container ends
        or the stream drops; a read waits at most ``idle_s`` for a line. Nothing when it cannot be read (yet)."""
        from kubernetes.client.exceptions import ApiException
        from kubernetes.watch.watch import iter_resp_lines

        try:
            response = self.core.read_namespaced_pod_log(pod, self.namespace, follow=True, _preload_content=False,
                                                         **self._log_args(container, since_seconds, tail_lines),
                                                         _request_timeout=(TIMEOUT[0], idle_s))
        except ApiException as exc:
            if exc.status in (400, 404):
                return
            raise self._explain(exc, "read the log of", f"pod {pod}") from exc
        with closing(response):
            yield from iter_resp_lines(response)
