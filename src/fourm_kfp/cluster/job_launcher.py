"""Create a training job, follow it to the end, and delete it once it succeeded: the operator-agnostic half of the
launcher.

:func:`run_job` takes a rendered PyTorchJob or TrainJob (:mod:`.job_spec`) and

1. **creates** it, or **adopts** it when a job of that name exists with this launcher's content address and KFP run
   id (the step's retry after its launcher pod was lost to a node drain or a preemption). An adopted job that already
   failed is reported as failed when this attempt is a retry of the step (``KFP_RETRY_INDEX`` > 0: its restart budget
   is spent, and step retries must not multiply it); on a first attempt (e.g. a run retried by hand) it is deleted and
   created afresh. Any other name conflict fails and names the job, never adopting a stranger's or a stale job;
2. **follows** it by polling (every ``poll_s``): the master pod's log goes to ``out`` line by line (read with
   timestamps, so a dropped connection or a launcher restart loses and repeats nothing); whenever a container of
   any pod shows a terminated instance (``lastState.terminated``) newer than the one last read, that instance's log
   is read with ``previous=True`` at once (the master's in full, another pod's last lines), since on a backoff or
   deadline failure the operator deletes the pods before it marks the job Failed; while pods are Pending the
   reason is printed (unschedulable, image pull, init containers) when it changes and once a minute while it does
   not. While some of the job's pods do not exist yet, its Warning events are read (:func:`job_events`: about the job
   itself by its uid, or about what its controllers made for it and newer than the job, since a previous job of the
   same name left events that live an hour) and sorted (:func:`event_kind`): a queue (a gang scheduler's PodGroup, a
   Kueue Workload, the scheduler) means waiting and is said with its reason, however long it lasts; a refusal that
   cannot heal (the API server forbids the pods: quota, an admission webhook, an invalid pod) fails the launcher once
   it has lasted ``no_pods_s``. A container whose image cannot be pulled for ``image_pull_s`` fails it too, naming
   the pod, the image and the kubelet's error;
3. stops at the job's terminal condition (PyTorchJob ``Succeeded``/``Failed``, TrainJob ``Complete``/``Failed``)
   or at the deadline, and raises :class:`JobFailed` with the conditions and the last log lines on failure or
   timeout;
4. **deletes** the job when it succeeded, and when the launcher gives up on it (a refusal, an image that cannot be
   pulled, its deadline), both unless ``delete=False``. A job that **failed** is kept: the step's retry finds and
   reports it, and the run's exit handler deletes it when the run ends (:mod:`.stop_jobs`, which also says who
   else cleans up). On SIGTERM (the launcher pod deleted: a node drain, a preemption) the launcher exits and leaves
   the job running for the step's retry to adopt; the job is not owned by the launcher pod
   (:mod:`fourm_kfp.launchers.kubernetes_job`). KFP's launcher does not forward a stopped run's SIGTERM to the
   step: the pipeline's exit handler deletes a stopped run's jobs.
"""

from __future__ import annotations

import collections
import datetime as dt
import logging
import os
import re
import signal
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from fourm_kfp.cluster import job_spec
from fourm_kfp.cluster.job_spec import ADDRESS_LABEL, RUN_ID_LABEL
from fourm_kfp.cluster.kube import JobConflict, KubeApi, Resource
from fourm_kfp.errors import UserError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class JobKind:
    """What differs between the operators: the resource, the training container, the pod labels and conditions."""

    resource: Resource
    container: str
    pod_selector: Callable[[str], str]  # all pods of the job
    is_master: Callable[[dict[str, Any]], bool]
    succeeded: str  # the terminal success condition; "Failed" is the failure condition of both
    expected_pods: Callable[[dict[str, Any]], int]  # the pods the job's spec asks for


def _labels(pod: dict[str, Any]) -> dict[str, str]:
    return pod.get("metadata", {}).get("labels") or {}


