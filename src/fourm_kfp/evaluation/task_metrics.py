"""Metrics of the cross-modal tasks, computed over a whole evaluation set (numpy only, independent of the model).

Every metric takes the predictions and ground truths of all samples at once and returns a dict of floats:

==============  ===========================================================================  =======================
task            metrics                                                                      primary
==============  ===========================================================================  =======================
rgb-to-depth    ``abs_rel``, ``rmse`` (metres), ``delta1`` (max ratio < 1.25)                ``abs_rel`` ↓
rgb-to-normal   ``mean_angle_deg``, ``within_11_25`` (fraction of pixels)                    ``mean_angle_deg`` ↓
rgb-to-semseg   ``miou`` (classes in truth or prediction), ``pixel_accuracy``                ``miou`` ↑
rgb-to-det      ``ap50`` (mean over classes with ground truth), ``ap50_<class>``             ``ap50`` ↑
rgb-to-caption  ``count_accuracy``, ``object_f1``, ``shape_f1``, ``colour_f1``, ``word_f1``  ``object_f1`` ↑ [*]
caption-to-rgb  ``shape_presence_f1`` (shapes seen vs shapes named)                          ``shape_presence_f1`` ↑
==============  ===========================================================================  =======================

The primary metrics and their direction (↑ higher is better, ↓ lower) are :data:`TASK_PRIMARY`. [*] On real
captions (outside the synthetic vocabulary) :func:`caption_primary` picks ``word_f1`` instead.

Invalid pixels: the synthetic renderer gives sky (a ray that misses the 25 m ground disc and every object) depth 0
and a zero normal; shards keep that (depth PNG value 0 = invalid, normal PNG black = invalid) and decode it back to
0 / the zero vector, so there is no "far" depth value. Depth is scored where the truth is positive and finite,
normals where the true normal is non-zero.

Detection AP is the VOC/COCO all-point interpolated area under the precision-recall curve: per class, predictions in
descending score order are matched greedily to the still unmatched ground-truth box of the same image with the
highest IoU, if that IoU is at least 0.5. Captions are parsed into ``(size, colour, shape)`` objects with the
vocabularies of :mod:`fourm_kfp.data.synthetic_scenes`; F1 scores count multisets and are micro-averaged over the set.
The trivial baselines of the dense tasks (mean depth or normal map, majority class map) are the tokenizer reports'
ones in :mod:`fourm_kfp.tokenizers.metrics`; :func:`most_common` serves the text targets.
"""

from __future__ import annotations

import math
import re
import unicodedata
from collections import Counter
from typing import Callable, Hashable, Iterable, Sequence, TypeVar

import numpy as np

from fourm_kfp.data.modalities import CLASS_NAMES, COORD_BINS, MAX_DEPTH_M, OBJECT_CLASSES
from fourm_kfp.data.synthetic_scenes import COLORS, SHAPES, SIZES
from fourm_kfp.tokenizers.metrics import _class_errors, depth_errors

H = TypeVar("H", bound=Hashable)
Box = tuple[float, float, float, float]
CaptionObject = tuple[str, str, str]

#: Predicted depths are clamped to at least this (metres) so that ratios stay finite.
MIN_DEPTH_M = 1e-3
#: IoU at which a predicted box matches a ground-truth box (inclusive).
IOU_THRESHOLD = 0.5

#: Primary metric of each task (``<source>-to-<target>``, as in ``EVALUATION_TASKS``) and its better direction.
TASK_PRIMARY: dict[str, tuple[str, str]] = {
    "rgb-to-depth": ("abs_rel", "lower"),
    "rgb-to-normal": ("mean_angle_deg", "lower"),
    "rgb-to-semseg": ("miou", "higher"),
    "rgb-to-det": ("ap50", "higher"),
    "rgb-to-caption": ("object_f1", "higher"),
    "caption-to-rgb": ("shape_presence_f1", "higher"),
}


