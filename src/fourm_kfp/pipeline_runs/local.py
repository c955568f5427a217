"""``fourm-kfp run``: the whole pipeline on one machine through KFP's own local engine (``kfp.local``).

The identical pipeline definition that runs in the cluster runs here with ``SubprocessRunner(use_venv=False)``
(components execute in this Python environment), KFP caching on, and the KFP pipeline root inside the run folder,
less its steps' retry policies (:func:`without_step_retries`): a local step that fails fails the run.
The MLflow store defaults to ``<root>/mlflow.db``. A run with nothing to compute (no ``--force``, every enabled stage
committed) reuses each stage in this process, recording it in MLflow as its step would, without starting the
pipeline. Afterwards a summary JSON is assembled from the MLflow runs:
``{"run_id", "mlflow": {"tracking_uri", "parent_run_id", "parent_run_page", "model_page"},
"stages": [{"name", "status", "output_uri", "seconds"}], "seconds", "machine": {"fp32_matmul_gflops", "threads"}}``:
each stage's seconds (a fanned-out stage's include its parts', also given as ``parts_seconds``), the run's wall time
and, measured after it, the CPU's fp32 matmul rate, so a time taken on one machine can be read against another's.
"""

from __future__ import annotations

import copy
import json
import logging
import os
import time
import uuid
from pathlib import Path
from typing import Any, Sequence

from fourm_kfp.cluster.job_spec import IN_POD
from fourm_kfp.config.loader import load_config
from fourm_kfp.config.schema import ConfigError
from fourm_kfp.console import ConsoleLog
from fourm_kfp.contract import lineage
from fourm_kfp.contract.spec import param_prefix
from fourm_kfp.launchers.kfp_lineage import open_pipeline_run
from fourm_kfp.launchers.stage import apply_s3_endpoint, local_root, resolve_store_uri
from fourm_kfp.stages import GATE_FILE, STAGES
from fourm_kfp.storage import open_store

log = logging.getLogger(__name__)


class PipelineFailed(RuntimeError):
    """The local pipeline run failed; ``summary`` says which stages ran."""

    def __init__(self, message: str, summary: dict[str, Any]):
        super().__init__(message)
        self.summary = summary


