"""The masked-modeling loss and token accuracy of the val samples, as per-sample statistics: the evaluate stage's
version of what pretrain's validation reports (:mod:`fourm_kfp.train.validation`), so that the gate can bootstrap
it over the samples like every task metric (:mod:`.scene_stats`).
"""

from __future__ import annotations

import math
from typing import Mapping, Sequence

import numpy as np

from fourm_kfp.evaluation.scene_stats import SummedStats, ratio


def masked_finish(t: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Columns ``<modality>.loss/correct/tokens``: per modality the token-weighted loss and accuracy, and
    ``val.loss``/``val.accuracy``, their means over the modalities with target tokens."""
    names = list(dict.fromkeys(c.rsplit(".", 1)[0] for c in t))
    out = {}
    for name in names:
        out[f"val.loss.{name}"] = ratio(t[f"{name}.loss"], t[f"{name}.tokens"])
        out[f"val.accuracy.{name}"] = ratio(t[f"{name}.correct"], t[f"{name}.tokens"])
    for kind in ("loss", "accuracy"):
        values = np.stack([out[f"val.{kind}.{name}"] for name in names]) if names else np.full((1, 0), math.nan)
        present = np.isfinite(values)
        out[f"val.{kind}"] = ratio(np.where(present, values, 0.0).sum(0), present.sum(0).astype(np.float64))
    return out


def masked_stats(names: Sequence[str], sample_sums: np.ndarray) -> SummedStats:
    """The masked-modeling loss and token accuracy: ``sample_sums`` ``[n, len(names), 3]``, per val sample and
    modality the summed cross-entropy, the correctly predicted and the target tokens. Metrics ``val.loss.<name>``,
    ``val.accuracy.<name>`` (token-weighted over the set) and ``val.loss``, ``val.accuracy`` (their means over the
    modalities with targets), as pretrain's validation computes them."""
    columns = [f"{name}.{part}" for name in names for part in ("loss", "correct", "tokens")]
    return SummedStats("masked", columns, np.asarray(sample_sums, dtype=np.float64).reshape(-1, len(columns)),
                       masked_finish)
