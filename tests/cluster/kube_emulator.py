"""An in-memory Kubernetes API for the launcher's tests: kmock's ``KubernetesEmulator`` on a local port.

The launcher talks to it through the real ``kubernetes`` client over HTTP, exactly as in a cluster. The test plays
the operator and the kubelet: it creates the job's pods, moves their status along, writes their logs, and sets the
job's conditions, all through the same API. :class:`TrainingOperatorV1` holds the Training Operator v1 controller's
failure rules for those scripts (``pkg/core/job.go``, ``pkg/controller.v1/common/job.go``): the backoff limit
compared with the container restarts summed over all running pods, and on a backoff or deadline failure the pods
deleted before the job's ``Failed`` status is written.

What the emulator does not do (so the tests do it, or do without it):
- no controllers: nothing creates pods or sets conditions on its own (the test's operator script does);
- no label or field selectors: a list returns every pod (event) of the namespace (the tests create only the job's
  pods; the launcher filters events itself);
- no watch for the client's ``watch=True`` (the launcher polls anyway);
- no pod logs: :class:`Kubelet` serves ``pods/<name>/log`` from lines the test appends, honouring ``timestamps``,
  ``sinceSeconds``, ``tailLines`` and ``previous`` like the kubelet (404 once the pod is deleted), and can fail a
  read on purpose;
- no grace period: a deleted pod is gone at once (a real one is listed, terminating, for its grace period);
- creating a PyTorchJob or TrainJob is checked against its CRD's structural schema (``tests/k8s_schemas.py``) for
  unknown fields only: with ``fieldValidation=Strict`` they fail the request (400, ``strict decoding error: unknown
  field "spec.x"``), otherwise they are pruned silently, as the API server does; types, required fields and the
  operators' webhooks are not checked here (test_job_spec.py checks the rendered objects against the full schemas);
- no uids, resourceVersions, admission or RBAC.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import threading
import time
from dataclasses import dataclass, field

import kmock
from kubernetes import client

from fourm_kfp.cluster.kube import KubeApi
from tests.k8s_schemas import PYTORCHJOB_CRD, TRAINJOB_CRD, crd_schema, unknown_fields

#: The custom resources served, with their CRDs (group/version/plural -> CRD file and version).
CRDS = {"kubeflow.org/v1/pytorchjobs": PYTORCHJOB_CRD, "trainer.kubeflow.org/v1alpha1/trainjobs": TRAINJOB_CRD}


def rfc3339(seconds: float) -> str:
    stamp = dt.datetime.fromtimestamp(seconds, dt.timezone.utc)
    return stamp.strftime("%Y-%m-%dT%H:%M:%S.") + f"{stamp.microsecond:06d}".rstrip("0").ljust(1, "0") + "Z"


@dataclass
class Kubelet:
    """Container logs of the emulated pods: ``(pod, container, instance)`` -> [(time, line)]."""

    logs: dict[tuple[str, str, int], list[tuple[float, str]]] = field(default_factory=dict)
    instance: dict[tuple[str, str], int] = field(default_factory=dict)
    fail_next: int = 0  # make this many log reads fail with HTTP 500 (a dropped connection)
    reads: int = 0
    gone: set[str] = field(default_factory=set)  # deleted pods: their logs went with them
    lock: threading.Lock = field(default_factory=threading.Lock)

    def write(self, pod: str, container: str, *lines: str) -> None:
        with self.lock:
            key = (pod, container, self.instance.get((pod, container), 0))
            for line in lines:
                self.logs.setdefault(key, []).append((time.time(), line))
                time.sleep(0.001)  # distinct timestamps, as real lines mostly have

    def restart(self, pod: str, container: str) -> None:
        with self.lock:
            self.instance[(pod, container)] = self.instance.get((pod, container), 0) + 1

    def serve(self, pod: str, params) -> str:
        with self.lock:
            self.reads += 1
            if self.fail_next:
                self.fail_next -= 1
                raise RuntimeError("connection dropped (injected)")
            if pod in self.gone:
                raise kmock.KubernetesObjectNotFoundError()
            container = params.get("container", "")
            current = self.instance.get((pod, container), 0)
            instance = current - 1 if params.get("previous") == "True" else current
            lines = list(self.logs.get((pod, container, instance), []))
        if "sinceSeconds" in params:
            lines = [(t, s) for t, s in lines if t >= time.time() - int(params["sinceSeconds"])]
        if "tailLines" in params:
            lines = lines[-int(params["tailLines"]):]
        stamp = params.get("timestamps") == "True"
        return "".join(f"{rfc3339(t)} {s}\n" if stamp else f"{s}\n" for t, s in lines)


class SchemaCheckingEmulator(kmock.KubernetesEmulator):
    """kmock's emulator with the API server's handling of unknown fields on create (see the module docstring)."""

    schemas: dict = {}

    async def _handle(self, request):
        resource = request.resource
        key = f"{resource.group + '/' if resource and resource.group else ''}{resource.version}/{resource.plural}" \
            if resource is not None else None
        if request.action == kmock.action.CREATE and key in self.schemas and isinstance(request.data, dict):
            strict = request.params.get("fieldValidation") == "Strict"
            unknown = unknown_fields(self.schemas[key], request.data, prune=not strict)
            if unknown and strict:
                kind = request.data.get("kind", resource.plural)
                raise kmock.KubernetesError(
                    status=400, reason="BadRequest", details={},
                    message=f"{kind} in version \"{resource.version}\" cannot be handled as a {kind}: strict decoding "
                            f"error: " + ", ".join(f'unknown field "{field}"' for field in unknown))
        return await super()._handle(request)


class EmulatedCluster:
    """The emulator served on 127.0.0.1 from a background event loop; :meth:`api` is a launcher-side client."""

    def __init__(self, namespace: str = "fourm"):
        self.namespace = namespace
        self.kubelet = Kubelet()
        SchemaCheckingEmulator.schemas = {key: crd_schema(crd) for key, crd in CRDS.items()}
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=lambda: asyncio.run(self._serve()), daemon=True)
        self._thread.start()
        if not self._ready.wait(30):
            raise RuntimeError("the Kubernetes emulator did not start")

    async def _serve(self) -> None:
        self.loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        async with SchemaCheckingEmulator() as emulator, kmock.Server(emulator) as server:
            self.emulator, self.url = emulator, str(server.url).rstrip("/")
            for resource in ("v1/pods", "v1/events", "kubeflow.org/v1/pytorchjobs",
                             "trainer.kubeflow.org/v1alpha1/trainjobs"):
                emulator.resources[resource] = {}  # known before the first object (an empty list, not a 404)
            self._ready.set()
            await self._stop.wait()

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)

    def api(self) -> KubeApi:
        return KubeApi(client.ApiClient(client.Configuration(host=self.url)), self.namespace)

    # ------------------------------------------------------------------------------- the operator's side

    def add_pod(self, name: str, labels: dict[str, str], container: str, phase: str = "Pending",
                conditions: list | None = None, waiting: dict | None = None) -> None:
        """Create a pod (as the operator would) and serve its log from the kubelet."""
        status = {"phase": phase, "conditions": conditions or [],
                  "containerStatuses": [{"name": container, "image": "fourm", "imageID": "", "ready": False,
                                         "restartCount": 0, "state": {"waiting": waiting} if waiting else {}}]}
        body = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels},
                "spec": {"containers": [{"name": container, "image": "fourm"}]}, "status": status}
        self.api().core.create_namespaced_pod(self.namespace, body)
        self.kubelet.gone.discard(name)
        path = f"get /api/v1/namespaces/{self.namespace}/pods/{name}/log"

        def install():
            self.emulator[path] << (lambda request: self.kubelet.serve(name, request.params).encode())

        done = threading.Event()
        self.loop.call_soon_threadsafe(lambda: (install(), done.set()))
        done.wait(10)

    def delete_pod(self, name: str) -> None:
        self.api().core.delete_namespaced_pod(name, self.namespace)
        self.kubelet.gone.add(name)

    def pods(self) -> list[dict]:
        return self.api().pods("")

    def add_event(self, kind: str, name: str, reason: str, message: str, type_: str = "Warning") -> None:
        """An event about ``kind``/``name``, as a controller's recorder writes it (core/v1)."""
        body = {"apiVersion": "v1", "kind": "Event",
                "metadata": {"name": f"{name}.{time.time_ns():x}", "namespace": self.namespace},
                "involvedObject": {"kind": kind, "name": name, "namespace": self.namespace}, "reason": reason,
                "message": message, "type": type_, "count": 1, "lastTimestamp": rfc3339(time.time())}
        self.api().core.create_namespaced_event(self.namespace, body)

    def set_pod_status(self, name: str, status: dict) -> None:
        self.api().core.patch_namespaced_pod_status(name, self.namespace, {"status": status})

    def set_job_conditions(self, resource, name: str, *conditions: tuple[str, str, str]) -> None:
        """Set the job's status conditions: (type, reason, message), each with status True."""
        body = {"status": {"conditions": [{"type": t, "status": "True", "reason": r, "message": m}
                                          for t, r, m in conditions]}}
        self.api().custom.patch_namespaced_custom_object_status(resource.group, resource.version, self.namespace,
                                                                resource.plural, name, body)

    def wait_for_job(self, resource, name: str, timeout: float = 30) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            job = self.api().get(resource, name)
            if job is not None:
                return job
            time.sleep(0.02)
        raise TimeoutError(f"no {resource.kind} {name} was created")


