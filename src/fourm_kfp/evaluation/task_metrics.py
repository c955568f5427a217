"""Metrics of the cross-modal tasks, computed over a whole evaluation set (numpy only, independent of the model).

=============  =================================================================  =========================
task           metrics                                                            primary
=============  =================================================================  =========================
rgb-to-depth     ``abs_rel``, ``rmse`` (metres), ``delta1`` (max ratio < 1.25)        ``abs_rel`` (lower)
rgb-to-normal    ``mean_angle_deg``, ``within_11_25`` (fraction of pixels)           ``mean_angle_deg`` (lower)
rgb-to-semseg    ``miou`` (classes in truth or prediction), ``pixel_accuracy``       ``miou`` (higher)
rgb-to-det       ``ap50`` (mean over classes with ground truth) and ``ap50_<class>``  ``ap50`` (higher)
rgb-to-caption   ``count_accuracy``, ``object_f1``, ``shape_f1``, ``colour_f1``       ``object_f1`` (higher)
caption-to-rgb   ``shape_presence_f1`` (shapes seen vs shapes the caption names)     ``shape_presence_f1``
=============  =================================================================  =========================

Depth is valid where the truth is positive and finite (sky is stored as 0). Normals are valid where the truth is
non-zero (sky). Detection AP is the VOC/COCO all-point interpolated area under the precision-recall curve, with
greedy matching at IoU >= 0.5 in score order. Captions are parsed into ``(size, colour, shape)`` objects with the
vocabularies of the synthetic scenes; F1 scores are micro-averaged over the set on multisets.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Hashable, Iterable, Sequence, TypeVar

import numpy as np

from fourm_kfp.data.modalities import CLASS_NAMES, COORD_BINS, OBJECT_CLASSES
from fourm_kfp.data.synthetic_scenes import COLORS, SHAPES, SIZES

H = TypeVar("H", bound=Hashable)
Box = tuple[float, float, float, float]

#: Primary metric of each task and its direction.
TASK_PRIMARY: dict[str, tuple[str, str]] = {
    "rgb-to-depth": ("abs_rel", "lower"),
    "rgb-to-normal": ("mean_angle_deg", "lower"),
    "rgb-to-semseg": ("miou", "higher"),
    "rgb-to-det": ("ap50", "higher"),
    "rgb-to-caption": ("object_f1", "higher"),
    "caption-to-rgb": ("shape_presence_f1", "higher"),
}


def better(task: str, value: float, reference: float, margin: float = 0.0) -> bool:
    """Whether ``value`` beats ``reference`` on ``task``'s primary metric by the relative ``margin`` (0.1 = 10%).

    Lower is better: ``value <= reference * (1 - margin)`` and strictly below. Higher is better:
    ``value >= reference * (1 + margin)`` and strictly above; against a reference of 0 any positive value wins."""
    if not (np.isfinite(value) and np.isfinite(reference)):
        return bool(np.isfinite(value) and not np.isfinite(reference))
    if TASK_PRIMARY[task][1] == "lower":
        return value < reference and value <= reference * (1 - margin)
    return value > reference and value >= reference * (1 + margin)


# -- dense predictions ------------------------------------------------------------------------------------------

def depth_metrics(pred: np.ndarray, true: np.ndarray) -> dict[str, float]:
    """``[N, H, W]`` depths in metres."""
    valid = np.isfinite(true) & (true > 0)
    t = true[valid].astype(np.float64)
    p = np.clip(pred[valid].astype(np.float64), 1e-3, None)
    ratio = np.maximum(p / t, t / p)
    return {"abs_rel": float(np.mean(np.abs(p - t) / t)), "rmse": float(np.sqrt(np.mean((p - t) ** 2))),
            "delta1": float(np.mean(ratio < 1.25))}


def normal_metrics(pred: np.ndarray, true: np.ndarray, valid: np.ndarray | None = None) -> dict[str, float]:
    """``[N, H, W, 3]`` normals (the prediction is normalised first); valid = non-zero truth unless given."""
    valid = np.any(true != 0, axis=-1) if valid is None else valid
    p = pred[valid].astype(np.float64)
    p = p / np.maximum(np.linalg.norm(p, axis=-1, keepdims=True), 1e-8)
    t = true[valid].astype(np.float64)
    t = t / np.maximum(np.linalg.norm(t, axis=-1, keepdims=True), 1e-8)
    angle = np.degrees(np.arccos(np.clip(np.sum(p * t, axis=-1), -1.0, 1.0)))
    return {"mean_angle_deg": float(angle.mean()), "within_11_25": float(np.mean(angle < 11.25))}


def semseg_miou(pred: np.ndarray, true: np.ndarray, num_classes: int = len(CLASS_NAMES)) -> dict[str, float]:
    """Class-id maps ``[N, H, W]``; IoU per class over the classes present in truth or prediction."""
    p, t = pred.astype(np.int64).ravel(), true.astype(np.int64).ravel()
    confusion = np.bincount(t * num_classes + p, minlength=num_classes**2).reshape(num_classes, num_classes)
    intersection = np.diag(confusion).astype(np.float64)
    union = confusion.sum(0) + confusion.sum(1) - intersection
    present = union > 0
    return {"miou": float(np.mean(intersection[present] / union[present])) if present.any() else 0.0,
            "pixel_accuracy": float(intersection.sum() / max(t.size, 1))}


# -- detection --------------------------------------------------------------------------------------------------

_BOX = re.compile(r"v0=(\d+) v1=(\d+) v2=(\d+) v3=(\d+) ([a-z]+)")


def parse_generated_det(text: str) -> list[tuple[Box, str]]:
    """Boxes in a generated det text (coordinates in bins); malformed groups, coordinates outside the bins and
    unknown class names are skipped; swapped corners are put in order."""
    boxes = []
    for match in _BOX.finditer(text.replace(" = ", "=").replace("= ", "=").replace(" =", "=")):
        coords = [int(v) for v in match.groups()[:4]]
        name = match.group(5)
        if name not in OBJECT_CLASSES or max(coords) >= COORD_BINS:
            continue
        x0, x1 = sorted(coords[0::2])
        y0, y1 = sorted(coords[1::2])
        boxes.append(((float(x0), float(y0), float(x1), float(y1)), name))
    return boxes


def box_iou(a: Box, b: Box) -> float:
    ix = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    iy = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = ix * iy
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union if union > 0 else 0.0


def _average_precision(hits: list[bool], scores: list[float], positives: int) -> float:
    order = np.argsort(-np.asarray(scores, dtype=np.float64), kind="stable")
    tp = np.asarray(hits, dtype=np.float64)[order]
    recall = np.concatenate([[0.0], np.cumsum(tp) / positives, [1.0]]) if tp.size else np.array([0.0, 1.0])
    precision = (np.concatenate([[1.0], np.cumsum(tp) / np.arange(1, tp.size + 1), [0.0]]) if tp.size
                 else np.array([1.0, 0.0]))
    precision = np.maximum.accumulate(precision[::-1])[::-1]  # monotone envelope
    if tp.size:
        recall[-1] = recall[-2]
    return float(np.sum(np.diff(recall) * precision[1:]))


def box_ap50(predictions: Sequence[Sequence[tuple[Box, str, float]]],
             ground_truth: Sequence[Sequence[tuple[Box, str]]], classes: Sequence[str] = OBJECT_CLASSES
             ) -> dict[str, float]:
    """AP at IoU 0.5 per class with ground truth, and their mean ``ap50`` (one list per image on both sides)."""
    out = {}
    for cls in classes:
        positives = sum(1 for boxes in ground_truth for _, c in boxes if c == cls)
        if not positives:
            continue
        ranked = sorted(((score, i, box) for i, boxes in enumerate(predictions) for box, c, score in boxes
                         if c == cls), key=lambda r: -r[0])
        used = [set() for _ in ground_truth]
        hits, scores = [], []
        for score, i, box in ranked:
            candidates = [(box_iou(box, gt), j) for j, (gt, c) in enumerate(ground_truth[i])
                          if c == cls and j not in used[i]]
            best = max(candidates, default=(0.0, -1))
            hit = best[0] >= 0.5
            if hit:
                used[i].add(best[1])
            hits.append(hit)
            scores.append(score)
        out[f"ap50_{cls}"] = _average_precision(hits, scores, positives)
    out["ap50"] = float(np.mean(list(out.values()))) if out else 0.0
    return out


# -- captions ---------------------------------------------------------------------------------------------------

_OBJECT = re.compile(rf"\b({'|'.join(SIZES)}) ({'|'.join(COLORS)}) ({'|'.join(SHAPES)})\b")


def parse_caption(text: str) -> list[tuple[str, str, str]]:
    """The ``(size, colour, shape)`` objects a caption names, in order (``"an empty scene"`` → ``[]``)."""
    return [m.groups() for m in _OBJECT.finditer(text.lower())]


def _multiset_counts(pred: Iterable[H], true: Iterable[H]) -> tuple[int, int, int]:
    p, t = Counter(pred), Counter(true)
    return sum((p & t).values()), sum(p.values()), sum(t.values())


def _f1(matched: int, predicted: int, actual: int) -> float:
    if predicted + actual == 0:
        return 1.0
    return 2 * matched / (predicted + actual)


def caption_metrics(pred_texts: Sequence[str], true_texts: Sequence[str]) -> dict[str, float]:
    counts = {"object": [0, 0, 0], "shape": [0, 0, 0], "colour": [0, 0, 0]}
    correct_count = 0
    for pred, true in zip(pred_texts, true_texts, strict=True):
        p, t = parse_caption(pred), parse_caption(true)
        correct_count += len(p) == len(t)
        for name, key in (("object", lambda o: (o[1], o[2])), ("shape", lambda o: o[2]), ("colour", lambda o: o[1])):
            for k, v in enumerate(_multiset_counts(map(key, p), map(key, t))):
                counts[name][k] += v
    out = {"count_accuracy": correct_count / max(len(true_texts), 1)}
    out |= {f"{name}_f1": _f1(*c) for name, c in counts.items()}
    return out


# -- caption -> image -------------------------------------------------------------------------------------------

def shapes_in_semseg(semseg: np.ndarray, min_fraction: float = 0.002) -> frozenset[str]:
    """Object classes covering at least ``min_fraction`` of the pixels of a class-id map."""
    counts = np.bincount(semseg.astype(np.int64).ravel(), minlength=len(CLASS_NAMES))
    return frozenset(CLASS_NAMES[c] for c in range(2, len(CLASS_NAMES)) if counts[c] >= min_fraction * semseg.size)


def shape_set_f1(pred_sets: Sequence[frozenset[str]], true_sets: Sequence[frozenset[str]]) -> dict[str, float]:
    """Micro F1 between predicted and true sets of shapes, over the set."""
    matched = predicted = actual = 0
    for p, t in zip(pred_sets, true_sets, strict=True):
        matched, predicted, actual = matched + len(p & t), predicted + len(p), actual + len(t)
    return {"shape_presence_f1": _f1(matched, predicted, actual)}


def shape_presence_f1(pred_semsegs: Sequence[np.ndarray], captions: Sequence[str]) -> dict[str, float]:
    """Shapes visible in each predicted semseg vs the shapes its caption names."""
    return shape_set_f1([shapes_in_semseg(s) for s in pred_semsegs],
                        [frozenset(o[2] for o in parse_caption(c)) for c in captions])


def most_common(items: Sequence[H]) -> H:
    """The most frequent item (ties: the first seen)."""
    counts = Counter(items)
    best = max(counts.values())
    return next(item for item in items if counts[item] == best)
