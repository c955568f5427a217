"""How long a pretraining run is and how its global batch is cut: the schedule's length in optimizer steps (from
``train.steps``, ``train.epochs`` or ``train.tokens``) and the micro-batches each rank runs per step."""

from __future__ import annotations

import math
from typing import Any

from fourm_kfp.config.schema import ConfigError


def batch_layout(train: Any, world: int) -> tuple[int, int]:
    """``(micro batch per rank, micro-batches per step)`` from the global batch."""
    micro = train.micro_batch_size or train.global_batch_size // world
    if micro < 1 or train.global_batch_size % (micro * world):
        raise ConfigError(f"train.global_batch_size={train.global_batch_size} is not a multiple of "
                          f"micro_batch_size ({micro}) x world size ({world})")
    return micro, train.global_batch_size // (micro * world)


def total_steps(train: Any, train_samples: int) -> int:
    """The schedule's length from ``steps``, ``epochs`` or ``tokens``."""
    if train.steps:
        return train.steps
    if train.epochs:
        return max(math.ceil(train.epochs * train_samples / train.global_batch_size), 1)
    return max(math.ceil(train.tokens / (train.global_batch_size * (train.input_budget + train.target_budget))), 1)
