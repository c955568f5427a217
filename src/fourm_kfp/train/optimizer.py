"""AdamW with 4M's parameter groups and the learning-rate schedule (linear warmup, then cosine).

Parameter groups: weight decay on the matrices of linear layers only; none on norms, biases, positional and mask
tokens, nor (unless configured) on embeddings. The peak learning rate scales with the global batch as in the
reference, ``lr = base_lr * global_batch_size / 256``. The schedule is a pure function of the step, so a resumed
run recomputes it from the restored step and nothing about it needs saving besides the step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from fourm_kfp.config.fourm_config import OptimizerConfig


@dataclass(frozen=True)
class Schedule:
    """``lr(step)``: linear warmup from 0 to ``peak_lr`` over ``warmup_steps``, then cosine to
    ``peak_lr * min_lr_ratio`` at ``total_steps``."""

    peak_lr: float
    warmup_steps: int
    total_steps: int
    min_lr_ratio: float = 0.0

    def lr(self, step: int) -> float:
        """The learning rate of optimizer step ``step`` (0-based)."""
        if self.warmup_steps and step < self.warmup_steps:
            return self.peak_lr * (step + 1) / self.warmup_steps
        span = max(self.total_steps - self.warmup_steps, 1)
        progress = min(max(step - self.warmup_steps, 0) / span, 1.0)
        floor = self.peak_lr * self.min_lr_ratio
        return floor + (self.peak_lr - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))


def peak_learning_rate(base_lr: float, global_batch_size: int) -> float:
    return base_lr * global_batch_size / 256


def _no_decay(name: str, param: nn.Parameter, embedding_names: set[str], decay_embeddings: bool) -> bool:
    if param.ndim < 2:
        return True  # norms, biases, mask tokens, scalar gates
    if name in embedding_names:
        return not decay_embeddings
    return False


def parameter_groups(model: nn.Module, weight_decay: float, decay_embeddings: bool = False) -> list[dict]:
    """``[{"params": decayed, "weight_decay": wd}, {"params": the rest, "weight_decay": 0}]`` (names kept for
    inspection under ``"names"``)."""
    embedding_names = {f"{prefix}.{pname}" if prefix else pname
                       for prefix, module in model.named_modules() if isinstance(module, nn.Embedding)
                       for pname, _ in module.named_parameters(recurse=False)}
    decay, no_decay = ([], []), ([], [])
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        group = no_decay if _no_decay(name, param, embedding_names, decay_embeddings) else decay
        group[0].append(name)
        group[1].append(param)
    return [{"params": decay[1], "names": decay[0], "weight_decay": weight_decay},
            {"params": no_decay[1], "names": no_decay[0], "weight_decay": 0.0}]


def build_optimizer(model: nn.Module, cfg: OptimizerConfig, peak_lr: float) -> torch.optim.AdamW:
    """AdamW over the groups above, fused (one kernel over all parameters) on CUDA and on the CPU alike: on 2 CPU
    threads it steps ~170M parameters in 0.16 s where the foreach implementation takes 0.66 s."""
    groups = [{k: v for k, v in g.items() if k != "names"} for g in parameter_groups(model, cfg.weight_decay,
                                                                                      cfg.decay_embeddings)]
    return torch.optim.AdamW(groups, lr=peak_lr, betas=tuple(cfg.betas), eps=1e-8, fused=True)


def set_learning_rate(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr
