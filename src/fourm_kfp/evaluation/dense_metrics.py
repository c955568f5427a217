"""Metrics of the dense targets (depth, surface normals, semantic segmentation), computed over a whole evaluation
set from per-scene sums (numpy only, independent of the model).

==============  ===========================================================================  =======================
task            metrics                                                                      primary
==============  ===========================================================================  =======================
rgb-to-depth    ``abs_rel``, ``rmse`` (metres), ``delta1`` (max ratio < 1.25)                ``abs_rel`` ↓
rgb-to-normal   ``mean_angle_deg``, ``within_11_25`` (fraction of pixels)                    ``mean_angle_deg`` ↓
rgb-to-semseg   ``miou`` (classes in truth or prediction), ``pixel_accuracy``                ``miou`` ↑
rgb-to-clip     ``cosine`` (mean over cells of the feature vectors' cosine), ``mse``        ``cosine`` ↑
(``dinov2``)    (per value, the features' units)
==============  ===========================================================================  =======================

Each ``*_stats`` function returns the per-scene statistics (:class:`~.scene_stats.SummedStats`) and each
``*_metrics`` / :func:`semseg_miou` the whole set's metrics as a dict of floats. The primary metrics and their
direction (↑ higher is better, ↓ lower) come from the scorer families (:mod:`fourm_kfp.evaluation.targets`); the
trivial baselines (mean depth, normal or feature map, majority class map) are the tokenizer reports' ones in
:mod:`fourm_kfp.tokenizers.metrics`.

Invalid pixels: the synthetic renderer gives sky (a ray that misses the 25 m ground disc and every object) depth 0
and a zero normal; shards keep that (depth PNG value 0 = invalid, normal PNG black = invalid) and decode it back to
0 / the zero vector, so there is no "far" depth value. Depth is scored where the truth is positive and finite,
normals where the true normal is non-zero.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

from fourm_kfp.data.modalities import MAX_DEPTH_M
from fourm_kfp.data.vocabularies import DEFAULT_VOCABULARIES
from fourm_kfp.evaluation.scene_stats import SummedStats, ratio
from fourm_kfp.tokenizers.metrics import cosine_similarity

#: Predicted depths are clamped to at least this (metres) so that ratios stay finite.
MIN_DEPTH_M = 1e-3
#: semseg's class count where none is given: the default vocabulary's (a dataset's own comes with the model).
_DEFAULT_CLASSES = len(DEFAULT_VOCABULARIES["semseg"])
#: A vocabulary of up to this many classes keeps every cell of the confusion matrix in semseg's per-scene statistics
#: (the columns of the six synthetic classes' saved evaluations); a larger one keeps the cells some scene has, so the
#: statistics (and the bootstrap over them) grow with what the scenes show, not with the vocabulary squared.
DENSE_CONFUSION_CLASSES = 64


def depth_finish(t: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {"abs_rel": ratio(t["abs_rel"], t["pixels"]), "rmse": np.sqrt(ratio(t["squared_error"], t["pixels"])),
            "delta1": ratio(t["delta1"], t["pixels"])}


def normal_finish(t: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {"mean_angle_deg": ratio(t["angle_deg"], t["pixels"]),
            "within_11_25": ratio(t["within_11_25"], t["pixels"])}


def _class_sums(totals: np.ndarray, class_of: np.ndarray, count: int) -> np.ndarray:
    """``[R, cells]`` counts summed per class (``class_of[cell]`` in ``0..count - 1``) → ``[R, count]``; exact, as
    the counts are whole numbers."""
    order = np.argsort(class_of, kind="stable")
    bounds = np.searchsorted(class_of[order], np.arange(count + 1))
    running = np.concatenate([np.zeros((len(totals), 1)), np.cumsum(totals[:, order], axis=1)], axis=1)
    return running[:, bounds[1:]] - running[:, bounds[:-1]]


def semseg_finish(t: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Columns ``"<true>,<pred>"``: cells of the summed confusion matrix (every cell, or those some scene has: the
    others are 0); mIoU over the classes in truth or prediction."""
    cells = np.array([name.split(",") for name in t], dtype=np.int64).reshape(-1, 2)
    classes, index = np.unique(cells, return_inverse=True)
    true_of, pred_of = index.reshape(-1, 2).T
    totals = np.stack(list(t.values()), axis=-1)
    diagonal = true_of == pred_of
    intersection = np.zeros((len(totals), len(classes)))
    intersection[:, true_of[diagonal]] = totals[:, diagonal]
    union = _class_sums(totals, pred_of, len(classes)) + _class_sums(totals, true_of, len(classes)) - intersection
    present = union > 0
    iou = np.divide(intersection, union, out=np.zeros(union.shape), where=present)
    return {"miou": ratio(iou.sum(1), present.sum(1).astype(np.float64)),
            "pixel_accuracy": intersection.sum(1) / np.maximum(totals.sum(1), 1)}