def run_pipeline_locally(preset: str, root: str | os.PathLike, *, store: str | None = None,
                         s3_endpoint: str | None = None, overrides: Sequence[str] = (),
                         force: Sequence[str] = (), tracking_uri: str | None = None,
                         summary_path: str | os.PathLike | None = None,
                         pipeline_arguments: dict[str, Any] | None = None) -> dict[str, Any]:
    """Run the pipeline with ``kfp.local``; returns (and optionally writes) the summary."""
    root = local_root(root)
    root.mkdir(parents=True, exist_ok=True)
    load_config(preset, overrides=overrides)  # fail here, with the config error, before KFP starts
    unknown = sorted(set(force) - set(STAGES))
    if unknown:
        raise ConfigError(f"--force names unknown stages {unknown}; stages: {', '.join(STAGES)}")
    logging.getLogger("mlflow").setLevel(logging.WARNING)  # its store set-up lines are noise on the console
    tracking = lineage.resolve_tracking_uri(tracking_uri, root)
    if tracking is None:
        raise ConfigError("fourm-kfp run needs MLflow lineage: MLFLOW_TRACKING_URI=none is not supported here")
    apply_s3_endpoint(s3_endpoint)  # the component subprocesses inherit it
    started = time.perf_counter()
    label = f"local-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
    store_uri = resolve_store_uri(root, store, s3_endpoint)
    # Opening the parent run here (not in a pipeline step) saves every step a second MLflow start-up.
    parent_run_id = open_pipeline_run(label, preset, list(overrides), store_uri, tracking)
    arguments = dict(preset=preset, config_overrides=list(overrides), store_uri=store_uri,
                     s3_endpoint=s3_endpoint or "", mlflow_tracking_uri=tracking, run_label=label,
                     mlflow_parent_run_id=parent_run_id,
                     # No cluster here: pretrain trains in its own (sub)process, not as a PyTorchJob.
                     pretrain_launcher=IN_POD,
                     **{f"{param_prefix(name)}_force": name in force for name in STAGES},
                     **(pipeline_arguments or {}))

    error = None
    kfp_log: Path | None = root / "logs" / f"{label}.log"
    reusable = _all_committed(preset, overrides, store_uri, s3_endpoint, force, pipeline_arguments or {})
    if reusable is not None:
        kfp_log = None
        _record_reuse(reusable, tracking, parent_run_id, label, store_uri)
    else:
        from kfp import local

        from fourm_kfp.pipelines.fourm_pretrain import fourm_pretrain

        local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=str(root / "kfp"),
                   enable_caching=True, raise_on_error=True)
        with ConsoleLog(kfp_log) as console:
            console.print(f"fourm-kfp run {label}: preset {preset}, outputs under {store_uri}")
            console.print(f"  (KFP's full log: {kfp_log})")
            try:
                without_step_retries(fourm_pretrain)(**arguments)
            except RuntimeError as exc:
                error = exc
    lineage.finish_run(tracking, parent_run_id, "FAILED" if error else "FINISHED")
    from fourm_kfp.hardware import cpu_matmul_rate

    seconds = round(time.perf_counter() - started, 1)
    # the yardstick beside the run's time, kept short: matmuls of side 1024 (recorded as matmul_side), best of 3
    # timings of 6, in 0.45 s on a 2-core EPYC where the benches' side 2048 took 2.3 s with 3 a timing, for rates
    # within 5% in fp32 (169-180 against 172-175 GFLOP/s, 2026-12-02); a fully reused run measured nothing heavy, so
    # fewer timings keep it in a fraction of a second
    machine = cpu_matmul_rate(size=1024, trials=3, reps=6) if reusable is None else cpu_matmul_rate(
        size=1024, trials=2, reps=3)
    summary = {**build_summary(label, tracking, parent_run_id), "kfp_log": str(kfp_log) if kfp_log else None,
               "seconds": seconds, "machine": machine}
    if summary_path:
        Path(summary_path).parent.mkdir(parents=True, exist_ok=True)
        Path(summary_path).write_text(json.dumps(summary, indent=2) + "\n")
    if error is not None:
        failed = [s["name"] for s in summary["stages"] if s["status"] == "failed"]
        raise PipelineFailed(f"pipeline run {label} failed{' at ' + ', '.join(failed) if failed else ''}; "
                             f"the stage's error is in {kfp_log}", summary) from error
    return summary


def without_step_retries(pipeline: Any) -> Any:
    """``pipeline`` (a ``@dsl.pipeline`` component) with no step's retry policy; the pipeline itself is unchanged.

    The job stages' steps are retried for the cluster, where a launcher pod lost with its node comes back and adopts
    its job when Argo's status-capture finalizer records its failure (``fourm_kfp.pipelines.fourm_pretrain.LAUNCHER_RETRIES``). kfp.local honours the same policy, whatever
    the failure: kfp 2.17.0's ``kfp/local/orchestrator/task_executor.py`` runs a task up to ``max_retry_count + 1``
    times, sleeping ``backoff_duration * backoff_factor**attempt`` (at most ``backoff_max_duration``) between attempts,
    and ``local.init`` has no setting to turn that off. Here no pod can be lost: a step fails on its own error (a
    dead S3 endpoint, a bad input), which a retry repeats, and 3 retries at 60 s doubling added 7 minutes of sleep
    to a run that had already failed. So the local run executes the same pipeline spec with the retry policies
    cleared: every other field, and the compiled YAML the cluster runs, keep them."""
    local = copy.copy(pipeline)
    local.component_spec = copy.deepcopy(pipeline.component_spec)
    spec = local.component_spec.implementation.graph
    for dag in [spec.root.dag, *(c.dag for c in spec.components.values() if c.HasField("dag"))]:
        for task in dag.tasks.values():
            task.ClearField("retry_policy")
    return local


