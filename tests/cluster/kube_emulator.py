"""An in-memory Kubernetes API for the launcher's tests: kmock's ``KubernetesEmulator`` on a local port, made to
answer as the real API server and kubelet do where the launcher relies on it (:mod:`.apiserver_emulator`: identity
and the launcher's Role, resourceVersions, watches, field selectors, injected faults; :mod:`.kubelet_emulator`: the
pods' logs, followed or not).

The launcher talks to it through the real ``kubernetes`` client over HTTP, exactly as in a cluster: :meth:`api` is
the launcher's client, with its ServiceAccount's token (every request checked against the Role of
``manifests/base/rbac.yaml``) and the client configuration of :meth:`fourm_kfp.cluster.kube.KubeApi.connect` (its
retries). The test plays the operator and the kubelet with an admin's client (:meth:`admin`): it creates the job's
pods, moves their status along, writes their logs, and sets the job's conditions, all through the same API.
:meth:`fail`, :meth:`outage`, :meth:`drop_streams` and :meth:`compact` make the API misbehave for the launcher only.
:class:`TrainingOperatorV1` holds the Training Operator v1 controller's failure rules for those scripts
(``pkg/core/job.go``, ``pkg/controller.v1/common/job.go``): the backoff limit compared with the container restarts
summed over all running pods, and on a backoff or deadline failure the pods deleted before the job's ``Failed``
status is written.

Like the API server, it gives every object it creates a fresh ``metadata.uid``, a ``creationTimestamp`` (whole
seconds) and a ``resourceVersion``, whatever the request said. :meth:`EmulatedCluster.add_event` writes events as the
two recorders do (``involvedObject`` with the object's uid; client-go's ``record`` package, used by the Training
Operator v1 and Volcano: ``firstTimestamp``/``lastTimestamp`` in whole seconds and ``count``, repeats update the same
event; the ``events.k8s.io`` recorder, used by Kueue: ``eventTime`` in microseconds, repeats in ``series``), and can
date an event in the past and give it another uid: a previous job of the same name's events, which live an hour.

What the emulator does not do (so the tests do it, or do without it):
- no controllers: nothing creates pods or sets conditions on its own (the test's operator script does;
  :meth:`EmulatedCluster.start_pod` applies the scheduler's volume rules and the kubelet's container-creation rules
  to a pod the test creates);
- creating a PyTorchJob or TrainJob is checked against its CRD's structural schema (``tests/k8s_schemas.py``) for
  unknown fields only: with ``fieldValidation=Strict`` they fail the request (400, ``strict decoding error: unknown
  field "spec.x"``), otherwise they are pruned silently, as the API server does; types, required fields and the
  operators' webhooks are not checked here (test_job_spec.py checks the rendered objects against the full schemas);
- no grace period: a deleted pod is gone at once (a real one is listed, terminating, for its grace period);
- no admission, no event aggregation of its own (the test's recorder repeats an event), and what
  :mod:`.apiserver_emulator` lists as not done.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import itertools
import math
import threading
import time
import uuid
from dataclasses import dataclass

import kmock
from kubernetes import client

from fourm_kfp.cluster.kube import KubeApi, Resource
from tests.cluster.apiserver_emulator import ADMIN_TOKEN, LAUNCHER_TOKEN, ApiServer, Fault, RequestInfo, metav1_time
from tests.cluster.kubelet_emulator import Kubelet, container_start, rfc3339
from tests.k8s_schemas import PYTORCHJOB_CRD, TRAINJOB_CRD, crd_schema

#: The job kinds served (their resources), to find a job's uid by kind and name.
_JOB_RESOURCES = (Resource("kubeflow.org", "v1", "pytorchjobs", "PyTorchJob"),
                  Resource("trainer.kubeflow.org", "v1alpha1", "trainjobs", "TrainJob"))
#: The custom resources served, with their CRDs (group/version/plural -> CRD file and version).
CRDS = {"kubeflow.org/v1/pytorchjobs": PYTORCHJOB_CRD, "trainer.kubeflow.org/v1alpha1/trainjobs": TRAINJOB_CRD}


def micro_time(seconds: float) -> str:
    """A ``metav1.MicroTime`` (an event's ``eventTime``): RFC 3339 with six fractional digits."""
    return dt.datetime.fromtimestamp(seconds, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class EmulatedCluster:
    """The emulator served on 127.0.0.1 from a background event loop; :meth:`api` is a launcher-side client.
    ``rules``: the launcher's Role rules instead of those of ``manifests/base/rbac.yaml``."""

    def __init__(self, namespace: str = "fourm", rules: list[dict] | None = None):
        self.namespace = namespace
        self.kubelet = Kubelet()
        self._rules = rules
        self._uids: dict[tuple[str, str], str] = {}
        self._serial = itertools.count()  # event names: the object's name and a unique number, as the recorder's
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=lambda: asyncio.run(self._serve()), daemon=True)
        self._thread.start()
        if not self._ready.wait(30):
            raise RuntimeError("the Kubernetes emulator did not start")
        self._admin = self._client(ADMIN_TOKEN)

    async def _serve(self) -> None:
        self.loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        async with ApiServer() as emulator, kmock.Server(emulator) as server:
            emulator.setup(self.namespace, {key: crd_schema(crd) for key, crd in CRDS.items()}, self.kubelet,
                           self._rules)
            self.emulator, self.url = emulator, str(server.url).rstrip("/")
            for resource in ("v1/pods", "v1/events", "kubeflow.org/v1/pytorchjobs",
                             "trainer.kubeflow.org/v1alpha1/trainjobs"):
                emulator.resources[resource] = {}  # known before the first object (an empty list, not a 404)
            self._ready.set()
            await self._stop.wait()
            self.emulator.drop_streams()

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)

    def _configuration(self, token: str) -> client.Configuration:
        return client.Configuration(host=self.url, api_key={"authorization": token},
                                    api_key_prefix={"authorization": "Bearer"})

    def _client(self, token: str) -> KubeApi:
        return KubeApi(client.ApiClient(self._configuration(token)), self.namespace)

    def api(self, retries=None) -> KubeApi:
        """The launcher's client: its ServiceAccount's token, the production client configuration (``retries``:
        other than :func:`fourm_kfp.cluster.kube.api_retries`)."""
        return KubeApi.connect(self._configuration(LAUNCHER_TOKEN), self.namespace, retries)

    def admin(self) -> KubeApi:
        """The controllers' client (the test's): allowed everything, never failed."""
        return self._admin

    # ------------------------------------------------------------------------------ the API misbehaving

    def _call(self, fn):
        """Run ``fn`` on the emulator's event loop; its result."""
        done, box = threading.Event(), []
        self.loop.call_soon_threadsafe(lambda: (box.append(fn()), done.set()))
        done.wait(10)
        return box[0] if box else None

    def fail(self, count: int, *, status: int | None = None, retry_after: int | None = None,
             reset: str | None = None, method: str | None = None) -> Fault:
        """Answer the launcher's next ``count`` requests (``method``: those only) with ``status`` (and
        ``Retry-After``), or reset their connection ``reset`` = "before" serving them or "after"."""
        fault = Fault(count, status, retry_after, reset, method)
        self._call(lambda: self.emulator.faults.append(fault))
        return fault

    def outage(self, on: bool = True) -> None:
        """From now until ``outage(False)``: every request and open stream of the launcher reset."""
        def switch():
            self.emulator.faults = [f for f in self.emulator.faults if f.count != math.inf]
            if on:
                self.emulator.faults.insert(0, Fault(math.inf, reset="before"))
                self.emulator.drop_streams()

        self._call(switch)

    def drop_streams(self) -> None:
        """Reset every open watch and log stream (the launcher reconnects)."""
        self._call(self.emulator.drop_streams)

    def compact(self) -> None:
        """Forget the history of changes: a watch resuming from before now gets 410 Expired."""
        self._call(self.emulator.compact)

    def requests(self) -> list[tuple[RequestInfo, dict]]:
        """The launcher's resource requests so far (attributes, query parameters)."""
        return self._call(lambda: list(self.emulator.seen))

    # ------------------------------------------------------------------------------- the operator's side

    def add_pod(self, name: str, labels: dict[str, str], container: str, phase: str = "Pending",
                conditions: list | None = None, waiting: dict | None = None, image: str = "fourm",
                owner_references: list | None = None) -> dict:
        """Create a pod (as the operator would) whose log the kubelet serves; the pod as created."""
        status = {"phase": phase, "conditions": conditions or [],
                  "containerStatuses": [{"name": container, "image": image, "imageID": "", "ready": False,
                                         "restartCount": 0, "state": {"waiting": waiting} if waiting else {}}]}
        metadata = {"name": name, "labels": labels, **({"ownerReferences": owner_references} if owner_references
                                                       else {})}
        body = {"apiVersion": "v1", "kind": "Pod", "metadata": metadata,
                "spec": {"containers": [{"name": container, "image": image}]}, "status": status}
        self.kubelet.create(name)
        self.admin().core.create_namespaced_pod(self.namespace, body)
        return self.admin().pod(name)

    def read(self, kind: str, name: str) -> dict | None:
        """The Secret, ConfigMap or PersistentVolumeClaim ``name`` of the namespace as a dict, None when absent."""
        reader = {"Secret": self.admin().core.read_namespaced_secret,
                  "ConfigMap": self.admin().core.read_namespaced_config_map,
                  "PersistentVolumeClaim": self.admin().core.read_namespaced_persistent_volume_claim}[kind]
        try:
            return self.admin().api_client.sanitize_for_serialization(reader(name, self.namespace))
        except client.ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def start_pod(self, name: str, labels: dict[str, str], spec: dict) -> dict:
        """Create a pod with ``spec`` (the operator's, from the job's pod template) and move it on as the scheduler and
        the kubelet would; the pod as it then is.

        - the scheduler (kubernetes ``pkg/scheduler/framework/plugins/volumebinding/volume_binding.go``, ``PreFilter``
          and ``podHasPVCs``): a ``persistentVolumeClaim`` volume whose claim does not exist, is Lost or is not bound
          (taken as immediate binding) leaves the pod Pending, ``PodScheduled`` False ``Unschedulable`` with the
          plugin's text, and a ``FailedScheduling`` Warning on it;
        - the kubelet's volume manager: a ``secret`` or ``configMap`` volume whose object is missing (not optional)
          leaves the containers ``ContainerCreating`` and posts a ``FailedMount`` Warning "MountVolume.SetUp failed
          for volume ..." (``pkg/volume/util/operationexecutor/operation_generator.go``, the secret and configmap
          volume plugins' ``SetUpAt``);
        - the kubelet (:func:`.kubelet_emulator.container_start`): a container it cannot create waits with its reason
          and message, and the kubelet posts a ``Failed`` Warning "Error: <message>" (``recordContainerEvent``);
          otherwise the pod runs."""
        self.kubelet.create(name)
        body = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels}, "spec": spec,
                "status": {"phase": "Pending", "conditions": []}}
        self.admin().core.create_namespaced_pod(self.namespace, body)
        return self.sync_pod(name)

    def sync_pod(self, name: str) -> dict:
        """The scheduler's and the kubelet's next look at a pod that does not run yet (:meth:`start_pod`): what was
        missing may exist now."""
        spec = self.admin().pod(name)["spec"]
        body = {"metadata": {"name": name}, "spec": spec}
        unschedulable = None
        for volume in spec.get("volumes") or []:
            claim = (volume.get("persistentVolumeClaim") or {}).get("claimName")
            if claim is None or unschedulable:
                continue
            pvc = self.read("PersistentVolumeClaim", claim)
            if pvc is None:
                unschedulable = f'persistentvolumeclaim "{claim}" not found'
            elif (pvc.get("status") or {}).get("phase") == "Lost":
                unschedulable = (f'persistentvolumeclaim "{claim}" bound to non-existent persistentvolume '
                                 f'"{(pvc.get("spec") or {}).get("volumeName", "")}"')
            elif (pvc.get("status") or {}).get("phase") != "Bound":
                unschedulable = "pod has unbound immediate PersistentVolumeClaims"
        if unschedulable:
            message = (f"0/1 nodes are available: {unschedulable}. preemption: 0/1 nodes are available: 1 Preemption "
                       "is not helpful for scheduling.")
            self.set_pod_status(name, {"phase": "Pending", "conditions": [
                {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message}]})
            self.add_event("Pod", name, "FailedScheduling", message, component="default-scheduler")
            return self.admin().pod(name)
        unmounted = [(volume["name"], kind, ref[key]) for volume in spec.get("volumes") or []
                     for source, kind, key in (("secret", "Secret", "secretName"), ("configMap", "ConfigMap", "name"))
                     for ref in [volume.get(source)] if ref is not None and not ref.get("optional")
                     and self.read(kind, ref[key]) is None]
        if unmounted:
            for volume, kind, missing in unmounted:
                self.add_event("Pod", name, "FailedMount", f'MountVolume.SetUp failed for volume "{volume}" : '
                               f'{kind.lower()} "{missing}" not found', component="kubelet")
            self.set_pod_status(name, {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "True"}],
                                       "containerStatuses": [
                                           {"name": c["name"], "image": c.get("image", ""), "imageID": "",
                                            "ready": False, "restartCount": 0,
                                            "state": {"waiting": {"reason": "ContainerCreating"}}}
                                           for c in spec["containers"]]})
            return self.admin().pod(name)
        states = container_start(body, self.namespace, self.read, self.kubelet.runtime_errors.get(name),
                                 self.kubelet.node_images)
        statuses = []
        for container in spec["containers"]:
            waiting = states[container["name"]]
            state = {"waiting": waiting} if waiting else {"running": {"startedAt": rfc3339(time.time())}}
            statuses.append({"name": container["name"], "image": container.get("image", ""), "imageID": "",
                             "ready": waiting is None, "restartCount": 0, "state": state})
            if waiting:
                self.add_event("Pod", name, "Failed", f"Error: {waiting['message']}", component="kubelet")
        blocked = any(states.values())
        self.set_pod_status(name, {"phase": "Pending" if blocked else "Running", "conditions": [
            {"type": "PodScheduled", "status": "True"}], "containerStatuses": statuses})
        return self.admin().pod(name)

    def delete_pod(self, name: str) -> None:
        self.admin().core.delete_namespaced_pod(name, self.namespace)
        self.kubelet.delete(name)

    def pods(self) -> list[dict]:
        return self.admin().pods("")

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
            job = self.admin().get(resource, name) if resource.kind == kind else None
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
        self.admin().core.create_namespaced_event(self.namespace, body)
        return body["metadata"]["name"]

    def repeat_event(self, event: str, at: float | None = None) -> None:
        """The recorder seeing the same event again: ``count`` and ``lastTimestamp`` (``record``), or ``series``
        (``events.k8s.io``), on the same event object."""
        at = time.time() if at is None else at
        api = self.admin()
        current = api.api_client.sanitize_for_serialization(api.core.read_namespaced_event(event, self.namespace))
        if current.get("eventTime"):
            count = int((current.get("series") or {}).get("count") or 1) + 1
            patch = {"series": {"count": count, "lastObservedTime": micro_time(at)}}
        else:
            patch = {"count": int(current.get("count") or 1) + 1, "lastTimestamp": metav1_time(at)}
        api.core.patch_namespaced_event(event, self.namespace, patch)

    def set_pod_status(self, name: str, status: dict) -> None:
        self.admin().core.patch_namespaced_pod_status(name, self.namespace, {"status": status})

    def set_job_conditions(self, resource, name: str, *conditions: tuple[str, str, str]) -> None:
        """Set the job's status conditions: (type, reason, message), each with status True."""
        body = {"status": {"conditions": [{"type": t, "status": "True", "reason": r, "message": m}
                                          for t, r, m in conditions]}}
        self.admin().custom.patch_namespaced_custom_object_status(resource.group, resource.version, self.namespace,
                                                                resource.plural, name, body)

    def wait_for_job(self, resource, name: str, timeout: float = 30,
                     until: threading.Event | None = None) -> dict | None:
        """The job once it exists; ``None`` if ``until`` is set first (the launcher ended without creating it)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            job = self.admin().get(resource, name)
            if job is not None:
                return job
            if until is not None and until.is_set():
                return None
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
        return self.cluster.admin().get(self.resource, self.name)

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
