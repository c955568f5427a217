"""Token-table gradients written in place: the token lookups and the tied output head add their gradients straight
into one persistent ``.grad`` buffer per table (single-process training on the CPU).

Autograd gives a table used by a lookup a fresh, table-sized, zero-filled gradient per step, and a head applied per
modality (one slice of the table each) a fresh gradient per slice plus their concatenation. On the CPU each fresh
table-sized tensor is new memory, paid for in page faults: at ml-4m's tiny configuration (two 54576 x 384 tables)
that was ~0.2 s of a ~1.1 s step. Here the lookup's backward ``index_add_``s its rows into the table's ``.grad`` and
the head's backward ``addmm_``s each modality's weight gradient into its rows of the same buffer; the buffer is
zeroed in place between steps (:func:`clear_gradients`), and micro-batches accumulate into it as autograd would.

The values are autograd's, summed in another order (so not the same bits). Only for one process: DDP and FSDP2
reduce gradients from autograd's accumulation hooks, which a gradient written here never reaches, and on CUDA
``index_add_`` accumulates with atomics (not reproducible) while fresh memory costs nothing; there the model keeps
plain autograd (:func:`fourm_kfp.model.parallelize.parallelize` decides).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

#: set on a parameter whose ``.grad`` is a buffer written in backward and kept across steps
_KEPT = "_fourm_grad_buffer"


def _buffer(table: torch.Tensor) -> torch.Tensor:
    if table.grad is None:  # first step: allocated once, kept by clear_gradients
        table.grad = torch.zeros_like(table)
        setattr(table, _KEPT, True)
    return table.grad


class _GatherRows(torch.autograd.Function):
    """``table[ids]``; backward adds the rows' gradients into ``table.grad`` (and returns none to autograd)."""

    @staticmethod
    def forward(ctx, table: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        ctx.table = table
        ctx.save_for_backward(ids)
        return F.embedding(ids, table)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[None, None]:
        (ids,) = ctx.saved_tensors
        buffer = _buffer(ctx.table)
        buffer.index_add_(0, ids.reshape(-1), grad.reshape(-1, grad.shape[-1]).to(buffer.dtype))
        return None, None


class _SliceLogits(torch.autograd.Function):
    """``hidden @ table[start:stop].t()`` (in autocast's dtype where autocast is on); backward returns the hidden
    states' gradient and adds the weight gradient into rows ``start:stop`` of ``table.grad``."""

    @staticmethod
    def forward(ctx, hidden: torch.Tensor, table: torch.Tensor, start: int, stop: int) -> torch.Tensor:
        ctx.table, ctx.rows = table, (start, stop)
        ctx.save_for_backward(hidden)
        return hidden @ table[start:stop].t()

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        (hidden,) = ctx.saved_tensors
        start, stop = ctx.rows
        weight = ctx.table.detach()[start:stop]
        rows = _buffer(ctx.table)[start:stop]
        operand = hidden.to(grad.dtype)
        if grad.dtype == rows.dtype:
            rows.addmm_(grad.t(), operand)
        else:  # autocast: the product in its dtype, accumulated in the buffer's (as autograd's cast would)
            rows.add_(grad.t() @ operand)
        return (grad @ weight.to(grad.dtype)).to(hidden.dtype), None, None, None


def gather_rows(table: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    return _GatherRows.apply(table, ids)


def slice_logits(hidden: torch.Tensor, table: torch.Tensor, start: int, stop: int) -> torch.Tensor:
    return _SliceLogits.apply(hidden, table, start, stop)


def clear_gradients(optimizer: torch.optim.Optimizer) -> None:
    """After a step: drop every gradient (``set_to_none``) except the buffers written in backward, zeroed in place."""
    for group in optimizer.param_groups:
        for param in group["params"]:
            if param.grad is None:
                continue
            if getattr(param, _KEPT, False):
                param.grad.zero_()
            else:
                param.grad = None
