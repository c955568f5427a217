"""What the KFP components call: the same code runs in a cluster pod and under ``kfp.local``.

Component bodies stay one-liners around these functions, so every behaviour lives (and is tested) in the package.
Parameters arrive as plain values: the preset, the list of ``section.key=value`` overrides, the store URI, and the
MLflow tracking URI and parent run id (empty = take the environment). Stages run through the one launch path,
:func:`fourm_kfp.launchers.stage.launch_stage`.
"""

from __future__ import annotations

import json
import math
from typing import Sequence

from fourm_kfp.cluster.job_spec import (GPU_TOLERATION, IN_POD, ClusterParams, JobParams, check_launcher,
                                        param_prefix)
from fourm_kfp.config.loader import load_config
from fourm_kfp.config.schema import ConfigError, to_dict
from fourm_kfp.contract import StageOutcome, lineage
from fourm_kfp.launchers.kfp_artifacts import fill_output_artifact, output_record
from fourm_kfp.launchers.stage import (RunContext, clear_stage_output, launch_stage, launch_stage_part,
                                       setup_logging)
from fourm_kfp.storage import open_store

TAG_RUN_LABEL = "fourm.run_label"
#: On a parent run: the KFP run it belongs to. The pipeline's first step tags the parent it opens, and claims a
#: launcher's parent it is given; the id of a parent a cloned run declined (it opened its own) goes in
#: TAG_DECLINED_PARENT.
TAG_KFP_RUN_ID = lineage.TAG_KFP_RUN_ID  # the tag that links a pipeline run (and its stage runs) to KFP
TAG_DECLINED_PARENT = "fourm.declined_parent_run_id"
#: How long KFP retries a job stage's step, from its first attempt's start (the compiled retry policy's
#: backoffMaxDuration, which KFP hands Argo as the retry strategy's maxDuration; a retried pod is also killed at the
#: first attempt's start plus this). A job's queue time and deadline must fit in it (:func:`check_retry_window`).
RETRY_WINDOW_S = 30 * 86400
#: Config sections that only pretrain and evaluate read: what ``pretrain_config_overrides`` may change.
PRETRAIN_ONLY_SECTIONS = ("train.", "evaluate.")


def with_stage_overrides(config_overrides: Sequence[str], stage_overrides: Sequence[str]) -> list[str]:
    """The shared overrides followed by ``pretrain_config_overrides`` (later wins), which may touch only sections
    that no upstream stage reads: so a rerun that changes only them recomputes pretrain and evaluate and reuses
    every upstream output by its content address."""
    wrong = [item for item in stage_overrides if not item.startswith(PRETRAIN_ONLY_SECTIONS)]
    if wrong:
        allowed = ", ".join(section + "*" for section in PRETRAIN_ONLY_SECTIONS)
        raise ConfigError(f"pretrain_config_overrides {wrong}: only {allowed} keys (read by pretrain and evaluate "
                          "alone); put others in config_overrides")
    return [*config_overrides, *stage_overrides]


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


def run_stage_component(stage: str, preset: str, config_overrides: Sequence[str], store_uri: str,
                        s3_endpoint: str, mlflow_tracking_uri: str, parent_run_id: str, force: bool,
                        input_uris: dict[str, str] | None = None, report_path: str | None = None,
                        metrics=None, parts: int = 1, html_path: str | None = None,
                        part_uris: Sequence[str] = (), artifact=None) -> StageOutcome:
    """Run one stage as a pipeline step; its committed output, Markdown report and metrics also become KFP output
    artifacts (``artifact``: the typed output artifact, :mod:`fourm_kfp.launchers.kfp_artifacts`; ``report_path``: a
    Markdown artifact's path; ``metrics``: a ``dsl.Metrics`` artifact; ``html_path``: an HTML artifact's path, for a
    stage with an HTML report), which the UI shows. A fan-out stage's collect step passes
    the output URIs its workers returned (``part_uris``), which must all be one output, and no ``force``: a forced
    fan-out stage was cleared by its fan-out step (:func:`fan_out_items`) and recomputed by its workers."""
    if len(set(part_uris)) > 1:
        raise ValueError(f"the {stage} parts wrote to different outputs: {sorted(set(part_uris))}")
    if force and part_uris:
        raise ValueError(f"the {stage} collect step got force: it would clear what its workers wrote and recompute "
                         "every part in one process; force the stage's fan-out step instead")
    run = RunContext(preset, config_overrides, store_uri, s3_endpoint, mlflow_tracking_uri, parent_run_id)
    outcome = launch_stage(stage, run, force=force, input_uris=input_uris, parts=parts)
    return publish_outcome(outcome, report_path=report_path, metrics=metrics, html_path=html_path,
                           artifact=artifact, preset=preset, input_uris=input_uris)


