"""Metrics of the dense targets (depth, surface normals, semantic segmentation), computed over a whole evaluation
set from per-scene sums (numpy only, independent of the model).

==============  ===========================================================================  =======================
task            metrics                                                                      primary
==============  ===========================================================================  =======================
rgb-to-depth    ``abs_rel``, ``rmse`` (metres), ``delta1`` (max ratio < 1.25)                ``abs_rel`` ↓
rgb-to-normal   ``mean_angle_deg``, ``within_11_25`` (fraction of pixels)                    ``mean_angle_deg`` ↓
rgb-to-semseg   ``miou`` (classes in truth or prediction), ``pixel_accuracy``                ``miou`` ↑
==============  ===========================================================================  =======================

Each ``*_stats`` function returns the per-scene statistics (:class:`~.scene_stats.SummedStats`) and each
``*_metrics`` / :func:`semseg_miou` the whole set's metrics as a dict of floats. The primary metrics and their
direction (↑ higher is better, ↓ lower) come from the scorer families (:mod:`fourm_kfp.evaluation.targets`); the
trivial baselines (mean depth or normal map, majority class map) are the tokenizer reports' ones in
:mod:`fourm_kfp.tokenizers.metrics`.

Invalid pixels: the synthetic renderer gives sky (a ray that misses the 25 m ground disc and every object) depth 0
and a zero normal; shards keep that (depth PNG value 0 = invalid, normal PNG black = invalid) and decode it back to
0 / the zero vector, so there is no "far" depth value. Depth is scored where the truth is positive and finite,
normals where the true normal is non-zero.
"""

from __future__ import annotations

import math
from typing import Mapping

import numpy as np

from fourm_kfp.data.modalities import CLASS_NAMES, MAX_DEPTH_M
from fourm_kfp.evaluation.scene_stats import SummedStats, ratio

#: Predicted depths are clamped to at least this (metres) so that ratios stay finite.
MIN_DEPTH_M = 1e-3


def depth_finish(t: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {"abs_rel": ratio(t["abs_rel"], t["pixels"]), "rmse": np.sqrt(ratio(t["squared_error"], t["pixels"])),
            "delta1": ratio(t["delta1"], t["pixels"])}


def normal_finish(t: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {"mean_angle_deg": ratio(t["angle_deg"], t["pixels"]),
            "within_11_25": ratio(t["within_11_25"], t["pixels"])}


def semseg_finish(t: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Columns ``"<true>,<pred>"``: the summed confusion matrix; mIoU over the classes in truth or prediction."""
    c = math.isqrt(len(t))
    confusion = np.stack(list(t.values()), axis=-1).reshape(-1, c, c)
    intersection = np.diagonal(confusion, axis1=1, axis2=2)
    union = confusion.sum(1) + confusion.sum(2) - intersection
    present = union > 0
    iou = np.divide(intersection, union, out=np.zeros(union.shape), where=present)
    return {"miou": ratio(iou.sum(1), present.sum(1).astype(np.float64)),
            "pixel_accuracy": intersection.sum(1) / np.maximum(confusion.sum((1, 2)), 1)}


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


def semseg_stats(pred: np.ndarray, true: np.ndarray, num_classes: int = len(CLASS_NAMES)) -> SummedStats:
    """Class-id maps ``[N, H, W]``: a confusion matrix per scene, summed over the set; ``miou`` (mean IoU over the
    classes present in truth or prediction) and ``pixel_accuracy``."""
    for name, ids in (("pred", pred), ("true", true)):
        if ids.size and (ids.min() < 0 or ids.max() >= num_classes):
            raise ValueError(f"semseg_stats: {name} has class ids outside 0..{num_classes - 1}")
    n, cells = len(true), num_classes * num_classes
    flat = (np.asarray(true, np.int64) * num_classes + np.asarray(pred, np.int64)).reshape(n, -1)
    flat = flat + cells * np.arange(n)[:, None]
    confusion = np.bincount(flat.ravel(), minlength=n * cells).reshape(n, cells)
    columns = [f"{t},{p}" for t in range(num_classes) for p in range(num_classes)]
    return SummedStats("semseg", columns, confusion, semseg_finish)


def semseg_miou(pred: np.ndarray, true: np.ndarray, num_classes: int = len(CLASS_NAMES)) -> dict[str, float]:
    """The whole set's :func:`semseg_stats` (one confusion matrix over the set)."""
    return semseg_stats(pred, true, num_classes).whole()