PYTORCHJOB = JobKind(
    resource=Resource("kubeflow.org", "v1", "pytorchjobs", "PyTorchJob"),
    container="pytorch",
    pod_selector=lambda name: f"training.kubeflow.org/job-name={name}",
    is_master=lambda pod: _labels(pod).get("training.kubeflow.org/replica-type", "").lower() == "master",
    succeeded="Succeeded",
    expected_pods=lambda job: sum(int(spec.get("replicas", 1))
                                  for spec in ((job.get("spec") or {}).get("pytorchReplicaSpecs") or {}).values()),
)
TRAINJOB = JobKind(
    resource=Resource("trainer.kubeflow.org", "v1alpha1", "trainjobs", "TrainJob"),
    container="node",
    pod_selector=lambda name: f"jobset.sigs.k8s.io/jobset-name={name}",
    is_master=lambda pod: (_labels(pod).get("jobset.sigs.k8s.io/job-index") == "0"
                           and _labels(pod).get("batch.kubernetes.io/job-completion-index", "0") == "0"),
    succeeded="Complete",
    expected_pods=lambda job: int(((job.get("spec") or {}).get("trainer") or {}).get("numNodes") or 1),
)
JOB_KINDS = {job_spec.PYTORCHJOB: PYTORCHJOB, job_spec.TRAINJOB: TRAINJOB}


class JobFailed(UserError):
    """The job failed or ran out of time; the message holds its conditions and the master's last log lines."""


@dataclass
class FollowSettings:
    """How the launcher follows a job; times in seconds."""

    poll_s: float = 5.0
    grace_s: float = 600.0  # past the job's own deadline, for the operator to mark it failed
    delete: bool = True  # delete the job once it succeeded or was given up on (``<stage>_delete_job``)
    tail_lines: int = 40  # log lines quoted in a failure
    pending_every_s: float = 60.0  # repeat an unchanged pending reason this often
    no_pods_s: float = 300.0  # pods missing and the cluster refusing them (cannot heal) this long: fail
    image_pull_s: float = 600.0  # a container's image failing to pull this long: fail (kubelet back-off tops at 300)


@dataclass
class JobResult:
    name: str
    succeeded: bool
    conditions: list[dict[str, Any]]
    adopted: bool
    log_tail: list[str] = field(default_factory=list)
    peer_crashes: dict[str, list[str]] = field(default_factory=dict)  # other pods' last crashed lines


def conditions_of(job: dict[str, Any]) -> list[dict[str, Any]]:
    return list((job.get("status") or {}).get("conditions") or [])


def terminal_state(kind: JobKind, job: dict[str, Any]) -> str | None:
    """``"succeeded"``, ``"failed"`` or None while the job runs."""
    true = {c.get("type") for c in conditions_of(job) if str(c.get("status")) == "True"}
    if "Failed" in true:
        return "failed"
    if kind.succeeded in true:
        return "succeeded"
    return None


def describe_conditions(job: dict[str, Any]) -> str:
    parts = [f"{c.get('type')}={c.get('status')}" + (f" ({c.get('reason')}: {c.get('message')})"
                                                     if c.get("reason") or c.get("message") else "")
             for c in conditions_of(job)]
    return "; ".join(parts) or "no conditions yet"


# ----------------------------------------------------------------------------------------------------- logs


def parse_timestamp(text: str) -> int:
    """Nanoseconds since the epoch of an RFC 3339 timestamp as the kubelet writes it (fraction of any length)."""
    main, _, rest = text.rstrip("Z").partition(".")
    seconds = dt.datetime.fromisoformat(main).replace(tzinfo=dt.timezone.utc).timestamp()
    digits = "".join(ch for ch in rest if ch.isdigit())[:9]
    return int(seconds) * 1_000_000_000 + int(digits.ljust(9, "0") or 0)


