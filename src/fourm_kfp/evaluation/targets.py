"""How the evaluate stage scores a generated modality: a small registry of scorer families.

A modality's entry in the modality table (:data:`fourm_kfp.data.modalities.MODALITIES`) names its family in
``scoring``; the family gives the per-scene statistics of predictions against the exact truth (every metric of the
task: :mod:`.dense_metrics`, :mod:`.detection_metrics`, :mod:`.caption_metrics`), the primary metric and its
direction, and the trivial baseline fitted on training values (one prediction for every val scene; the text
targets' is :func:`most_common`). So a new modality scored like an existing one (a second depth sensor, another
label map) needs no code here: its table entry names the family, and the ``rgb-to-<name>`` task follows
(:data:`fourm_kfp.config.fourm_config.EVALUATION_TASKS`); what else a new modality needs is listed in
``docs/ARCHITECTURE.md``. The ``classes`` and ``boxes`` families are scored over the model's class vocabularies
(its tokenizer bundle's, :func:`scorer`; the synthetic scenes' by default).

=========  ========================================================  ======================================
family     metrics (primary first)                                   baseline
=========  ========================================================  ======================================
depth      ``abs_rel`` ↓, ``rmse``, ``delta1``                       per-pixel mean depth (valid pixels)
normal     ``mean_angle_deg`` ↓, ``within_11_25``                    per-pixel mean normal
classes    ``miou`` ↑, ``pixel_accuracy``                            per-pixel majority class
boxes      ``ap50`` ↑, ``ap50_<class>``                              the most common det text
caption    ``object_f1`` ↑ (``word_f1`` on real captions), others    the most common caption
edges      ``edge_f1_1px`` ↑, precision/recall, ``pixel_err``        the best per-pixel frequency map
palette    ``delta_e`` ↓ (CIELAB), ``well_formed_rate``              the medoid training palette
metadata   ``bin_error`` ↓, ``exact_bin_accuracy``, others           each field's median training bin
features   ``cosine`` ↑ (mean over cells), ``mse``                   the mean training feature map
=========  ========================================================  ======================================

``edges``, ``palette`` and ``metadata`` score 4M-21's pseudo-labelled modalities (``canny_edge``,
``color_palette``, ``metadata``; their definitions are in :mod:`.label_metrics`), ``features`` its teachers' feature
maps (``clip``, ``dinov2``: :func:`.dense_metrics.feature_stats`). ``edges`` fits any 0/1 map, but the synthetic
``edge`` has no ``scoring``: giving it one would add a task to the synthetic presets' evaluation.

``caption-to-rgb`` is the one chained task: its image is scored through the semseg the model reads off it
(:data:`CHAINED_TASKS`, :mod:`.shape_presence`). Whether one score beats another is the margin rule of
:func:`beats`, which the model gate applies too.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, Hashable, Mapping, Sequence, TypeVar

import numpy as np

from fourm_kfp.config.fourm_config import CAPTION_TO_RGB
from fourm_kfp.data.modalities import get_modality, parse_det
from fourm_kfp.data.vocabularies import DEFAULT_VOCABULARIES
from fourm_kfp.evaluation.caption_metrics import caption_primary, caption_stats
from fourm_kfp.evaluation.dense_metrics import depth_stats, feature_stats, normal_stats, semseg_stats
from fourm_kfp.evaluation.detection_metrics import box_stats, parse_generated_det
from fourm_kfp.evaluation.label_metrics import (
    best_frequency_map,
    edge_stats,
    median_metadata,
    medoid_palette,
    metadata_stats,
    palette_stats,
)
from fourm_kfp.evaluation.scene_stats import SceneStats
from fourm_kfp.tokenizers.metrics import majority_map, mean_depth, mean_feature_map, mean_normal

H = TypeVar("H", bound=Hashable)


def beats(new: float, old: float, higher_is_better: bool, margin: float = 0.0) -> bool:
    """The margin rule (also the model gate's): strictly better than ``old``, and by at least ``margin * |old|``
    (``|old|`` keeps it meaningful for negative scores; anything strictly better beats an ``old`` of 0)."""
    if higher_is_better:
        return new > old and new >= old + margin * abs(old)
    return new < old and new <= old - margin * abs(old)


def most_common(items: Sequence[H]) -> H:
    """The most frequent item; ties go to the one seen first (the trivial baseline of the text targets)."""
    if not items:
        raise ValueError("most_common: no items")
    counts = Counter(items)
    best = max(counts.values())
    return next(item for item in items if counts[item] == best)


@dataclass(frozen=True)
class Scorer:
    """One family: ``stats(predicted, truth, confidence)`` (a confidence per scene: the model's mean
    log-probability of what it generated, 0 for references), the primary metric and its direction, ``baseline``
    (training values → the one prediction used for every scene), and optionally ``primary_for`` (the truth picks
    the primary metric) and, for a family scored over a class vocabulary, ``with_vocabulary`` (the family over
    another vocabulary: the model's, :func:`scorer`)."""

    primary: str
    higher_is_better: bool
    stats: Callable[[Sequence[Any], Sequence[Any], Sequence[float]], SceneStats]
    baseline: Callable[[list[Any]], Any]
    primary_for: Callable[[Sequence[Any]], str] | None = None
    with_vocabulary: Callable[[Sequence[str]], "Scorer"] | None = None

    def primary_of(self, truth: Sequence[Any]) -> str:
        return self.primary_for(truth) if self.primary_for else self.primary


def _boxes(texts: Sequence[str], confidence: Sequence[float],
           classes: Sequence[str]) -> list[list[tuple[Any, str, float]]]:
    """Boxes of generated det texts naming ``classes``; a box's score is its text's confidence, earlier boxes
    first."""
    return [[(box, name, score - 1e-3 * i) for i, (box, name) in enumerate(parse_generated_det(text, classes))]
            for text, score in zip(texts, confidence)]


def _true_boxes(texts: Sequence[str]) -> list[list[tuple[Any, str]]]:
    return [[(tuple(float(c) for c in box), name) for box, name in parse_det(text)] for text in texts]


def _class_scorer(classes: Sequence[str]) -> Scorer:
    """The ``classes`` family over a semseg vocabulary: mIoU over its ids, the per-pixel majority as baseline."""
    n = len(classes)
    return Scorer("miou", True, lambda p, t, _: semseg_stats(np.stack(p), np.stack(t), n),
                  lambda train: majority_map(n)(np.stack(train)), with_vocabulary=_class_scorer)


def _box_scorer(classes: Sequence[str]) -> Scorer:
    """The ``boxes`` family over a det vocabulary: AP50 over its names, the most common det text as baseline."""
    classes = tuple(classes)
    return Scorer("ap50", True, lambda p, t, c: box_stats(_boxes(p, c, classes), _true_boxes(t), classes),
                  most_common, with_vocabulary=_box_scorer)


SCORERS: dict[str, Scorer] = {
    "depth": Scorer("abs_rel", False, lambda p, t, _: depth_stats(np.stack(p), np.stack(t)),
                    lambda train: mean_depth(np.stack(train))),
    "normal": Scorer("mean_angle_deg", False, lambda p, t, _: normal_stats(np.stack(p), np.stack(t)),
                     lambda train: mean_normal(np.stack(train))),
    "classes": _class_scorer(DEFAULT_VOCABULARIES["semseg"]),
    "boxes": _box_scorer(DEFAULT_VOCABULARIES["det"]),
    "caption": Scorer("object_f1", True, lambda p, t, _: caption_stats(p, t), most_common,
                      primary_for=caption_primary),
    "edges": Scorer("edge_f1_1px", True, lambda p, t, _: edge_stats(np.stack(p), np.stack(t)),
                    lambda train: best_frequency_map(np.stack(train))),
    "palette": Scorer("delta_e", False, lambda p, t, _: palette_stats(p, t), medoid_palette),
    "metadata": Scorer("bin_error", False, lambda p, t, _: metadata_stats(p, t), median_metadata),
    "features": Scorer("cosine", True, lambda p, t, _: feature_stats(np.stack(p), np.stack(t)),
                       lambda train: mean_feature_map(np.stack(train))),
}

@dataclass(frozen=True)
class ChainedTask:
    """A task scored through a chain rather than its target's family: the modalities the chain reads besides the
    task's own, and its primary metric and direction."""

    needs: tuple[str, ...]
    primary: str
    higher_is_better: bool


CHAINED_TASKS: dict[str, ChainedTask] = {CAPTION_TO_RGB: ChainedTask(("semseg",), "shape_presence_f1", True)}


def split_task(task: str) -> tuple[str, str]:
    """``"rgb-to-depth"`` → ``("rgb", "depth")``."""
    source, sep, target = task.partition("-to-")
    if not sep or not source or not target:
        raise ValueError(f"task {task!r}: expected <source>-to-<target>")
    return source, target


def task_modalities(task: str) -> set[str]:
    """Every modality ``task`` reads: its source and target, and what its chain needs."""
    chained = CHAINED_TASKS.get(task)
    return set(split_task(task)) | set(chained.needs if chained else ())


def scorer(modality: str, vocabularies: Mapping[str, Sequence[str]] | None = None) -> Scorer:
    """The scorer family of a generated ``modality`` (its ``scoring`` in the modality table), over the modality's
    class vocabulary in ``vocabularies`` (the model's tokenizer bundle's) when its family has classes; without one,
    over the default vocabulary."""
    family = get_modality(modality).scoring
    if not family:
        raise ValueError(f"modality {modality!r} has no scoring in the modality table: no task generates it")
    found, vocabulary = SCORERS[family], (vocabularies or {}).get(modality)
    return found.with_vocabulary(vocabulary) if vocabulary is not None and found.with_vocabulary else found


def task_primary(task: str) -> tuple[str, bool]:
    """``(primary metric, higher is better)`` of a task (for captions, the metric the synthetic truth uses)."""
    chained = CHAINED_TASKS.get(task)
    if chained:
        return chained.primary, chained.higher_is_better
    family = scorer(split_task(task)[1])
    return family.primary, family.higher_is_better


def better(task: str, a: float, b: float, margin: float = 0.0, *, higher: bool | None = None) -> bool:
    """Whether ``a`` beats ``b`` on ``task``'s primary metric by the relative ``margin`` (:func:`beats`); a
    non-finite value on either side is never better. ``higher`` overrides the task's direction (for a primary
    metric chosen by the data, see :func:`~.caption_metrics.caption_primary`)."""
    if not (math.isfinite(a) and math.isfinite(b)):
        return False
    return beats(a, b, task_primary(task)[1] if higher is None else higher, margin)
