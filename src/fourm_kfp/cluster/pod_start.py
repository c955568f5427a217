"""Pods that cannot start: how long each of the job's pods has been kept from starting by something waiting does not
fix (:class:`StartWatch`), and what a user needs to fix it (:meth:`StartWatch.failure`: the pod, the reason, the
missing object or the kubelet's error, and the fix).

Such a pod is often scheduled already and holds its GPUs while it waits: a container whose image cannot be pulled
or whose reference does not parse, whose Secret, ConfigMap or key is missing, or that the container runtime will
not create; or a pod the scheduler will not place because its PersistentVolumeClaim is missing or unbound, or whose
volume the kubelet cannot mount. The launcher fails the job once one of these has lasted its grace
(``image_pull_s``), instead of letting the queue clock run for ``queue_timeout_s``.

The reasons (:data:`CANNOT_START`) are the kubelet's and the scheduler's own strings, each with the upstream file
(kubernetes/kubernetes) that sets it.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from typing import Any

from fourm_kfp.cluster.job_events import event_time_ns
from fourm_kfp.cluster.job_kinds import JobKind
from fourm_kfp.cluster.kube import KubeApi

log = logging.getLogger(__name__)

#: A container's ``state.waiting.reason`` that means it cannot start until someone acts, and where kubelet sets it.
CANNOT_START = {
    "ErrImagePull": "pkg/kubelet/images/types.go (ErrImagePull)",
    "ImagePullBackOff": "pkg/kubelet/images/types.go (ErrImagePullBackOff)",
    "ErrImageNeverPull": "pkg/kubelet/images/types.go (ErrImageNeverPull)",
    "InvalidImageName": "pkg/kubelet/images/types.go (ErrInvalidImageName, from EnsureImageExists)",
    "CreateContainerConfigError": "pkg/kubelet/kuberuntime/kuberuntime_container.go (ErrCreateContainerConfig: "
                                  "the env's Secret, ConfigMap or key missing, makeEnvironmentVariables)",
    "CreateContainerError": "pkg/kubelet/kuberuntime/kuberuntime_container.go (ErrCreateContainer: the runtime's "
                            "CreateContainer failed)",
}
#: Of those, the image pulls (the registry's answer is in the kubelet's "Failed" events).
PULL_REASONS = frozenset({"ErrImagePull", "ImagePullBackOff"})
#: The volume binding plugin's texts in a pod's ``PodScheduled`` condition when its claim is missing, lost or unbound
#: (``pkg/scheduler/framework/plugins/volumebinding/volume_binding.go``, ``podHasPVCs`` and ``PreFilter``).
_CLAIM_UNSCHEDULABLE = re.compile(r'persistentvolumeclaim "[^"]+" (?:not found|bound to non-existent|is being '
                                  r'deleted)|pod has unbound immediate PersistentVolumeClaims')
#: The kubelet's volume manager's event when a scheduled pod's volume cannot be attached or mounted
#: (``pkg/kubelet/events/event.go``, ``FailedMountVolume``).
FAILED_MOUNT = "FailedMount"
_MISSING = re.compile(r'(secret|configmap|persistentvolumeclaim) "([^"]+)" not found'
                      r"|couldn't find key (\S+) in (Secret|ConfigMap) ([^/\s]+)/(\S+)", re.IGNORECASE)
_KINDS = {"secret": "Secret", "configmap": "ConfigMap", "persistentvolumeclaim": "PersistentVolumeClaim"}
_PULL_AUTH = re.compile(r"unauthori[sz]ed|authori[sz]|authenticat|denied|forbidden|\b40[13]\b", re.IGNORECASE)
_PULL_MISSING = re.compile(r"not found|manifest unknown|\b404\b", re.IGNORECASE)


@dataclass(frozen=True)
class Blocked:
    """One pod kept from starting: the pod, its container (None: the pod's scheduling or volumes), the reason and the
    message as the kubelet or scheduler wrote them, and for how long the launcher has seen it."""

    pod: dict[str, Any]
    container: dict[str, Any] | None
    reason: str
    message: str
    seconds: float


def _scheduled(pod: dict[str, Any]) -> bool:
    return any(c.get("type") == "PodScheduled" and str(c.get("status")) == "True"
               for c in (pod.get("status") or {}).get("conditions") or [])


def _claim_problem(pod: dict[str, Any]) -> str | None:
    """The scheduler's message when the pod's PersistentVolumeClaim keeps it from being placed, else None."""
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "PodScheduled" and str(cond.get("status")) == "False" \
                and _CLAIM_UNSCHEDULABLE.search(cond.get("message") or ""):
            return cond["message"]
    return None


class StartWatch:
    """Since when (launcher's clock) each container or pod has been kept from starting; :meth:`check` the longest.
    ``every_s``: how often a scheduled pod whose containers are still being created has its ``FailedMount`` events
    read (by its uid, a server-side selector)."""

    def __init__(self, every_s: float = 30.0) -> None:
        self.since: dict[tuple[str, str], float] = {}
        self.every_s = every_s
        self.mounts: dict[str, tuple[float, str | None]] = {}  # pod uid -> (read at, latest FailedMount message)

    def _mount_problem(self, api: KubeApi, pod: dict[str, Any], now: float) -> str | None:
        uid = pod["metadata"].get("uid") or ""
        read_at, message = self.mounts.get(uid, (None, None))
        if uid and (read_at is None or now - read_at >= self.every_s):
            try:
                events = api.events(f"involvedObject.uid={uid},reason={FAILED_MOUNT},type=Warning")
                message = next((e.get("message") for e in sorted(events, key=event_time_ns, reverse=True)), None)
            except Exception as exc:  # read again at the next turn; the pod keeps its clock meanwhile
                log.debug("reading the events of pod %s failed: %s", pod["metadata"]["name"], exc)
            self.mounts[uid] = (now, message)
        return message

    def check(self, api: KubeApi, pods: list[dict[str, Any]], now: float) -> Blocked | None:
        """The pod kept from starting the longest, or None. A container counts from the first time it was seen with a
        :data:`CANNOT_START` reason until it runs; a pod from the first time its claim kept it unscheduled, or (once
        scheduled, nothing running) the kubelet reported a ``FailedMount``, until that clears."""
        found: Blocked | None = None
        seen: set[tuple[str, str]] = set()

        def note(key: tuple[str, str], pod, container, reason: str, message: str) -> None:
            nonlocal found
            seen.add(key)
            since = self.since.setdefault(key, now)
            if found is None or now - since > found.seconds:
                found = Blocked(pod, container, reason, message, now - since)

        for pod in pods:
            pod_key = pod["metadata"].get("uid") or pod["metadata"]["name"]
            status = pod.get("status") or {}
            containers = (status.get("initContainerStatuses") or []) + (status.get("containerStatuses") or [])
            for container in containers:
                waiting = (container.get("state") or {}).get("waiting") or {}
                if waiting.get("reason") in CANNOT_START:
                    note((pod_key, container.get("name", "")), pod, container, waiting["reason"],
                         waiting.get("message", ""))
            claim = _claim_problem(pod)
            if claim:
                note((pod_key, ""), pod, None, "PersistentVolumeClaim", claim)
            elif status.get("phase") == "Pending" and _scheduled(pod) and not any(
                    (c.get("state") or {}).get("running") for c in containers):
                mount = self._mount_problem(api, pod, now)
                if mount:
                    note((pod_key, ""), pod, None, FAILED_MOUNT, mount)
        for key in set(self.since) - seen:  # started, cleared, or the pod is gone
            del self.since[key]
        return found

    def failure(self, api: KubeApi, kind: JobKind, name: str, blocked: Blocked) -> str:
        """What a user needs: the pod, what cannot start and why, the missing object, the fix."""
        pod_name = blocked.pod["metadata"]["name"]
        what = (f"cannot start its container {blocked.container.get('name')!r}" if blocked.container is not None
                else "cannot start")
        text = f"{blocked.reason}: {blocked.message}".rstrip(": ")
        if blocked.reason in PULL_REASONS:
            text, fix, image = _pull_details(api, blocked, text)
            what = f"cannot pull the image {image} of its container {blocked.container.get('name')!r}"
        else:
            fix = _fix(api.namespace, blocked, _image(blocked))
        return (f"{kind.resource.kind} {name!r}: pod {pod_name} {what} ({blocked.seconds:.0f}s): {text}. "
                f"Fix: {fix}")


def _image(blocked: Blocked) -> str:
    if blocked.container is None:
        return "?"
    spec = blocked.pod.get("spec") or {}
    specs = {c.get("name"): c for c in (spec.get("initContainers") or []) + (spec.get("containers") or [])}
    return blocked.container.get("image") or specs.get(blocked.container.get("name"), {}).get("image", "?")


def missing_object(message: str) -> str | None:
    """The object a kubelet or scheduler message says is missing: ``Secret "x"``, ``key "k" of ConfigMap "x"``."""
    match = _MISSING.search(message or "")
    if match is None:
        return None
    if match.group(1):
        return f'{_KINDS[match.group(1).lower()]} "{match.group(2)}"'
    return f'key "{match.group(3)}" of {match.group(4)} "{match.group(6)}"'


def _fix(namespace: str, blocked: Blocked, image: str) -> str:
    missing = missing_object(blocked.message)
    if blocked.reason == "InvalidImageName":
        return (f"the image reference {image!r} does not parse; the job's pods run the image of this step: build and "
                "compile the pipeline with a valid image reference")
    if blocked.reason == "ErrImageNeverPull":
        return (f"the container's imagePullPolicy is Never and its node has no {image}: load the image onto the GPU "
                "nodes, or let the kubelet pull it (imagePullPolicy IfNotPresent)")
    if missing:
        return (f"{missing} is missing in namespace {namespace!r}: create it (or the key), or make the reference "
                "optional in the job's pod template")
    if blocked.reason == "PersistentVolumeClaim":
        return (f"a PersistentVolumeClaim of the pod is not bound: `kubectl -n {namespace} describe pvc` shows why "
                "(no matching PersistentVolume, a StorageClass that provisions none)")
    if blocked.reason == FAILED_MOUNT:
        return "the kubelet cannot mount a volume of the pod: the message above names it"
    return "the container runtime on the pod's node refused to create the container: the message above says why"


def _pull_details(api: KubeApi, blocked: Blocked, text: str) -> tuple[str, str, str]:
    """The kubelet's pull error read from the pod's Warning events (its uid), the fix, and the image."""
    pod, image = blocked.pod, _image(blocked)
    try:  # the kubelet's "Failed" events on this pod hold the registry's answer
        pulls = [e for e in api.events(f"involvedObject.uid={pod['metadata'].get('uid')},type=Warning")
                 if e.get("reason") in ("Failed", "ErrImagePull")]
    except Exception as exc:  # the failure is reported either way
        log.debug("reading the events of pod %s failed: %s", pod["metadata"]["name"], exc)
        pulls = []
    details = [text] + [e.get("message", "") for e in sorted(pulls, key=event_time_ns)[-1:]
                        if e.get("message") and e.get("message") not in text]
    text = "; ".join(details)
    registry = image.split("/")[0] if "/" in image and any(c in image.split("/")[0] for c in ".:") else "docker.io"
    if _PULL_AUTH.search(text):
        fix = (f"the registry {registry} refused the pull: set the pipeline parameter image_pull_secret to a Secret of "
               f"type kubernetes.io/dockerconfigjson in namespace {api.namespace!r} that may pull {image}")
    elif _PULL_MISSING.search(text):
        fix = f"the registry {registry} has no {image}: push it (the job's pods run the image of this step)"
    else:
        fix = f"check that the cluster's nodes can reach {registry}"
    return text, fix, image
