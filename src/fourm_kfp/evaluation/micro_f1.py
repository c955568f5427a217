"""Micro F1 over a set from per-scene multiset counts: what the caption and shape-presence scores share.

A scene contributes, per F1, three columns ``<name>.matched``, ``<name>.predicted`` and ``<name>.actual`` (the
sizes of the multiset intersection, of the prediction and of the truth, :func:`multiset_counts`); summed over the
scenes (:class:`~.scene_stats.SummedStats`) they give the micro F1 ``2 * matched / (predicted + actual)``, 1.0
where both sides are empty.
"""

from __future__ import annotations

from collections import Counter
from typing import Hashable, Iterable, Mapping, TypeVar

import numpy as np

from fourm_kfp.evaluation.scene_stats import ratio

H = TypeVar("H", bound=Hashable)


def multiset_counts(pred: Iterable[H], true: Iterable[H]) -> tuple[int, int, int]:
    """``(matched, predicted, true)`` sizes of two multisets; matches are the multiset intersection."""
    p, t = Counter(pred), Counter(true)
    return (p & t).total(), p.total(), t.total()


def _f1_of(matched: np.ndarray, predicted: np.ndarray, actual: np.ndarray) -> np.ndarray:
    """Micro F1 from summed counts; 1.0 where both sides are empty."""
    return np.divide(2.0 * matched, predicted + actual, out=np.ones(np.shape(matched)), where=predicted + actual > 0)


def _f1_names(t: Mapping[str, np.ndarray]) -> list[str]:
    """The ``<name>`` of every ``<name>.matched/predicted/actual`` column group, in order."""
    return list(dict.fromkeys(c.rsplit(".", 1)[0] for c in t if "." in c))


def f1_finish(t: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Each ``<name>`` F1 of the summed ``<name>.matched/predicted/actual`` columns."""
    out = {}
    for name in _f1_names(t):
        out[name] = _f1_of(t[f"{name}.matched"], t[f"{name}.predicted"], t[f"{name}.actual"])
    return out


def f1_precision_recall_finish(t: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """:func:`f1_finish`, and each F1's precision (``<name>.precision``: of what was predicted, the share that is
    true) and recall (``<name>.recall``: of what is true, the share predicted), NaN without any."""
    out = f1_finish(t)
    for name in _f1_names(t):
        out[f"{name}.precision"] = ratio(t[f"{name}.matched"], t[f"{name}.predicted"])
        out[f"{name}.recall"] = ratio(t[f"{name}.matched"], t[f"{name}.actual"])
    return out