def beats(new: float, old: float, higher_is_better: bool, margin: float = 0.0) -> bool:
    """The margin rule (also the model gate's): strictly better than ``old``, and by at least ``margin * |old|``
    (``|old|`` keeps it meaningful for negative scores; anything strictly better beats an ``old`` of 0)."""
    if higher_is_better:
        return new > old and new >= old + margin * abs(old)
    return new < old and new <= old - margin * abs(old)


def better(task: str, a: float, b: float, margin: float = 0.0, *, higher: bool | None = None) -> bool:
    """Whether ``a`` beats ``b`` on ``task``'s primary metric by the relative ``margin`` (:func:`beats`); a
    non-finite value on either side is never better. ``higher`` overrides the direction of :data:`TASK_PRIMARY`
    (for a primary metric chosen by the data, see :func:`caption_primary`)."""
    if not (math.isfinite(a) and math.isfinite(b)):
        return False
    return beats(a, b, TASK_PRIMARY[task][1] == "higher" if higher is None else higher, margin)


# -- dense predictions ------------------------------------------------------------------------------------------

def depth_metrics(pred: np.ndarray, true: np.ndarray) -> dict[str, float]:
    """``[N, H, W]`` depths in metres, on pixels whose truth is positive and finite (all NaN when there is none).

    The prediction is clamped to ``[MIN_DEPTH_M, MAX_DEPTH_M]`` first (NaN counts as ``MIN_DEPTH_M``)."""
    true = np.where(np.isfinite(true), true, 0.0)
    valid = true > 0
    if not valid.any():
        return {"abs_rel": math.nan, "rmse": math.nan, "delta1": math.nan}
    pred = np.clip(np.nan_to_num(np.asarray(pred, dtype=np.float64), nan=0.0), MIN_DEPTH_M, MAX_DEPTH_M)
    errors = depth_errors(pred, true)
    p, t = pred[valid], true[valid].astype(np.float64)
    return {"abs_rel": errors["abs_rel"], "rmse": errors["rmse"],
            "delta1": float(np.mean(np.maximum(p / t, t / p) < 1.25))}


def _unit(vectors: np.ndarray) -> np.ndarray:
    vectors = vectors.astype(np.float64)
    return vectors / np.maximum(np.linalg.norm(vectors, axis=-1, keepdims=True), 1e-8)


def normal_metrics(pred: np.ndarray, true: np.ndarray, valid: np.ndarray | None = None) -> dict[str, float]:
    """``[N, H, W, 3]`` float normals (both normalised first; a zero prediction scores 90°) on ``valid`` pixels
    (default: non-zero truth); all NaN when no pixel is valid."""
    valid = np.any(true != 0, axis=-1) if valid is None else np.asarray(valid, dtype=bool)
    if not valid.any():
        return {"mean_angle_deg": math.nan, "within_11_25": math.nan}
    cosine = np.sum(_unit(pred[valid]) * _unit(true[valid]), axis=-1)
    angle = np.degrees(np.arccos(np.clip(cosine, -1.0, 1.0)))
    return {"mean_angle_deg": float(angle.mean()), "within_11_25": float(np.mean(angle < 11.25))}


def semseg_miou(pred: np.ndarray, true: np.ndarray, num_classes: int = len(CLASS_NAMES)) -> dict[str, float]:
    """Class-id maps ``[N, H, W]``: one confusion matrix over the set; mean IoU over the classes present in truth or
    prediction."""
    for name, ids in (("pred", pred), ("true", true)):
        if ids.size and (ids.min() < 0 or ids.max() >= num_classes):
            raise ValueError(f"semseg_miou: {name} has class ids outside 0..{num_classes - 1}")
    errors = _class_errors(num_classes)(pred, true)
    return {"miou": errors["miou"], "pixel_accuracy": errors["pixel_acc"]}


# -- detection --------------------------------------------------------------------------------------------------

_BOX = re.compile(r"\bv0\s*=\s*(\d+)\s+v1\s*=\s*(\d+)\s+v2\s*=\s*(\d+)\s+v3\s*=\s*(\d+)\s+([a-z]+)\b", re.IGNORECASE)