def publish_outcome(outcome: StageOutcome, report_path: str | None = None, metrics=None,
                    html_path: str | None = None, artifact=None, preset: str = "",
                    input_uris: dict[str, str] | None = None) -> StageOutcome:
    """Copy a committed stage's reports and metrics into the step's KFP output artifacts, record its output in its
    typed artifact (``artifact``, made from ``preset`` and the ``input_uris`` it read), print its outcome."""
    if artifact is not None:
        fill_output_artifact(artifact, output_record(outcome, preset, input_uris))
    output = open_store(outcome.output_uri) if report_path or html_path else None
    if report_path:
        pages = [k for k in output.list("reports") if k.endswith(".md")]
        text = "\n\n".join(output.get_text(k) for k in pages) or f"# {outcome.name}\n"
        with open(report_path, "w") as fh:
            fh.write(text)
    if html_path:
        with open(html_path, "w") as fh:
            fh.write(html_report(output, outcome.name))
    if metrics is not None:  # KFP's metrics metadata cannot hold NaN or infinity: those stay in the manifest
        for name, value in sorted(outcome.metrics.items()):
            if math.isfinite(float(value)):
                metrics.log_metric(name, float(value))
    print(json.dumps(outcome.to_dict()), flush=True)
    return outcome


def html_report(output, stage: str) -> str:
    """The stage's HTML report for the KFP UI: its own ``reports/*.html``, else a page with its pictures inline
    (``reports/*.png``, e.g. pretrain's loss curves) above its Markdown reports."""
    import base64
    import html

    keys = output.list("reports")
    pages = [k for k in keys if k.endswith(".html")]
    if pages:
        return output.get_text(pages[0])
    parts = [f"<!doctype html><meta charset='utf-8'><title>{html.escape(stage)}</title><h1>{html.escape(stage)}</h1>"]
    for key in sorted(k for k in keys if k.endswith(".png")):
        data = base64.b64encode(output.get_bytes(key)).decode()
        name = html.escape(key.rsplit("/", 1)[-1])
        parts.append(f"<h3>{name}</h3><img alt='{name}' style='max-width:100%' src='data:image/png;base64,{data}'>")
    for key in sorted(k for k in keys if k.endswith(".md")):
        parts.append(f"<pre style='white-space:pre-wrap'>{html.escape(output.get_text(key))}</pre>")
    return "\n".join(parts)


