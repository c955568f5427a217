"""The validation pretrain's trainer runs every ``train.val_every`` steps: masked-modeling loss and token accuracy
per modality on fixed val batches.

Each modality's loss and accuracy are weighted by its target tokens over the batches; ``val/loss`` is their mean
over the modalities with targets (the same numbers the evaluate stage recomputes per sample,
:mod:`fourm_kfp.evaluation.masked_modeling_stats`).
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np
import torch

from fourm_kfp.model.parallelize import unwrap
from fourm_kfp.train.step import autocast


def masked_modeling_validator(batches: list, device: torch.device, dtype: torch.dtype | None,
                              names: tuple[str, ...]) -> Callable[[torch.nn.Module], dict[str, float]]:
    """``model -> {"val/loss/<name>", "val/accuracy/<name>", "val/loss"}`` on ``batches`` (autocast to ``dtype``,
    ``None`` for fp32), for the modalities ``names`` that have target tokens there."""
    @torch.no_grad()
    def validate(model: torch.nn.Module) -> dict[str, float]:
        sums: dict[str, list[float]] = {}
        for batch in batches:
            with autocast(device, dtype):
                out = unwrap(model)(batch.to(device), with_accuracy=True)
            for name, loss in out.modality_losses.items():
                n = out.token_counts[name]
                acc = out.modality_accuracy[name]
                s = sums.setdefault(name, [0.0, 0.0, 0])
                s[0] += float(loss) * n
                s[1] += float(acc) * n
                s[2] += n
        values = {}
        for name in names:
            if name in sums:
                loss, acc, n = sums[name]
                values[f"val/loss/{name}"], values[f"val/accuracy/{name}"] = loss / n, acc / n
        losses = [v for k, v in values.items() if k.startswith("val/loss/")]
        values["val/loss"] = float(np.mean(losses)) if losses else math.nan
        return values

    return validate
