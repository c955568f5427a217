"""The kubelet's side of ``pods/<name>/log`` in the emulated cluster (:mod:`tests.cluster.kube_emulator`): container
logs the test writes, served as the kubelet serves them through the API server.

- every line is kept with the time it was written, per container instance (:meth:`Kubelet.restart` starts the next
  one, as the kubelet restarts a crashed container);
- ``timestamps`` prefixes each line with its time in RFC 3339 with nanoseconds, trailing zeros cut
  (``pkg/kubelet/kuberuntime/logs/logs.go``, ``timestampFormat``); ``sinceSeconds`` / ``sinceTime`` keep the lines
  written at or after that time, ``tailLines`` the last N, ``previous`` reads the instance before the current one
  (``PodLogOptions``, ``staging/src/k8s.io/api/core/v1/types.go``);
- ``follow`` streams the instance that is current when the request comes: what it has, then each line as it is
  written, and ends once that instance ended (restarted, :meth:`Kubelet.end`, or its pod deleted) and its last lines
  were sent: the kubelet's follow reader drains the log file after the container stops (``logs.go``,
  ``ReadLogs``: ``waitLogs`` checks the container's state and returns once it is not running);
- :attr:`Kubelet.fail_next` makes that many reads fail (the API server answers 500 when the kubelet cannot be reached).

Whether a scheduled pod's containers can be created (:func:`container_start`), as the kubelet decides it (upstream
kubernetes/kubernetes, master at 2026-12):

- the image reference must parse, else the container waits ``InvalidImageName`` with "Failed to apply default image
  tag ..."; with ``imagePullPolicy: Never`` the image must be on the node (:attr:`Kubelet.node_images`), else
  ``ErrImageNeverPull`` "Container image ... is not present with pull policy of Never"
  (``pkg/kubelet/images/image_manager.go``, ``EnsureImageExists``; the reasons in ``pkg/kubelet/images/types.go``);
- every ``envFrom`` Secret/ConfigMap and every ``env[].valueFrom`` ``secretKeyRef``/``configMapKeyRef`` must exist
  (and hold its key), unless ``optional: true``; else ``CreateContainerConfigError`` with the API's NotFound text
  (``secret "x" not found``) or "couldn't find key K in Secret ns/x" (``pkg/kubelet/kubelet_pods.go``,
  ``makeEnvironmentVariables``; the reason set in ``pkg/kubelet/kuberuntime/kuberuntime_container.go``,
  ``startContainer``);
- :attr:`Kubelet.runtime_errors` (pod -> message): the container runtime refusing to create the container,
  ``CreateContainerError`` (``kuberuntime_container.go``), which nothing in the spec predicts.

Volume mounts (a missing Secret or ConfigMap volume: ``FailedMount``) are played by
:meth:`tests.cluster.kube_emulator.EmulatedCluster.sync_pod`. Not emulated: image pulls (a test sets
``ErrImagePull``/``ImagePullBackOff`` itself), other volume kinds' mounts, probes, restarts on their own.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import re
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

#: A container image reference as the kubelet's parser accepts it (distribution's reference grammar, lower-case
#: repository path, optional registry host:port, tag and digest).
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
IMAGE_REFERENCE = re.compile(rf"^(?:[A-Za-z0-9.-]+(?::[0-9]+)?/)?{_COMPONENT}(?:/{_COMPONENT})*"
                             r"(?::[\w][\w.-]{0,127})?(?:@sha256:[0-9a-f]{64})?$")


def rfc3339(seconds: float) -> str:
    stamp = dt.datetime.fromtimestamp(seconds, dt.timezone.utc)
    return stamp.strftime("%Y-%m-%dT%H:%M:%S.") + f"{stamp.microsecond:06d}".rstrip("0").ljust(1, "0") + "Z"


def _true(value: str | None) -> bool:
    """A boolean query parameter as the API server parses it (``strconv.ParseBool``)."""
    return (value or "") in ("1", "t", "T", "true", "TRUE", "True")


@dataclass
class Kubelet:
    """Container logs of the emulated pods: ``(pod, container, instance)`` -> [(time, line)]."""

    logs: dict[tuple[str, str, int], list[tuple[float, str]]] = field(default_factory=dict)
    instance: dict[tuple[str, str], int] = field(default_factory=dict)
    ended: set[tuple[str, str, int]] = field(default_factory=set)  # instances that stopped and were not restarted
    gone: set[str] = field(default_factory=set)  # deleted pods
    fail_next: int = 0  # make this many log reads fail with HTTP 500 (the kubelet out of reach)
    runtime_errors: dict[str, str] = field(default_factory=dict)  # pod -> the runtime's CreateContainer error
    node_images: set[str] = field(default_factory=set)  # images present on the node (imagePullPolicy: Never)
    reads: int = 0
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

    def end(self, pod: str, container: str) -> None:
        """The current instance stopped (completed or crashed, not restarted yet)."""
        with self.lock:
            self.ended.add((pod, container, self.instance.get((pod, container), 0)))

    def delete(self, pod: str) -> None:
        """The pod was deleted: its containers stopped."""
        with self.lock:
            self.gone.add(pod)

    def create(self, pod: str) -> None:
        """A pod of that name was created (again)."""
        with self.lock:
            self.gone.discard(pod)

    def take_failure(self) -> bool:
        with self.lock:
            self.reads += 1
            if self.fail_next:
                self.fail_next -= 1
                return True
            return False

    def _instance(self, pod: str, params) -> tuple[str, int]:
        container = params.get("container", "")
        current = self.instance.get((pod, container), 0)
        return container, current - 1 if _true(params.get("previous")) else current

    @staticmethod
    def _since(params) -> float | None:
        if "sinceSeconds" in params:
            return time.time() - int(params["sinceSeconds"])
        if "sinceTime" in params:
            return dt.datetime.fromisoformat(params["sinceTime"].replace("Z", "+00:00")).timestamp()
        return None

    def _lines(self, pod: str, params) -> tuple[tuple[str, str, int], list[tuple[float, str]], int]:
        """The instance asked for, its lines as selected by ``sinceSeconds``/``sinceTime``/``tailLines``, and how
        many lines it has."""
        with self.lock:
            container, instance = self._instance(pod, params)
            key = (pod, container, instance)
            lines = list(self.logs.get(key, []))
        total, since = len(lines), self._since(params)
        if since is not None:
            lines = [(t, s) for t, s in lines if t >= since]
        if "tailLines" in params:
            lines = lines[-int(params["tailLines"]):]
        return key, lines, total

    def read(self, pod: str, params) -> str:
        """The log as one answer (no ``follow``)."""
        return self.format(self._lines(pod, params)[1], params)

    @staticmethod
    def format(lines: list[tuple[float, str]], params) -> str:
        stamp = _true(params.get("timestamps"))
        return "".join(f"{rfc3339(t)} {s}\n" if stamp else f"{s}\n" for t, s in lines)

    async def follow(self, pod: str, params, write) -> None:
        """Stream the current instance's log through ``write`` (an async callable) until that instance ended."""
        key, lines, sent = self._lines(pod, params)
        pod, container, instance = key
        if lines:
            await write(self.format(lines, params).encode())
        while True:
            with self.lock:
                lines = self.logs.get(key, [])[sent:]
                sent += len(lines)
                over = (key in self.ended or pod in self.gone
                        or self.instance.get((pod, container), 0) != instance)
            if lines:
                await write(self.format(lines, params).encode())
            if over:
                return
            await asyncio.sleep(0.02)


