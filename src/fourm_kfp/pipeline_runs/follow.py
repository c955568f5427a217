"""Follow a pipeline run on a KFP server to its end: poll its state (retrying the API's transient errors with
backoff), print each stage's state as it changes, and build the stage table from the run's task details.

A KFP server names a task by its DAG task key (``pretrain-3`` for the third branch that runs pretrain); the stage
it runs is found from its component (:func:`stage_tasks`), against the stage table's names.
"""

from __future__ import annotations

import re
import time
from typing import Any, Callable, Sequence

from fourm_kfp.pipeline_runs.kfp_api import kfp_api_errors, transient_error
from fourm_kfp.pipeline_runs.run_outcome import SubmitRequest, SubmitResult
from fourm_kfp.stages import PIPELINE

MAX_BACKOFF_S = 300.0
TERMINAL_STATES = {"SUCCEEDED", "FAILED", "SKIPPED", "CANCELED"}
#: The stages in pipeline order, from the stage table.
STAGE_NAMES = tuple(spec.name for spec in PIPELINE)


class LostContact(Exception):
    """The KFP API failed more times in a row than following tolerates."""


def read_run(client, run_id: str, request: "SubmitRequest", out: Callable[[str], None], deadline: float):
    """``client.get_run``, retrying transient errors with exponential backoff (from ``poll_s``, at most
    :data:`MAX_BACKOFF_S`); :class:`LostContact` after ``max_poll_errors`` in a row or past the deadline."""
    failures = 0
    while True:
        try:
            return client.get_run(run_id)
        except Exception as exc:
            reason = transient_error(exc, client)
            if reason is None:
                raise
            failures += 1
            if failures > request.max_poll_errors or time.monotonic() > deadline:
                raise LostContact(f"the KFP API failed {failures} times in a row (last: {reason})") from None
            delay = min(max(request.poll_s, 0.001) * 2 ** failures, MAX_BACKOFF_S)
            out(f"  (KFP API: {reason}; try {failures + 1} of {request.max_poll_errors + 1} in {delay:.0f}s)")
            time.sleep(delay)



def stage_tasks(spec: dict) -> dict[str, str]:
    """The pipeline's stage tasks by DAG task key (what a KFP server shows as a task's ``display_name``, e.g.
    ``pretrain-3`` for the third branch that runs pretrain), found by their component (``comp-pretrain-3`` runs the
    pretrain stage). Tasks of other components, and the DAGs around them, are not stages."""
    keys: dict[str, str] = {}
    for component in [spec["root"], *spec.get("components", {}).values()]:
        for key, task in (component.get("dag") or {}).get("tasks", {}).items():
            ref = task.get("componentRef", {}).get("name", "")
            stage = re.sub(r"-[0-9]+$", "", ref.removeprefix("comp-"))
            if stage in STAGE_NAMES and "dag" not in spec["components"].get(ref, {}):
                keys[key] = stage
    return keys


def stage_table(tasks: Sequence[Any], keys: dict[str, str]) -> list[dict[str, Any]]:
    """One row per stage, in pipeline order, from the run's task details: the executed branch's task (the node
    named by its task key; its ``-driver`` node and the ``executor`` pod node under it are not stages); a stage that
    never started is ``NOT_RUN``."""
    rows = {name: {"name": name, "state": "NOT_RUN", "seconds": None} for name in STAGE_NAMES}
    for task in sorted(tasks, key=lambda t: str(t.start_time or "")):
        stage = keys.get(task.display_name or "")
        if stage:
            rows[stage] = {"name": stage, "state": str(task.state or ""), "task": task.display_name,
                           "seconds": _seconds(task.start_time, task.end_time)}
    return list(rows.values())


def follow_run(client, result: SubmitResult, request: SubmitRequest, out: Callable[[str], None],
               keys: dict[str, str]) -> None:
    """Poll the run to a terminal state, printing each stage's state when it changes; fills ``result``.
    ``keys``: :func:`stage_tasks` of the run's pipeline."""
    seen: dict[str, str] = {}
    deadline = time.monotonic() + request.timeout_s
    while True:
        try:
            with kfp_api_errors(request.host):
                run = read_run(client, result.run_id, request, out, deadline)
        except LostContact as exc:
            result.stopped = str(exc)
            out(f"  stopped following run {result.run_id}: {exc}")
            return
        tasks = (run.run_details.task_details if run.run_details else None) or []
        for row in stage_table(tasks, keys):
            if row["state"] != "NOT_RUN" and seen.get(row["name"]) != row["state"]:
                seen[row["name"]] = row["state"]
                out(f"  {row['name']}: {row['state'].lower()}")
        result.state = str(run.state or "")
        if result.state in TERMINAL_STATES:
            result.stages = stage_table(tasks, keys)
            if run.error and result.state != "SUCCEEDED":
                out(f"  error: {getattr(run.error, 'message', run.error)}")
            return
        if time.monotonic() > deadline:
            result.stopped = f"still {result.state.lower()} after {request.timeout_s:.0f}s (--timeout)"
            out(f"  stopped following run {result.run_id}: {result.stopped}")
            return
        time.sleep(request.poll_s)


def _seconds(start, end) -> float | None:
    """A task's duration; None while it runs (the server then gives the zero time, or nothing, as its end)."""
    try:
        seconds = (end - start).total_seconds()
    except TypeError:
        return None
    return round(seconds, 1) if seconds >= 0 else None

