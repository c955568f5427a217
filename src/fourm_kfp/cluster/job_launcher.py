"""Create a training job, follow it to the end, and delete it once it succeeded: the operator-agnostic half of the
launcher.

:func:`run_job` takes a rendered PyTorchJob or TrainJob (:mod:`.job_spec`) and

1. **creates** it, or **adopts** it when a job of that name exists with this launcher's content address
   (:mod:`.job_adoption`: the step's retry after its launcher pod was lost, a create whose answer was lost, or a rerun
   of the same configuration while the job a lost launcher left behind still runs). This run's job that already
   failed is replaced only on a first attempt of the step (``KFP_RETRY_INDEX`` = 0), else reported as failed, so
   that step retries never multiply its restart budget;
2. **follows** it (:func:`follow`): the job and its pods are watched (:mod:`.job_watch`), the master's log is
   streamed to ``out`` line by line and every crashed container's last lines are read at once
   (:mod:`.log_follower`); while pods are Pending the reason is printed when it changes and every
   ``pending_every_s``; while some pods do not exist, the job's Warning events are read by server-side selectors
   and sorted into a queue (said, waited for) or a refusal that waiting does not heal (quota, admission webhook,
   invalid pod: fails once it lasted ``no_pods_s``) (:mod:`.job_events`); a pod that cannot start for
   ``image_pull_s`` (an image that cannot be pulled or does not parse, a missing Secret, ConfigMap, key or
   PersistentVolumeClaim, a volume that cannot be mounted, the runtime refusing the container) fails it, naming the
   pod, the reason, the missing object or the kubelet's error, and the fix (:mod:`.pod_start`).
   **Two clocks**: until all the pods the job asks for have run at once, its wait counts against ``queue_s`` (the
   pipeline parameter ``queue_timeout_s``: queued in Volcano or Kueue, unschedulable); from that moment its
   ``deadline_s`` (+ ``grace_s``) counts, so a day in the queue does not eat the training's time. An adopted job's
   clocks start when this launcher first sees it. The Kubernetes API failing is retried (``api_outage_s``);
3. stops at the job's terminal condition (PyTorchJob ``Succeeded``/``Failed``, TrainJob ``Complete``/``Failed``) or
   at a limit, and raises :class:`JobFailed` with the conditions and the last log lines on failure or timeout;
4. **deletes** the job when it succeeded, and when the launcher gives up on it (a refusal, a pod that cannot
   start, the queue limit, its deadline), both unless ``delete=False``. A job that **failed** is kept: the step's
   retry finds and reports it, and the run's exit handler deletes it when the run ends (:mod:`.stop_jobs`, which
   also says who else cleans up). When the API stays unreachable past ``api_outage_s``, and on SIGTERM (the launcher
   pod deleted: a node drain, a preemption), the launcher exits and leaves the job running for the step's retry to
   adopt; the job is not owned by the launcher pod (:mod:`fourm_kfp.launchers.kubernetes_job`). Argo retries the
   step only when its controller saw the pod fail (with ``ARGO_POD_STATUS_CAPTURE_FINALIZER=true``, or when the
   pod ended before it was deleted); a pod deleted first ends ``Error`` and is not retried: the run fails, its exit
   handler reports the job still running and deletes it unless ``<stage>_delete_job=false``, and a rerun of the
   same configuration adopts a job still running. KFP's launcher does not forward a stopped run's SIGTERM to the
   step: the pipeline's exit handler deletes a stopped run's jobs.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from fourm_kfp.cluster.pod_start import StartWatch
from fourm_kfp.cluster.job_adoption import create_or_adopt, step_retry_index
from fourm_kfp.cluster.job_events import Waiting
from fourm_kfp.cluster.job_kinds import (JOB_KINDS, PYTORCHJOB, TRAINJOB, JobFailed, JobKind, conditions_of,
                                         describe_conditions, running_pods, terminal_state)
from fourm_kfp.cluster.job_watch import ApiHealth, ApiOutage, JobFeed
from fourm_kfp.cluster.kube import KubeApi
from fourm_kfp.cluster.log_follower import LogFollower
from fourm_kfp.errors import UserError

__all__ = ["JOB_KINDS", "PYTORCHJOB", "TRAINJOB", "FollowSettings", "JobFailed", "JobResult", "follow", "run_job"]

log = logging.getLogger(__name__)


@dataclass
class FollowSettings:
    """How the launcher follows a job; times in seconds."""

    poll_s: float = 5.0  # check the clocks, read events while pods are missing, retry after an API error this often
    grace_s: float = 600.0  # past the job's own deadline, for the operator to mark it failed
    delete: bool = True  # delete the job once it succeeded or was given up on (``<stage>_delete_job``)
    tail_lines: int = 40  # log lines quoted in a failure
    pending_every_s: float = 60.0  # repeat an unchanged pending reason this often
    no_pods_s: float = 300.0  # pods missing and the cluster refusing them (cannot heal) this long: fail
    image_pull_s: float = 600.0  # a pod kept from starting this long (image pull, config, volume): fail (pull back-off
    # tops at 300)
    queue_s: float = 86400.0  # waiting before all expected pods run (Volcano, Kueue, unschedulable): queue_timeout_s
    api_outage_s: float = 900.0  # the Kubernetes API failing this long (after the client's retries): give up
    watch_s: float = 300.0  # a watch's server-side timeout, and how long a quiet log stream is kept open


@dataclass
class JobResult:
    name: str
    succeeded: bool
    conditions: list[dict[str, Any]]
    adopted: bool
    log_tail: list[str] = field(default_factory=list)
    peer_crashes: dict[str, list[str]] = field(default_factory=dict)  # other pods' last crashed lines


def _tail_text(lines: list[str], peer_crashes: dict[str, list[str]] | None = None) -> str:
    text = ("\nlast log lines of the master:\n  " + "\n  ".join(lines)) if lines else ""
    for pod, crashed in sorted((peer_crashes or {}).items()):
        text += f"\nlast lines of {pod}'s crashed container:\n  " + "\n  ".join(crashed)
    return text


class _Clock:
    """The queue clock until all expected pods run at once, the deadline clock from then (module docstring, 2)."""

    def __init__(self, kind: JobKind, name: str, deadline_s: float, settings: FollowSettings,
                 out: Callable[[str], None]):
        self.kind, self.name, self.deadline_s, self.settings, self.out = kind, name, deadline_s, settings, out
        self.started, self.running_since = time.monotonic(), None

    def check(self, job: dict[str, Any], pods: list[dict[str, Any]], pending: str | None, now: float,
              logs: LogFollower) -> None:
        what = f"{self.kind.resource.kind} {self.name!r}"
        expected, running = self.kind.expected_pods(job), running_pods(pods)
        if self.running_since is None and running >= expected:
            self.running_since = now
            self.out(f"[launcher] {self.kind.resource.kind} {self.name}: all {expected} pods run after "
                     f"{now - self.started:.0f}s; its deadline of {self.deadline_s:.0f}s counts from now")
        if self.running_since is None and now - self.started > self.settings.queue_s:
            raise JobFailed(f"{what} waited in the queue longer than queue_s={self.settings.queue_s:g}s: "
                            f"{running} of {expected} pods running after {now - self.started:.0f}s"
                            + (f" ({pending})" if pending else "") + ". Free room for it, or raise the pipeline "
                            "parameter queue_timeout_s (the seconds a job may wait for all its pods to run)")
        if self.running_since is not None and now - self.running_since > self.deadline_s + self.settings.grace_s:
            raise JobFailed(f"{what} did not finish within its deadline of {self.deadline_s:.0f}s "
                            f"(+{self.settings.grace_s:.0f}s grace) after its pods started; conditions: "
                            f"{describe_conditions(job)}" + _tail_text(list(logs.tail), logs.peer_crashes))


def _read_logs(logs: LogFollower, kind: JobKind, pods: list[dict[str, Any]]) -> None:
    """The master's new state to the log follower, and every other pod's crashes; errors are read again later."""
    master = [p for p in pods if kind.is_master(p)][:1]
    for pod in master + [p for p in pods if p not in master]:
        try:
            logs.poll(pod) if pod in master else logs.poll_peer(pod)
        except UserError:
            raise
        except Exception as exc:  # a dropped connection: the crashed instance is read at the next news
            logs.ended.pop(pod["metadata"].get("uid", pod["metadata"]["name"]), None)
            logs.news.set()
            log.debug("reading the log of %s failed (%s)", pod["metadata"]["name"], exc)
    logs.emit()


def follow(api: KubeApi, kind: JobKind, name: str, deadline_s: float, settings: FollowSettings,
           out: Callable[[str], None] = print, adopted: bool = False) -> JobResult:
    """Follow the job to its end, printing the master's log and why pods wait; see the module docstring. Raises
    :class:`JobFailed` when it gives up on the job (a limit, a refusal, a pod that cannot start)."""
    news = threading.Event()
    health = ApiHealth(settings.api_outage_s, out)
    logs = LogFollower(api, kind.container, out, settings.tail_lines, retry_s=settings.poll_s,
                       idle_s=settings.watch_s, news=news)
    clock, starts = _Clock(kind, name, deadline_s, settings, out), StartWatch(max(settings.poll_s, 30.0))
    waiting = Waiting(settings.no_pods_s, settings.poll_s, health)
    last_pending, pending_said_at = None, 0.0
    with JobFeed(api, kind, name, health, news, watch_s=settings.watch_s, retry_s=settings.poll_s) as feed:
        try:
            while True:
                news.wait(settings.poll_s)
                news.clear()
                now = time.monotonic()
                health.check(now)
                job, pods = feed.state()
                if not feed.listed:
                    continue
                if job is None:
                    raise JobFailed(f"{kind.resource.kind} {name!r} disappeared from namespace {api.namespace!r} "
                                    "before it finished (deleted by someone else?)")
                _read_logs(logs, kind, pods)
                state = terminal_state(kind, job)
                if state is not None:
                    logs.finish([p for p in pods if kind.is_master(p)][:1])
                    out(f"[launcher] {kind.resource.kind} {name}: {state} ({describe_conditions(job)})")
                    return JobResult(name, state == "succeeded", conditions_of(job), adopted, list(logs.tail),
                                     dict(logs.peer_crashes))
                pending = waiting.check(api, kind, job, pods, now, clock.started)
                blocked = starts.check(api, pods, now)
                if blocked is not None and blocked.seconds >= settings.image_pull_s:
                    raise JobFailed(starts.failure(api, kind, name, blocked))
                if pending and (pending != last_pending or now - pending_said_at >= settings.pending_every_s):
                    out(f"[launcher] {kind.resource.kind} {name}: {pending} (for {now - clock.started:.0f}s)")
                    pending_said_at = now
                last_pending = pending
                clock.check(job, pods, pending, now, logs)
        finally:
            logs.close()


class _Stopped(BaseException):
    """SIGTERM arrived: the launcher pod is being deleted (a node drain, a preemption, a deleted run)."""


def _settle(api: KubeApi, kind: JobKind, name: str, outcome: str, settings: FollowSettings,
            out: Callable[[str], None]) -> None:
    """Delete the job or say why it stays, by how following it ended (see the module docstring, step 4)."""
    what = f"{kind.resource.kind} {name}"
    if outcome in ("succeeded", "given up") and settings.delete:
        try:
            if api.delete(kind.resource, name):
                out(f"[launcher] deleted {what}")
        except UserError:
            raise  # forbidden: the Role to fix
        except Exception as exc:  # the API still failing after the client's retries: the exit handler deletes it
            out(f"[launcher] could not delete {what} ({exc}): the run's exit handler deletes it")
    elif outcome == "failed":
        out(f"[launcher] kept the failed {what}: a retry of this step reports it; "
            + ("the run's exit handler deletes it" if settings.delete else "it outlives the run (delete_job=false)"))
    elif outcome == "interrupted":
        out(f"[launcher] left {what} in place: a retry of this step (or a rerun of the same configuration) adopts "
            "it; if the run ends first, its exit handler reports it and deletes it unless delete_job=false")


def run_job(api: KubeApi, kind: JobKind, job: dict[str, Any], deadline_s: float, settings: FollowSettings,
            out: Callable[[str], None] = print, before_create: Callable[[], None] | None = None,
            retry_index: int | None = None) -> JobResult:
    """Create or adopt ``job``, follow it, delete it once it succeeded; raises :class:`JobFailed` unless it succeeded.
    ``retry_index``: which attempt of the step this is (default :func:`.job_adoption.step_retry_index`)."""
    name = job["metadata"]["name"]
    retry_index = step_retry_index() if retry_index is None else retry_index

    def stop(signum, frame):
        raise _Stopped()

    previous = signal.signal(signal.SIGTERM, stop) if threading.current_thread() is threading.main_thread() else None
    ours, outcome = False, "interrupted"
    try:
        adopted = create_or_adopt(api, kind, job, settings.poll_s, before_create, retry_index)
        ours = True
        try:
            result = follow(api, kind, name, deadline_s, settings, out, adopted)
        except ApiOutage:
            raise  # the job runs on: "interrupted"
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
                         f"{kind.resource.kind} {name} is left running; a retry of this step adopts it (Argo retries a "
                         "deleted pod only under the status-capture finalizer), and if the run ends first its exit "
                         "handler reports it and deletes it unless delete_job=false (then a rerun of the same "
                         "configuration adopts it)") from None
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
        if ours:
            _settle(api, kind, name, outcome, settings, out)
