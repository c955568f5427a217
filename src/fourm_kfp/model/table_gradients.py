"""Token-table gradients written in place: the token lookups and the tied output head add their gradients straight
into one persistent ``.grad`` buffer per table (single-process training on the CPU).

Autograd gives a table used by a lookup a fresh, table-sized, zero-filled gradient per step, and a head applied per
modality (one slice of the table each) a fresh gradient per slice plus their concatenation. On the CPU each fresh
table-sized tensor is new memory, paid for in page faults: at ml-4m's tiny configuration (two 54576 x 384 tables)
that was ~0.2 s of a ~1.1 s step. Here the lookup's backward ``index_add_``s its rows into the table's ``.grad`` and
the head's backward (:class:`_SliceCrossEntropy`, the head and its loss in one function) ``addmm_``s each
modality's weight gradient into its rows of the same buffer; the buffer is zeroed in place between steps
(:func:`clear_gradients`), and micro-batches accumulate into it as autograd would.

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


class _SliceCrossEntropy(torch.autograd.Function):
    """The summed cross-entropy of ``hidden @ table[start:stop].t()`` against ``targets`` (``ignore_index`` and
    ``label_smoothing`` as :func:`torch.nn.functional.cross_entropy`'s, ``reduction="sum"``), in one function.

    Autograd's chain (logits, ``log_softmax``, ``nll_loss``) gives backward a fresh zero-filled gradient of the
    logits, then a fresh softmax gradient that computes the exponentials a second time (at ml-4m's tiny shapes the
    head's forward and backward took 137 ms with that chain, 127 ms with this function). Here forward keeps the
    softmax itself (whose row maximum, at least ``1 / vocab``, gives each row's log-sum-exp exactly:
    ``lse = x_j - log p_j``), and backward turns it into the logits' gradient in place (minus the targets'
    one-hot), applying the upstream gradient, zero for ignored rows, to the small ``[N, dim]`` operands of the two
    matmuls instead of the logits. The weight gradient is added into rows ``start:stop`` of ``table.grad``.
    Autocast: the logits' matmul runs in autocast's dtype and the softmax in fp32 (as ``.float()`` and
    ``cross_entropy`` would); backward's matmuls in the logits' dtype, accumulated in the buffer's (as autograd's
    cast would). The table's rows are cast once, in forward, and backward reuses that copy (this backward used to
    cast them again: about 2% of a bf16 step at ml-4m tiny's widths)."""

    @staticmethod
    def forward(ctx, hidden: torch.Tensor, table: torch.Tensor, start: int, stop: int, targets: torch.Tensor,
                ignore_index: int, label_smoothing: float) -> torch.Tensor:
        weight = table[start:stop]
        if torch.is_autocast_enabled(hidden.device.type):  # one cast, which backward reuses
            weight = weight.to(torch.get_autocast_dtype(hidden.device.type))
        logits = hidden @ weight.t()
        x = logits.float()
        probs = torch.softmax(x, dim=-1)
        top, at = x.max(dim=-1, keepdim=True)
        lse = top - probs.gather(1, at).log()  # [N, 1]
        valid = targets != ignore_index
        safe = targets.clamp_min(0).unsqueeze(1)
        token_loss = (lse - x.gather(1, safe)).squeeze(1)
        if label_smoothing > 0:
            token_loss = (1 - label_smoothing) * token_loss + label_smoothing * (lse.squeeze(1) - x.mean(-1))
        ctx.table, ctx.rows, ctx.dtype, ctx.smoothing = table, (start, stop), logits.dtype, label_smoothing
        ctx.weight = weight.detach()  # the rows as the logits used them (a view where nothing was cast)
        ctx.save_for_backward(hidden, probs, safe, valid)
        return torch.where(valid, token_loss, 0.0).sum()

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        hidden, probs, safe, valid = ctx.saved_tensors
        start, stop = ctx.rows
        smoothing, dtype = ctx.smoothing, ctx.dtype
        # the saved softmax becomes d(loss)/d(logits) / scale in place (backward runs once)
        if smoothing > 0:
            probs.sub_(smoothing / probs.shape[1])
        probs.scatter_add_(1, safe, torch.full(safe.shape, smoothing - 1.0, dtype=probs.dtype, device=probs.device))
        scale = (grad * valid).to(probs.dtype).unsqueeze(1)
        probs = probs.to(dtype)
        weight = ctx.weight
        rows = _buffer(ctx.table)[start:stop]
        operand = (hidden.to(scale.dtype) * scale).to(dtype)
        if dtype == rows.dtype:
            rows.addmm_(probs.t(), operand)
        else:  # autocast: the product in its dtype, accumulated in the buffer's
            rows.add_(probs.t() @ operand)
        return ((probs @ weight) * scale).to(hidden.dtype), None, None, None, None, None, None


def gather_rows(table: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    return _GatherRows.apply(table, ids)


def slice_cross_entropy(hidden: torch.Tensor, table: torch.Tensor, start: int, stop: int, targets: torch.Tensor,
                        ignore_index: int, label_smoothing: float = 0.0) -> torch.Tensor:
    return _SliceCrossEntropy.apply(hidden, table, start, stop, targets, ignore_index, label_smoothing)


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