class LogFollower:
    """Prints a container's new log lines on every :meth:`poll`, across dropped reads and container restarts."""

    SKEW_S = 60  # ask for this much more history than needed: node and launcher clocks differ

    def __init__(self, api: KubeApi, container: str, out: Callable[[str], None], tail_lines: int):
        self.api, self.container, self.out = api, container, out
        self.last_ns: int | None = None
        self.seen_at_last: set[str] = set()
        self.ended: dict[str, tuple] = {}  # pod uid -> the terminated container instance whose log was read
        self.tail: collections.deque[str] = collections.deque(maxlen=tail_lines)
        self.peer_crashes: dict[str, list[str]] = {}  # another pod -> the last lines of its last crashed container
        self.tail_lines = tail_lines

    def _emit(self, text: str, prefix: str = "") -> None:
        for raw in text.splitlines():
            stamp, _, line = raw.partition(" ")
            try:
                ns = parse_timestamp(stamp)
            except ValueError:  # a continuation without a timestamp
                ns, line = self.last_ns or 0, raw
            if self.last_ns is not None and (ns < self.last_ns or (ns == self.last_ns and raw in self.seen_at_last)):
                continue
            if ns != self.last_ns:
                self.seen_at_last = set()
            self.last_ns = ns
            self.seen_at_last.add(raw)
            self.tail.append(prefix + line)
            self.out(prefix + line)

    def _since(self) -> int | None:
        if self.last_ns is None:
            return None
        return max(1, int(time.time() - self.last_ns / 1e9) + self.SKEW_S)

    def _status(self, pod: dict[str, Any]) -> dict[str, Any]:
        statuses = {s.get("name"): s for s in (pod.get("status") or {}).get("containerStatuses") or []}
        return statuses.get(self.container, {})

    def _new_termination(self, pod: dict[str, Any], status: dict[str, Any]) -> dict[str, Any] | None:
        """The container's last terminated instance if its log has not been read yet (and mark it read)."""
        ended = (status.get("lastState") or {}).get("terminated")
        if not ended:
            return None
        uid = pod["metadata"].get("uid", pod["metadata"]["name"])
        key = (ended.get("containerID"), ended.get("startedAt"), ended.get("finishedAt"), status.get("restartCount"))
        if self.ended.get(uid) == key:
            return None
        self.ended[uid] = key
        return ended

    def _crash_line(self, name: str, status: dict[str, Any], ended: dict[str, Any]) -> str:
        return (f"[launcher] {name}: container {self.container!r} ended (restart "
                f"{int(status.get('restartCount') or 0)}; exit code {ended.get('exitCode', '?')}, "
                f"{ended.get('reason', 'unknown reason')}); training resumes from the newest complete checkpoint "
                "unless the job fails")

    def poll(self, pod: dict[str, Any]) -> None:
        """The master pod: the log of a newly terminated instance first (``previous``), then the running one's."""
        name = pod["metadata"]["name"]
        status = self._status(pod)
        ended = self._new_termination(pod, status)
        if ended is not None:
            tail = 1000 if self.last_ns is None else None
            self._emit(self.api.log(name, self.container, previous=True, since_seconds=self._since(),
                                    tail_lines=tail))
            self.out(self._crash_line(name, status, ended))
        if status.get("state", {}).get("running") or status.get("state", {}).get("terminated"):
            tail = 1000 if self.last_ns is None else None
            self._emit(self.api.log(name, self.container, since_seconds=self._since(), tail_lines=tail))

    def poll_peer(self, pod: dict[str, Any]) -> None:
        """Another pod: the last lines of each newly terminated instance (where a multi-node crash often starts)."""
        name = pod["metadata"]["name"]
        status = self._status(pod)
        ended = self._new_termination(pod, status)
        if ended is None:
            return
        text = self.api.log(name, self.container, previous=True, tail_lines=self.tail_lines)
        lines = [raw.partition(" ")[2] if raw[:1].isdigit() else raw for raw in text.splitlines()]
        self.out(self._crash_line(name, status, ended) + (": its last lines" if lines else ""))
        for line in lines:
            self.out(f"  {name} | {line}")
        if lines:
            self.peer_crashes[name] = lines


