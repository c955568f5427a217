"""The job and its pods as the launcher sees them: kept current by watches on background threads, through API
outages up to a limit.

:class:`Watched` lists one kind of object by selector and then watches it (``kubernetes.watch.Watch`` from the
list's ``resourceVersion``, ``timeoutSeconds`` = ``watch_s``), keeping a copy of the objects: when the server ends a
watch it resumes from the last version seen; when that version has expired (HTTP 410), or after an error, it lists
again. :class:`JobFeed` is the pair the launcher follows a job with: the job by its name (``fieldSelector
metadata.name=…``) and its pods by the operator's label; each change sets ``news``, which the launcher's loop waits
on.

A dropped stream is listed again at once; an error that survives the client's own retries
(:func:`.kube.api_retries`) and that second try is logged, and the thread tries again every ``poll_s``;
:class:`ApiHealth` counts how long each source (the job, its pods, events) has failed without an
answer in between, says so in the step's log, and makes the launcher give up (:class:`ApiOutage`, leaving the job
running for the step's retry to adopt) once one has failed longer than ``api_outage_s``. A 403 or another
:class:`~fourm_kfp.errors.UserError` is not retried: the launcher raises it.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable

from fourm_kfp.cluster.job_kinds import JobFailed, JobKind
from fourm_kfp.cluster.kube import PODS, Expired, KubeApi, Resource
from fourm_kfp.errors import UserError

log = logging.getLogger(__name__)


class ApiOutage(JobFailed):
    """The Kubernetes API has not answered for longer than ``api_outage_s``: the job is left running."""


class ApiHealth:
    """Since when each source of the launcher's reads has failed (none: it answered last time)."""

    def __init__(self, limit_s: float, out: Callable[[str], None]):
        self.limit_s, self.out = limit_s, out
        self.failing: dict[str, tuple[float, str]] = {}  # source -> (first failure, last error)
        self.said: set[str] = set()
        self.lock = threading.Lock()

    def ok(self, source: str) -> None:
        with self.lock:
            self.failing.pop(source, None)

    def failed(self, source: str, exc: BaseException) -> None:
        text = " ".join(str(exc).split())[:300] or type(exc).__name__
        with self.lock:
            since = self.failing.get(source, (time.monotonic(), ""))[0]
            self.failing[source] = (since, text)
        log.warning("reading %s from the Kubernetes API failed (%s); trying again", source, text)

    def check(self, now: float) -> None:
        """Say when a source starts or stops failing (on the launcher's thread); raise :class:`ApiOutage` when one
        has failed for longer than the limit."""
        with self.lock:
            failing = dict(self.failing)
        for source in sorted(self.said - set(failing)):
            self.out(f"[launcher] the Kubernetes API answers again ({source})")
            self.said.discard(source)
        for source, (since, error) in sorted(failing.items()):
            if source not in self.said:
                self.said.add(source)
                self.out(f"[launcher] the Kubernetes API does not answer ({source}: {error}); trying again for up "
                         f"to {self.limit_s:.0f}s (api_outage_s), the job runs on meanwhile")
            if now - since > self.limit_s:
                raise ApiOutage(f"the Kubernetes API has not answered the launcher for {now - since:.0f}s (reading "
                                f"{source}; limit api_outage_s={self.limit_s:g}s): {error}. The job was left "
                                "running; a retry of this step adopts it")


class Watched(threading.Thread):
    """A list and then a watch of the objects of ``resource`` matching the selectors, as a dict by name."""

    def __init__(self, api: KubeApi, resource: Resource, source: str, news: threading.Event, health: ApiHealth, *,
                 labels: str = "", fields: str = "", watch_s: float = 300.0, retry_s: float = 5.0):
        super().__init__(name=f"watch {source}", daemon=True)
        self.api, self.resource, self.source, self.news, self.health = api, resource, source, news, health
        self.labels, self.fields, self.watch_s, self.retry_s = labels, fields, watch_s, retry_s
        self.objects: dict[str, dict[str, Any]] = {}
        self.listed = False  # the first list has come
        self.fatal: UserError | None = None
        self.lock, self.stopped = threading.Lock(), threading.Event()

    def snapshot(self) -> dict[str, dict[str, Any]]:
        with self.lock:
            return dict(self.objects)

    def _apply(self, type_: str, obj: dict[str, Any]) -> str:
        name = (obj.get("metadata") or {}).get("name", "")
        with self.lock:
            if type_ == "DELETED":
                self.objects.pop(name, None)
            elif type_ in ("ADDED", "MODIFIED"):
                self.objects[name] = obj
        self.news.set()
        return str((obj.get("metadata") or {}).get("resourceVersion") or "")

    def run(self) -> None:
        version, again = "", False  # again: a watch failed since the last one that worked
        while not self.stopped.is_set():
            try:
                if not version:
                    items, version = self.api.snapshot(self.resource, labels=self.labels, fields=self.fields)
                    with self.lock:
                        self.objects = {item["metadata"]["name"]: item for item in items}
                        self.listed = True
                    self.health.ok(self.source)
                    self.news.set()
                for type_, obj in self.api.watch(self.resource, version, int(self.watch_s), labels=self.labels,
                                                 fields=self.fields):
                    if self.stopped.is_set():
                        return
                    again = False
                    if type_ in ("ADDED", "MODIFIED", "DELETED"):
                        version = self._apply(type_, obj) or version
                again = False  # the server ended the watch (watch_s): resume from the last version
            except Expired:
                version = ""
            except UserError as exc:  # forbidden: nothing to wait for
                self.fatal = exc
                self.news.set()
                return
            except Exception as exc:  # a dropped stream: list again at once; what that does not cure, after a pause
                if self.stopped.is_set():
                    return
                version = ""
                if again:
                    self.health.failed(self.source, exc)
                    self.news.set()
                    self.stopped.wait(self.retry_s)
                again = True


class JobFeed:
    """The job (by name) and its pods (by label), watched on two threads; use as a context manager."""

    def __init__(self, api: KubeApi, kind: JobKind, name: str, health: ApiHealth, news: threading.Event, *,
                 watch_s: float, retry_s: float):
        common = dict(news=news, health=health, watch_s=watch_s, retry_s=retry_s)
        self.jobs = Watched(api, kind.resource, f"{kind.resource.kind} {name}", fields=f"metadata.name={name}",
                            **common)
        self.pod_watch = Watched(api, PODS, f"the pods of {name}", labels=kind.pod_selector(name), **common)
        self.name = name

    def __enter__(self) -> "JobFeed":
        self.jobs.start()
        self.pod_watch.start()
        return self

    def __exit__(self, *exc) -> None:
        for watched in (self.jobs, self.pod_watch):
            watched.stopped.set()

    @property
    def listed(self) -> bool:
        return self.jobs.listed and self.pod_watch.listed

    def state(self) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
        """The job (None: it is gone) and its pods, as last seen; raises what made a watch give up."""
        for watched in (self.jobs, self.pod_watch):
            if watched.fatal is not None:
                raise watched.fatal
        pods = self.pod_watch.snapshot()
        return self.jobs.snapshot().get(self.name), [pods[name] for name in sorted(pods)]