def parse_generated_det(text: str) -> list[tuple[Box, str]]:
    """Boxes ``((x0, y0, x1, y1) in bins, class)`` of a generated det text, tolerant of garbage.

    Groups that are malformed, have a coordinate outside ``0..COORD_BINS - 1`` or a name outside
    ``OBJECT_CLASSES`` are skipped; swapped corners are put in order."""
    boxes = []
    for match in _BOX.finditer(text):
        coords, name = [int(v) for v in match.groups()[:4]], match.group(5).lower()
        if name not in OBJECT_CLASSES or max(coords) >= COORD_BINS:
            continue
        (x0, x1), (y0, y1) = sorted(coords[0::2]), sorted(coords[1::2])
        boxes.append(((float(x0), float(y0), float(x1), float(y1)), name))
    return boxes


def box_iou(a: Box, b: Box) -> float:
    """Intersection over union of two ``(x0, y0, x1, y1)`` boxes (0 when the union is empty)."""
    inter = max(0.0, min(a[2], b[2]) - max(a[0], b[0])) * max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union if union > 0 else 0.0


def _average_precision(hits: Sequence[bool], positives: int) -> float:
    """All-point interpolated AP of predictions in descending score order (``hits``: true positive or not)."""
    tp = np.cumsum(np.asarray(hits, dtype=np.float64))
    precision = tp / np.arange(1, tp.size + 1)
    envelope = np.maximum.accumulate(precision[::-1])[::-1]  # best precision at this recall or higher
    recall_steps = np.diff(tp, prepend=0.0) / positives
    return float(np.sum(recall_steps * envelope))


def _class_hits(predictions: Sequence[Sequence[tuple[Box, str, float]]],
                ground_truth: Sequence[Sequence[tuple[Box, str]]], cls: str) -> list[bool]:
    """Whether each prediction of ``cls``, in descending score order, matches a still unmatched truth box."""
    ranked = sorted(((score, i, box) for i, boxes in enumerate(predictions) for box, c, score in boxes if c == cls),
                    key=lambda r: -r[0])
    unmatched = [{j: gt for j, (gt, c) in enumerate(boxes) if c == cls} for boxes in ground_truth]
    hits = []
    for _, i, box in ranked:
        iou, j = max(((box_iou(box, gt), j) for j, gt in unmatched[i].items()), default=(0.0, -1))
        hits.append(iou >= IOU_THRESHOLD)
        if hits[-1]:
            del unmatched[i][j]
    return hits


def box_ap50(predictions: Sequence[Sequence[tuple[Box, str, float]]],
             ground_truth: Sequence[Sequence[tuple[Box, str]]],
             classes: Sequence[str] = OBJECT_CLASSES) -> dict[str, float]:
    """AP at IoU 0.5 (``ap50_<class>``) of each class with ground truth, and their mean ``ap50`` (0 if none has any).

    ``predictions``: per image, ``(box, class, score)``; ``ground_truth``: per image, ``(box, class)``."""
    if len(predictions) != len(ground_truth):
        raise ValueError(f"box_ap50: {len(predictions)} prediction lists for {len(ground_truth)} images")
    out = {}
    for cls in classes:
        positives = sum(c == cls for boxes in ground_truth for _, c in boxes)
        if positives:
            out[f"ap50_{cls}"] = _average_precision(_class_hits(predictions, ground_truth, cls), positives)
    return {"ap50": float(np.mean(list(out.values()))) if out else 0.0, **out}


# -- captions ---------------------------------------------------------------------------------------------------

_OBJECT = re.compile(rf"\b({'|'.join(SIZES)})\s+({'|'.join(COLORS)})\s+({'|'.join(SHAPES)})\b")


def parse_caption(text: str) -> list[CaptionObject]:
    """The ``(size, colour, shape)`` objects a caption names, in order (``"an empty scene"`` → ``[]``)."""
    return [(size, colour, shape) for size, colour, shape in _OBJECT.findall(text.lower())]


def caption_shapes(text: str) -> frozenset[str]:
    """The set of shapes a caption names."""
    return frozenset(shape for _, _, shape in parse_caption(text))


