"""Why a job's pods do not run: the pods' pending reasons and the Warning events about the job, sorted into a queue
(wait, however long, up to the queue limit) and a refusal (fail once it lasted ``no_pods_s``).

Events are read with server-side field selectors, never the namespace's whole list (:func:`read_job_events`): by
``involvedObject.uid`` for the objects whose uid the launcher knows (the job, its pods), by ``involvedObject.name``
for what a controller names exactly after the job (Volcano's PodGroup, a TrainJob's JobSet), and by
``involvedObject.kind`` for the kinds whose names only start with the job's (Kueue's Workload
``<kind>-<job>-<hash>``, whose hash differs between Kueue versions; the Jobs of a TrainJob's JobSet), each with
``type=Warning``; those are then kept when named after the job and newer than it (:func:`job_events`).
"""

from __future__ import annotations

import re
from typing import Any

from fourm_kfp.cluster.job_kinds import JobFailed, JobKind, describe_conditions
from fourm_kfp.cluster.kube import KubeApi
from fourm_kfp.cluster.log_follower import parse_timestamp
from fourm_kfp.errors import UserError

#: Objects that hold a job while it waits its turn: a gang scheduler's PodGroup (Volcano posts a Warning
#: "Unschedulable" on it every scheduling cycle while the gang does not fit, and the operator makes no pod
#: meanwhile) and Kueue's Workload (a Warning, "Pending" by default, each time it is not admitted; the job is
#: suspended). Events with these reasons mean a wait for room, on the pods too (the default scheduler).
QUEUE_KINDS = frozenset({"PodGroup", "Workload"})
QUEUE_REASONS = frozenset({"Unschedulable", "FailedScheduling"})
#: Kinds whose objects a controller names ``<job>-…`` or ``…-<job>-…`` (uid unknown to the launcher): Kueue's
#: Workload, and the batch Jobs of a TrainJob's JobSet (where the Job controller reports a pod it could not create).
DERIVED_KINDS = ("Workload", "Job")
#: A controller that could not create a pod (Training Operator v1: FailedCreatePod; the Job controller under a
#: TrainJob's JobSet: FailedCreate) writes "Error creating: <the API server's error>"; these errors do not heal by
#: waiting (a quota the pods exceed, an admission webhook's denial, an invalid pod).
_REFUSAL = re.compile(r"is forbidden|denied the request|is invalid")


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


def read_job_events(api: KubeApi, kind: JobKind, job: dict[str, Any], pods: list[dict[str, Any]]) -> list[dict]:
    """The job's Warning events, oldest first, read by server-side selectors (see the module docstring)."""
    meta = job.get("metadata") or {}
    about = [f"involvedObject.uid={uid}" for uid in [meta.get("uid")] + [p["metadata"].get("uid") for p in pods]
             if uid]
    about += [f"involvedObject.name={meta.get('name', '')}"] + [f"involvedObject.kind={k}" for k in DERIVED_KINDS]
    found: dict[str, dict[str, Any]] = {}
    for selector in about:
        for event in api.events(f"{selector},type=Warning"):
            found[(event.get("metadata") or {}).get("uid") or (event.get("metadata") or {}).get("name", "")] = event
    return job_events(list(found.values()), kind, job)


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


def event_messages(events: list[dict[str, Any]]) -> str:
    """``Reason (object): message`` of each distinct event, the newest last."""
    seen: dict[str, None] = {}
    for event in events:
        about = event.get("involvedObject") or {}
        seen[f"{event.get('reason', '')} ({about.get('kind', '')} {about.get('name', '')}): "
             f"{event.get('message', '')}".strip()] = None
    return "; ".join(list(seen)[-5:])


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


class Waiting:
    """What the launcher says while some of the job's pods do not exist, and when a refusal began. Events are read
    at most every ``every_s``; a read that fails is reported to ``health`` (:class:`.job_watch.ApiHealth`) and the
    last events read stand in."""

    def __init__(self, no_pods_s: float, every_s: float, health) -> None:
        self.no_pods_s, self.every_s, self.health = no_pods_s, every_s, health
        self.refused_since: float | None = None
        self.events: list[dict[str, Any]] = []
        self.read_at: float | None = None

    def _events(self, api: KubeApi, kind: JobKind, job: dict[str, Any], pods: list[dict[str, Any]],
                now: float) -> list[dict[str, Any]]:
        if self.read_at is None or now - self.read_at >= self.every_s:
            self.read_at = now
            try:
                self.events = read_job_events(api, kind, job, pods)
                self.health.ok("events")
            except UserError:
                raise
            except Exception as exc:
                self.health.failed("events", exc)
        return self.events

    def check(self, api: KubeApi, kind: JobKind, job: dict[str, Any], pods: list[dict[str, Any]], now: float,
              started: float) -> str | None:
        """The pending line with the job's events sorted in; raises :class:`JobFailed` on a lasting refusal."""
        pending = pending_reason(pods)
        expected = kind.expected_pods(job)
        if pods and len(pods) >= expected:
            self.refused_since = None
            return pending
        events = self._events(api, kind, job, pods, now)
        by_kind = {k: [e for e in events if event_kind(e) == k] for k in ("queued", "refused", "warning")}
        if not pods:
            pending = f"waiting for the operator to create pods ({describe_conditions(job)})"
        else:
            pending = pending or f"{len(pods)} of {expected} pods created"
        for what, said in (("queued", "queued"), ("refused", "refused"), ("warning", "warnings")):
            if by_kind[what]:
                pending += f"; {said}: {event_messages(by_kind[what])}"
        if not by_kind["refused"]:
            self.refused_since = None
            return pending
        self.refused_since = now if self.refused_since is None else self.refused_since
        if now - self.refused_since >= self.no_pods_s:
            have = "no pods" if not pods else f"{len(pods)} of {expected} pods"
            name = job["metadata"]["name"]
            raise JobFailed(f"{kind.resource.kind} {name!r} has {have} after {now - started:.0f}s and the cluster "
                            "refuses to create them, which waiting does not heal: "
                            f"{event_messages(by_kind['refused'])}. Remove the cause (the quota, the admission "
                            "policy, the pod spec) and run the step again")
        return pending
