"""Reconstruction error metrics per image modality, and the trivial baseline each is compared against.

Metrics compare in-memory arrays (a reconstruction vs the original), so they measure the whole round trip
array → tokens → array. The baseline predicts one fixed image for every sample: the per-pixel mean of the
training set (rgb; depth and normal over valid pixels; a feature map's per-cell mean) or the per-pixel majority
class (semseg, edge). ``primary`` names the error (lower is better, the modality record's ``metric``) that
:func:`~fourm_kfp.tokenizers.training.evaluate_tokenizer` divides by the baseline's to report ``error_ratio``.

A modality's record names its family of errors and baseline (``errors``, a key of :data:`ERROR_FAMILIES`);
:data:`METRICS` gives each image modality its family's with the record's primary error.

=========  ============================  =================================================================
family     modalities                    errors
=========  ============================  =================================================================
rgb        rgb                           ``mse`` (0..255 units), ``psnr`` (dB)
depth      depth                         ``abs_rel``, ``rmse`` (metres) on valid pixels; ``valid_acc``
normal     normal                        ``angle_deg`` (mean angular error) on valid pixels; ``valid_acc``
classes    semseg                        ``pixel_acc``, ``miou``, ``pixel_err`` (= 1 - pixel_acc)
binary     edge, canny_edge              ``pixel_acc``, ``miou`` (edge / no-edge), ``pixel_err``
features   clip, dinov2                  ``mse`` (the features' units), ``cosine`` (mean over cells)
=========  ============================  =================================================================
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from fourm_kfp.data.modalities import MAX_SEMSEG_CLASSES, MODALITIES, get_modality
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


def cosine_similarity(pred: np.ndarray, true: np.ndarray) -> np.ndarray:
    """The cosine of the feature vectors ``[..., C]`` cell by cell (``[...]``); 0 where either is the zero vector."""
    pred, true = np.asarray(pred, np.float64), np.asarray(true, np.float64)
    norms = np.linalg.norm(pred, axis=-1) * np.linalg.norm(true, axis=-1)
    return np.divide(np.sum(pred * true, axis=-1), norms, out=np.zeros(norms.shape), where=norms > 0)


def feature_errors(pred: np.ndarray, true: np.ndarray) -> dict[str, float]:
    squared = (np.asarray(pred, np.float64) - np.asarray(true, np.float64)) ** 2
    return {"mse": float(squared.mean()), "cosine": float(cosine_similarity(pred, true).mean())}


def mean_feature_map(train: np.ndarray) -> np.ndarray:
    """Training feature maps ``[N, g, g, C]`` → their mean map (float32)."""
    return np.asarray(train, np.float64).mean(0).astype(np.float32)


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


Errors = Callable[[np.ndarray, np.ndarray], dict[str, float]]  # (reconstructions, originals) -> errors
Baseline = Callable[[np.ndarray], np.ndarray]  # training arrays -> the one prediction for every sample


@dataclass(frozen=True)
class ModalityMetrics:
    """Error metrics of a modality, its trivial baseline (training arrays → one prediction) and primary error."""

    name: str
    errors: Errors
    baseline: Baseline

    @property
    def primary(self) -> str:
        """The primary error, as the modality table names it."""
        return get_modality(self.name).metric


#: The families of errors and baselines a modality record names (``errors``): ``(errors, baseline)``.
ERROR_FAMILIES: dict[str, tuple[Errors, Baseline]] = {
    "rgb": (rgb_errors, mean_image),
    "depth": (depth_errors, mean_depth),
    "normal": (normal_errors, mean_normal),
    # the semseg vocabulary is the dataset's: its errors and baseline take whatever ids the maps hold
    "classes": (_class_errors(len(DEFAULT_VOCABULARIES["semseg"])), majority_map(MAX_SEMSEG_CLASSES)),
    "binary": (_class_errors(2), majority_map(2)),
    "features": (feature_errors, mean_feature_map),
}

#: Every image modality's metrics: its record's family.
METRICS: dict[str, ModalityMetrics] = {name: ModalityMetrics(name, *ERROR_FAMILIES[m.errors])
                                       for name, m in MODALITIES.items() if m.errors}