def _f1(matched: int, predicted: int, actual: int) -> float:
    """F1 from counts; 1.0 when both sides are empty."""
    return 1.0 if predicted + actual == 0 else 2.0 * matched / (predicted + actual)


def _multiset_f1(pairs: Iterable[tuple[Iterable[H], Iterable[H]]]) -> float:
    """Micro F1 over ``(predicted, true)`` multisets: matches are the multiset intersection."""
    matched = predicted = actual = 0
    for pred, true in pairs:
        p, t = Counter(pred), Counter(true)
        matched, predicted, actual = matched + (p & t).total(), predicted + p.total(), actual + t.total()
    return _f1(matched, predicted, actual)


def caption_words(text: str) -> list[str]:
    """The words of a caption: lower-cased, accents stripped, punctuation dropped (as the text tokenizer sees it)."""
    text = "".join(c for c in unicodedata.normalize("NFKD", text.lower()) if not unicodedata.combining(c))
    return re.findall(r"\w+", text)


_CAPTION_KEYS: dict[str, Callable[[CaptionObject], Hashable]] = {
    "object_f1": lambda o: (o[1], o[2]), "shape_f1": lambda o: o[2], "colour_f1": lambda o: o[1]}


def caption_metrics(pred_texts: Sequence[str], true_texts: Sequence[str]) -> dict[str, float]:
    """Object count accuracy; micro F1 of the (colour, shape) pairs, shapes and colours the captions name; and
    ``word_f1``, the micro F1 of their words (the score for captions outside the synthetic vocabulary)."""
    parsed = [(parse_caption(p), parse_caption(t)) for p, t in zip(pred_texts, true_texts, strict=True)]
    out = {"count_accuracy": float(np.mean([len(p) == len(t) for p, t in parsed])) if parsed else math.nan}
    for name, key in _CAPTION_KEYS.items():
        out[name] = _multiset_f1(([key(o) for o in p], [key(o) for o in t]) for p, t in parsed)
    out["word_f1"] = _multiset_f1((caption_words(p), caption_words(t)) for p, t in zip(pred_texts, true_texts))
    return out


def caption_primary(true_texts: Sequence[str]) -> str:
    """``object_f1`` when every true caption is a synthetic-scene one (names objects, or is ``"an empty scene"``),
    else ``word_f1`` (real captions); both are higher-is-better."""
    synthetic = all(parse_caption(t) or caption_words(t) == ["an", "empty", "scene"] for t in true_texts)
    return "object_f1" if true_texts and synthetic else "word_f1"


# -- caption -> image -------------------------------------------------------------------------------------------

def shapes_in_semseg(semseg: np.ndarray, min_fraction: float = 0.002) -> frozenset[str]:
    """Object classes (``OBJECT_CLASSES``) covering at least ``min_fraction`` of the pixels of a class-id map."""
    counts = np.bincount(np.asarray(semseg, dtype=np.int64).ravel(), minlength=len(CLASS_NAMES))
    first = CLASS_NAMES.index(OBJECT_CLASSES[0])
    return frozenset(name for c, name in enumerate(OBJECT_CLASSES, first) if counts[c] >= min_fraction * semseg.size)


def shape_set_f1(pred_sets: Sequence[frozenset[str]], true_sets: Sequence[frozenset[str]]) -> dict[str, float]:
    """Micro F1 between predicted and true sets of shapes, over the set."""
    return {"shape_presence_f1": _multiset_f1(zip(pred_sets, true_sets, strict=True))}


def shape_presence_f1(pred_semsegs: Sequence[np.ndarray], captions: Sequence[str]) -> dict[str, float]:
    """Micro F1 of the shapes visible in each predicted semseg vs the set of shapes its caption names."""
    return shape_set_f1([shapes_in_semseg(s) for s in pred_semsegs],
                        [caption_shapes(c) for c in captions])


def most_common(items: Sequence[H]) -> H:
    """The most frequent item; ties go to the one seen first."""
    if not items:
        raise ValueError("most_common: no items")
    counts = Counter(items)
    best = max(counts.values())
    return next(item for item in items if counts[item] == best)