def run_job_component(stage: str, preset: str, config_overrides: Sequence[str], store_uri: str, s3_endpoint: str,
                      mlflow_tracking_uri: str, parent_run_id: str, force: bool, input_uris: dict[str, str],
                      job: JobParams, kfp_run_id: str, report_path: str | None = None,
                      metrics=None, job_spec_path: str | None = None, html_path: str | None = None,
                      cluster: ClusterParams | None = None, artifact=None) -> StageOutcome:
    """A job stage's step (pretrain, train-tokenizers): train in this pod (``job.launcher`` ``in-pod``), or launch
    and follow a PyTorchJob / TrainJob (:mod:`fourm_kfp.launchers.kubernetes_job`) and report its committed output
    the same way, under the run-wide ``cluster`` settings (scheduler, pull secret, GPU placement)."""
    if check_launcher(job.launcher, stage) == IN_POD:
        if job_spec_path:
            with open(job_spec_path, "w") as fh:
                fh.write(f"# {param_prefix(stage)}_launcher=in-pod: trained in the step's own pod, no job\n")
        return run_stage_component(stage, preset, config_overrides, store_uri, s3_endpoint,
                                   mlflow_tracking_uri, parent_run_id, force, input_uris=input_uris,
                                   report_path=report_path, metrics=metrics, html_path=html_path,
                                   artifact=artifact)
    from fourm_kfp.launchers.kubernetes_job import launch_stage_job
    from fourm_kfp.images import GPU_IMAGE

    check_retry_window(stage, job, cluster or ClusterParams())

    run = RunContext(preset, config_overrides, store_uri, s3_endpoint, mlflow_tracking_uri, parent_run_id)
    outcome = launch_stage_job(stage, run, force=force, input_uris=input_uris, params=job, image=GPU_IMAGE,
                               kfp_run_id=kfp_run_id, spec_path=job_spec_path, cluster=cluster)
    return publish_outcome(outcome, report_path=report_path, metrics=metrics, html_path=html_path,
                           artifact=artifact, preset=preset, input_uris=input_uris)


def check_retry_window(stage: str, job: JobParams, cluster: ClusterParams) -> None:
    """Refuse a job whose queue time and deadline (with the launcher's grace past it) outlast the step's retry window
    (:data:`RETRY_WINDOW_S`): past it Argo retries nothing, and kills a retried launcher pod, so the job would train
    on unfollowed."""
    from fourm_kfp.cluster.job_launcher import FollowSettings

    grace_s = int(FollowSettings.grace_s)
    needed = job.deadline_s + cluster.queue_timeout_s + grace_s
    if needed > RETRY_WINDOW_S:
        raise ConfigError(f"{param_prefix(stage)}_deadline_s={job.deadline_s} + queue_timeout_s="
                          f"{cluster.queue_timeout_s} (+{grace_s}s) exceed the step's retry window of "
                          f"{RETRY_WINDOW_S}s ({RETRY_WINDOW_S // 86400} days), after which KFP neither retries nor "
                          "keeps a retried launcher: shorten them, or train in stages from the newest checkpoint")


def dataset_uris(dataset: str) -> dict[str, str]:
    """The URIs of the dataset's layers by stage name, from the ``dataset`` parameter that every dataset stage's
    step passes on to the next (a JSON object: prepare-data's output, then the label stage's when it ran). The
    downstream steps take it whole, so a new dataset layer changes none of their parameters."""
    layers = json.loads(dataset or "{}")
    if not isinstance(layers, dict) or not all(isinstance(v, str) for v in layers.values()):
        raise ValueError(f"dataset {dataset!r}: expected a JSON object of stage name -> output URI")
    return layers


def with_dataset_layer(dataset: str, stage: str, uri: str) -> str:
    """``dataset`` with ``stage``'s output as its top layer (unchanged when the stage is off: ``uri`` empty)."""
    layers = dataset_uris(dataset)
    if uri:
        layers[stage] = uri
    return json.dumps(layers)


def stage_is_on(stage: str, preset: str, config_overrides: Sequence[str]) -> bool:
    """Whether ``stage`` has anything to do under this config (the label stage: some labelers are configured)."""
    from fourm_kfp.stages import get_stage

    return get_stage(stage).is_enabled(load_config(preset, overrides=list(config_overrides)))


