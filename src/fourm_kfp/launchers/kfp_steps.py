"""What the KFP components call: the same code runs in a cluster pod and under ``kfp.local``.

Component bodies stay short around these functions, so every behaviour lives (and is tested) in the package.
Parameters arrive as plain values: the preset, the list of ``section.key=value`` overrides, the store URI, and the
MLflow tracking URI and parent run id (empty = take the environment). Stages run through the one launch path,
:func:`fourm_kfp.launchers.stage.launch_stage`; a step's committed output, reports and metrics become its KFP output
artifacts (:func:`publish_outcome`). The lineage steps are :mod:`.kfp_lineage`, the fan-out and placement steps
:mod:`.kfp_placement`.
"""

from __future__ import annotations

import json
import math
from typing import Sequence

from fourm_kfp.cluster.job_spec import IN_POD, ClusterParams, JobParams, check_launcher, param_prefix
from fourm_kfp.config.loader import load_config
from fourm_kfp.config.schema import ConfigError
from fourm_kfp.contract import StageOutcome
from fourm_kfp.launchers.kfp_artifacts import fill_output_artifact, output_record
from fourm_kfp.launchers.kfp_retry import check_retry_window
from fourm_kfp.launchers.stage import RunContext, launch_stage, launch_stage_part
from fourm_kfp.storage import open_store

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


def stage_is_on(stage: str, preset: str, config_overrides: Sequence[str]) -> bool:
    """Whether ``stage`` has anything to do under this config (the label stage: some labelers are configured)."""
    from fourm_kfp.stages import get_stage

    return get_stage(stage).is_enabled(load_config(preset, overrides=list(config_overrides)))


def run_stage_part_component(stage: str, part: int, parts: int, preset: str, config_overrides: Sequence[str],
                             store_uri: str, s3_endpoint: str, mlflow_tracking_uri: str, parent_run_id: str,
                             input_uris: dict[str, str] | None = None, accelerator: str = "") -> str:
    """Run one fan-out worker of a stage as a pipeline step (``dsl.ParallelFor``), in a pod that requested
    ``accelerator`` ("" = none; said in the log); returns the output URI."""
    print(f"{stage} part {part} of {parts}: pod with {accelerator or 'no accelerator'}", flush=True)
    run = RunContext(preset, config_overrides, store_uri, s3_endpoint, mlflow_tracking_uri, parent_run_id)
    return launch_stage_part(stage, run, part, parts, input_uris=input_uris)
