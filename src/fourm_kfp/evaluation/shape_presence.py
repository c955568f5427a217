"""Caption-to-rgb's score: do the shapes a caption names show in the generated image (numpy only).

==============  ===========================================================================  =======================
task            metrics                                                                      primary
==============  ===========================================================================  =======================
caption-to-rgb  ``shape_presence_f1`` (shapes seen vs named), ``.precision``, ``.recall``    ``shape_presence_f1`` ↑
==============  ===========================================================================  =======================

The shapes *seen* are the object classes covering enough of a semseg map (:func:`shapes_in_semseg`; the evaluate
stage reads that map off the generated image with the model itself), the shapes *named* those of the caption's
objects (:func:`caption_shapes`, through the synthetic scenes' caption grammar). The F1 is micro-averaged over the
set (:mod:`.micro_f1`). The trivial baseline is the one set of shapes that scores best for every scene
(:func:`best_constant_set`).
"""

from __future__ import annotations

from collections import Counter
from typing import Sequence

import numpy as np

from fourm_kfp.data.modalities import CLASS_NAMES, OBJECT_CLASSES
from fourm_kfp.data.scene_captions import parse_caption
from fourm_kfp.evaluation.micro_f1 import f1_precision_recall_finish, multiset_counts
from fourm_kfp.evaluation.scene_stats import SummedStats


def caption_shapes(text: str) -> frozenset[str]:
    """The set of shapes a caption names."""
    return frozenset(shape for _, _, shape in parse_caption(text))


def shapes_in_semseg(semseg: np.ndarray, min_fraction: float = 0.002) -> frozenset[str]:
    """Object classes (``OBJECT_CLASSES``) covering at least ``min_fraction`` of the pixels of a class-id map."""
    counts = np.bincount(np.asarray(semseg, dtype=np.int64).ravel(), minlength=len(CLASS_NAMES))
    first = CLASS_NAMES.index(OBJECT_CLASSES[0])
    return frozenset(name for c, name in enumerate(OBJECT_CLASSES, first) if counts[c] >= min_fraction * semseg.size)


def shape_set_stats(pred_sets: Sequence[frozenset[str]], true_sets: Sequence[frozenset[str]]) -> SummedStats:
    """``shape_presence_f1``: micro F1 between predicted and true sets of shapes, over the set, with its precision
    (``shape_presence_f1.precision``: of the shapes predicted, the share the truth has) and recall (``.recall``)."""
    rows = [multiset_counts(p, t) for p, t in zip(pred_sets, true_sets, strict=True)]
    columns = [f"shape_presence_f1.{part}" for part in ("matched", "predicted", "actual")]
    return SummedStats("set_f1", columns, np.array(rows, dtype=np.float64).reshape(-1, 3), f1_precision_recall_finish)


def shape_set_f1(pred_sets: Sequence[frozenset[str]], true_sets: Sequence[frozenset[str]]) -> dict[str, float]:
    """The whole set's :func:`shape_set_stats`."""
    return shape_set_stats(pred_sets, true_sets).whole()


def shape_presence_stats(pred_semsegs: Sequence[np.ndarray], captions: Sequence[str]) -> SummedStats:
    """Micro F1 of the shapes visible in each predicted semseg vs the set of shapes its caption names."""
    return shape_set_stats([shapes_in_semseg(s) for s in pred_semsegs], [caption_shapes(c) for c in captions])


def shape_presence_f1(pred_semsegs: Sequence[np.ndarray], captions: Sequence[str]) -> dict[str, float]:
    """The whole set's :func:`shape_presence_stats`."""
    return shape_presence_stats(pred_semsegs, captions).whole()


def best_constant_set(true_sets: Sequence[frozenset[str]]) -> frozenset[str]:
    """The one set of shapes that, predicted for every scene, has the highest :func:`shape_set_stats` F1 on
    ``true_sets``: the trivial baseline of caption-to-rgb.

    With one set ``S`` for all ``N`` scenes, micro F1 is ``2 * sum(n_c for c in S) / (|S| * N + A)`` (``n_c``: the
    scenes naming shape ``c``, ``A``: the shapes named in all), so among sets of ``k`` shapes the ``k`` most named
    are best, and the answer is the best of those prefixes. The most common set is a weaker baseline: naming every
    shape buys recall 1 at a precision of about half on scenes of two shapes out of four."""
    counts = Counter(shape for t in true_sets for shape in t)
    named = sum(counts.values())
    ranked = sorted(counts, key=lambda shape: (-counts[shape], shape))
    best, best_f1 = frozenset(), 0.0
    for k in range(1, len(ranked) + 1):
        f1 = 2 * sum(counts[c] for c in ranked[:k]) / (k * len(true_sets) + named)
        if f1 > best_f1:
            best, best_f1 = frozenset(ranked[:k]), f1
    return best