def fan_out_items(stage: str, width: int, preset: str, config_overrides: Sequence[str], store_uri: str,
                  s3_endpoint: str, force: bool, carried: dict) -> list[dict]:
    """The items of a fan-out stage's ``dsl.ParallelFor``: one per part, each carrying ``carried`` (kfp.local
    resolves upstream outputs inside a loop of width > 1 to the loop item, so they travel in it).

    ``force`` (``<stage>_force``) clears the stage's output here, once, before any worker starts: each worker then
    finds nothing committed and computes its own part, and the collect step commits what they wrote, as in a first
    run at that width (the collect step itself never forces: it would recompute every part in one process)."""
    if width < 1:
        raise ValueError(f"{param_prefix(stage)}_width must be >= 1, got {width}")
    load_config(preset, overrides=list(config_overrides))  # a bad config fails here, before the workers
    if force:
        cleared = clear_stage_output(stage, RunContext(preset, config_overrides, store_uri, s3_endpoint))
        print(f"{param_prefix(stage)}_force: cleared {cleared} objects of {stage}'s output; its {width} workers "
              "recompute it", flush=True)
    return [{"part": i, **carried} for i in range(width)]


#: CPU and memory limits of each placed step's pod when it works itself (the fan-out workers, in-pod training,
#: evaluate), and of a job stage's step when it only launches and follows the job (``<stage>_launcher`` a job kind).
STEP_RESOURCES = {"prepare-data": ("8", "16Gi"), "label": ("8", "32Gi"), "pretokenize": ("8", "16Gi"),
                  "train-tokenizers": ("8", "32Gi"), "pretrain": ("16", "64Gi"), "evaluate": ("8", "32Gi")}
LAUNCHER_RESOURCES = ("1", "2Gi")


def pod_placement(stage: str, preset: str, config_overrides: Sequence[str], accelerator: str,
                  gpu_node_selector: dict, gpu_tolerations: list, launcher: str = IN_POD) -> dict:
    """Where a step of ``stage`` runs, as values the KFP backend resolves into its pod at run time: ``accelerator``
    (the resource to request one of, "" = none), ``node_selector``, ``tolerations``, ``cpu_limit`` and
    ``memory_limit``.

    One step serves the CPU and the GPU case (no ``dsl.If`` branches: before KFP 2.17 a branch holding a loop never
    completes and its ``dsl.OneOf`` join fails). It requests the run's ``accelerator`` (the ``<stage>_accelerator``
    or ``pretrain_accelerator`` parameter, "cpu" = none) when its work wants one: a label worker only for a teacher
    network (``StageSpec.wants_accelerator``), a job stage only when it trains in its own pod (as a job's launcher it
    is a light CPU pod). A pod with an accelerator gets its taint's toleration, ``gpu_tolerations`` and
    ``gpu_node_selector``; one without gets none of them, so it never lands on a GPU node."""
    from fourm_kfp.stages import get_stage

    spec, config = get_stage(stage), load_config(preset, overrides=list(config_overrides))
    launches_job = check_launcher(launcher, stage) != IN_POD
    wants = not launches_job and (spec.wants_accelerator is None or (spec.is_enabled(config)
                                                                     and spec.wants_accelerator(config)))
    resource = "" if accelerator in ("", "cpu") or not wants else accelerator
    cpu, memory = LAUNCHER_RESOURCES if launches_job else STEP_RESOURCES[stage]
    return {"accelerator": resource,
            "node_selector": dict(gpu_node_selector) if resource else {},
            "tolerations": [{**GPU_TOLERATION, "key": resource}, *gpu_tolerations] if resource else [],
            "cpu_limit": cpu, "memory_limit": memory}


def run_stage_part_component(stage: str, part: int, parts: int, preset: str, config_overrides: Sequence[str],
                             store_uri: str, s3_endpoint: str, mlflow_tracking_uri: str, parent_run_id: str,
                             input_uris: dict[str, str] | None = None, accelerator: str = "") -> str:
    """Run one fan-out worker of a stage as a pipeline step (``dsl.ParallelFor``), in a pod that requested
    ``accelerator`` ("" = none; said in the log); returns the output URI."""
    print(f"{stage} part {part} of {parts}: pod with {accelerator or 'no accelerator'}", flush=True)
    run = RunContext(preset, config_overrides, store_uri, s3_endpoint, mlflow_tracking_uri, parent_run_id)
    return launch_stage_part(stage, run, part, parts, input_uris=input_uris)
