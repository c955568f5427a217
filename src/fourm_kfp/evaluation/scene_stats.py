"""Per-scene sufficient statistics: how every evaluation metric is computed for any weighting of the scenes.

Every metric of the evaluation is a set-level one (a ratio of sums over pixels, a summed confusion matrix, a micro
F1, AP over a ranking of all the set's boxes), so each is computed from per-scene sufficient statistics
(:class:`SceneStats`). ``stats.metrics(counts)`` evaluates the metrics with scene ``i`` counted ``counts[r, i]``
times, for every row ``r`` at once: exactly the metric of the set in which each scene is repeated that often (a
bootstrap resample, :mod:`fourm_kfp.evaluation.paired_bootstrap`). A row of ones is the whole set
(``stats.whole()``), a row of the identity the score of one scene alone (``stats.per_scene``).

Most metrics are functions of column sums over the scenes (:class:`SummedStats`: one row of columns per scene and
the family's function of the summed columns); detection AP is not (:class:`~.detection_metrics.DetectionStats`).
The families build their statistics in :mod:`.dense_metrics`, :mod:`.detection_metrics`, :mod:`.caption_metrics`,
:mod:`.shape_presence` and :mod:`.masked_modeling_stats`; :mod:`.scene_stats_reader` reads any of them back from
its JSON.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Mapping, Sequence

import numpy as np

#: A family's metrics from its summed columns: ``{column: [R]}`` → ``{metric: [R]}``.
Finish = Callable[[Mapping[str, np.ndarray]], dict[str, np.ndarray]]


def ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    """``num / den``, NaN where ``den`` is 0."""
    return np.divide(num, den, out=np.full(np.shape(num), math.nan), where=np.asarray(den) > 0)


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


class SummedStats(SceneStats):
    """Metrics that are functions of column sums over the scenes: ``sums`` ``[n, columns]``, one row per scene, and
    ``finish``, the family's metrics of the summed columns (``kind`` names the family in the JSON)."""

    def __init__(self, kind: str, columns: Sequence[str], sums: np.ndarray, finish: Finish):
        self.kind, self.columns, self.finish = kind, tuple(columns), finish
        self.sums = np.asarray(sums, dtype=np.float64).reshape(-1, len(self.columns))

    def __len__(self) -> int:
        return self.sums.shape[0]

    def metrics(self, counts: np.ndarray) -> dict[str, np.ndarray]:
        totals = np.asarray(counts, dtype=np.float64) @ self.sums
        return self.finish(dict(zip(self.columns, totals.T)))

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "columns": list(self.columns), "sums": self.sums.tolist()}

    @classmethod
    def read(cls, doc: Mapping[str, Any], finish: Finish) -> "SummedStats":
        return cls(doc["kind"], doc["columns"], np.asarray(doc["sums"], dtype=np.float64), finish)