def running_status(container: str, restarts: int = 0, last_exit: dict | None = None) -> dict:
    status = {"name": container, "image": "fourm", "imageID": "", "ready": True, "restartCount": restarts,
              "state": {"running": {"startedAt": rfc3339(time.time())}}}
    if last_exit:
        status["lastState"] = {"terminated": last_exit}
    return {"phase": "Running", "conditions": [], "containerStatuses": [status]}


@dataclass
class TrainingOperatorV1:
    """The Training Operator v1 controller's failure rules, for a test's operator script to apply.

    - :meth:`past_backoff_limit` is ``PastBackoffLimit`` (``pkg/core/job.go``): the restart counts of every container
      of every *running* pod, summed over all replicas, against ``runPolicy.backoffLimit`` (reached: ``>=``);
    - :meth:`fail` is the order of ``ReconcileJobs`` (``pkg/controller.v1/common/job.go``) on a backoff or deadline
      failure: the pods are deleted (``cleanPodPolicy``), and the status with ``Failed`` is written after that.
    """

    cluster: EmulatedCluster
    resource: object
    name: str

    def job(self) -> dict:
        return self.cluster.api().get(self.resource, self.name)

    def restarts(self) -> int:
        total = 0
        for pod in self.cluster.pods():
            status = pod.get("status") or {}
            if status.get("phase") != "Running":
                continue
            for group in ("initContainerStatuses", "containerStatuses"):
                total += sum(int(cs.get("restartCount") or 0) for cs in status.get(group) or [])
        return total

    def past_backoff_limit(self) -> bool:
        limit = self.job()["spec"]["runPolicy"].get("backoffLimit")
        if limit is None:
            return False
        return self.restarts() > 0 if limit == 0 else self.restarts() >= limit

    def fail(self, message: str) -> None:
        for pod in self.cluster.pods():
            self.cluster.delete_pod(pod["metadata"]["name"])
        self.cluster.set_job_conditions(self.resource, self.name, ("Created", "", ""), ("Running", "", ""),
                                        ("Failed", "PyTorchJobFailed", message))

    def reconcile(self) -> bool:
        """Fail the job when the restarts reached the backoff limit; whether it did."""
        if self.past_backoff_limit():
            self.fail(f"PyTorchJob {self.name} has failed because it has reached the specified backoff limit")
            return True
        return False