def _all_committed(preset: str, overrides: Sequence[str], store_uri: str, s3_endpoint: str | None,
                   force: Sequence[str], pipeline_arguments: dict[str, Any]) -> tuple[Any, Any, list] | None:
    """``(config, store, the enabled stages' specs)`` when the run has nothing to compute: no ``--force``, no
    pipeline parameter but the fan-out widths (which move no address), and every enabled stage committed; else
    None (the pipeline runs)."""
    from fourm_kfp.contract.planning import iter_plans
    from fourm_kfp.launchers.stage import RunContext, open_run
    from fourm_kfp.stages import PIPELINE

    if force or any(not name.endswith("_width") for name in pipeline_arguments):
        return None
    config, store = open_run(RunContext(preset, tuple(overrides), store_uri, s3_endpoint or ""), create=False)
    enabled = []
    for spec, plan in zip(PIPELINE, iter_plans(PIPELINE, config, store)):  # stops at the first stage to compute: a
        if not (plan.off or plan.committed):  # fresh run's check reads one manifest and imports no stage's torch
            return None
        if not plan.off:
            enabled.append(spec)
    return config, store, enabled


def _record_reuse(reusable: tuple[Any, Any, list], tracking: str, parent_run_id: str, label: str,
                  store_uri: str) -> None:
    """A run whose every stage is committed: each stage is reused as its pipeline step would reuse it (the same
    stage run under the parent run, tagged reused), here in this process, without starting the pipeline: a fully
    reused run takes seconds rather than a process per step."""
    from fourm_kfp.contract import run_stage

    config, store, specs = reusable
    print(f"fourm-kfp run {label}: preset {config.preset}, outputs under {store_uri}")
    print("  every stage is committed: each is reused, and the pipeline is not started")
    for spec in specs:
        outcome = run_stage(spec, config, store, tracking_uri=tracking, parent_run_id=parent_run_id)
        print(f"  ✓ {spec.name} {outcome.status} ({outcome.output_uri})")


def build_summary(run_label: str, tracking_uri: str, parent_run_id: str) -> dict[str, Any]:
    """The run summary, read back from the stage runs under the MLflow parent run."""
    stages = []
    for run in lineage.child_runs(tracking_uri, parent_run_id):
        tags, metrics = run.data.tags, run.data.metrics
        # a fanned-out stage (pretokenize) did its work in parts before its own step: its seconds count them
        parts = metrics.get("parts_seconds") if tags.get(lineage.TAG_STATUS) == "ran" else None
        stage = {
            "name": tags.get(lineage.TAG_STAGE),
            "status": tags.get(lineage.TAG_STATUS, "failed"),
            "output_uri": tags.get(lineage.TAG_OUTPUT_URI),
            "seconds": round(metrics.get("seconds", 0.0) + (parts or 0.0), 3),
            "mlflow_run_id": run.info.run_id,
        }
        if parts is not None:
            stage["parts_seconds"] = round(parts, 3)
        stages.append(stage)
    summary = {
        "run_id": run_label,
        "mlflow": {"tracking_uri": tracking_uri, "parent_run_id": parent_run_id,
                   "parent_run_page": lineage.run_page(tracking_uri, parent_run_id)},
        "stages": stages,
    }
    evaluation = next((s for s in stages if s["name"] == "evaluate" and s["output_uri"]), None)
    if evaluation:
        gate = summary["model_gate"] = json.loads(open_store(evaluation["output_uri"]).get_bytes(GATE_FILE))
        if gate.get("version"):
            summary["mlflow"]["model_page"] = lineage.model_version_page(gate["model_name"], gate["version"])
    return summary
