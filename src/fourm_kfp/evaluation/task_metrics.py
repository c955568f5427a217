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
caption-to-rgb  ``shape_presence_f1`` (shapes seen vs named), ``.precision``, ``.recall``    ``shape_presence_f1`` ↑
==============  ===========================================================================  =======================

The primary metrics and their direction (↑ higher is better, ↓ lower) come from each target's scorer family
(:mod:`fourm_kfp.evaluation.targets`). [*] On real
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
ones in :mod:`fourm_kfp.tokenizers.metrics`; :func:`most_common` serves the text targets and
:func:`best_constant_set` caption-to-rgb.

Per-scene statistics: every metric is a set-level one (a ratio of sums over pixels, a summed confusion matrix, a
micro F1, AP over a ranking of all the set's boxes), so each is computed from per-scene sufficient statistics
(:class:`SceneStats`: ``depth_stats``, ``normal_stats``, ``semseg_stats``, ``box_stats``, ``caption_stats``,
``shape_set_stats``, and ``masked_stats`` for the masked-modeling loss). ``stats.metrics(counts)`` evaluates the
metrics with scene ``i`` counted ``counts[r, i]`` times, for every row ``r`` at once: exactly the metric of the set in
which each scene is repeated that often (a bootstrap resample, :mod:`fourm_kfp.evaluation.paired_bootstrap`). A row
of ones is the whole set (``stats.whole()``, what ``depth_metrics`` and the others return), a row of the identity the
score of one scene alone (``stats.per_scene``).
"""

from __future__ import annotations

import math
import re
import unicodedata
from collections import Counter
from typing import Any, Callable, Hashable, Iterable, Mapping, Sequence, TypeVar

import numpy as np

from fourm_kfp.data.modalities import CLASS_NAMES, COORD_BINS, MAX_DEPTH_M, OBJECT_CLASSES
from fourm_kfp.data.synthetic_scenes import COLORS, SHAPES, SIZES

H = TypeVar("H", bound=Hashable)
Box = tuple[float, float, float, float]
CaptionObject = tuple[str, str, str]

#: Predicted depths are clamped to at least this (metres) so that ratios stay finite.
MIN_DEPTH_M = 1e-3
#: IoU at which a predicted box matches a ground-truth box (inclusive).
IOU_THRESHOLD = 0.5

def beats(new: float, old: float, higher_is_better: bool, margin: float = 0.0) -> bool:
    """The margin rule (also the model gate's): strictly better than ``old``, and by at least ``margin * |old|``
    (``|old|`` keeps it meaningful for negative scores; anything strictly better beats an ``old`` of 0)."""
    if higher_is_better:
        return new > old and new >= old + margin * abs(old)
    return new < old and new <= old - margin * abs(old)


# -- per-scene statistics ---------------------------------------------------------------------------------------

def _ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    """``num / den``, NaN where ``den`` is 0."""
    return np.divide(num, den, out=np.full(np.shape(num), math.nan), where=np.asarray(den) > 0)


def _f1_of(matched: np.ndarray, predicted: np.ndarray, actual: np.ndarray) -> np.ndarray:
    """Micro F1 from summed counts; 1.0 where both sides are empty."""
    return np.divide(2.0 * matched, predicted + actual, out=np.ones(np.shape(matched)), where=predicted + actual > 0)


class SceneStats:
    """Per-scene sufficient statistics of a set of metrics (see the module docstring)."""

    kind: str

    def __len__(self) -> int:
        raise NotImplementedError

    def metrics(self, counts: np.ndarray) -> dict[str, np.ndarray]:
        """``counts`` ``[R, n]`` (how often each of the ``n`` scenes counts, per row) -> each metric ``[R]``."""
        raise NotImplementedError

    def whole(self) -> dict[str, float]:
        """The metrics of the whole set, every scene once."""
        return {name: float(v[0]) for name, v in self.metrics(np.ones((1, len(self)))).items()}

    def per_scene(self, name: str) -> list[float]:
        """Metric ``name`` of each scene alone."""
        return [float(v) for v in self.metrics(np.eye(len(self)))[name]]

    def statistic(self, name: str) -> Callable[[np.ndarray], np.ndarray]:
        """``counts -> metric name [R]``: what the bootstrap resamples."""
        return lambda counts: self.metrics(counts)[name]

    def to_json(self) -> dict[str, Any]:
        raise NotImplementedError

    @staticmethod
    def from_json(doc: Mapping[str, Any]) -> "SceneStats":
        return (DetectionStats if doc["kind"] == "det" else SummedStats).read(doc)


def _depth_finish(t: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {"abs_rel": _ratio(t["abs_rel"], t["pixels"]), "rmse": np.sqrt(_ratio(t["squared_error"], t["pixels"])),
            "delta1": _ratio(t["delta1"], t["pixels"])}


def _normal_finish(t: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {"mean_angle_deg": _ratio(t["angle_deg"], t["pixels"]),
            "within_11_25": _ratio(t["within_11_25"], t["pixels"])}


def _semseg_finish(t: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Columns ``"<true>,<pred>"``: the summed confusion matrix; mIoU over the classes in truth or prediction."""
    c = math.isqrt(len(t))
    confusion = np.stack(list(t.values()), axis=-1).reshape(-1, c, c)
    intersection = np.diagonal(confusion, axis1=1, axis2=2)
    union = confusion.sum(1) + confusion.sum(2) - intersection
    present = union > 0
    iou = np.divide(intersection, union, out=np.zeros(union.shape), where=present)
    return {"miou": _ratio(iou.sum(1), present.sum(1).astype(np.float64)),
            "pixel_accuracy": intersection.sum(1) / np.maximum(confusion.sum((1, 2)), 1)}


def _f1_names(t: Mapping[str, np.ndarray]) -> list[str]:
    """The ``<name>`` of every ``<name>.matched/predicted/actual`` column group, in order."""
    return list(dict.fromkeys(c.rsplit(".", 1)[0] for c in t if "." in c))


def _f1_finish(t: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Columns ``count_correct`` and ``scenes`` (caption object counts), and ``<name>.matched/predicted/actual``."""
    out = {"count_accuracy": _ratio(t["count_correct"], t["scenes"])} if "scenes" in t else {}
    for name in _f1_names(t):
        out[name] = _f1_of(t[f"{name}.matched"], t[f"{name}.predicted"], t[f"{name}.actual"])
    return out


def _set_f1_finish(t: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """:func:`_f1_finish`, and each F1's precision (``<name>.precision``: of what was predicted, the share that is
    true) and recall (``<name>.recall``: of what is true, the share predicted), NaN without any."""
    out = _f1_finish(t)
    for name in _f1_names(t):
        out[f"{name}.precision"] = _ratio(t[f"{name}.matched"], t[f"{name}.predicted"])
        out[f"{name}.recall"] = _ratio(t[f"{name}.matched"], t[f"{name}.actual"])
    return out


def _masked_finish(t: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Columns ``<modality>.loss/correct/tokens``: per modality the token-weighted loss and accuracy, and
    ``val.loss``/``val.accuracy``, their means over the modalities with target tokens."""
    names = list(dict.fromkeys(c.rsplit(".", 1)[0] for c in t))
    out = {}
    for name in names:
        out[f"val.loss.{name}"] = _ratio(t[f"{name}.loss"], t[f"{name}.tokens"])
        out[f"val.accuracy.{name}"] = _ratio(t[f"{name}.correct"], t[f"{name}.tokens"])
    for kind in ("loss", "accuracy"):
        values = np.stack([out[f"val.{kind}.{name}"] for name in names]) if names else np.full((1, 0), math.nan)
        present = np.isfinite(values)
        out[f"val.{kind}"] = _ratio(np.where(present, values, 0.0).sum(0), present.sum(0).astype(np.float64))
    return out


_FINISH: dict[str, Callable[[Mapping[str, np.ndarray]], dict[str, np.ndarray]]] = {
    "depth": _depth_finish, "normal": _normal_finish, "semseg": _semseg_finish, "f1": _f1_finish,
    "set_f1": _set_f1_finish, "masked": _masked_finish}


class SummedStats(SceneStats):
    """Metrics that are functions of column sums over the scenes: ``sums`` ``[n, columns]``, one row per scene."""

    def __init__(self, kind: str, columns: Sequence[str], sums: np.ndarray):
        self.kind, self.columns = kind, tuple(columns)
        self.sums = np.asarray(sums, dtype=np.float64).reshape(-1, len(self.columns))

    def __len__(self) -> int:
        return self.sums.shape[0]

    def metrics(self, counts: np.ndarray) -> dict[str, np.ndarray]:
        totals = np.asarray(counts, dtype=np.float64) @ self.sums
        return _FINISH[self.kind](dict(zip(self.columns, totals.T)))

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "columns": list(self.columns), "sums": self.sums.tolist()}

    @classmethod
    def read(cls, doc: Mapping[str, Any]) -> "SummedStats":
        return cls(doc["kind"], doc["columns"], np.asarray(doc["sums"], dtype=np.float64))


# -- dense predictions ------------------------------------------------------------------------------------------

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
    return SummedStats("depth", columns, np.stack([np.where(valid, v, 0.0).sum(axes) for v in columns.values()], 1))


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
    return SummedStats("normal", columns, np.stack([np.where(valid, v, 0.0).sum(axes) for v in columns.values()], 1))


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
    return SummedStats("semseg", columns, confusion)


def semseg_miou(pred: np.ndarray, true: np.ndarray, num_classes: int = len(CLASS_NAMES)) -> dict[str, float]:
    """The whole set's :func:`semseg_stats` (one confusion matrix over the set)."""
    return semseg_stats(pred, true, num_classes).whole()


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


def _class_hits(predictions: Sequence[Sequence[tuple[Box, str, float]]],
                ground_truth: Sequence[Sequence[tuple[Box, str]]], cls: str) -> tuple[list[int], list[bool]]:
    """The predictions of ``cls`` in descending score order (ties: scene order, then box order): their scene, and
    whether each matches a still unmatched truth box of its scene."""
    ranked = sorted(((score, i, box) for i, boxes in enumerate(predictions) for box, c, score in boxes if c == cls),
                    key=lambda r: -r[0])
    unmatched = [{j: gt for j, (gt, c) in enumerate(boxes) if c == cls} for boxes in ground_truth]
    scenes, hits = [], []
    for _, i, box in ranked:
        iou, j = max(((box_iou(box, gt), j) for j, gt in unmatched[i].items()), default=(0.0, -1))
        scenes.append(i)
        hits.append(iou >= IOU_THRESHOLD)
        if hits[-1]:
            del unmatched[i][j]
    return scenes, hits


#: Rows of counts times predictions handled at once by :meth:`DetectionStats.metrics` (bounds its memory).
_AP_CHUNK = 1 << 22


class DetectionStats(SceneStats):
    """Box AP50: per class, the ranked predictions (their scene and whether they match), and the true boxes per
    scene. Greedy matching is within a scene, so a scene counted ``k`` times contributes ``k`` copies of its
    predictions (same score, same outcome) and of its true boxes: AP is computed with those multiplicities."""

    kind = "det"

    def __init__(self, classes: Sequence[str], positives: np.ndarray,
                 ranked: Mapping[str, tuple[Sequence[int], Sequence[bool]]]):
        self.classes = tuple(classes)
        self.positives = np.asarray(positives, dtype=np.float64).reshape(-1, len(self.classes))
        self.ranked = {c: (np.asarray(ranked[c][0], dtype=np.int64), np.asarray(ranked[c][1], dtype=bool))
                       for c in self.classes}

    def __len__(self) -> int:
        return self.positives.shape[0]

    def metrics(self, counts: np.ndarray) -> dict[str, np.ndarray]:
        """``ap50_<class>`` for the classes with true boxes in the set (NaN in rows that draw none of them), and
        ``ap50``, their mean over the classes with true boxes in the row (0 if none)."""
        counts = np.asarray(counts, dtype=np.float64)
        per_class = {}
        for c, cls in enumerate(self.classes):
            if self.positives[:, c].sum() > 0:
                per_class[f"ap50_{cls}"] = self._average_precision(counts, cls, counts @ self.positives[:, c])
        values = np.stack(list(per_class.values())) if per_class else np.full((1, len(counts)), math.nan)
        present = np.isfinite(values)
        mean = np.divide(np.where(present, values, 0.0).sum(0), present.sum(0), out=np.zeros(len(counts)),
                         where=present.any(0))
        return {"ap50": mean, **per_class}

    def _average_precision(self, counts: np.ndarray, cls: str, positives: np.ndarray) -> np.ndarray:
        """All-point interpolated AP, each prediction repeated as often as its scene. Copies of one prediction are
        adjacent in the ranking with the same outcome, so precision only needs evaluating after each block: within
        a block of hits it rises (the envelope is the block end's), within a block of misses it falls."""
        scenes, hits = self.ranked[cls]
        out = np.zeros(len(counts))
        step = max(1, _AP_CHUNK // max(scenes.size, 1))
        for start in range(0, len(counts), step):
            weight = counts[start:start + step][:, scenes]  # [rows, predictions]
            tp = np.cumsum(weight * hits, axis=1)
            seen = np.cumsum(weight, axis=1)
            precision = np.divide(tp, seen, out=np.zeros_like(tp), where=seen > 0)
            envelope = np.maximum.accumulate(precision[:, ::-1], axis=1)[:, ::-1]
            out[start:start + step] = np.sum(weight * hits * envelope, axis=1)
        return _ratio(out, positives)

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "classes": list(self.classes), "positives": self.positives.tolist(),
                "ranked": {c: {"scenes": s.tolist(), "hits": h.tolist()} for c, (s, h) in self.ranked.items()}}

    @classmethod
    def read(cls, doc: Mapping[str, Any]) -> "DetectionStats":
        return cls(doc["classes"], np.asarray(doc["positives"], dtype=np.float64),
                   {c: (r["scenes"], r["hits"]) for c, r in doc["ranked"].items()})


def box_stats(predictions: Sequence[Sequence[tuple[Box, str, float]]],
              ground_truth: Sequence[Sequence[tuple[Box, str]]],
              classes: Sequence[str] = OBJECT_CLASSES) -> DetectionStats:
    """AP at IoU 0.5 per class with ground truth (``ap50_<class>``) and their mean ``ap50`` (0 if no class has any).

    ``predictions``: per image, ``(box, class, score)``; ``ground_truth``: per image, ``(box, class)``."""
    if len(predictions) != len(ground_truth):
        raise ValueError(f"box_stats: {len(predictions)} prediction lists for {len(ground_truth)} images")
    positives = np.array([[sum(c == cls for _, c in boxes) for cls in classes] for boxes in ground_truth],
                         dtype=np.float64).reshape(len(ground_truth), len(classes))
    return DetectionStats(classes, positives, {cls: _class_hits(predictions, ground_truth, cls) for cls in classes})


def box_ap50(predictions: Sequence[Sequence[tuple[Box, str, float]]],
             ground_truth: Sequence[Sequence[tuple[Box, str]]],
             classes: Sequence[str] = OBJECT_CLASSES) -> dict[str, float]:
    """The whole set's :func:`box_stats`."""
    return box_stats(predictions, ground_truth, classes).whole()


# -- captions ---------------------------------------------------------------------------------------------------

_OBJECT = re.compile(rf"\b({'|'.join(SIZES)})\s+({'|'.join(COLORS)})\s+({'|'.join(SHAPES)})\b")


def parse_caption(text: str) -> list[CaptionObject]:
    """The ``(size, colour, shape)`` objects a caption names, in order (``"an empty scene"`` → ``[]``)."""
    return [(size, colour, shape) for size, colour, shape in _OBJECT.findall(text.lower())]


def caption_shapes(text: str) -> frozenset[str]:
    """The set of shapes a caption names."""
    return frozenset(shape for _, _, shape in parse_caption(text))


def _multiset_counts(pred: Iterable[H], true: Iterable[H]) -> tuple[int, int, int]:
    """``(matched, predicted, true)`` sizes of two multisets; matches are the multiset intersection."""
    p, t = Counter(pred), Counter(true)
    return (p & t).total(), p.total(), t.total()


def caption_words(text: str) -> list[str]:
    """The words of a caption: lower-cased, accents stripped, punctuation dropped (as the text tokenizer sees it)."""
    text = "".join(c for c in unicodedata.normalize("NFKD", text.lower()) if not unicodedata.combining(c))
    return re.findall(r"\w+", text)


_CAPTION_KEYS: dict[str, Callable[[CaptionObject], Hashable]] = {
    "object_f1": lambda o: (o[1], o[2]), "shape_f1": lambda o: o[2], "colour_f1": lambda o: o[1]}


def caption_stats(pred_texts: Sequence[str], true_texts: Sequence[str]) -> SummedStats:
    """Object count accuracy; micro F1 of the (colour, shape) pairs, shapes and colours the captions name; and
    ``word_f1``, the micro F1 of their words (the score for captions outside the synthetic vocabulary)."""
    rows = []
    for pred, true in zip(pred_texts, true_texts, strict=True):
        p, t = parse_caption(pred), parse_caption(true)
        row = [float(len(p) == len(t)), 1.0]
        for key in _CAPTION_KEYS.values():
            row += _multiset_counts([key(o) for o in p], [key(o) for o in t])
        rows.append(row + list(_multiset_counts(caption_words(pred), caption_words(true))))
    columns = ["count_correct", "scenes"] + [f"{name}.{part}" for name in [*_CAPTION_KEYS, "word_f1"]
                                             for part in ("matched", "predicted", "actual")]
    return SummedStats("f1", columns, np.array(rows, dtype=np.float64).reshape(-1, len(columns)))


def caption_metrics(pred_texts: Sequence[str], true_texts: Sequence[str]) -> dict[str, float]:
    """The whole set's :func:`caption_stats`."""
    return caption_stats(pred_texts, true_texts).whole()


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


def shape_set_stats(pred_sets: Sequence[frozenset[str]], true_sets: Sequence[frozenset[str]]) -> SummedStats:
    """``shape_presence_f1``: micro F1 between predicted and true sets of shapes, over the set, with its precision
    (``shape_presence_f1.precision``: of the shapes predicted, the share the truth has) and recall (``.recall``)."""
    rows = [_multiset_counts(p, t) for p, t in zip(pred_sets, true_sets, strict=True)]
    columns = [f"shape_presence_f1.{part}" for part in ("matched", "predicted", "actual")]
    return SummedStats("set_f1", columns, np.array(rows, dtype=np.float64).reshape(-1, 3))


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


def shape_set_f1(pred_sets: Sequence[frozenset[str]], true_sets: Sequence[frozenset[str]]) -> dict[str, float]:
    """The whole set's :func:`shape_set_stats`."""
    return shape_set_stats(pred_sets, true_sets).whole()


def shape_presence_stats(pred_semsegs: Sequence[np.ndarray], captions: Sequence[str]) -> SummedStats:
    """Micro F1 of the shapes visible in each predicted semseg vs the set of shapes its caption names."""
    return shape_set_stats([shapes_in_semseg(s) for s in pred_semsegs], [caption_shapes(c) for c in captions])


def shape_presence_f1(pred_semsegs: Sequence[np.ndarray], captions: Sequence[str]) -> dict[str, float]:
    """The whole set's :func:`shape_presence_stats`."""
    return shape_presence_stats(pred_semsegs, captions).whole()


# -- masked modeling --------------------------------------------------------------------------------------------

def masked_stats(names: Sequence[str], sample_sums: np.ndarray) -> SummedStats:
    """The masked-modeling loss and token accuracy: ``sample_sums`` ``[n, len(names), 3]``, per val sample and
    modality the summed cross-entropy, the correctly predicted and the target tokens. Metrics ``val.loss.<name>``,
    ``val.accuracy.<name>`` (token-weighted over the set) and ``val.loss``, ``val.accuracy`` (their means over the
    modalities with targets), as pretrain's validation computes them."""
    columns = [f"{name}.{part}" for name in names for part in ("loss", "correct", "tokens")]
    return SummedStats("masked", columns, np.asarray(sample_sums, dtype=np.float64).reshape(-1, len(columns)))


def most_common(items: Sequence[H]) -> H:
    """The most frequent item; ties go to the one seen first."""
    if not items:
        raise ValueError("most_common: no items")
    counts = Counter(items)
    best = max(counts.values())
    return next(item for item in items if counts[item] == best)