def _env_error(namespace: str, env: dict[str, Any], read: Callable[[str, str], dict | None]) -> str | None:
    """What ``makeEnvironmentVariables`` returns for one ``env`` entry (None: it resolves, or may be left out)."""
    source = env.get("valueFrom") or {}
    for ref_key, kind in (("secretKeyRef", "Secret"), ("configMapKeyRef", "ConfigMap")):
        ref = source.get(ref_key)
        if ref is None:
            continue
        found, optional = read(kind, ref["name"]), bool(ref.get("optional"))
        if found is None:
            return None if optional else f'{kind.lower()} "{ref["name"]}" not found'
        data = {**(found.get("data") or {}), **(found.get("stringData") or {})}
        if kind == "ConfigMap":
            data.update(found.get("binaryData") or {})
        if ref["key"] not in data and not optional:
            return f"couldn't find key {ref['key']} in {kind} {namespace}/{ref['name']}"
    return None


def container_start(pod: dict[str, Any], namespace: str, read: Callable[[str, str], dict | None],
                    runtime_error: str | None = None, node_images: set[str] = frozenset()
                    ) -> dict[str, dict[str, str] | None]:
    """Each container of a scheduled ``pod``: the ``waiting`` state the kubelet gives it when it cannot create it,
    or None when it starts (see the module docstring). ``read(kind, name)``: the Secret or ConfigMap, None if
    absent."""
    states: dict[str, dict[str, str] | None] = {}
    for container in pod["spec"]["containers"]:
        image = container.get("image", "")
        if not IMAGE_REFERENCE.match(image):
            states[container["name"]] = {
                "reason": "InvalidImageName",
                "message": f'Failed to apply default image tag "{image}": couldn\'t parse image name "{image}": '
                           "invalid reference format"}
            continue
        if container.get("imagePullPolicy") == "Never" and image not in node_images:
            states[container["name"]] = {
                "reason": "ErrImageNeverPull",
                "message": f'Container image "{image}" is not present with pull policy of Never'}
            continue
        error = None
        for source in container.get("envFrom") or []:
            for ref_key, kind in (("secretRef", "Secret"), ("configMapRef", "ConfigMap")):
                ref = source.get(ref_key)
                if error is None and ref is not None and read(kind, ref["name"]) is None and not ref.get("optional"):
                    error = f'{kind.lower()} "{ref["name"]}" not found'
        for env in container.get("env") or []:
            error = error or _env_error(namespace, env, read)
        if error:
            states[container["name"]] = {"reason": "CreateContainerConfigError", "message": error}
        elif runtime_error:
            states[container["name"]] = {"reason": "CreateContainerError", "message": runtime_error}
        else:
            states[container["name"]] = None
    return states
