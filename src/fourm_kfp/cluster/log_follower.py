"""The job's log in the step's log: the master's container followed as a stream, and the crashed instances of every
pod's container read at once.

:class:`LogFollower` keeps one follow stream (``read_namespaced_pod_log(follow=True)``) of the master's training
container open on a thread while that container runs; its lines are printed by the launcher's own thread
(:meth:`LogFollower.emit`), in order, each once: every line carries the kubelet's timestamp, and after a dropped
stream, a container restart or a launcher restart the stream resumes with ``sinceSeconds`` reaching a little before
the last line printed (:attr:`SKEW_S`: the node's and the launcher's clocks differ), the repeated lines dropped by
their timestamps. Whenever a container of any pod shows a terminated instance (``lastState.terminated``) newer than
the one last read, that instance's log is read at once with ``previous=True`` (the master's from the last line
printed, another pod's last lines), since on a backoff or deadline failure the operator deletes the pods before it
marks the job Failed.
"""

from __future__ import annotations

import collections
import datetime as dt
import logging
import queue
import threading
import time
from typing import Any, Callable

from fourm_kfp.cluster.kube import KubeApi
from fourm_kfp.errors import UserError

log = logging.getLogger(__name__)


def parse_timestamp(text: str) -> int:
    """Nanoseconds since the epoch of an RFC 3339 timestamp as the kubelet writes it (fraction of any length)."""
    main, _, rest = text.rstrip("Z").partition(".")
    seconds = dt.datetime.fromisoformat(main).replace(tzinfo=dt.timezone.utc).timestamp()
    digits = "".join(ch for ch in rest if ch.isdigit())[:9]
    return int(seconds) * 1_000_000_000 + int(digits.ljust(9, "0") or 0)


def _since(last_ns: int | None, skew_s: int) -> int | None:
    """``sinceSeconds`` reaching ``skew_s`` before the line at ``last_ns`` (None: from the start)."""
    return None if last_ns is None else max(1, int(time.time() - last_ns / 1e9) + skew_s)


class LogFollower:
    """Prints the master's log as it comes and the last lines of every crashed container (see the module docstring).
    The launcher's thread calls :meth:`poll` / :meth:`poll_peer` with each new state of a pod and :meth:`emit` to
    print what the stream brought; :meth:`close` ends the stream."""

    SKEW_S = 60  # ask for this much more history than needed: node and launcher clocks differ

    def __init__(self, api: KubeApi, container: str, out: Callable[[str], None], tail_lines: int, *,
                 retry_s: float = 5.0, idle_s: float = 300.0, news: threading.Event | None = None):
        self.api, self.container, self.out = api, container, out
        self.last_ns: int | None = None
        self.seen_at_last: set[str] = set()
        self.ended: dict[str, tuple] = {}  # pod uid -> the terminated container instance whose log was read
        self.tail: collections.deque[str] = collections.deque(maxlen=tail_lines)
        self.peer_crashes: dict[str, list[str]] = {}  # another pod -> the last lines of its last crashed container
        self.tail_lines, self.retry_s, self.idle_s = tail_lines, retry_s, idle_s
        self.news = news or threading.Event()  # set when the stream brought lines
        self._lines: queue.SimpleQueue[str] = queue.SimpleQueue()
        self._target: tuple | None = None  # (pod, uid, restarts, state, started): the container instance to follow
        self._changed, self._closed = threading.Event(), threading.Event()
        self._thread: threading.Thread | None = None
        self.fatal: UserError | None = None  # the stream may not be read (the Role): raised by emit()

    # ------------------------------------------------------------------------------ the launcher's thread

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

    def emit(self) -> None:
        """Print the lines the stream brought since the last call; raises what made the stream give up."""
        if self.fatal is not None:
            raise self.fatal
        while True:
            try:
                self._emit(self._lines.get_nowait())
            except queue.Empty:
                return

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
        """The master pod's new state: a newly terminated instance's log first (``previous``), then the stream
        follows the instance that runs (or ran to its end)."""
        name = pod["metadata"]["name"]
        status = self._status(pod)
        ended = self._new_termination(pod, status)
        if ended is not None:
            self.emit()  # what the stream brought of that instance first
            self._read_on(name, previous=True)
            self.out(self._crash_line(name, status, ended))
        state = status.get("state") or {}
        current = state.get("running") or state.get("terminated")
        target = None if not current else (name, pod["metadata"].get("uid"), status.get("restartCount"),
                                            "running" if state.get("running") else "terminated",
                                            current.get("startedAt"))
        if target != self._target:
            self._target = target
            self._changed.set()
        if target is not None and self._thread is None:
            self._thread = threading.Thread(target=self._follow, name=f"log {name}", daemon=True)
            self._thread.start()

    def _read_on(self, pod: str, previous: bool) -> None:
        """Print the container's log (``previous``: its last terminated instance) from the last line printed."""
        self._emit(self.api.log(pod, self.container, previous=previous, since_seconds=_since(self.last_ns, self.SKEW_S),
                                tail_lines=1000 if self.last_ns is None else None))

    def finish(self, masters: list[dict[str, Any]]) -> None:
        """At the job's end: what the stream brought, then what the master wrote since (the stream may lag behind
        the job's terminal condition)."""
        self.emit()
        for pod in masters:
            try:
                self._read_on(pod["metadata"]["name"], previous=False)
            except UserError:
                raise
            except Exception as exc:  # the pod gone, the API failing: what was printed stands
                log.debug("reading the log of %s failed (%s)", pod["metadata"]["name"], exc)

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

    def close(self) -> None:
        """End the stream (its thread stops at its next line or timeout) and print what it brought."""
        self._closed.set()
        self._changed.set()
        if self.fatal is None:
            self.emit()

    # ------------------------------------------------------------------------------------ the stream's thread

    def _follow(self) -> None:
        """Follow the target instance; reconnect after a drop, and after its end only once the target changed (or
        after ``retry_s`` while it still reads as running: the end may be the server's, not the container's)."""
        done, read_ns = None, None  # the instance streamed to its end; the newest line read
        while not self._closed.is_set():
            target = self._target
            if target is None or target == done:
                self._changed.wait(self.retry_s)
                self._changed.clear()
                continue
            pod = target[0]
            try:
                for raw in self.api.follow_log(pod, self.container, since_seconds=_since(read_ns, self.SKEW_S),
                                               tail_lines=1000 if read_ns is None else None, idle_s=self.idle_s):
                    try:
                        read_ns = parse_timestamp(raw.partition(" ")[0])
                    except ValueError:
                        pass
                    self._lines.put(raw)
                    self.news.set()
                    if self._closed.is_set():
                        return
                done = target if target[3] == "terminated" else None
            except UserError as exc:  # forbidden: for the launcher's thread to raise
                self.fatal = exc
                self.news.set()
                return
            except Exception as exc:  # a dropped stream, a read timeout of a quiet log: resume from the last line
                log.debug("following the log of %s stopped (%s); resuming", pod, exc)
            self._closed.wait(self.retry_s if done is None else 0)
