"""Transformer building blocks of the 4M model: pre-norm blocks, attention, SwiGLU, sin-cos positions.

Every linear and LayerNorm is bias-free, as in 4M's SwiGLU models (apple/ml-4m's ``*_swiglu_nobias``).
Attention (:func:`attention`) takes a boolean mask (``True`` = may attend) that the model builds once per batch and
goes through ``torch.nn.functional.scaled_dot_product_attention``, except on the CPU where an explicit path is
faster (:class:`_ExplicitAttention`); the q/k/v projections are one fused matmul, and so are SwiGLU's gate and up
projections (whose activation writes both halves' gradients into one tensor).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


def layer_norm(dim: int, eps: float) -> nn.LayerNorm:
    return nn.LayerNorm(dim, eps=eps, bias=False)


def swiglu_hidden(dim: int, mlp_ratio: float = 4.0) -> int:
    """The reference's SwiGLU width: two thirds of ``mlp_ratio * dim`` (same parameters as a plain MLP)."""
    return int(2 * mlp_ratio * dim / 3)


class _GatedSiLU(torch.autograd.Function):
    """``silu(gate) * up`` of the fused projection's output ``[..., 2 * hidden]`` (gate half first).

    The same values and gradients, bit for bit, as autograd's ``chunk``, ``silu`` and ``mul``, whose backward
    computes each half's gradient separately and then concatenates them: one more pass over the widest activation
    of the block. Here both halves are written into one tensor (1-2% of a CPU train step at ml-4m's tiny and base
    widths)."""

    @staticmethod
    def forward(ctx, gate_up: torch.Tensor) -> torch.Tensor:
        gate, up = gate_up.chunk(2, dim=-1)
        activated = F.silu(gate)
        ctx.save_for_backward(gate_up, activated)
        return activated * up

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        gate_up, activated = ctx.saved_tensors
        gate, up = gate_up.chunk(2, dim=-1)
        grad_gate_up = torch.empty_like(gate_up)
        grad_gate, grad_up = grad_gate_up.chunk(2, dim=-1)
        torch.mul(grad, activated, out=grad_up)
        torch.ops.aten.silu_backward.grad_input(grad * up, gate, grad_input=grad_gate)
        return grad_gate_up


#: On the CPU, fp32 attention under autograd takes the explicit path while one call's scores ``[B, heads, n, m]``
#: have at most this many elements (4 MiB in fp32): at the demo's shapes (64 x 4 heads x 64 x 64) and ml-4m tiny's
#: (8 x 6 x 128 x 128) forward and backward take 4-19% less time than the fused kernel (2-core Zen 4); above it
#: (ml-4m base's 8 x 12 x 128 x 128) the two are even and the fused kernel, which keeps no probabilities, stays.
EXPLICIT_ATTENTION_MAX_SCORES = 1 << 20