def pending_reason(pods: list[dict[str, Any]]) -> str | None:
    """Why pods are not running yet (scheduling, image pulls, init containers), or None when none is waiting."""
    reasons = []
    for pod in sorted(pods, key=lambda p: p["metadata"]["name"]):
        status = pod.get("status") or {}
        if status.get("phase") != "Pending":
            continue
        why = []
        for cond in status.get("conditions") or []:
            if str(cond.get("status")) == "False" and (cond.get("reason") or cond.get("message")):
                why.append(f"{cond.get('type')}: {cond.get('reason', '')} {cond.get('message', '')}".strip())
        for group in ("initContainerStatuses", "containerStatuses"):
            for cs in status.get(group) or []:
                waiting = (cs.get("state") or {}).get("waiting")
                if waiting:
                    why.append(f"{cs.get('name')}: {waiting.get('reason', 'waiting')} "
                               f"{waiting.get('message', '')}".strip())
        reasons.append(f"{pod['metadata']['name']} pending" + (f" ({'; '.join(why)})" if why else ""))
    return "; ".join(reasons) or None


# ----------------------------------------------------------------------------------- events, image pulls

#: Objects that hold a job while it waits its turn: a gang scheduler's PodGroup (Volcano posts a Warning
#: "Unschedulable" on it every scheduling cycle while the gang does not fit, and the operator makes no pod
#: meanwhile) and Kueue's Workload (a Warning, "Pending" by default, each time it is not admitted; the job is
#: suspended). Events with these reasons mean a wait for room, on the pods too (the default scheduler).
QUEUE_KINDS = frozenset({"PodGroup", "Workload"})
QUEUE_REASONS = frozenset({"Unschedulable", "FailedScheduling"})
#: A controller that could not create a pod (Training Operator v1: FailedCreatePod; the Job controller under a
#: TrainJob's JobSet: FailedCreate) writes "Error creating: <the API server's error>"; these errors do not heal by
#: waiting (a quota the pods exceed, an admission webhook's denial, an invalid pod).
_REFUSAL = re.compile(r"is forbidden|denied the request|is invalid")
#: Waiting reasons of a container whose image the kubelet cannot pull.
PULL_ERRORS = frozenset({"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull"})
_PULL_AUTH = re.compile(r"unauthori[sz]ed|authori[sz]|authenticat|denied|forbidden|\b40[13]\b", re.IGNORECASE)
_PULL_MISSING = re.compile(r"not found|manifest unknown|\b404\b", re.IGNORECASE)


def event_time_ns(event: dict[str, Any]) -> int:
    """When an event was last seen, in ns: ``series.lastObservedTime`` (the events.k8s.io recorder's repeats),
    ``lastTimestamp`` (client-go's ``record`` recorder), ``eventTime``, ``firstTimestamp``, its creation; 0 if none."""
    for stamp in ((event.get("series") or {}).get("lastObservedTime"), event.get("lastTimestamp"),
                  event.get("eventTime"), event.get("firstTimestamp"),
                  (event.get("metadata") or {}).get("creationTimestamp")):
        if stamp:
            try:
                return parse_timestamp(stamp)
            except ValueError:
                continue
    return 0


def _named_after(about: str, name: str) -> bool:
    """Whether an object is one a controller named after the job: its PodGroup (the job's name), a JobSet's Jobs
    and the pods (``name-…``), Kueue's Workload (``<kind>-name-<hash>``)."""
    return about == name or about.startswith(f"{name}-") or f"-{name}-" in about


