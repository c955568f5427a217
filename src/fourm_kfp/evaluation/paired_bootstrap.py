"""Claims with confidence: a bootstrap over the val scenes for "A scores better than B".

A claim such as "the model beats the trivial baseline" or "the candidate beats the champion" is made on a sample of
val scenes; one lucky scene can move a set-level metric a little, so a positive difference alone proves nothing. The
bootstrap redraws the scenes: a resample draws ``n`` scene indices with replacement out of ``n``
(:data:`BOOTSTRAP_RESAMPLES` times, generator seeded with :data:`BOOTSTRAP_SEED`) and recomputes both sides' metric on
it. A resample is kept as counts (``[resamples, n]``: how often each scene was drawn), and each side is a
*statistic*, ``counts -> metric per resample``: the task metrics recompute the set-level metric exactly from
per-scene sufficient statistics weighted by those counts (:class:`fourm_kfp.evaluation.scene_stats.SceneStats`).

* **paired** (:func:`paired`): both sides are scored on the same scenes (the model and the baseline; a candidate and
  the champion evaluated on the same scene keys), and each resample uses the same counts for both, so what the two
  share (a hard scene is hard for both) cancels in the difference;
* **unpaired** (:func:`unpaired`): the scene sets differ, and each side is resampled on its own.

The difference is signed so that positive means better: ``new - old`` when higher is better, ``old - new`` when
lower is better. The :class:`Interval` is the 95% percentile interval of the resampled differences (resamples where
a side's metric is undefined, e.g. no valid depth pixel drawn, are left out). A claim holds when the interval's
lower bound clears what it must (:meth:`Interval.clears`): above 0 for "beats the baseline", above
``margin * |champion|`` for the model gate. An interval that cannot be computed (no scene, a non-finite score) never
clears anything.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Callable

import numpy as np

#: Resamples of every interval, and the seed of the generator drawing them (fixed: the same inputs give the same
#: interval, byte for byte).
BOOTSTRAP_RESAMPLES = 1000
BOOTSTRAP_SEED = 0
#: Coverage of the percentile interval.
CONFIDENCE = 0.95

#: ``counts [R, n] -> metric [R]``: one side's metric on each resample.
Statistic = Callable[[np.ndarray], np.ndarray]


@dataclass(frozen=True)
class Interval:
    """The difference on the full sets and its percentile interval (signed: positive = better)."""

    difference: float
    low: float
    high: float
    resamples: int
    paired: bool

    def clears(self, required: float = 0.0) -> bool:
        """Whether the whole interval lies above ``required`` (the lower bound is strictly above it)."""
        return math.isfinite(self.low) and self.low > required

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def resample_counts(n: int, resamples: int, rng: np.random.Generator) -> np.ndarray:
    """``[resamples, n]``: how often each of ``n`` scenes is drawn when ``n`` indices are drawn with replacement."""
    indices = rng.integers(0, n, size=(resamples, n)) + n * np.arange(resamples)[:, None]
    return np.bincount(indices.ravel(), minlength=resamples * n).reshape(resamples, n).astype(np.float64)


def _signed(new: np.ndarray, old: np.ndarray, higher_is_better: bool) -> np.ndarray:
    return np.asarray(new, dtype=np.float64) - old if higher_is_better else np.asarray(old, dtype=np.float64) - new


def _interval(full: np.ndarray, differences: np.ndarray, resamples: int, paired: bool) -> Interval:
    difference = float(full[0])
    finite = differences[np.isfinite(differences)]
    if not (math.isfinite(difference) and finite.size):
        return Interval(difference, math.nan, math.nan, resamples, paired)
    tail = (1 - CONFIDENCE) / 2 * 100
    low, high = np.percentile(finite, [tail, 100 - tail])
    return Interval(difference, float(low), float(high), resamples, paired)


def paired(new: Statistic, old: Statistic, n: int, higher_is_better: bool, *,
           resamples: int = BOOTSTRAP_RESAMPLES, seed: int = BOOTSTRAP_SEED) -> Interval:
    """``new`` against ``old`` on the same ``n`` scenes (the same column is the same scene on both sides), each
    resample's counts used for both."""
    if n == 0:
        return Interval(math.nan, math.nan, math.nan, resamples, True)
    counts = resample_counts(n, resamples, np.random.default_rng(seed))
    ones = np.ones((1, n))
    return _interval(_signed(new(ones), old(ones), higher_is_better),
                     _signed(new(counts), old(counts), higher_is_better), resamples, True)


def unpaired(new: Statistic, n_new: int, old: Statistic, n_old: int, higher_is_better: bool, *,
             resamples: int = BOOTSTRAP_RESAMPLES, seed: int = BOOTSTRAP_SEED) -> Interval:
    """``new`` on its ``n_new`` scenes against ``old`` on its ``n_old`` (different scenes): each resampled on its
    own (``new``'s counts drawn first, then ``old``'s, from one generator)."""
    if not (n_new and n_old):
        return Interval(math.nan, math.nan, math.nan, resamples, False)
    rng = np.random.default_rng(seed)
    new_counts, old_counts = resample_counts(n_new, resamples, rng), resample_counts(n_old, resamples, rng)
    return _interval(_signed(new(np.ones((1, n_new))), old(np.ones((1, n_old))), higher_is_better),
                     _signed(new(new_counts), old(old_counts), higher_is_better), resamples, False)
