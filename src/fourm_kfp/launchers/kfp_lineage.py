"""The pipeline run's MLflow lineage, as its KFP steps keep it: the first step opens (or claims) the parent run, the
exit handler closes it with the run's real outcome, judged from the final state KFP hands it and, where that state is
not to be taken at its word, from each stage's latest MLflow run."""

from __future__ import annotations

import json
from typing import Sequence

from fourm_kfp.config.loader import load_config
from fourm_kfp.config.schema import to_dict
from fourm_kfp.contract import lineage
from fourm_kfp.launchers.stage import setup_logging

TAG_RUN_LABEL = "fourm.run_label"
#: On a parent run: the KFP run it belongs to. The pipeline's first step tags the parent it opens, and claims a
#: launcher's parent it is given; the id of a parent a cloned run declined (it opened its own) goes in
#: TAG_DECLINED_PARENT.
TAG_KFP_RUN_ID = lineage.TAG_KFP_RUN_ID  # the tag that links a pipeline run (and its stage runs) to KFP
TAG_DECLINED_PARENT = "fourm.declined_parent_run_id"


def open_pipeline_run(run_label: str, preset: str, config_overrides: Sequence[str], store_uri: str,
                      tracking_uri: str | None, tags: dict[str, str] | None = None) -> str:
    """Validate the config (fail fast, before any stage) and open the MLflow parent run; returns its id or ``""``.

    Called by the pipeline's first step, or by a launcher (``fourm-kfp run``, CI) that then passes the id in.
    """
    config = load_config(preset, overrides=list(config_overrides))
    run_id = lineage.start_pipeline_run(
        tracking_uri, f"fourm-pretrain {run_label}",
        params={"preset": preset, "config_overrides": json.dumps(list(config_overrides)), "store_uri": store_uri,
                **to_dict(config)},
        tags={TAG_RUN_LABEL: run_label, **(tags or {})})
    return run_id or ""


def parent_run_in_use(tracking: str | None, parent_run_id: str, kfp_run_id: str) -> str:
    """Why ``parent_run_id`` cannot hold this KFP run's stages ("" = it can): it is finished, unknown, or claimed
    by another KFP run. The KFP UI's "Clone run" copies ``mlflow_parent_run_id``, so a clone is given its
    original's parent run, closed when the original ended (or claimed by it while it runs)."""
    if tracking is None:
        return ""  # lineage off: nothing to check, nothing recorded
    from mlflow.exceptions import MlflowException

    try:
        run = lineage._client(tracking).get_run(parent_run_id)
    except MlflowException:
        return f"no run {parent_run_id} in {tracking}"
    if run.info.status != "RUNNING":
        return f"it is {run.info.status.lower()} (its KFP run ended)"
    owner = run.data.tags.get(TAG_KFP_RUN_ID)
    if owner and owner != kfp_run_id:
        return f"it belongs to KFP run {owner}"
    return ""


def open_lineage_step(run_label: str, kfp_run_id: str, preset: str, config_overrides: Sequence[str],
                      store_uri: str, mlflow_tracking_uri: str, mlflow_parent_run_id: str) -> str:
    """The pipeline's first step: use a launcher's parent run (claiming it for this KFP run), else open one labelled
    with the run label or id. A given parent that is finished or another KFP run's (a cloned run's copied
    ``mlflow_parent_run_id``) is declined: this run opens its own, so its stages never land under another run."""
    setup_logging()
    tracking = lineage.resolve_tracking_uri(mlflow_tracking_uri, None)
    tags = {TAG_KFP_RUN_ID: kfp_run_id}
    if mlflow_parent_run_id:
        load_config(preset, overrides=list(config_overrides))  # still fail fast on a bad config
        declined = parent_run_in_use(tracking, mlflow_parent_run_id, kfp_run_id)
        if not declined:
            if tracking is not None:
                lineage.MLflowTracker(lineage._client(tracking), mlflow_parent_run_id).set_tags(tags)
            return mlflow_parent_run_id
        print(f"mlflow_parent_run_id {mlflow_parent_run_id}: not used, {declined} (a cloned run?); opening this "
              "run's own parent run", flush=True)
        tags[TAG_DECLINED_PARENT] = mlflow_parent_run_id
        run_label = f"{run_label}-{kfp_run_id[:8]}" if run_label else ""  # not the original's label
    return open_pipeline_run(run_label or kfp_run_id, preset, config_overrides, store_uri, tracking, tags)


