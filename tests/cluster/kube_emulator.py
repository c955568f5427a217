"""An in-memory Kubernetes API for the launcher's tests: kmock's ``KubernetesEmulator`` on a local port.

The launcher talks to it through the real ``kubernetes`` client over HTTP, exactly as in a cluster. The test plays
the operator and the kubelet: it creates the job's pods, moves their status along, writes their logs, and sets the
job's conditions, all through the same API. :class:`TrainingOperatorV1` holds the Training Operator v1 controller's
failure rules for those scripts (``pkg/core/job.go``, ``pkg/controller.v1/common/job.go``): the backoff limit
compared with the container restarts summed over all running pods, and on a backoff or deadline failure the pods
deleted before the job's ``Failed`` status is written.

Like the API server, it gives every object it creates a fresh ``metadata.uid`` and a ``creationTimestamp`` (whole
seconds), whatever the request said. :meth:`EmulatedCluster.add_event` writes events as the two recorders do
(``involvedObject`` with the object's uid; client-go's ``record`` package, used by the Training Operator v1 and
Volcano: ``firstTimestamp``/``lastTimestamp`` in whole seconds and ``count``, repeats update the same event; the
``events.k8s.io`` recorder, used by Kueue: ``eventTime`` in microseconds, repeats in ``series``), and can date an
event in the past and give it another uid: a previous job of the same name's events, which live an hour.

What the emulator does not do (so the tests do it, or do without it):
- no controllers: nothing creates pods or sets conditions on its own (the test's operator script does);
- label and field selectors: equality only (``a=b,c=d``; ``!=``, set-based selectors and ``metadata.*`` field
  paths beyond those the launcher uses are refused with a 400 here rather than answered wrongly);
- no watch for the client's ``watch=True`` (the launcher polls anyway);
- no pod logs: :class:`Kubelet` serves ``pods/<name>/log`` from lines the test appends, honouring ``timestamps``,
  ``sinceSeconds``, ``tailLines`` and ``previous`` like the kubelet (404 once the pod is deleted), and can fail a
  read on purpose;
- no grace period: a deleted pod is gone at once (a real one is listed, terminating, for its grace period);
- creating a PyTorchJob or TrainJob is checked against its CRD's structural schema (``tests/k8s_schemas.py``) for
  unknown fields only: with ``fieldValidation=Strict`` they fail the request (400, ``strict decoding error: unknown
  field "spec.x"``), otherwise they are pruned silently, as the API server does; types, required fields and the
  operators' webhooks are not checked here (test_job_spec.py checks the rendered objects against the full schemas);
- no resourceVersions, admission or RBAC; no event aggregation of its own (the test's recorder repeats an event).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import itertools
import json
import threading
import time
import uuid
from dataclasses import dataclass, field

import kmock
from kubernetes import client

from fourm_kfp.cluster.kube import KubeApi, Resource
from tests.k8s_schemas import PYTORCHJOB_CRD, TRAINJOB_CRD, crd_schema, unknown_fields

#: The job kinds served (their resources), to find a job's uid by kind and name.
_JOB_RESOURCES = (Resource("kubeflow.org", "v1", "pytorchjobs", "PyTorchJob"),
                  Resource("trainer.kubeflow.org", "v1alpha1", "trainjobs", "TrainJob"))
#: The custom resources served, with their CRDs (group/version/plural -> CRD file and version).
CRDS = {"kubeflow.org/v1/pytorchjobs": PYTORCHJOB_CRD, "trainer.kubeflow.org/v1alpha1/trainjobs": TRAINJOB_CRD}


def metav1_time(seconds: float) -> str:
    """A ``metav1.Time`` as the API server serializes it: RFC 3339 in whole seconds."""
    return dt.datetime.fromtimestamp(int(seconds), dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def micro_time(seconds: float) -> str:
    """A ``metav1.MicroTime`` (an event's ``eventTime``): RFC 3339 with six fractional digits."""
    return dt.datetime.fromtimestamp(seconds, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


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


def _selected(obj: dict, selector: str, field_paths: bool) -> bool:
    """Whether ``obj`` matches an equality selector (labels, or dotted field paths such as ``type``)."""
    for term in filter(None, selector.split(",")):
        key, op, value = term.partition("=")
        if not op or key.endswith("!") or value.startswith("=") or " in " in term:
            raise kmock.KubernetesError(status=400, reason="BadRequest", details={},
                                        message=f"the emulator handles equality selectors only: {selector!r}")
        if field_paths:
            found: object = obj
            for part in key.split("."):
                found = (found or {}).get(part) if isinstance(found, dict) else None
        else:
            found = (obj.get("metadata", {}).get("labels") or {}).get(key)
        if str(found) != value:
            return False
    return True


class SchemaCheckingEmulator(kmock.KubernetesEmulator):
    """kmock's emulator with the API server's handling of unknown fields on create, uids and creation times, and
    equality selectors (see the module docstring)."""

    schemas: dict = {}

    async def _serve_list(self, request):
        listed = await super()._serve_list(request)
        labels, fields_ = request.params.get("labelSelector", ""), request.params.get("fieldSelector", "")
        listed["items"] = [item for item in listed["items"]
                           if _selected(item, labels, False) and _selected(item, fields_, True)]
        return listed

    async def _handle(self, request):
        if request.action == kmock.action.CREATE and isinstance(request.data, dict):
            meta = request.data.setdefault("metadata", {})  # the server's, whatever the client sent
            meta.update(uid=str(uuid.uuid4()), creationTimestamp=metav1_time(time.time()))
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
        self._uids: dict[tuple[str, str], str] = {}
        self._serial = itertools.count()  # event names: the object's name and a unique number, as the recorder's
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
                conditions: list | None = None, waiting: dict | None = None, image: str = "fourm",
                owner_references: list | None = None) -> dict:
        """Create a pod (as the operator would) and serve its log from the kubelet; the pod as created."""
        status = {"phase": phase, "conditions": conditions or [],
                  "containerStatuses": [{"name": container, "image": image, "imageID": "", "ready": False,
                                         "restartCount": 0, "state": {"waiting": waiting} if waiting else {}}]}
        metadata = {"name": name, "labels": labels, **({"ownerReferences": owner_references} if owner_references
                                                       else {})}
        body = {"apiVersion": "v1", "kind": "Pod", "metadata": metadata,
                "spec": {"containers": [{"name": container, "image": image}]}, "status": status}
        self.api().core.create_namespaced_pod(self.namespace, body)
        self.kubelet.gone.discard(name)
        path = f"get /api/v1/namespaces/{self.namespace}/pods/{name}/log"

        def install():
            self.emulator[path] << (lambda request: self.kubelet.serve(name, request.params).encode())

        done = threading.Event()
        self.loop.call_soon_threadsafe(lambda: (install(), done.set()))
        done.wait(10)
        return json.loads(self.api().core.read_namespaced_pod(name, self.namespace, _preload_content=False).data)

    def delete_pod(self, name: str) -> None:
        self.api().core.delete_namespaced_pod(name, self.namespace)
        self.kubelet.gone.add(name)

    def pods(self) -> list[dict]:
        return self.api().pods("")

    #: The API groups of the kinds events are posted about in the tests (an event's ``involvedObject.apiVersion``).
    API_VERSIONS = {"Pod": "v1", "Job": "batch/v1", "PyTorchJob": "kubeflow.org/v1",
                    "TrainJob": "trainer.kubeflow.org/v1alpha1", "JobSet": "jobset.x-k8s.io/v1alpha2",
                    "PodGroup": "scheduling.volcano.sh/v1beta1", "Workload": "kueue.x-k8s.io/v1beta1"}

    def uid_of(self, kind: str, name: str) -> str:
        """The uid of the object ``kind``/``name``: a pod's or job's as the emulator made it, else one made up once
        per name (an object the test's controllers own: a PodGroup, a JobSet's Job, a Kueue Workload)."""
        if kind == "Pod":
            found = [p for p in self.pods() if p["metadata"]["name"] == name]
            if found:
                return found[0]["metadata"]["uid"]
        for resource in _JOB_RESOURCES:
            job = self.api().get(resource, name) if resource.kind == kind else None
            if job is not None:
                return job["metadata"]["uid"]
        return self._uids.setdefault((kind, name), str(uuid.uuid4()))

    def add_event(self, kind: str, name: str, reason: str, message: str, type_: str = "Warning", *,
                  uid: str | None = None, at: float | None = None, recorder: str = "record",
                  component: str = "") -> str:
        """An event about ``kind``/``name`` (its uid unless ``uid`` says otherwise), written at ``at`` (default
        now) as a controller's recorder writes it (core/v1): ``recorder="record"`` is client-go's
        ``tools/record`` (first/last timestamp in whole seconds, ``count``), ``"events"`` the ``events.k8s.io``
        recorder (``eventTime`` in microseconds, no first/last timestamp). Returns the event's name."""
        at = time.time() if at is None else at
        about = {"kind": kind, "name": name, "namespace": self.namespace, "apiVersion": self.API_VERSIONS[kind],
                 "uid": uid or self.uid_of(kind, name)}
        body = {"apiVersion": "v1", "kind": "Event",
                "metadata": {"name": f"{name}.{int(at * 1e9) + next(self._serial):x}", "namespace": self.namespace},
                "involvedObject": about, "reason": reason, "message": message, "type": type_}
        if recorder == "events":
            body.update(eventTime=micro_time(at), reportingComponent=component or "kueue-admission",
                        reportingInstance=f"{component or 'kueue-admission'}-0", action=reason)
        else:
            body.update(firstTimestamp=metav1_time(at), lastTimestamp=metav1_time(at), count=1,
                        source={"component": component or "controller"})
        self.api().core.create_namespaced_event(self.namespace, body)
        return body["metadata"]["name"]

    def repeat_event(self, event: str, at: float | None = None) -> None:
        """The recorder seeing the same event again: ``count`` and ``lastTimestamp`` (``record``), or ``series``
        (``events.k8s.io``), on the same event object."""
        at = time.time() if at is None else at
        api = self.api()
        current = api.api_client.sanitize_for_serialization(api.core.read_namespaced_event(event, self.namespace))
        if current.get("eventTime"):
            count = int((current.get("series") or {}).get("count") or 1) + 1
            patch = {"series": {"count": count, "lastObservedTime": micro_time(at)}}
        else:
            patch = {"count": int(current.get("count") or 1) + 1, "lastTimestamp": metav1_time(at)}
        api.core.patch_namespaced_event(event, self.namespace, patch)

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
