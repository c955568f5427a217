"""Cross-modal tasks on the val scenes: the model's generations, the tokenizer ceiling and a trivial baseline,
scored with the same metric in the same run.

A task is ``<source>-to-<target>``. The model gets the source's tokens (crop 0, the full view, as pretokenized) and
generates the target (:class:`~fourm_kfp.evaluation.any_to_any.AnyToAny`); the generation is decoded and scored
against the exact ground truth of the prepared val scenes. Beside it:

* the **tokenizer ceiling**: the ground truth's own tokens decoded (what a perfect token predictor would score);
* the **trivial baseline**: one prediction for every scene, fitted on training scenes (the per-pixel mean depth or
  normal, the per-pixel majority class, the most common det text or caption, the set of shapes that scores best).

``caption-to-rgb`` is scored by what the generated image shows: the model predicts semseg from its own generated
rgb (a chain), and the shapes visible in it are compared with the shapes the caption names. Its ceiling is the true
image's rgb tokens decoded and read the same way, so the reader's own mistakes are in it.

The model *beats the baseline* on a task when the 95% interval of the paired bootstrap over the val scenes
(:mod:`fourm_kfp.evaluation.paired_bootstrap`) of the primary metric's difference lies above zero: a positive
difference that one lucky scene explains is not a win. The relative gain is reported beside it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

from fourm_kfp.config.fourm_config import CAPTION_TO_RGB
from fourm_kfp.data.modalities import get_modality
from fourm_kfp.evaluation import paired_bootstrap
from fourm_kfp.evaluation.any_to_any import AnyToAny
from fourm_kfp.evaluation.scene_stats import SceneStats
from fourm_kfp.evaluation.shape_presence import best_constant_set, caption_shapes, shape_presence_stats, shape_set_stats
from fourm_kfp.evaluation.targets import CHAINED_TASKS, better, scorer, split_task, task_primary
from fourm_kfp.model.generation import SamplingArgs


@dataclass
class Scenes:
    """Val scenes: ground truth values per modality (prepared data) and crop-0 tokens (pretokenized data)."""

    keys: list[str]
    truth: dict[str, list[Any]]
    tokens: dict[str, list[np.ndarray]]

    def __len__(self) -> int:
        return len(self.keys)

    def head(self, n: int) -> "Scenes":
        """The first ``n`` scenes."""
        return Scenes(self.keys[:n], {m: v[:n] for m, v in self.truth.items()},
                      {m: v[:n] for m, v in self.tokens.items()})


@dataclass
class TaskResult:
    task: str
    metrics: dict[str, float]  # the model's
    ceiling: dict[str, float]
    baseline: dict[str, float]
    primary: str
    higher_is_better: bool
    scene_keys: list[str]  # the val scenes, in the order of the statistics' rows
    model_stats: SceneStats  # per-scene statistics of the model's predictions (every metric)
    baseline_stats: SceneStats
    # per shown sample: column title -> (modality, value)
    examples: list[dict[str, tuple[str, Any]]] = field(default_factory=list)
    #: the primary metric's difference to the baseline (positive = better) and its paired bootstrap interval
    interval: paired_bootstrap.Interval = field(init=False)

    def __post_init__(self) -> None:
        self.interval = paired_bootstrap.paired(self.model_stats.statistic(self.primary),
                                                self.baseline_stats.statistic(self.primary), len(self.scene_keys),
                                                self.higher_is_better)

    @classmethod
    def scored(cls, task: str, primary: str, higher_is_better: bool, keys: list[str], model: SceneStats,
               ceiling: SceneStats, baseline: SceneStats,
               examples: list[dict[str, tuple[str, Any]]]) -> "TaskResult":
        return cls(task, model.whole(), ceiling.whole(), baseline.whole(), primary, higher_is_better, list(keys),
                   model, baseline, examples)

    @property
    def difference(self) -> float:
        """Model minus baseline on the primary metric, signed so that positive is better."""
        return self.interval.difference

    @property
    def beats_baseline(self) -> bool:
        """The 95% interval of the difference lies above zero."""
        return self.interval.clears(0.0)

    @property
    def gain_over_baseline(self) -> float:
        """Relative improvement of the primary metric over the baseline (0.2 = 20% better; a point estimate, see
        :attr:`beats_baseline` for whether it is more than noise)."""
        model, base = self.metrics[self.primary], self.baseline[self.primary]
        if base == 0:  # no relative gain to speak of: unbounded if the model is better at all
            return float("inf") if better(self.task, model, base, higher=self.higher_is_better) else 0.0
        return (model - base) / abs(base) * (1 if self.higher_is_better else -1)

    def scene_scores(self) -> dict[str, dict[str, float]]:
        """The primary metric of each scene alone, for the model and the baseline, keyed by scene key."""
        return {side: dict(zip(self.scene_keys, stats.per_scene(self.primary)))
                for side, stats in (("model", self.model_stats), ("baseline", self.baseline_stats))}

    def to_dict(self) -> dict[str, Any]:
        return {"task": self.task, "primary": self.primary, "higher_is_better": self.higher_is_better,
                "model": self.metrics, "ceiling": self.ceiling, "baseline": self.baseline,
                "difference": self.difference, "interval_low": self.interval.low,
                "interval_high": self.interval.high, "resamples": self.interval.resamples,
                "confidence": paired_bootstrap.CONFIDENCE, "beats_baseline": self.beats_baseline,
                "gain_over_baseline": self.gain_over_baseline, "scene_scores": self.scene_scores()}


# -- the tasks ----------------------------------------------------------------------------------------------------

@dataclass
class Baselines:
    """Trivial predictions fitted on training scenes (one value used for every val scene): per scored modality its
    family's baseline (:mod:`.targets`), and for caption-to-rgb the set of shapes that scores best against the
    shapes the training captions name (:func:`~fourm_kfp.evaluation.shape_presence.best_constant_set`); and the
    class vocabularies they were fitted over, which the tasks are scored over too (the model's)."""

    predictions: dict[str, Any]
    shapes: frozenset[str]
    vocabularies: Mapping[str, Sequence[str]] = field(default_factory=dict)

    @classmethod
    def fit(cls, train: dict[str, list[Any]], vocabularies: Mapping[str, Sequence[str]] | None = None
            ) -> "Baselines":
        """``train``: training values per modality (those without a ``scoring`` are ignored); ``vocabularies``:
        the model's class vocabularies (:attr:`AnyToAny.vocabularies`; default: the synthetic scenes')."""
        predictions = {m: scorer(m, vocabularies).baseline(values) for m, values in train.items()
                       if values and get_modality(m).scoring}
        shapes = [caption_shapes(c) for c in train.get("caption", [])]
        return cls(predictions, best_constant_set(shapes), dict(vocabularies or {}))


def run_task(engine: AnyToAny, scenes: Scenes, task: str, baselines: Baselines, sampling: SamplingArgs,
             seed: int, batch_size: int, shown: int, map_sampling: SamplingArgs | None = None,
             text_sampling: SamplingArgs | None = None) -> TaskResult:
    """Score ``task`` on ``scenes``. ``sampling`` generates an image from text (caption-to-rgb's image);
    ``map_sampling`` (default ``sampling``) the dense maps read off an image (an image target from an image source,
    and caption-to-rgb's semseg of its own image); ``text_sampling`` (default ``sampling``) text targets."""
    source, target = split_task(task)
    inputs = engine.token_inputs(source, scenes.tokens[source], scenes.truth.get(source))
    map_sampling = map_sampling or sampling
    if task in CHAINED_TASKS:
        return _caption_to_rgb(engine, scenes, inputs, baselines, sampling, map_sampling, seed, batch_size, shown,
                               task_primary(task)[0])
    family = scorer(target, baselines.vocabularies)
    if engine.specs[target].kind == "sequence":
        how = text_sampling or sampling
    elif engine.specs[source].kind == "image":  # a map read off an image
        how = map_sampling
    else:
        how = sampling
    generated = engine.generate_tokens(inputs, target, how, seed, batch_size)
    predicted = engine.detokenize(target, [g.tokens for g in generated])
    ceiling_values = engine.detokenize(target, scenes.tokens[target]) if target in scenes.tokens else None
    truth = scenes.truth[target]
    n = len(scenes)
    confidence = [float(g.logprobs.mean()) if g.logprobs.size else -1e9 for g in generated]
    metrics = family.stats(predicted, truth, confidence)
    ceiling = family.stats(ceiling_values, truth, [0.0] * n)
    baseline = family.stats([baselines.predictions[target]] * n, truth, [0.0] * n)
    examples = [{"input": (source, scenes.truth[source][i]), "generated": (target, predicted[i]),
                 "ceiling": (target, ceiling_values[i]), "ground truth": (target, truth[i])}
                for i in range(min(shown, n))]
    return TaskResult.scored(task, family.primary_of(truth), family.higher_is_better, scenes.keys, metrics, ceiling,
                             baseline, examples)


def _caption_to_rgb(engine: AnyToAny, scenes: Scenes, inputs: list[dict[str, np.ndarray]], baselines: Baselines,
                    sampling: SamplingArgs, map_sampling: SamplingArgs, seed: int, batch_size: int, shown: int,
                    primary: str) -> TaskResult:
    captions = scenes.truth["caption"]
    rgb = engine.generate_tokens(inputs, "rgb", sampling, seed, batch_size)
    images = engine.detokenize("rgb", [g.tokens for g in rgb])
    predicted = read_semseg(engine, [g.tokens for g in rgb], images, map_sampling, seed + 1, batch_size)
    metrics = shape_presence_stats(predicted, captions)
    # The ceiling goes the same way from the true image's tokens: what a perfect rgb token predictor would score
    # with this reader, whose own mistakes (a shape's pixels given another shape's class) cap it below 1.
    true_tokens = scenes.tokens["rgb"]
    ceiling = shape_presence_stats(read_semseg(engine, true_tokens, engine.detokenize("rgb", true_tokens),
                                               map_sampling, seed + 1, batch_size), captions)
    baseline = shape_set_stats([baselines.shapes] * len(captions), [caption_shapes(c) for c in captions])
    examples = [{"input": ("caption", captions[i]), "generated": ("rgb", images[i]),
                 "its semseg": ("semseg", predicted[i]), "ground truth": ("rgb", scenes.truth["rgb"][i])}
                for i in range(min(shown, len(captions)))]
    return TaskResult.scored(CAPTION_TO_RGB, primary, True, scenes.keys, metrics, ceiling, baseline, examples)


def read_semseg(engine: AnyToAny, rgb_tokens: list[np.ndarray], images: list[np.ndarray], sampling: SamplingArgs,
                seed: int, batch_size: int) -> list[np.ndarray]:
    """The model reads an image: semseg predicted from the rgb (its tokens and decoded pixels) alone."""
    semseg = engine.generate_tokens(engine.token_inputs("rgb", [np.asarray(t).reshape(-1) for t in rgb_tokens],
                                                        images), "semseg", sampling, seed, batch_size)
    return engine.detokenize("semseg", [g.tokens for g in semseg])
