"""Box AP50 of generated det texts over a whole evaluation set (numpy only, independent of the model).

==============  ===========================================================================  =======================
task            metrics                                                                      primary
==============  ===========================================================================  =======================
rgb-to-det      ``ap50`` (mean over classes with ground truth), ``ap50_<class>``             ``ap50`` ↑
==============  ===========================================================================  =======================

A generated det text is read leniently (:func:`parse_generated_det`). AP is the VOC/COCO all-point interpolated
area under the precision-recall curve: per class, predictions in descending score order are matched greedily to
the still unmatched ground-truth box of the same image with the highest IoU, if that IoU is at least 0.5. The
per-scene statistics (:class:`DetectionStats`) are the ranked predictions' scenes and outcomes, so AP can be
computed for any weighting of the scenes (a bootstrap resample, :mod:`.scene_stats`).
"""

from __future__ import annotations

import math
import re
from typing import Any, Mapping, Sequence

import numpy as np

from fourm_kfp.data.modalities import COORD_BINS, OBJECT_CLASSES
from fourm_kfp.evaluation.scene_stats import SceneStats, ratio

Box = tuple[float, float, float, float]

#: IoU at which a predicted box matches a ground-truth box (inclusive).
IOU_THRESHOLD = 0.5

#: A box: four coordinates and a name (a word that is not itself the start of a coordinate, ``v0=``).
_BOX = re.compile(r"\bv0\s*=\s*(\d+)\s+v1\s*=\s*(\d+)\s+v2\s*=\s*(\d+)\s+v3\s*=\s*(\d+)\s+(\w+)\b(?!\s*=)",
                  re.IGNORECASE)


def parse_generated_det(text: str, classes: Sequence[str] = OBJECT_CLASSES) -> list[tuple[Box, str]]:
    """Boxes ``((x0, y0, x1, y1) in bins, class)`` of a generated det text, tolerant of garbage.

    Groups that are malformed, have a coordinate outside ``0..COORD_BINS - 1`` or a name outside ``classes`` (the
    det vocabulary; matched without case, as the text tokenizer lower-cases, and given as the vocabulary spells
    it) are skipped; swapped corners are put in order."""
    spelling = {name.lower(): name for name in classes}
    boxes = []
    for match in _BOX.finditer(text):
        coords, name = [int(v) for v in match.groups()[:4]], spelling.get(match.group(5).lower())
        if name is None or max(coords) >= COORD_BINS:
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
        return ratio(out, positives)

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
