"""The model gate's verdict of a finished pipeline run, read from MLflow: the evaluate stage's ``gate.json`` under
the run's parent run (from the run that produced the evaluation, when it was reused)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from fourm_kfp.pipeline_runs.run_outcome import SubmitResult, error_line, verdict_problem
from fourm_kfp.stages import GATE_FILE


class GateUnreadable(Exception):
    """The gate's verdict of a succeeded run could not be read; the message says why."""


def gate_verdict(tracking_uri: str, parent_run_id: str) -> dict[str, Any]:
    """The evaluate stage's ``gate.json`` (from the run that produced a reused evaluation, if it was reused);
    :class:`GateUnreadable` with the reason when there is none, it cannot be read (e.g. an ``s3://`` artifact root
    this machine has no credentials or client for) or it is not a verdict (:func:`.run_outcome.verdict_problem`)."""
    import tempfile

    from fourm_kfp.contract import lineage

    try:
        runs = lineage.child_runs(tracking_uri, parent_run_id)
    except Exception as exc:
        raise GateUnreadable(f"cannot search the stage runs under MLflow run {parent_run_id} at "
                             f"{tracking_uri}: {error_line(exc)}") from None
    evaluate = [run for run in runs if run.data.tags.get(lineage.TAG_STAGE) == "evaluate"]
    if not evaluate:
        raise GateUnreadable(f"no evaluate stage run under MLflow run {parent_run_id}: the run did not record it")
    run = evaluate[-1]
    reused = run.data.tags.get(lineage.TAG_REUSED) == "true"
    source = run.data.tags.get(lineage.TAG_PRODUCED_BY) if reused else run.info.run_id
    if not source:
        raise GateUnreadable(f"the reused evaluate run {run.info.run_id} names no run that produced it")
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    with tempfile.TemporaryDirectory() as tmp:
        try:
            path = lineage._client(tracking_uri).download_artifacts(source, GATE_FILE, tmp)
            gate = json.loads(Path(path).read_text())
        except Exception as exc:
            where = run.info.artifact_uri if source == run.info.run_id else f"run {source}"
            raise GateUnreadable(f"cannot read {GATE_FILE} of evaluate run {source} ({where}): "
                                 f"{error_line(exc)}") from None
    problem = verdict_problem(gate)
    if problem:
        raise GateUnreadable(f"{GATE_FILE} of evaluate run {source} is not a verdict: {problem}")
    return gate


def read_gate(result: SubmitResult, tracking: str | None) -> None:
    """Fill ``result.gate`` (or ``result.gate_error``) for a succeeded run."""
    if not tracking or not result.mlflow_parent_run_id:
        result.gate_error = ("no MLflow tracking URI (--mlflow-tracking-uri or $MLFLOW_TRACKING_URI), so no parent "
                             f"run to find the evaluate stage's {GATE_FILE} under")
        return
    try:
        result.gate = gate_verdict(tracking, result.mlflow_parent_run_id)
    except GateUnreadable as exc:
        result.gate_error = str(exc)