def depth_stats(pred: np.ndarray, true: np.ndarray) -> SummedStats:
    """``[N, H, W]`` depths in metres, on pixels whose truth is positive and finite (metrics NaN without any):
    ``abs_rel``, ``rmse``, ``delta1``.

    The prediction is clamped to ``[MIN_DEPTH_M, MAX_DEPTH_M]`` first (NaN counts as ``MIN_DEPTH_M``)."""
    true = np.where(np.isfinite(true), true, 0.0).astype(np.float64)
    valid = true > 0
    p = np.clip(np.nan_to_num(np.asarray(pred, dtype=np.float64), nan=0.0), MIN_DEPTH_M, MAX_DEPTH_M)
    t = np.where(valid, true, 1.0)
    axes = tuple(range(1, true.ndim))
    columns = {"abs_rel": np.abs(p - t) / t, "squared_error": (p - t) ** 2,
               "delta1": np.maximum(p / t, t / p) < 1.25, "pixels": np.ones_like(t)}
    return SummedStats("depth", columns, np.stack([np.where(valid, v, 0.0).sum(axes) for v in columns.values()], 1),
                       depth_finish)


def depth_metrics(pred: np.ndarray, true: np.ndarray) -> dict[str, float]:
    """The whole set's :func:`depth_stats`."""
    return depth_stats(pred, true).whole()


def _unit(vectors: np.ndarray) -> np.ndarray:
    vectors = vectors.astype(np.float64)
    return vectors / np.maximum(np.linalg.norm(vectors, axis=-1, keepdims=True), 1e-8)


def normal_stats(pred: np.ndarray, true: np.ndarray, valid: np.ndarray | None = None) -> SummedStats:
    """``[N, H, W, 3]`` float normals (both normalised first; a zero prediction scores 90°) on ``valid`` pixels
    (default: non-zero truth): ``mean_angle_deg``, ``within_11_25`` (NaN without any valid pixel)."""
    valid = np.any(true != 0, axis=-1) if valid is None else np.asarray(valid, dtype=bool)
    cosine = np.sum(_unit(np.asarray(pred)) * _unit(np.asarray(true)), axis=-1)
    angle = np.degrees(np.arccos(np.clip(cosine, -1.0, 1.0)))
    axes = tuple(range(1, valid.ndim))
    columns = {"angle_deg": angle, "within_11_25": angle < 11.25, "pixels": np.ones_like(angle)}
    return SummedStats("normal", columns, np.stack([np.where(valid, v, 0.0).sum(axes) for v in columns.values()], 1),
                       normal_finish)


def normal_metrics(pred: np.ndarray, true: np.ndarray, valid: np.ndarray | None = None) -> dict[str, float]:
    """The whole set's :func:`normal_stats`."""
    return normal_stats(pred, true, valid).whole()


def semseg_stats(pred: np.ndarray, true: np.ndarray, num_classes: int = _DEFAULT_CLASSES) -> SummedStats:
    """Class-id maps ``[N, H, W]`` with ids below ``num_classes`` (the vocabulary's size): a confusion matrix per
    scene, summed over the set; ``miou`` (mean IoU over the classes present in truth or prediction) and
    ``pixel_accuracy``."""
    for name, ids in (("pred", pred), ("true", true)):
        if ids.size and (ids.min() < 0 or ids.max() >= num_classes):
            raise ValueError(f"semseg_stats: {name} has class ids outside 0..{num_classes - 1}")
    n = len(true)
    codes = (np.asarray(true, np.int64) * num_classes + np.asarray(pred, np.int64)).reshape(n, -1)
    # the cells kept: all of a small vocabulary's (DENSE_CONFUSION_CLASSES), else those some scene has
    cells = np.arange(num_classes**2) if num_classes <= DENSE_CONFUSION_CLASSES else np.unique(codes)
    flat = np.searchsorted(cells, codes) + len(cells) * np.arange(n)[:, None]
    confusion = np.bincount(flat.ravel(), minlength=n * len(cells)).reshape(n, len(cells))
    columns = [f"{c // num_classes},{c % num_classes}" for c in cells.tolist()]
    return SummedStats("semseg", columns, confusion, semseg_finish)


def features_finish(t: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {"cosine": ratio(t["cosine"], t["cells"]), "mse": ratio(t["squared_error"], t["values"])}


def feature_stats(pred: np.ndarray, true: np.ndarray) -> SummedStats:
    """Feature maps ``[N, g, g, C]``: per scene the summed cosine of predicted and true feature vectors over the
    cells (a zero vector scores 0) and the summed squared error; ``cosine`` (mean over cells) and ``mse``."""
    pred, true = np.asarray(pred, np.float64), np.asarray(true, np.float64)
    if pred.shape != true.shape:
        raise ValueError(f"feature_stats: predicted maps {pred.shape}, true maps {true.shape}")
    n = len(true)
    cosine = cosine_similarity(pred, true).reshape(n, -1)
    squared = ((pred - true) ** 2).reshape(n, -1)
    sums = np.stack([cosine.sum(1), np.full(n, cosine.shape[1]), squared.sum(1), np.full(n, squared.shape[1])], 1)
    return SummedStats("features", ("cosine", "cells", "squared_error", "values"), sums, features_finish)


def semseg_miou(pred: np.ndarray, true: np.ndarray, num_classes: int = _DEFAULT_CLASSES) -> dict[str, float]:
    """The whole set's :func:`semseg_stats` (one confusion matrix over the set)."""
    return semseg_stats(pred, true, num_classes).whole()