def job_events(events: list[dict[str, Any]], kind: JobKind, job: dict[str, Any]) -> list[dict[str, Any]]:
    """The Warning events of ``job`` among ``events``, oldest first: about the job itself (its uid), or about an object
    named after it and last seen since the job was created. Job names are fixed per address and events live an hour:
    a previous job of the same name's events (another uid, older) are left out."""
    meta = job.get("metadata") or {}
    name, uid = meta.get("name", ""), meta.get("uid", "")
    created = parse_timestamp(meta["creationTimestamp"]) if meta.get("creationTimestamp") else 0
    found = []
    for event in events:
        about = event.get("involvedObject") or {}
        if event.get("type") != "Warning" or not _named_after(about.get("name", ""), name):
            continue
        if about.get("kind") == kind.resource.kind and uid and about.get("uid") and about["uid"] != uid:
            continue  # a previous job of this name
        if event_time_ns(event) < created:
            continue  # older than this job: a previous attempt's
        found.append(event)
    return sorted(found, key=event_time_ns)


def event_kind(event: dict[str, Any]) -> str:
    """``"refused"`` (the API server will not create a pod: waiting does not help), ``"queued"`` (the job waits for
    room: a PodGroup, a Kueue Workload, an unschedulable pod) or ``"warning"`` (reported, not acted on)."""
    reason, about = event.get("reason") or "", (event.get("involvedObject") or {}).get("kind")
    if reason.startswith("FailedCreate") and _REFUSAL.search(event.get("message") or ""):
        return "refused"
    if about in QUEUE_KINDS or reason in QUEUE_REASONS:
        return "queued"
    return "warning"


def _event_messages(events: list[dict[str, Any]]) -> str:
    """``Reason (object): message`` of each distinct event, the newest last."""
    seen: dict[str, None] = {}
    for event in events:
        about = event.get("involvedObject") or {}
        seen[f"{event.get('reason', '')} ({about.get('kind', '')} {about.get('name', '')}): "
             f"{event.get('message', '')}".strip()] = None
    return "; ".join(list(seen)[-5:])


class PullWatch:
    """How long each container of the job's pods has failed to pull its image (launcher's clock)."""

    def __init__(self) -> None:
        self.since: dict[tuple[str, str], float] = {}

    def check(self, pods: list[dict[str, Any]], now: float) -> tuple[dict[str, Any], dict[str, Any], float] | None:
        """The pod, container status and seconds of the longest-failing pull, or None when no pull fails. A pull
        counts as failing from the first poll that saw it until its container runs (the kubelet retries between)."""
        failing, seen = None, set()
        for pod in pods:
            pod_key = pod["metadata"].get("uid") or pod["metadata"]["name"]
            status = pod.get("status") or {}
            for container in (status.get("initContainerStatuses") or []) + (status.get("containerStatuses") or []):
                key = (pod_key, container.get("name", ""))
                seen.add(key)
                state = container.get("state") or {}
                if (state.get("waiting") or {}).get("reason") in PULL_ERRORS:
                    since = self.since.setdefault(key, now)
                    if failing is None or now - since > failing[2]:
                        failing = (pod, container, now - since)
                elif state.get("running") or state.get("terminated"):
                    self.since.pop(key, None)
        for key in set(self.since) - seen:  # the pod is gone
            del self.since[key]
        return failing


def _pull_failure(api: KubeApi, kind: JobKind, name: str, pod: dict[str, Any], container: dict[str, Any],
                  seconds: float) -> str:
    """What a user needs about an image that cannot be pulled: the pod, the image, the kubelet's error, the fix."""
    pod_name = pod["metadata"]["name"]
    specs = {c.get("name"): c for c in ((pod.get("spec") or {}).get("initContainers") or [])
             + ((pod.get("spec") or {}).get("containers") or [])}
    image = container.get("image") or specs.get(container.get("name"), {}).get("image", "?")
    waiting = (container.get("state") or {}).get("waiting") or {}
    details = [f"{waiting.get('reason')}: {waiting.get('message', '')}".rstrip(": ")]
    try:  # the kubelet's "Failed" events on this pod (its uid) hold the registry's answer
        pulls = [e for e in api.warnings() if (e.get("involvedObject") or {}).get("uid") == pod["metadata"].get("uid")
                 and e.get("reason") in ("Failed", "ErrImagePull")]
    except Exception as exc:  # the failure is reported either way
        log.debug("reading the events of pod %s failed: %s", pod_name, exc)
        pulls = []
    details += [e.get("message", "") for e in sorted(pulls, key=event_time_ns)[-1:]
                if e.get("message") and e.get("message") not in details[0]]
    text = "; ".join(details)
    registry = image.split("/")[0] if "/" in image and any(c in image.split("/")[0] for c in ".:") else "docker.io"
    if _PULL_AUTH.search(text):
        fix = (f"the registry {registry} refused the pull: set the pipeline parameter image_pull_secret to a Secret of "
               f"type kubernetes.io/dockerconfigjson in namespace {api.namespace!r} that may pull {image}")
    elif _PULL_MISSING.search(text):
        fix = f"the registry {registry} has no {image}: push it (the job's pods run the image of this step)"
    else:
        fix = f"check that the cluster's nodes can reach {registry}"
    return (f"{kind.resource.kind} {name!r}: pod {pod_name} cannot pull the image {image} of its container "
            f"{container.get('name')!r} ({seconds:.0f}s): {text}. Fix: {fix}")