class _ExplicitAttention(torch.autograd.Function):
    """``softmax(q kᵀ / √d + mask) v`` as batched matmuls, the probabilities saved for the backward.

    The CPU's fused ``scaled_dot_product_attention`` kernel is a flash kernel: it recomputes the probabilities
    block by block in its backward, which at short sequences costs more than it saves, and in bf16 its backward
    is 4-5x slower than this (20.4 ms against 3.7 ms per call at the demo's shapes on a 2-core AVX512 CPU; forward
    2.1 against 1.3 ms). Gradients are the fused kernel's to rounding (fp32: max difference ~1e-6). ``q``/``k``/``v``
    ``[B, heads, n | m, head_dim]``, any strides; ``mask`` boolean, broadcastable to ``[B, heads, n, m]``, or
    ``None``; every query row must see at least one key (the model's masks do)."""

    @staticmethod
    def forward(ctx, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                mask: torch.Tensor | None) -> torch.Tensor:
        b, h, n, d = q.shape
        m = k.shape[2]
        scale = d ** -0.5
        scaled_q = torch.empty((b, h, n, d), dtype=q.dtype, device=q.device)
        torch.mul(q, scale, out=scaled_q)
        scaled_q = scaled_q.view(b * h, n, d)
        keys, values = k.reshape(b * h, m, d), v.reshape(b * h, m, d)
        scores = torch.bmm(scaled_q, keys.transpose(1, 2))
        if mask is not None:
            scores.view(b, h, n, m).masked_fill_(~mask, float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        ctx.save_for_backward(scaled_q, keys, values, probs)
        ctx.scale = scale
        return torch.bmm(probs, values).view(b, h, n, d)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        scaled_q, keys, values, probs = ctx.saved_tensors
        b, h, n, d = grad.shape
        m = keys.shape[1]
        grad = grad.reshape(b * h, n, d)
        grad_v = torch.bmm(probs.transpose(1, 2), grad)
        grad_scores = torch._softmax_backward_data(torch.bmm(grad, values.transpose(1, 2)), probs, -1, probs.dtype)
        grad_q = torch.bmm(grad_scores, keys).mul_(ctx.scale)
        grad_k = torch.bmm(grad_scores.transpose(1, 2), scaled_q)
        return grad_q.view(b, h, n, d), grad_k.view(b, h, m, d), grad_v.view(b, h, m, d), None


def _explicit_on_cpu(q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor | None) -> bool:
    b, h, n, _ = q.shape
    if (q.device.type != "cpu" or k.shape[:2] != (b, h) or q.dtype != k.dtype
            or mask is not None and mask.dtype != torch.bool):
        return False
    if q.dtype != torch.float32:  # the fused kernel's reduced-precision backward is the slow one
        return True
    return torch.is_grad_enabled() and q.requires_grad and b * h * n * k.shape[2] <= EXPLICIT_ATTENTION_MAX_SCORES


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Scaled dot-product attention of ``q`` ``[B, heads, n, head_dim]`` over ``k``/``v`` ``[B, heads, m,
    head_dim]`` with a boolean ``mask`` broadcastable to ``[B, heads, n, m]`` (``True`` = may attend)."""
    if _explicit_on_cpu(q, k, mask):
        return _ExplicitAttention.apply(q, k, v, mask)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


class SwiGLU(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.gate_up = nn.Linear(dim, 2 * hidden, bias=False)
        self.down = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(_GatedSiLU.apply(self.gate_up(x)))


class SelfAttention(nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.proj = nn.Linear(dim, dim, bias=False)

    def _heads(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q, k, v ``[B, heads, n, head_dim]`` from one fused projection."""
        b, n, d = x.shape
        return self.qkv(x).view(b, n, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4).unbind(0)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        b, n, d = x.shape
        q, k, v = self._heads(x)
        out = attention(q, k, v, mask)
        return self.proj(out.transpose(1, 2).reshape(b, n, d))

    def step(self, x: torch.Tensor, cache: dict[str, torch.Tensor]) -> torch.Tensor:
        """Causal attention of new positions ``x`` [B, n, dim] over the cached keys/values plus their own
        (``cache`` holds ``k``/``v`` [B, heads, past, head_dim] and grows in place)."""
        b, n, d = x.shape
        q, k, v = self._heads(x)
        if "k" in cache:
            k, v = torch.cat([cache["k"], k], dim=2), torch.cat([cache["v"], v], dim=2)
        cache["k"], cache["v"] = k, v
        past = k.shape[2] - n
        mask = torch.ones(n, k.shape[2], dtype=torch.bool, device=x.device).tril(diagonal=past)
        out = attention(q, k, v, mask)
        return self.proj(out.transpose(1, 2).reshape(b, n, d))


class CrossAttention(nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.q = nn.Linear(dim, dim, bias=False)
        self.kv = nn.Linear(dim, 2 * dim, bias=False)
        self.proj = nn.Linear(dim, dim, bias=False)

    def context_kv(self, context: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values ``[B, heads, M, head_dim]`` of the (normalised) encoder output."""
        b, m, d = context.shape
        k, v = self.kv(context).view(b, m, 2, self.heads, d // self.heads).permute(2, 0, 3, 1, 4).unbind(0)
        return k, v

    def forward(self, x: torch.Tensor, context: torch.Tensor, mask: torch.Tensor | None,
                kv: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        b, n, d = x.shape
        q = self.q(x).view(b, n, self.heads, d // self.heads).transpose(1, 2)
        k, v = kv if kv is not None else self.context_kv(context)
        out = attention(q, k, v, mask)
        return self.proj(out.transpose(1, 2).reshape(b, n, d))


class EncoderBlock(nn.Module):
    def __init__(self, dim: int, heads: int, eps: float):
        super().__init__()
        self.norm1, self.attn = layer_norm(dim, eps), SelfAttention(dim, heads)
        self.norm2, self.mlp = layer_norm(dim, eps), SwiGLU(dim, swiglu_hidden(dim))

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        x = x + self.attn(self.norm1(x), mask)
        return x + self.mlp(self.norm2(x))


class DecoderBlock(nn.Module):
    """Self-attention within each target modality, cross-attention to the encoder, SwiGLU."""

    def __init__(self, dim: int, heads: int, eps: float):
        super().__init__()
        self.norm1, self.self_attn = layer_norm(dim, eps), SelfAttention(dim, heads)
        self.query_norm, self.context_norm = layer_norm(dim, eps), layer_norm(dim, eps)
        self.cross_attn = CrossAttention(dim, heads)
        self.norm2, self.mlp = layer_norm(dim, eps), SwiGLU(dim, swiglu_hidden(dim))

    def forward(self, x: torch.Tensor, context: torch.Tensor, self_mask: torch.Tensor,
                cross_mask: torch.Tensor | None) -> torch.Tensor:
        x = x + self.self_attn(self.norm1(x), self_mask)
        x = x + self.cross_attn(self.query_norm(x), self.context_norm(context), cross_mask)
        return x + self.mlp(self.norm2(x))

    def step(self, x: torch.Tensor, cache: dict[str, torch.Tensor], cross_mask: torch.Tensor) -> torch.Tensor:
        """Incremental decoding of one causal (sequence) modality: ``x`` [B, n, dim] are the next positions;
        ``cache`` holds this block's self-attention keys/values and the encoder's cross keys/values
        (``cross_k``/``cross_v``, computed once by the caller with :meth:`CrossAttention.context_kv`)."""
        x = x + self.self_attn.step(self.norm1(x), cache)
        x = x + self.cross_attn(self.query_norm(x), None, cross_mask, kv=(cache["cross_k"], cache["cross_v"]))
        return x + self.mlp(self.norm2(x))


def sincos_1d(length: int, dim: int, temperature: float = 10000.0) -> torch.Tensor:
    """``[length, dim]`` fixed sin-cos positions."""
    omega = 1.0 / temperature ** (torch.arange(dim // 2, dtype=torch.float64) / (dim // 2))
    angles = torch.arange(length, dtype=torch.float64)[:, None] * omega[None]
    table = torch.cat([angles.sin(), angles.cos()], dim=1)
    return F.pad(table, (0, dim - table.shape[1])).float()


def sincos_2d(height: int, width: int, dim: int, temperature: float = 10000.0) -> torch.Tensor:
    """``[height * width, dim]`` fixed 2-D sin-cos positions (half the channels for rows, half for columns),
    row-major like the token grid."""
    quarter = dim // 4
    omega = 1.0 / temperature ** (torch.arange(quarter, dtype=torch.float64) / max(quarter, 1))
    ys, xs = torch.meshgrid(torch.arange(height, dtype=torch.float64), torch.arange(width, dtype=torch.float64),
                            indexing="ij")
    ay, ax = ys.reshape(-1, 1) * omega, xs.reshape(-1, 1) * omega
    table = torch.cat([ay.sin(), ay.cos(), ax.sin(), ax.cos()], dim=1)
    return F.pad(table, (0, dim - table.shape[1])).float()


def init_weights(module: nn.Module, std: float) -> None:
    """Xavier-uniform linears (fused q/k/v and gate/up split so each part gets its own fan), normal embeddings."""
    if isinstance(module, nn.Linear):
        out_features, in_features = module.weight.shape
        parts = out_features // in_features if out_features % in_features == 0 and out_features > in_features else 1
        bound = math.sqrt(6.0 / (in_features + out_features // parts))
        nn.init.uniform_(module.weight, -bound, bound)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, nn.Embedding):
        nn.init.normal_(module.weight, std=std)
    elif isinstance(module, nn.LayerNorm):
        nn.init.ones_(module.weight)
