"""The training step: forward and backward over the micro-batches of one optimizer step, clip, update.

A pure function of (model, optimizer, micro-batches, settings) that returns device tensors only: nothing is read
back to the host here (the trainer reads the accumulated values at log steps). Gradients are clipped by the fused
AdamW itself (its ``grad_scale`` input), not by a pass of their own. A non-finite loss or gradient norm
skips the update: on CUDA through the fused AdamW's ``found_inf`` input (the kernel leaves parameters, moments and
step counts untouched, no synchronisation), on the CPU by a plain check (a host read costs nothing there).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

import torch
from torch import nn

from fourm_kfp.batch import MaskedBatch
from fourm_kfp.model.table_gradients import clear_gradients


@dataclass(frozen=True)
class StepSettings:
    autocast_dtype: torch.dtype | None  # None: fp32
    grad_clip: float  # 0: no clipping (the norm is still measured)
    modalities: tuple[str, ...]  # the model's modalities, in ModalitySpec order


def _grad_sync(model: nn.Module, enabled: bool) -> contextlib.AbstractContextManager:
    """Gradient all-reduce only on the last micro-batch (DDP ``no_sync``; FSDP2 ``set_requires_gradient_sync``)."""
    if hasattr(model, "no_sync") and not enabled:
        return model.no_sync()
    if hasattr(model, "set_requires_gradient_sync"):
        model.set_requires_gradient_sync(enabled)
    return contextlib.nullcontext()


def autocast(device: torch.device, dtype: torch.dtype | None) -> contextlib.AbstractContextManager:
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def train_step(model: nn.Module, optimizer: torch.optim.Optimizer, micro_batches: Sequence[MaskedBatch],
               settings: StepSettings, device: torch.device) -> dict[str, torch.Tensor]:
    """One optimizer step; returns ``loss``, ``loss/<modality>`` (NaN where absent), ``grad_norm`` and
    ``finite`` as device tensors."""
    count = len(micro_batches)
    loss_sum = torch.zeros((), device=device)
    modality_sum = torch.zeros(len(settings.modalities), device=device)
    modality_seen = torch.zeros(len(settings.modalities), device=device)
    for i, batch in enumerate(micro_batches):
        with _grad_sync(model, enabled=i == count - 1), autocast(device, settings.autocast_dtype):
            out = model(batch)
            (out.loss / count).backward()
        loss_sum += out.loss.detach().float()
        for j, name in enumerate(settings.modalities):
            value = out.modality_losses.get(name)
            if value is not None:
                modality_sum[j] += value.detach().float()
                modality_seen[j] += 1
    params = [p for p in model.parameters() if p.grad is not None]
    grad_norm = torch.nn.utils.get_total_norm([p.grad for p in params], foreach=True)
    if hasattr(grad_norm, "full_tensor"):  # FSDP2: the norm is a DTensor
        grad_norm = grad_norm.full_tensor()
    loss = loss_sum / count
    finite = torch.isfinite(loss) & torch.isfinite(grad_norm)
    _clipped_update(optimizer, params, grad_norm, settings.grad_clip, finite, device)
    clear_gradients(optimizer)
    values = {"loss": loss, "grad_norm": grad_norm, "finite": finite}
    per_modality = modality_sum / modality_seen  # NaN where a modality had no targets this step
    for j, name in enumerate(settings.modalities):
        values[f"loss/{name}"] = per_modality[j]
    return values


def _clipped_update(optimizer: torch.optim.Optimizer, params: list[torch.Tensor], grad_norm: torch.Tensor,
                    grad_clip: float, finite: torch.Tensor, device: torch.device) -> None:
    """The update with the gradients clipped to norm ``grad_clip`` (``clip_grad_norm_``'s coefficient), skipped
    when ``finite`` is false.

    A fused AdamW divides the gradients by its ``grad_scale`` input inside its one kernel (the input is there to
    unscale mixed-precision gradients), so the clip costs no pass of its own over every gradient (~1% of a CPU
    step at ml-4m's tiny configuration); other optimizers get the gradients divided first.
    """
    fused = all(group.get("fused") for group in optimizer.param_groups)
    scale = None
    if grad_clip > 0:
        scale = ((grad_norm + 1e-6) / grad_clip).clamp(min=1.0)  # 1 / clip_grad_norm_'s clip coefficient
        if not fused:
            torch._foreach_div_([p.grad for p in params], scale)
            scale = None
    optimizer.grad_scale = scale
    try:
        if device.type == "cuda" and fused:
            optimizer.found_inf = (~finite).float()  # read by the fused kernel: skips the update on the device
            optimizer.step()
        elif bool(finite):
            optimizer.step()
    finally:
        optimizer.grad_scale = optimizer.found_inf = None


def global_norm(tensors: Iterator[torch.Tensor]) -> torch.Tensor:
    """L2 norm over many tensors; FSDP2's sharded DTensors contribute their local shards, summed over ranks."""
    total, sharded = None, False
    for t in tensors:
        if hasattr(t, "to_local"):
            t, sharded = t.to_local(), True
        squares = t.detach().float().square().sum()
        total = squares if total is None else total + squares
    if total is None:
        return torch.zeros(())
    if sharded and torch.distributed.is_initialized():
        torch.distributed.all_reduce(total)
    return total.sqrt()


def optimized_parameters(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """The parameters as the optimizer holds them (under FSDP2 always the sharded DTensors)."""
    return [p for group in optimizer.param_groups for p in group["params"]]


def parameter_snapshot(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """Detached copies of the parameters (taken before a log step's update, for the update norm)."""
    return [p.detach().clone() for p in optimized_parameters(optimizer)]


def update_norm(optimizer: torch.optim.Optimizer, before: list[torch.Tensor]) -> torch.Tensor:
    return global_norm(p.detach() - b for p, b in zip(optimized_parameters(optimizer), before))


def to_host(values: dict[str, Any]) -> dict[str, float]:
    """One device-to-host transfer for all scalar tensors of a log step."""
    names = [k for k, v in values.items() if isinstance(v, torch.Tensor)]
    if not names:
        return {k: float(v) for k, v in values.items()}
    stacked = torch.stack([values[k].detach().float().reshape(()) for k in names]).cpu().tolist()
    out = {k: float(v) for k, v in values.items() if not isinstance(v, torch.Tensor)}
    out.update(dict(zip(names, stacked)))
    return out
