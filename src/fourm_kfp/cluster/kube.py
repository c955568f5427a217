"""The few Kubernetes API calls the job launcher makes, in one namespace, with errors a user can act on.

:class:`KubeApi` wraps the official client (``kubernetes``, installed with kfp): create / get / delete a custom
object (the job) and list them by label (the exit handler), read the launcher's own pod (its owner), list pods by
label and the namespace's Warning events (the launcher picks the job's own, :mod:`.job_launcher`), read a
container's log (with timestamps, so a reader can resume where it stopped). Jobs are
created with ``fieldValidation=Strict``: a field the installed operator's CRD does not know (an older Trainer
without ``runtimePatches``) fails the create with the field named, where the server's default would drop it
silently (tolerations, volumes, the deadline).
Objects come back as plain dicts. It needs the RBAC of ``manifests/base/rbac.yaml`` and nothing more; a 403 or a
missing CRD raises a :class:`~fourm_kfp.errors.UserError` that says which (events excepted: without them the
launcher only waits longer).
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fourm_kfp.errors import UserError

log = logging.getLogger(__name__)

SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


@dataclass(frozen=True)
class Resource:
    """A custom resource type: ``group/version``, ``plural`` and ``kind``."""

    group: str
    version: str
    plural: str
    kind: str

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}"


class JobConflict(UserError):
    """A job of that name exists and is not this launcher's to adopt."""


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
    """Create, read and delete custom objects and read pods and their logs in ``namespace``."""

    def __init__(self, api_client, namespace: str):
        from kubernetes import client

        self.api_client = api_client
        self.namespace = namespace
        self.custom = client.CustomObjectsApi(api_client)
        self.core = client.CoreV1Api(api_client)

    @classmethod
    def from_environment(cls, namespace: str = "") -> "KubeApi":
        """In a pod: its service account; elsewhere: the kubeconfig (``$KUBECONFIG`` or ``~/.kube/config``)."""
        from kubernetes import client, config

        try:
            if os.environ.get("KUBERNETES_SERVICE_HOST"):
                config.load_incluster_config()
            else:
                config.load_kube_config()
        except config.ConfigException as exc:
            raise UserError(f"no Kubernetes cluster to launch the job in ({exc}); run inside a cluster or set "
                            "KUBECONFIG, or use pretrain_launcher=in-pod") from exc
        return cls(client.ApiClient(), current_namespace(namespace))

    # --------------------------------------------------------------------------------------------- errors

    def _explain(self, exc, verb: str, what: str) -> Exception:
        status = getattr(exc, "status", None)
        if status == 403:
            return UserError(f"the service account may not {verb} {what} in namespace {self.namespace!r}: bind "
                             "the Role of manifests/base/rbac.yaml to the account the pipeline runs as "
                             "(manifests/README.md)")
        if status == 404 and verb == "create":
            return UserError(f"the API server does not know {what} in namespace {self.namespace!r}: is the "
                             "operator installed (its CRD applied)? See manifests/README.md")
        return exc

    # ------------------------------------------------------------------------------------ custom objects

    def create(self, resource: Resource, body: dict[str, Any]) -> dict[str, Any]:
        """Create ``body``; raises :class:`JobConflict` when the name is taken (HTTP 409)."""
        from kubernetes.client.exceptions import ApiException

        try:
            return self.custom.create_namespaced_custom_object(resource.group, resource.version, self.namespace,
                                                               resource.plural, body, field_validation="Strict")
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
                                                            resource.plural, name)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise self._explain(exc, "get", resource.plural) from exc

    def list(self, resource: Resource, selector: str) -> list[dict[str, Any]]:
        """The objects matching the label selector; [] when the resource is not installed (no such CRD)."""
        from kubernetes.client.exceptions import ApiException

        try:
            found = self.custom.list_namespaced_custom_object(resource.group, resource.version, self.namespace,
                                                              resource.plural, label_selector=selector)
        except ApiException as exc:
            if exc.status == 404:
                return []
            raise self._explain(exc, "list", resource.plural) from exc
        return found.get("items") or []

    def delete(self, resource: Resource, name: str) -> bool:
        """Delete the object and, in the background, what it owns (pods, services); False when it was gone."""
        from kubernetes.client.exceptions import ApiException

        try:
            self.custom.delete_namespaced_custom_object(resource.group, resource.version, self.namespace,
                                                        resource.plural, name, propagation_policy="Background")
            return True
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise self._explain(exc, "delete", resource.plural) from exc

    # ------------------------------------------------------------------------------------------ pods, logs

    def pods(self, selector: str) -> list[dict[str, Any]]:
        """Pods matching the label selector, as plain dicts (camelCase keys, as the API serves them)."""
        from kubernetes.client.exceptions import ApiException

        try:  # the JSON as served: no client model in between to reject a field it does not know
            response = self.core.list_namespaced_pod(self.namespace, label_selector=selector, _preload_content=False)
        except ApiException as exc:
            raise self._explain(exc, "list", "pods") from exc
        return json.loads(response.data).get("items") or []

    def pod(self, name: str) -> dict[str, Any] | None:
        """The pod ``name`` as served (camelCase keys), or None when there is none."""
        from kubernetes.client.exceptions import ApiException

        try:
            response = self.core.read_namespaced_pod(name, self.namespace, _preload_content=False)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise self._explain(exc, "get", "pods") from exc
        return json.loads(response.data)

    def warnings(self) -> list[dict[str, Any]]:
        """The namespace's Warning events (which are the job's is the caller's to decide: by uid and time); [] when
        the Role may not read events (said once in the log)."""
        from kubernetes.client.exceptions import ApiException

        try:
            response = self.core.list_namespaced_event(self.namespace, field_selector="type=Warning",
                                                       _preload_content=False)
        except ApiException as exc:
            if exc.status == 403 and not getattr(self, "_said_no_events", False):
                self._said_no_events = True
                log.warning("%s", self._explain(exc, "list", "events"))
            if exc.status == 403:
                return []
            raise self._explain(exc, "list", "events") from exc
        return [event for event in json.loads(response.data).get("items") or [] if event.get("type") == "Warning"]

    def log(self, pod: str, container: str, *, since_seconds: int | None = None, previous: bool = False,
            tail_lines: int | None = None) -> str:
        """A container's log, each line prefixed by its RFC 3339 timestamp; "" when it cannot be read (yet)."""
        from kubernetes.client.exceptions import ApiException

        kwargs: dict[str, Any] = {"container": container, "timestamps": True, "previous": previous}
        if since_seconds is not None:
            kwargs["since_seconds"] = since_seconds
        if tail_lines is not None:
            kwargs["tail_lines"] = tail_lines
        try:
            return self.core.read_namespaced_pod_log(pod, self.namespace, **kwargs) or ""
        except ApiException as exc:
            if exc.status in (400, 404):  # container not started yet / no previous instance / pod gone
                return ""
            raise self._explain(exc, "read the log of", f"pod {pod}") from exc
