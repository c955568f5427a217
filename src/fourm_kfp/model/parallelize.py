"""Parallelism, applied from outside the single-device model: activation checkpointing and ``torch.compile`` per
block, then data parallelism (DDP for small models, FSDP2 ``fully_shard`` per block then the root for large ones).
A single process on the CPU instead has its token tables write their gradients in place
(:mod:`fourm_kfp.model.table_gradients`).

The model code never knows about any of it; the trainer calls :func:`parallelize` once after building the model.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from fourm_kfp import distributed


class CheckpointedBlock(nn.Module):
    """Recomputes the wrapped block's activations in backward (non-reentrant, works with compile and FSDP2)."""

    def __init__(self, block: nn.Module):
        super().__init__()
        self.block = block

    def forward(self, *args: torch.Tensor) -> torch.Tensor:
        return checkpoint(self.block, *args, use_reentrant=False)


def _blocks(model: nn.Module) -> list[tuple[nn.ModuleList, int]]:
    return [(stack, i) for stack in (model.encoder, model.decoder) for i in range(len(stack))]


def parallelize(model: nn.Module, *, mode: Literal["none", "ddp", "fsdp"] = "none",
                activation_checkpointing: bool = False, compile: bool = False,
                param_dtype: torch.dtype | None = None) -> nn.Module:
    """Wrap ``model`` (a :class:`~fourm_kfp.model.fourm.FourM` on its device) for training; returns the module
    the trainer calls. ``param_dtype`` is FSDP2's compute dtype (gradients are reduced in fp32)."""
    for stack, i in _blocks(model):
        block = stack[i]
        if activation_checkpointing:
            block = CheckpointedBlock(block)
        if compile:
            block = torch.compile(block)
        stack[i] = block
    device = next(model.parameters()).device
    data_parallel = mode == "fsdp" or (mode == "ddp" and distributed.world_size() > 1)
    model.table_grads_in_place = device.type == "cpu" and not data_parallel
    if mode == "ddp" and distributed.world_size() > 1:
        return nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    if mode == "fsdp":
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
        for stack, i in _blocks(model):
            fully_shard(stack[i], mp_policy=policy)
        fully_shard(model, mp_policy=policy)
    return model


def unwrap(model: nn.Module) -> nn.Module:
    """The FourM inside a DDP wrapper (FSDP2 shards in place and needs no unwrapping)."""
    return model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model


def full_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The unwrapped model's full state dict on the CPU (gathers FSDP2 shards; call on every rank)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return {k: v.contiguous() for k, v in state.items()}
