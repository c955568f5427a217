"""``fourm-kfp submit --report HOURS``: every run of an experiment that ended in a time window, each attached to and
read as ``--attach`` reads one; the exit status is the worst of theirs (for runs longer than any CI job)."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Callable

from fourm_kfp.pipeline_runs.follow import TERMINAL_STATES
from fourm_kfp.pipeline_runs.kfp_api import kfp_api_errors, make_client
from fourm_kfp.pipeline_runs.run_outcome import (EXIT_FAILED, EXIT_GATE_REFUSED, EXIT_GATE_UNREAD, EXIT_NOT_FOLLOWED,
                                                 EXIT_SUCCEEDED, SubmitRequest, SubmitResult)
from fourm_kfp.pipeline_runs.submit import attach

#: How bad each exit status is when several runs are reported at once (the worst one is the report's).
REPORT_SEVERITY = (EXIT_SUCCEEDED, EXIT_NOT_FOLLOWED, EXIT_GATE_UNREAD, EXIT_GATE_REFUSED, EXIT_FAILED)


@dataclass
class ReportResult:
    """``submit --report``: the runs of the experiment that ended in the window, each attached to and read."""

    results: list[SubmitResult] = field(default_factory=list)
    running: list[str] = field(default_factory=list)  # run ids still going (reported by a later --report)

    @property
    def exit_code(self) -> int:
        return max((r.exit_code for r in self.results), key=REPORT_SEVERITY.index, default=EXIT_SUCCEEDED)


def report(request: SubmitRequest, since_hours: float, client=None, out: Callable[[str], None] = print,
           now: dt.datetime | None = None) -> ReportResult:
    """``fourm-kfp submit --report HOURS``: for runs longer than any CI job. Every run of ``request.experiment``
    that ended in the last ``since_hours`` hours is attached to (:func:`attach`: its stages, its MLflow parent run
    closed if submit opened it, its gate read); the exit status is the worst of theirs, so a scheduled CI job
    fails when the gate refused a model a run submitted days before. Runs still going are listed."""
    now = now or dt.datetime.now(dt.timezone.utc)
    since = now - dt.timedelta(hours=since_hours)
    result = ReportResult()
    with kfp_api_errors(request.host):
        client = client if client is not None else make_client(request.host, request.namespace)
        try:
            experiment = client.get_experiment(experiment_name=request.experiment,
                                               namespace=request.namespace or None)
        except ValueError:
            out(f"no experiment {request.experiment!r}: no run was submitted to it")
            return result
        runs, token = [], ""
        while True:
            page = client.list_runs(experiment_id=experiment.experiment_id, page_token=token, page_size=100,
                                    sort_by="created_at desc", namespace=request.namespace or None)
            runs += page.runs or []
            token = page.next_page_token or ""
            if not token:
                break
    ended = []
    for run in runs:
        state = str(run.state or "")
        if state not in TERMINAL_STATES:
            result.running.append(run.run_id)
            out(f"run {run.run_id} ({run.display_name}): {state.lower() or 'pending'}, not reported yet")
        elif run.finished_at is not None and run.finished_at >= since:
            ended.append(run)
    out(f"{len(ended)} run(s) of experiment {request.experiment} ended in the last {since_hours:g} h")
    for run in sorted(ended, key=lambda r: r.finished_at):
        result.results.append(attach(request, run.run_id, client=client, out=out))
    return result

