"""Create a training job, follow it to the end, and delete it: the operator-agnostic half of the launcher.

:func:`run_job` takes a rendered PyTorchJob or TrainJob (:mod:`.job_spec`) and

1. **creates** it, or **adopts** it when a job of that name exists with this launcher's content address and KFP run
   id (a restarted launcher step); an adopted job that already failed is deleted and created afresh (a retry). Any
   other name conflict fails and names the job, never adopting a stranger's or a stale job;
2. **follows** it by polling (every ``poll_s``): the master pod's log goes to ``out`` line by line (read with
   timestamps, so a dropped connection or a launcher restart loses and repeats nothing); whenever a container of
   any pod shows a terminated instance (``lastState.terminated``) newer than the one last read, that instance's log
   is read with ``previous=True`` at once (the master's in full, another pod's last lines), since on a backoff or
   deadline failure the operator deletes the pods before it marks the job Failed; while pods are Pending the
   reason is printed (unschedulable, image pull, init containers) when it changes and once a minute while it does
   not;
   while the operator has made no pods, the Warning events of the job and what it made (admission and quota
   rejections are reported nowhere else) are printed, and when there are still no pods after ``no_pods_s`` and
   such events exist, the launcher fails at once with their messages instead of waiting for the deadline (no
   events: a queued job, e.g. by Kueue, waits);
3. stops at the job's terminal condition (PyTorchJob ``Succeeded``/``Failed``, TrainJob ``Complete``/``Failed``)
   or at the deadline, and raises :class:`JobFailed` with the conditions and the last log lines on failure or
   timeout;
4. **deletes** the job when it is over (``delete=True``), and always when the launcher gets SIGTERM (its pod is
   deleted; a rerun resumes from the newest checkpoint). KFP's launcher does not forward a stopped run's SIGTERM to
   the step: the pipeline's exit handler deletes a stopped run's jobs (:mod:`.stop_jobs`).
"""

from __future__ import annotations

import collections
import datetime as dt
import logging
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


def _labels(pod: dict[str, Any]) -> dict[str, str]:
    return pod.get("metadata", {}).get("labels") or {}


PYTORCHJOB = JobKind(
    resource=Resource("kubeflow.org", "v1", "pytorchjobs", "PyTorchJob"),
    container="pytorch",
    pod_selector=lambda name: f"training.kubeflow.org/job-name={name}",
    is_master=lambda pod: _labels(pod).get("training.kubeflow.org/replica-type", "").lower() == "master",
    succeeded="Succeeded",
)
TRAINJOB = JobKind(
    resource=Resource("trainer.kubeflow.org", "v1alpha1", "trainjobs", "TrainJob"),
    container="node",
    pod_selector=lambda name: f"jobset.sigs.k8s.io/jobset-name={name}",
    is_master=lambda pod: (_labels(pod).get("jobset.sigs.k8s.io/job-index") == "0"
                           and _labels(pod).get("batch.kubernetes.io/job-completion-index", "0") == "0"),
    succeeded="Complete",
)
JOB_KINDS = {job_spec.PYTORCHJOB: PYTORCHJOB, job_spec.TRAINJOB: TRAINJOB}


class JobFailed(UserError):
    """The job failed or ran out of time; the message holds its conditions and the master's last log lines."""


@dataclass
class FollowSettings:
    poll_s: float = 5.0
    grace_s: float = 600.0  # past the job's own deadline, for the operator to mark it failed
    delete: bool = True
    tail_lines: int = 40  # log lines quoted in a failure
    pending_every_s: float = 60.0  # repeat an unchanged pending reason this often
    no_pods_s: float = 600.0  # no pods this long and Warning events about the job: fail with them


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


def create_or_adopt(api: KubeApi, kind: JobKind, job: dict[str, Any], settings: FollowSettings,
                    before_create: Callable[[], None] | None = None) -> bool:
    """Create ``job``, or adopt the existing one of that name if it is ours; returns whether it was adopted."""
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
        return create_or_adopt(api, kind, job, settings, before_create=None)
    log.info("created %s %s in namespace %s", kind.resource.kind, name, api.namespace)
    return False


# ------------------------------------------------------------------------------------------------- follow


def follow(api: KubeApi, kind: JobKind, name: str, deadline_s: float, settings: FollowSettings,
           out: Callable[[str], None] = print, adopted: bool = False) -> JobResult:
    """Poll the job to its end, printing the master's log and why pods wait; see the module docstring."""
    logs = LogFollower(api, kind.container, out, settings.tail_lines)
    started = time.monotonic()
    last_pending, pending_said_at = None, 0.0
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
        pending = pending_reason(pods) if state is None else None
        now = time.monotonic()
        if not pods and state is None:
            refused = _event_messages(api.warnings(name))
            pending = f"waiting for the operator to create pods ({describe_conditions(job)})" + (
                f"; warnings: {refused}" if refused else "")
            if refused and now - started > settings.no_pods_s:
                raise JobFailed(f"{kind.resource.kind} {name!r} has no pods after {now - started:.0f}s and the "
                                f"cluster reports: {refused}")
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


def _event_messages(events: list[dict[str, Any]]) -> str:
    """``Reason (object): message`` of each distinct event, the newest last."""
    seen: dict[str, None] = {}
    for event in events:
        about = event.get("involvedObject") or {}
        seen[f"{event.get('reason', '')} ({about.get('kind', '')} {about.get('name', '')}): "
             f"{event.get('message', '')}".strip()] = None
    return "; ".join(list(seen)[-5:])


def _tail_text(lines: list[str], peer_crashes: dict[str, list[str]] | None = None) -> str:
    text = ("\nlast log lines of the master:\n  " + "\n  ".join(lines)) if lines else ""
    for pod, crashed in sorted((peer_crashes or {}).items()):
        text += f"\nlast lines of {pod}'s crashed container:\n  " + "\n  ".join(crashed)
    return text


class _Stopped(BaseException):
    """SIGTERM arrived (the KFP run was stopped)."""


def run_job(api: KubeApi, kind: JobKind, job: dict[str, Any], deadline_s: float, settings: FollowSettings,
            out: Callable[[str], None] = print, before_create: Callable[[], None] | None = None) -> JobResult:
    """Create or adopt ``job``, follow it, delete it; raises :class:`JobFailed` unless it succeeded."""
    name = job["metadata"]["name"]

    def stop(signum, frame):
        raise _Stopped()

    previous = signal.signal(signal.SIGTERM, stop) if _main_thread() else None
    delete, ours = settings.delete, False
    try:
        adopted = create_or_adopt(api, kind, job, settings, before_create)
        ours = True
        result = follow(api, kind, name, deadline_s, settings, out, adopted)
        if not result.succeeded:
            raise JobFailed(f"{kind.resource.kind} {name!r} failed: "
                            f"{describe_conditions({'status': {'conditions': result.conditions}})}"
                            + _tail_text(result.log_tail, result.peer_crashes))
        return result
    except _Stopped:
        delete = True  # a stopped run leaves nothing running; a rerun resumes from the last checkpoint
        raise SystemExit(f"stopped: deleting {kind.resource.kind} {name}")
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
        if ours and delete and api.delete(kind.resource, name):
            out(f"[launcher] deleted {kind.resource.kind} {name}")


def _main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()
