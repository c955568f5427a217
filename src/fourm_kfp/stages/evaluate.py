"""The ``evaluate`` stage: the trained model against exact ground truth, with references, a report and the gate.

Masked-modeling loss per modality on the val split; cross-modal generation (rgb → depth/normal/semseg/det/caption,
caption → rgb) scored beside the tokenizer ceiling and a trivial baseline; a Markdown/HTML report with grids; the
model logged as an MLflow model (a pyfunc) and registered in the MLflow registry as ``candidate`` and promoted to
``champion`` when it beats the current one with confidence (a bootstrap over the val scenes against the champion's
per-scene scores).

Reads the model by URI (the pretrain output), its tokenizers, the pretokenized val split (the model's inputs) and
the prepared val split (exact ground truth). Writes the payload -- ``evaluation.json`` (every number, the per-scene
primary scores and the bootstrap intervals against the baseline), ``reports/scene_scores.json`` (the per-scene
statistics of every metric the gate can use; also an artifact of the stage's MLflow run, where a later gate reads
the champion's), the Markdown/HTML report and grids -- a function of the inputs alone, byte for byte (no timings,
the model as a store-relative reference, no registry outcome); with ``evaluate.curve_samples``, also the scores of
every weight snapshot of the model (``reports/scores_vs_steps.png``, :mod:`~fourm_kfp.evaluation.learning_curve`).
What the run did outside its output are run records (``EVALUATE.run_records``): ``gate.json`` (registered version,
promoted or not and why, so CI retraining can act on the outcome) and ``reports/model_gate.md``.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict
from typing import Any

import numpy as np
import torch

from fourm_kfp.config.schema import to_dict
from fourm_kfp.contract import StageContext, StageResult
from fourm_kfp.contract.addressing import address_in
from fourm_kfp.data.modalities import MODALITIES
from fourm_kfp.evaluation import masked_modeling_stats
from fourm_kfp.evaluation.any_to_any import AnyToAny
from fourm_kfp.evaluation.scene_loading import load_scenes, runnable_tasks, train_ground_truth
from fourm_kfp.evaluation.learning_curve import curve_png, score_curve
from fourm_kfp.evaluation.model_gate import scene_scores
from fourm_kfp.evaluation.report import gate_markdown, report_html, report_markdown, task_grid
from fourm_kfp.evaluation.scene_stats import SceneStats
from fourm_kfp.evaluation.tasks import Baselines, TaskResult, run_task
from fourm_kfp.model.generation import SamplingArgs
from fourm_kfp.progress import progress
from fourm_kfp.stages import GATE_FILE, PRETOKENIZE, PRETRAIN, TRAIN_TOKENIZERS
from fourm_kfp.storage import output_ref

log = logging.getLogger("fourm_kfp.evaluate")
TOKENIZERS, PRETOKENIZED, MODEL = TRAIN_TOKENIZERS.name, PRETOKENIZE.name, PRETRAIN.name


def masked_modeling(ctx: StageContext, engine: AnyToAny) -> tuple[list[str], SceneStats]:
    """Loss and token accuracy per modality on the val split, with train's budgets and seed (the batches pretrain
    validates on): the val sample keys and their per-sample statistics
    (:func:`~fourm_kfp.evaluation.masked_modeling_stats.masked_stats`)."""
    from fourm_kfp.masking.token_loader import validation_batches
    from fourm_kfp.train.build import TrainingInputs, loader_args, masking_args
    from fourm_kfp.train.step import autocast

    cfg = ctx.config
    inputs = TrainingInputs.read(ctx.inputs[PRETOKENIZED].uri, ctx.inputs[TOKENIZERS].uri)
    specs = engine.model.args.modalities
    masking = masking_args(cfg, specs, inputs)
    loader = loader_args(cfg, inputs, masking, cfg.evaluate.batch_size, 0, 1, engine.device)
    dtype = torch.bfloat16 if engine.generator.autocast else None  # as its generation
    names = engine.model.args.names
    keys, rows = [], []
    with torch.no_grad():
        for batch in validation_batches(loader, cfg.evaluate.masked_batches):
            with autocast(engine.device, dtype):
                out = engine.model(batch.to(engine.device), per_sample=True)
            empty = torch.zeros(batch.batch_size, 3)
            rows.append(torch.stack([out.sample_sums[n].float().cpu() if n in out.sample_sums else empty
                                     for n in names], 1).double().numpy())
            keys += batch.keys
    sums = np.concatenate(rows) if rows else np.zeros((0, len(names), 3))
    return keys, masked_modeling_stats.masked_stats(names, sums)


def masked_summary(stats: SceneStats) -> dict[str, dict[str, float]]:
    """``{modality: {"loss", "accuracy"}, "all": ...}`` over the modalities with target tokens."""
    values = stats.whole()
    names = [name.removeprefix("val.loss.") for name in values if name.startswith("val.loss.")]
    out = {name: {"loss": values[f"val.loss.{name}"], "accuracy": values[f"val.accuracy.{name}"]}
           for name in names if np.isfinite(values[f"val.loss.{name}"])}
    out["all"] = {"loss": values["val.loss"], "accuracy": values["val.accuracy"]}
    return out


def _json(value: Any, **kwargs: Any) -> bytes:
    return json.dumps(value, sort_keys=True, default=float, **kwargs).encode()


def run(ctx: StageContext) -> StageResult:
    cfg = ctx.config.evaluate
    model_uri = ctx.inputs[MODEL].uri
    engine = AnyToAny(model_uri, tokenizers_uri=ctx.inputs[TOKENIZERS].uri)
    log.info("evaluate: model %s (%s) on %s", model_uri, ", ".join(engine.modalities), engine.device)
    masked_keys, masked_stats = masked_modeling(ctx, engine)
    masked = masked_summary(masked_stats)
    scenes = load_scenes(engine, ctx.dataset, ctx.inputs[PRETOKENIZED].store, cfg.num_samples)
    tasks, skipped = runnable_tasks(cfg.tasks, scenes, engine.modalities)
    if skipped:
        log.info("evaluate: tasks skipped: %s", "; ".join(skipped))
    scored = [name for name, modality in MODALITIES.items() if modality.scoring]
    baselines = Baselines.fit(train_ground_truth(ctx.dataset, scored, cfg.baseline_samples), engine.vocabularies)
    sampling = SamplingArgs(**to_dict(cfg.sampling))
    map_sampling = SamplingArgs(steps=cfg.map_steps, temperature=0.0)  # a reading, not a draw: the likeliest map
    text_sampling = SamplingArgs(**to_dict(cfg.text_sampling))
    results: list[TaskResult] = []
    for task in progress(tasks, total=len(tasks), desc="evaluate tasks", unit="task", interval=0):
        results.append(run_task(engine, scenes, task, baselines, sampling, cfg.seed, cfg.batch_size,
                                cfg.grid_samples, map_sampling, text_sampling))
        r = results[-1]
        log.info("evaluate %s: %s %.4f (ceiling %.4f, baseline %.4f; difference %+.4f, 95%% interval "
                 "[%+.4f, %+.4f])%s", task, r.primary, r.metrics[r.primary], r.ceiling[r.primary],
                 r.baseline[r.primary], r.difference, r.interval.low, r.interval.high,
                 "" if r.beats_baseline else " — not above the baseline with confidence")

    curve = None
    if cfg.curve_samples and results:
        curve = score_curve(engine, scenes.head(cfg.curve_samples), tasks, baselines, sampling, cfg.seed,
                            cfg.batch_size, results, map_sampling, text_sampling)

    metrics = {f"val.loss.{m}" if m != "all" else "val.loss": v["loss"] for m, v in masked.items()}
    metrics |= {f"val.accuracy.{m}" if m != "all" else "val.accuracy": v["accuracy"] for m, v in masked.items()}
    for r in results:
        metrics |= {f"{r.task}.{k}": v for k, v in r.metrics.items()}
        metrics |= {f"{r.task}.ceiling.{k}": v for k, v in r.ceiling.items()}
        metrics |= {f"{r.task}.baseline.{k}": v for k, v in r.baseline.items()}
    metrics["tasks_beating_baseline"] = float(sum(r.beats_baseline for r in results))
    report: dict[str, Any] = {
        "model_uri": output_ref(model_uri), "step": engine.card.get("step"),
        "num_samples": len(scenes), "sampling": asdict(sampling), "map_steps": cfg.map_steps,
        "text_sampling": asdict(text_sampling),
        "masked": masked,
        "tasks": [r.to_dict() for r in results], "tasks_skipped": skipped,
        "tasks_beating_baseline": int(metrics["tasks_beating_baseline"]), "metrics": metrics,
        **({"curve": curve} if curve else {}),
        "decode_budget": engine.decode_budget(),
        **({"labelled_by": labelled} if (labelled := _labelled_by(ctx)) else {}),
    }
    grids = {r.task: task_grid(r.examples) for r in results}
    scores = scene_scores({"": (masked_keys, masked_stats)} | {f"{r.task}.": (r.scene_keys, r.model_stats)
                                                                for r in results})
    ctx.output.put_bytes("evaluation.json", _json(report, indent=2))
    ctx.write_report("scene_scores.json", _json(scores, separators=(",", ":")))
    for task, png in grids.items():
        if png:
            ctx.write_report(f"grid_{task}.png", png)
    figure = curve_png(curve) if curve else b""
    if figure:
        ctx.write_report("scores_vs_steps.png", figure)
    ctx.write_report("evaluation_report.md", report_markdown(report).encode())
    ctx.write_report("evaluation_report.html", report_html(report, grids, figure).encode())

    gate, gate_skipped = _gate(ctx, engine, model_uri, metrics, scores)
    gate_json = json.dumps(gate or {"skipped": gate_skipped}, indent=2).encode()
    ctx.output.put_bytes(GATE_FILE, gate_json)
    ctx.tracker.log_artifact(GATE_FILE, gate_json)  # where `fourm-kfp submit --wait` reads the verdict
    ctx.write_report("model_gate.md", gate_markdown(gate, gate_skipped).encode())
    result_metrics = {k: float(v) for k, v in metrics.items() if np.isfinite(v)}
    if gate:
        result_metrics["promoted"] = float(gate["promoted"])
    return StageResult(counts={"val_scenes": len(scenes), "tasks": tasks, "tasks_skipped": skipped},
                       metrics=result_metrics)


def _labelled_by(ctx: StageContext) -> dict[str, str]:
    """``{modality: "labeler vN"}`` for the modalities a dataset layer's labelers made (the label stage's)."""
    return {modality: f"{who['name']} v{who['version']}" for layer in ctx.dataset_layers
            for modality, who in layer.manifest.get("counts", {}).get("labelers", {}).items()}


def _gate(ctx: StageContext, engine: AnyToAny, model_uri: str, metrics: dict[str, float],
          scores: dict[str, Any]) -> tuple[dict[str, Any] | None, str]:
    """Log the model as an MLflow model of the evaluate run (a pyfunc, :mod:`fourm_kfp.evaluation.mlflow_model`),
    register it and apply the gate (needs an MLflow tracking store: lineage on)."""
    gate = ctx.config.evaluate.gate
    tracking = ctx.tracker.tracking_uri
    if not tracking:
        return None, "Lineage is off (no MLflow tracking store), so the model was not registered."
    from fourm_kfp.evaluation.model_gate import register_and_gate
    from fourm_kfp.evaluation.mlflow_model import INPUT_MODALITY, log_pyfunc

    lineage = {"model_uri": model_uri, "pipeline_run_id": ctx.tracker.parent_run_id or "",
               "evaluate_run_id": ctx.tracker.run_id or ""}
    for name, stage_input in ctx.inputs.items():
        lineage[f"{name}.uri"] = stage_input.uri
        lineage[f"{name}.address"] = address_in(stage_input.uri)
        lineage[f"{name}.manifest_digest"] = stage_input.digest
    logged_model_id = None
    targets = [m for m in engine.modalities if m != INPUT_MODALITY]
    if ctx.tracker.run_id and INPUT_MODALITY in engine.modalities and targets:
        logged_model_id = log_pyfunc(tracking, ctx.tracker.run_id, model_uri=model_uri,
                                     tokenizers_uri=ctx.inputs[TOKENIZERS].uri, image_size=engine.side(INPUT_MODALITY),
                                     target=targets[0])
    decision = register_and_gate(tracking, model_name=gate.model_name, model_uri=model_uri,
                                 run_id=ctx.tracker.run_id, metrics=metrics, primary_metric=gate.metric,
                                 higher_is_better=gate.higher_is_better, margin=gate.margin, lineage=lineage,
                                 scene_scores=scores, logged_model_id=logged_model_id)
    log.info("model gate: %s version %s %s — %s", decision.model_name, decision.version,
             "promoted to champion" if decision.promoted else "not promoted", decision.reason)
    return decision.to_dict(), ""
