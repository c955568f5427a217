"""Reconstruction error metrics per image modality, and the trivial baseline each is compared against.

Metrics compare in-memory arrays (a reconstruction vs the original), so they measure the whole round trip
array → tokens → array. The baseline predicts one fixed image for every sample: the per-pixel mean of the
training set (rgb; depth and normal over valid pixels) or the per-pixel majority class (semseg, edge).
``primary`` names the error (lower is better) that :func:`~fourm_kfp.tokenizers.training.evaluate_tokenizer`
divides by the baseline's to report ``error_ratio``.

=========  ===================================================================  ==============
modality   errors                                                               primary
=========  ===================================================================  ==============
rgb        ``mse`` (0..255 units), ``psnr`` (dB)                                 ``mse``
depth      ``abs_rel``, ``rmse`` (metres) on valid pixels; ``valid_acc``           ``abs_rel``
normal     ``angle_deg`` (mean angular error) on valid pixels; ``valid_acc``       ``angle_deg``
semseg     ``pixel_acc``, ``miou``, ``pixel_err`` (= 1 - pixel_acc)                  ``pixel_err``
edge       ``pixel_acc``, ``miou`` (edge / no-edge), ``pixel_err``                   ``pixel_err``
canny_edge as edge                                                                    ``pixel_err``
=========  ===================================================================  ==============
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from fourm_kfp.data.modalities import MAX_SEMSEG_CLASSES, get_modality
from fourm_kfp.data.vocabularies import DEFAULT_VOCABULARIES


def rgb_errors(pred: np.ndarray, true: np.ndarray) -> dict[str, float]:
    mse = float(np.mean((pred.astype(np.float64) - true.astype(np.float64)) ** 2))
    return {"mse": mse, "psnr": float(10 * np.log10(255.0**2 / max(mse, 1e-10)))}


def depth_errors(pred: np.ndarray, true: np.ndarray) -> dict[str, float]:
    valid = true > 0
    p, t = pred[valid].astype(np.float64), true[valid].astype(np.float64)
    return {
        "abs_rel": float(np.mean(np.abs(p - t) / t)),
        "rmse": float(np.sqrt(np.mean((p - t) ** 2))),
        "valid_acc": float(np.mean((pred > 0) == valid)),
    }


def normal_errors(pred: np.ndarray, true: np.ndarray) -> dict[str, float]:
    valid = np.any(true != 0, axis=-1)
    cosine = np.clip(np.sum(pred[valid].astype(np.float64) * true[valid], axis=-1), -1.0, 1.0)
    return {
        "angle_deg": float(np.degrees(np.arccos(cosine)).mean()),
        "valid_acc": float(np.mean(np.any(pred != 0, axis=-1) == valid)),
    }


def _class_errors(num_classes: int) -> Callable[[np.ndarray, np.ndarray], dict[str, float]]:
    """Class-map errors over at least ``num_classes`` classes (more when the ids go higher: a semseg vocabulary is
    the dataset's); mIoU is over the classes in truth or prediction, so the count does not change it."""

    def errors(pred: np.ndarray, true: np.ndarray) -> dict[str, float]:
        pred, true = pred.astype(np.int64).ravel(), true.astype(np.int64).ravel()
        n = max(num_classes, int(max(pred.max(initial=0), true.max(initial=0))) + 1)
        confusion = np.bincount(true * n + pred, minlength=n**2).reshape(n, -1)
        intersection = np.diag(confusion)
        union = confusion.sum(0) + confusion.sum(1) - intersection
        accuracy = float(intersection.sum() / max(true.size, 1))
        miou = float(np.mean(intersection[union > 0] / union[union > 0]))
        return {"pixel_acc": accuracy, "miou": miou, "pixel_err": 1.0 - accuracy}

    return errors


def mean_image(train: np.ndarray) -> np.ndarray:
    return np.round(train.astype(np.float64).mean(0)).astype(train.dtype)


def mean_depth(train: np.ndarray) -> np.ndarray:
    valid = train > 0
    total, count = np.where(valid, train, 0).sum(0, dtype=np.float64), valid.sum(0)
    fallback = train[valid].mean() if valid.any() else 0.0
    return np.where(count > 0, total / np.maximum(count, 1), fallback).astype(np.float32)


def mean_normal(train: np.ndarray) -> np.ndarray:
    total = train.astype(np.float64).sum(0)
    norm = np.linalg.norm(total, axis=-1, keepdims=True)
    return np.where(norm > 1e-6, total / np.maximum(norm, 1e-6), (0.0, 0.0, 1.0)).astype(np.float32)


def majority_map(num_classes: int) -> Callable[[np.ndarray], np.ndarray]:
    """Training class maps ``[N, H, W]`` → the most frequent id per pixel (ties: the lower id), for ids in
    ``0..num_classes - 1``; memory does not grow with the number of classes."""

    def baseline(train: np.ndarray) -> np.ndarray:
        ids = np.unique(train)
        if ids.size and (ids[0] < 0 or ids[-1] >= num_classes):
            raise ValueError(f"majority_map: class ids {ids[0]}..{ids[-1]} outside 0..{num_classes - 1}")
        best = np.zeros(train.shape[1:], train.dtype)
        best_count = np.full(train.shape[1:], -1, np.int64)
        for c in ids:  # ascending: a later class wins a pixel only with strictly more votes
            count = (train == c).sum(0)
            better = count > best_count
            best, best_count = np.where(better, c, best).astype(train.dtype), np.where(better, count, best_count)
        return best

    return baseline


@dataclass(frozen=True)
class ModalityMetrics:
    """Error metrics of a modality, its trivial baseline (training arrays → one prediction) and primary error."""

    name: str
    errors: Callable[[np.ndarray, np.ndarray], dict[str, float]]
    baseline: Callable[[np.ndarray], np.ndarray]

    @property
    def primary(self) -> str:
        """The primary error, as the modality table names it."""
        return get_modality(self.name).metric


METRICS: dict[str, ModalityMetrics] = {m.name: m for m in (
    ModalityMetrics("rgb", rgb_errors, mean_image),
    ModalityMetrics("depth", depth_errors, mean_depth),
    ModalityMetrics("normal", normal_errors, mean_normal),
    # the semseg vocabulary is the dataset's: its errors and baseline take whatever ids the maps hold
    ModalityMetrics("semseg", _class_errors(len(DEFAULT_VOCABULARIES["semseg"])), majority_map(MAX_SEMSEG_CLASSES)),
    ModalityMetrics("edge", _class_errors(2), majority_map(2)),
    ModalityMetrics("canny_edge", _class_errors(2), majority_map(2)),
)}