#: ``PipelineTaskFinalStatus.state`` as each engine sends it to the exit handler: kfp.local says SUCCEEDED; the KFP
#: backend sends the ExitHandler DAG's MLMD execution state, COMPLETE on success (kubeflow/pipelines#11826), and
#: otherwise what its tasks' launchers last set it to. COMPLETE is set only by an update that found every task
#: complete (``backend/src/v2/metadata/client.go``, ``UpdateDAGExecutionsState``), so it is taken at its word. The
#: others are not: before 2.17 the DAG stays RUNNING on success when a ParallelFor sits inside the ExitHandler
#: (#13321: the loop's end never reaches the DAG above it), as in this pipeline, and a step whose first attempt
#: failed and whose retry succeeded leaves it FAILED (the failed attempt's launcher set it FAILED,
#: ``v2/component/launcher_v2.go``, and no later update finds every task complete); a launcher pod deleted before it
#: published leaves it RUNNING. FAILED, RUNNING and any other state are read from the run's stage runs
#: (:func:`stage_runs_outcome`); a stopped run (:data:`STOPPED_STATES`) failed.
SUCCESS_STATES = frozenset({"SUCCEEDED", "COMPLETE", "CACHED"})
STOPPED_STATES = frozenset({"CANCELED", "CANCELLED", "CANCELING"})
#: MLflow statuses of a stage run that failed: FAILED (its code raised), KILLED (stopped: SIGTERM, a deleted pod).
FAILED_RUN_STATUSES = frozenset({"FAILED", "KILLED"})


def latest_stage_runs(runs: Sequence) -> dict:
    """Each stage's latest run (by start time) among ``runs``, by stage name: a retried step's earlier attempts
    (failed, killed, or left RUNNING by a pod deleted under them) are superseded by its latest."""
    latest: dict = {}
    for run in sorted(runs, key=lambda r: r.info.start_time or 0):
        latest[run.data.tags.get(lineage.TAG_STAGE)] = run
    return latest


def stage_runs_outcome(runs: Sequence) -> tuple[str, str]:
    """The MLflow status of a pipeline run judged by its stage runs ``runs``: FINISHED when the last stage
    (evaluate, which runs only once every other stage is committed) finished in its latest run and no stage's latest
    run failed or was killed; else FAILED. Also says why."""
    from fourm_kfp.stages import STAGES

    latest, last = latest_stage_runs(runs), list(STAGES)[-1]
    failed = sorted(f"{stage} {run.info.status.lower()}" for stage, run in latest.items()
                    if run.info.status in FAILED_RUN_STATUSES)
    finished = last in latest and latest[last].info.status == "FINISHED"
    outcome = "FINISHED" if finished and not failed else "FAILED"
    why = (f"{last} {'finished' if finished else 'did not finish'}; "
           + (f"latest run of {', '.join(failed)}" if failed else "no stage's latest run failed"))
    return outcome, why


def run_outcome(state: str, tracking: str, parent_run_id: str) -> str:
    """The MLflow status of a pipeline run that ended with final ``state``: FINISHED or FAILED. COMPLETE (or
    kfp.local's SUCCEEDED) is success and a stopped run failed; any other state (FAILED, RUNNING: see
    :data:`SUCCESS_STATES`) is judged by each stage's latest run (:func:`stage_runs_outcome`)."""
    if state in SUCCESS_STATES:
        return "FINISHED"
    if state in STOPPED_STATES:
        return "FAILED"
    outcome, why = stage_runs_outcome(lineage.child_runs(tracking, parent_run_id))
    print(f"[exit handler] final state {state!r} is not taken at its word (a retried step leaves FAILED before KFP "
          f"2.17, a loop RUNNING); from the stage runs: {outcome.lower()} ({why})", flush=True)
    return outcome


def close_lineage_step(run_label: str, kfp_run_id: str, mlflow_tracking_uri: str, mlflow_parent_run_id: str,
                       state: str) -> None:
    """Exit handler: close the parent run this pipeline opened (a launcher closes its own), by the run's outcome
    (:func:`run_outcome`); with a given parent, only the one opened in its place when it was declined
    (:func:`open_lineage_step`)."""
    tracking = lineage.resolve_tracking_uri(mlflow_tracking_uri, None)
    if tracking is None:
        return
    if mlflow_parent_run_id:
        run = lineage.find_run_by_tag(tracking, TAG_KFP_RUN_ID, kfp_run_id, kind="pipeline")
        if run is None or run.data.tags.get(TAG_DECLINED_PARENT) != mlflow_parent_run_id:
            return  # the launcher's parent run, claimed by this run: the launcher closes it
    else:
        run = lineage.find_run_by_tag(tracking, TAG_RUN_LABEL, run_label or kfp_run_id)
    if run is not None:
        lineage.finish_run(tracking, run.info.run_id, run_outcome(state, tracking, run.info.run_id))
