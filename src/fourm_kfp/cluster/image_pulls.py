"""Images the kubelet cannot pull: how long each container of the job's pods has failed to pull (:class:`PullWatch`)
and what a user needs to fix it (:func:`pull_failure`: the pod, the image, the kubelet's error read from the pod's
Warning events by its uid, and the fix: a pull secret, a push, the network).
"""

from __future__ import annotations

import logging
import re
from typing import Any

from fourm_kfp.cluster.job_events import event_time_ns
from fourm_kfp.cluster.job_kinds import JobKind
from fourm_kfp.cluster.kube import KubeApi

log = logging.getLogger(__name__)

#: Waiting reasons of a container whose image the kubelet cannot pull.
PULL_ERRORS = frozenset({"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull"})
_PULL_AUTH = re.compile(r"unauthori[sz]ed|authori[sz]|authenticat|denied|forbidden|\b40[13]\b", re.IGNORECASE)
_PULL_MISSING = re.compile(r"not found|manifest unknown|\b404\b", re.IGNORECASE)


class PullWatch:
    """How long each container of the job's pods has failed to pull its image (launcher's clock)."""

    def __init__(self) -> None:
        self.since: dict[tuple[str, str], float] = {}

    def check(self, pods: list[dict[str, Any]], now: float) -> tuple[dict[str, Any], dict[str, Any], float] | None:
        """The pod, container status and seconds of the longest-failing pull, or None when no pull fails. A pull
        counts as failing from the first time it was seen until its container runs (the kubelet retries between)."""
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


def pull_failure(api: KubeApi, kind: JobKind, name: str, pod: dict[str, Any], container: dict[str, Any],
                 seconds: float) -> str:
    """What a user needs about an image that cannot be pulled: the pod, the image, the kubelet's error, the fix."""
    pod_name = pod["metadata"]["name"]
    specs = {c.get("name"): c for c in ((pod.get("spec") or {}).get("initContainers") or [])
             + ((pod.get("spec") or {}).get("containers") or [])}
    image = container.get("image") or specs.get(container.get("name"), {}).get("image", "?")
    waiting = (container.get("state") or {}).get("waiting") or {}
    details = [f"{waiting.get('reason')}: {waiting.get('message', '')}".rstrip(": ")]
    try:  # the kubelet's "Failed" events on this pod (its uid) hold the registry's answer
        pulls = [e for e in api.events(f"involvedObject.uid={pod['metadata'].get('uid')},type=Warning")
                 if e.get("reason") in ("Failed", "ErrImagePull")]
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
