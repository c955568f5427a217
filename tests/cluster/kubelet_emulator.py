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
"""

from __future__ import annotations

import asyncio
import datetime as dt
import threading
import time
from dataclasses import dataclass, field


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
