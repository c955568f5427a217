"""Splitting a sample's token budgets across modalities by a draw from a Dirichlet mixture (4M's masking).

A mixture component is picked by weight; its per-modality concentrations give one Dirichlet draw for the input
budget and one for the target budget. A modality with concentration 0, or that the sample lacks, gets nothing.
Shares are rounded to whole tokens (largest remainders), capped by the tokens the modality has, and what a cap
leaves over moves to the other eligible modalities that still have tokens, so a budget is filled exactly whenever
the sample holds enough tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class MixtureComponent:
    """Concentrations over the model's modalities (in ModalitySpec order); 0 = never."""

    weight: float
    input_alphas: tuple[float, ...]
    target_alphas: tuple[float, ...]


def pick_component(rng: np.random.Generator, mixture: tuple[MixtureComponent, ...]) -> MixtureComponent:
    weights = np.array([c.weight for c in mixture], dtype=np.float64)
    return mixture[int(rng.choice(len(mixture), p=weights / weights.sum()))]


def split_budget(rng: np.random.Generator, budget: int, alphas: np.ndarray, available: np.ndarray) -> np.ndarray:
    """Integer allocation ``[M]`` of ``budget`` over modalities, Dirichlet(``alphas``) shares among the eligible
    ones (alpha > 0 and something available), capped by ``available``, leftovers moved on."""
    alloc = np.zeros(len(alphas), dtype=np.int64)
    eligible = np.flatnonzero((alphas > 0) & (available > 0))
    if budget <= 0 or eligible.size == 0:
        return alloc
    shares = rng.dirichlet(alphas[eligible]) if eligible.size > 1 else np.ones(1)
    raw = shares * budget
    base = np.floor(raw).astype(np.int64)
    order = np.argsort(-(raw - base), kind="stable")
    base[order[: budget - int(base.sum())]] += 1
    alloc[eligible] = np.minimum(base, available[eligible])
    leftover = budget - int(alloc.sum())
    for i in eligible[np.argsort(-shares, kind="stable")]:  # largest share first takes what is left
        if leftover <= 0:
            break
        extra = min(int(available[i] - alloc[i]), leftover)
        alloc[i] += extra
        leftover -= extra
    return alloc
