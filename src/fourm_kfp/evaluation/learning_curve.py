"""Scores against training steps: each cross-modal task's primary metric for every weight snapshot of the model.

The pretrain stage exports the weights every ``train.snapshot_every`` steps (:mod:`fourm_kfp.model.saved_model`).
The evaluate stage scores each snapshot and the final model on the first ``evaluate.curve_samples`` val scenes, with
the tasks, sampling and seed of its main evaluation (so the last point of the curve is the main evaluation's score
when both use the same scenes), and draws one panel per task: the model's score against the step, the trivial
baseline dashed. A curve answers what one number cannot: whether the model is still learning, and how fast.
"""

from __future__ import annotations

from typing import Any, Sequence

from fourm_kfp.evaluation.any_to_any import AnyToAny
from fourm_kfp.evaluation.tasks import Baselines, Scenes, TaskResult, run_task
from fourm_kfp.model.generation import SamplingArgs
from fourm_kfp.progress import progress
from fourm_kfp.train import curves


def score_curve(engine: AnyToAny, scenes: Scenes, tasks: Sequence[str], baselines: Baselines,
                sampling: SamplingArgs, seed: int, batch_size: int, final: Sequence[TaskResult],
                map_sampling: SamplingArgs | None = None,
                text_sampling: SamplingArgs | None = None) -> dict[str, Any]:
    """``{"scenes", "steps", "tasks": {task: {"primary", "higher_is_better", "model": [score per step],
    "baseline"}}}`` over the engine's snapshots and its final weights (``final``: the main evaluation's results,
    reused for the last point when it ran on these scenes). Leaves the engine on its final weights."""
    final_step = int(engine.card["step"])
    steps = [s for s in engine.snapshot_steps() if s < final_step] + [final_step]
    scores: dict[str, list[float]] = {task: [] for task in tasks}
    last: dict[str, TaskResult] = {r.task: r for r in final}
    reuse_final = bool(final) and len(final[0].scene_keys) == len(scenes)
    for step in progress(steps, total=len(steps), desc="evaluate snapshots", unit="snapshot", interval=0):
        if step == final_step and reuse_final:
            results = list(final)
        else:
            engine.use_weights(step if step != final_step else None)
            results = [run_task(engine, scenes, task, baselines, sampling, seed, batch_size, 0, map_sampling,
                                text_sampling)
                       for task in tasks]
        for r in results:
            scores[r.task].append(float(r.metrics[r.primary]))
            last[r.task] = r
    engine.use_weights(None)
    return {"scenes": len(scenes), "steps": steps,
            "tasks": {task: {"primary": last[task].primary, "higher_is_better": last[task].higher_is_better,
                             "model": scores[task], "baseline": float(last[task].baseline[last[task].primary])}
                      for task in tasks}}


def curve_png(curve: dict[str, Any]) -> bytes:
    """One panel per task: the model's primary metric against the step, the trivial baseline dashed."""
    panels = []
    for task, values in curve["tasks"].items():
        better = "higher" if values["higher_is_better"] else "lower"
        name = values["primary"]
        panels.append(curves.line_chart(f"{task}: {name}, {better} is better ({curve['scenes']} val scenes)",
                                        {name: list(zip(curve["steps"], values["model"]))},
                                        {name: values["baseline"]}, reference_label="dashed: trivial baseline",
                                        markers=True))
    return curves.stack_png(panels)