# ------------------------------------------------------------------------------------------ create / adopt


def _owned_by_us(job: dict[str, Any], address: str, kfp_run_id: str) -> bool:
    labels = job.get("metadata", {}).get("labels") or {}
    return labels.get(ADDRESS_LABEL) == address and labels.get(RUN_ID_LABEL) == kfp_run_id


def _wait_gone(api: KubeApi, kind: JobKind, name: str, settings: FollowSettings, timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while api.get(kind.resource, name) is not None:
        if time.monotonic() > deadline:
            raise JobFailed(f"{kind.resource.kind} {name!r} is still being deleted after {timeout_s:.0f}s")
        time.sleep(settings.poll_s)


def step_retry_index() -> int:
    """Which retry of the KFP step this is: ``KFP_RETRY_INDEX``, Argo's ``{{retries}}``, which KFP (>= 2.16) sets in a
    step with a retry policy; 0 for the first try and without a retry policy."""
    value = os.environ.get("KFP_RETRY_INDEX", "").strip()
    return int(value) if value.isdigit() else 0


def create_or_adopt(api: KubeApi, kind: JobKind, job: dict[str, Any], settings: FollowSettings,
                    before_create: Callable[[], None] | None = None, retry_index: int = 0) -> bool:
    """Create ``job``, or adopt the existing one of that name if it is ours; returns whether it was adopted. Ours and
    failed: reported (:class:`JobFailed`) on a retry of the step (``retry_index`` > 0), else replaced."""
    name = job["metadata"]["name"]
    labels = job["metadata"]["labels"]
    address, run_id = labels[ADDRESS_LABEL], labels[RUN_ID_LABEL]
    existing = api.get(kind.resource, name)
    if existing is not None:
        where = f"{kind.resource.kind} {name!r} in namespace {api.namespace!r}"
        if not _owned_by_us(existing, address, run_id):
            other = (existing["metadata"].get("labels") or {}).get(RUN_ID_LABEL)
            state = terminal_state(kind, existing) or "running"
            raise JobConflict(
                f"{where} exists ({state}) and is not this run's to adopt (it was created for KFP run "
                f"{other or 'unknown'}, this is {run_id or 'a run without id'}): wait for it to finish, or remove it "
                f"with `kubectl delete {kind.resource.plural}.{kind.resource.group} {name} -n {api.namespace}`")
        if terminal_state(kind, existing) == "failed" and retry_index > 0:
            raise JobFailed(f"{where} failed before this retry of the step (retry {retry_index}): "
                            f"{describe_conditions(existing)}. Its restart budget is spent; it is not started again "
                            "by the step's retry (retry the run, or start a new one, to train on from the newest "
                            "complete checkpoint)")
        if terminal_state(kind, existing) == "failed":
            log.warning("%s failed before this launcher attempt (%s); deleting it and starting again (training "
                        "resumes from the newest complete checkpoint)", where, describe_conditions(existing))
            api.delete(kind.resource, name)
            _wait_gone(api, kind, name, settings)
        else:
            log.info("adopting %s (created earlier by this run)", where)
            return True
    if before_create is not None:
        before_create()
    try:
        api.create(kind.resource, job)
    except JobConflict:  # created between our get and create: only adopt if it is ours
        return create_or_adopt(api, kind, job, settings, before_create=None, retry_index=retry_index)
    log.info("created %s %s in namespace %s", kind.resource.kind, name, api.namespace)
    return False


# ------------------------------------------------------------------------------------------------- follow


class _Waiting:
    """What the launcher says while some of the job's pods do not exist, and when a refusal began."""

    def __init__(self) -> None:
        self.refused_since: float | None = None

    def check(self, api: KubeApi, kind: JobKind, job: dict[str, Any], pods: list[dict[str, Any]], pending: str | None,
              now: float, started: float, settings: FollowSettings) -> str | None:
        """The pending line with the job's events sorted in; raises :class:`JobFailed` on a lasting refusal."""
        expected = kind.expected_pods(job)
        if pods and len(pods) >= expected:
            self.refused_since = None
            return pending
        events = job_events(api.warnings(), kind, job)
        by_kind = {k: [e for e in events if event_kind(e) == k] for k in ("queued", "refused", "warning")}
        if not pods:
            pending = f"waiting for the operator to create pods ({describe_conditions(job)})"
        else:
            pending = pending or f"{len(pods)} of {expected} pods created"
        for what, said in (("queued", "queued"), ("refused", "refused"), ("warning", "warnings")):
            if by_kind[what]:
                pending += f"; {said}: {_event_messages(by_kind[what])}"
        if not by_kind["refused"]:
            self.refused_since = None
            return pending
        self.refused_since = now if self.refused_since is None else self.refused_since
        if now - self.refused_since >= settings.no_pods_s:
            have = "no pods" if not pods else f"{len(pods)} of {expected} pods"
            name = job["metadata"]["name"]
            raise JobFailed(f"{kind.resource.kind} {name!r} has {have} after {now - started:.0f}s and the cluster "
                            "refuses to create them, which waiting does not heal: "
                            f"{_event_messages(by_kind['refused'])}. Remove the cause (the quota, the admission "
                            "policy, the pod spec) and run the step again")
        return pending


def follow(api: KubeApi, kind: JobKind, name: str, deadline_s: float, settings: FollowSettings,
           out: Callable[[str], None] = print, adopted: bool = False) -> JobResult:
    """Poll the job to its end, printing the master's log and why pods wait; see the module docstring. Raises
    :class:`JobFailed` when it gives up on the job (deadline, a refusal, an image that cannot be pulled)."""
    logs = LogFollower(api, kind.container, out, settings.tail_lines)
    started = time.monotonic()
    last_pending, pending_said_at = None, 0.0
    waiting, pulls = _Waiting(), PullWatch()
    while True:
        job = api.get(kind.resource, name)
        if job is None:
            raise JobFailed(f"{kind.resource.kind} {name!r} disappeared from namespace {api.namespace!r} before it "
                            "finished (deleted by someone else?)")
        pods = api.pods(kind.pod_selector(name))
        master = [p for p in pods if kind.is_master(p)][:1]
        for pod in master + [p for p in pods if p not in master]:
            try:
                if pod in master:
                    logs.poll(pod)
                else:
                    logs.poll_peer(pod)
            except UserError:
                raise
            except Exception as exc:  # a dropped connection: the next poll reads on from the last timestamp
                log.debug("reading the log of %s failed (%s); retrying", pod["metadata"]["name"], exc)
        state = terminal_state(kind, job)
        pending = None
        now = time.monotonic()
        if state is None:
            pending = waiting.check(api, kind, job, pods, pending_reason(pods), now, started, settings)
            failing = pulls.check(pods, now)
            if failing is not None and failing[2] >= settings.image_pull_s:
                raise JobFailed(_pull_failure(api, kind, name, *failing))
        if pending and (pending != last_pending or now - pending_said_at >= settings.pending_every_s):
            out(f"[launcher] {kind.resource.kind} {name}: {pending} (for {now - started:.0f}s)")
            pending_said_at = now
        last_pending = pending
        if state is not None:
            result = JobResult(name, state == "succeeded", conditions_of(job), adopted, list(logs.tail),
                               dict(logs.peer_crashes))
            out(f"[launcher] {kind.resource.kind} {name}: {state} ({describe_conditions(job)})")
            return result
        if now - started > deadline_s + settings.grace_s:
            raise JobFailed(f"{kind.resource.kind} {name!r} did not finish within its deadline of {deadline_s:.0f}s "
                            f"(+{settings.grace_s:.0f}s grace); conditions: {describe_conditions(job)}"
                            + _tail_text(list(logs.tail), logs.peer_crashes))
        time.sleep(settings.poll_s)


def _tail_text(lines: list[str], peer_crashes: dict[str, list[str]] | None = None) -> str:
    text = ("\nlast log lines of the master:\n  " + "\n  ".join(lines)) if lines else ""
    for pod, crashed in sorted((peer_crashes or {}).items()):
        text += f"\nlast lines of {pod}'s crashed container:\n  " + "\n  ".join(crashed)
    return text


class _Stopped(BaseException):
    """SIGTERM arrived: the launcher pod is being deleted (a node drain, a preemption, a deleted run)."""


def _settle(api: KubeApi, kind: JobKind, name: str, outcome: str, settings: FollowSettings,
            out: Callable[[str], None]) -> None:
    """Delete the job or say why it stays, by how following it ended (see the module docstring, step 4)."""
    what = f"{kind.resource.kind} {name}"
    if outcome in ("succeeded", "given up") and settings.delete:
        if api.delete(kind.resource, name):
            out(f"[launcher] deleted {what}")
    elif outcome == "failed":
        out(f"[launcher] kept the failed {what}: a retry of this step reports it; "
            + ("the run's exit handler deletes it" if settings.delete else "it outlives the run (delete_job=false)"))
    elif outcome == "interrupted":
        out(f"[launcher] left {what} in place: a retry of this step adopts it, the run's exit handler deletes it if "
            "the run ends first")


def run_job(api: KubeApi, kind: JobKind, job: dict[str, Any], deadline_s: float, settings: FollowSettings,
            out: Callable[[str], None] = print, before_create: Callable[[], None] | None = None,
            retry_index: int | None = None) -> JobResult:
    """Create or adopt ``job``, follow it, delete it once it succeeded; raises :class:`JobFailed` unless it succeeded.
    ``retry_index``: which retry of the step this is (default :func:`step_retry_index`)."""
    name = job["metadata"]["name"]
    retry_index = step_retry_index() if retry_index is None else retry_index

    def stop(signum, frame):
        raise _Stopped()

    previous = signal.signal(signal.SIGTERM, stop) if _main_thread() else None
    ours, outcome = False, "interrupted"
    try:
        adopted = create_or_adopt(api, kind, job, settings, before_create, retry_index)
        ours = True
        try:
            result = follow(api, kind, name, deadline_s, settings, out, adopted)
        except JobFailed:
            outcome = "given up"
            raise
        if not result.succeeded:
            outcome = "failed"
            raise JobFailed(f"{kind.resource.kind} {name!r} failed: "
                            f"{describe_conditions({'status': {'conditions': result.conditions}})}"
                            + _tail_text(result.log_tail, result.peer_crashes))
        outcome = "succeeded"
        return result
    except _Stopped:
        outcome = "stopped"
        raise SystemExit(f"stopped (SIGTERM: the launcher pod is being deleted, e.g. a node drain or a preemption): "
                         f"{kind.resource.kind} {name} is left running; a retry of this step adopts it, and the "
                         "run's exit handler deletes it if the run ends first") from None
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
        if ours:
            _settle(api, kind, name, outcome, settings, out)


def _main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()
