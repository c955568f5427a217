"""The CPU's explicit attention path gives the fused kernel's values and gradients, and is taken where it is meant
to be (reduced precision on the CPU; fp32 training at short sequences)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from fourm_kfp.model import layers
from fourm_kfp.model.layers import _ExplicitAttention, attention


def _inputs(dtype, b=3, h=2, n=5, m=7, d=8, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(b, h, size, d, generator=gen, dtype=dtype).requires_grad_()
               for size in (n, m, m))
    return q, k, v, torch.randn(b, h, n, d, generator=gen, dtype=dtype)


def _mask(kind: str, b=3, n=5, m=7):
    gen = torch.Generator().manual_seed(1)
    if kind == "none":
        return None
    if kind == "self":  # the model's self-attention masks: a random pattern, each row sees itself
        return (torch.rand(b, 1, n, n, generator=gen) > 0.5) | torch.eye(n, dtype=torch.bool)
    if kind == "cross":  # the cross mask: [B, 1, 1, M], slot 0 always valid
        mask = torch.rand(b, 1, 1, m, generator=gen) > 0.5
        mask[..., 0] = True
        return mask
    raise ValueError(kind)


@pytest.mark.parametrize("kind", ["none", "self", "cross"])
@pytest.mark.parametrize("dtype, tolerance", [(torch.float64, 1e-12), (torch.float32, 2e-6)])
def test_explicit_attention_matches_the_fused_kernel_and_its_gradients(kind, dtype, tolerance):
    mask = _mask(kind)
    q, k, v, grad = _inputs(dtype, m=5 if kind == "self" else 7)
    fused = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    explicit = _ExplicitAttention.apply(q, k, v, mask)
    torch.testing.assert_close(explicit, fused, rtol=0, atol=tolerance)
    for ours, theirs in zip(torch.autograd.grad(explicit, (q, k, v), grad),
                            torch.autograd.grad(fused, (q, k, v), grad)):
        torch.testing.assert_close(ours, theirs, rtol=0, atol=tolerance)
    if dtype == torch.float64:
        assert torch.autograd.gradcheck(lambda q, k, v: _ExplicitAttention.apply(q, k, v, mask), (q, k, v))


def test_explicit_attention_takes_the_strided_views_of_a_fused_projection():
    """q/k/v as the model makes them (views of one [B, n, 3, heads, d] projection), masked rows' probabilities 0."""
    b, n, h, d = 2, 6, 3, 4
    qkv = torch.randn(b, n, 3, h, d, dtype=torch.float64, requires_grad=True)
    q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
    mask = torch.ones(b, 1, n, n, dtype=torch.bool).tril()
    explicit = _ExplicitAttention.apply(q, k, v, mask)
    torch.testing.assert_close(explicit, F.scaled_dot_product_attention(q, k, v, attn_mask=mask))
    # causal: the first query sees only the first key, so its output is that key's value
    torch.testing.assert_close(explicit[:, :, 0], v[:, :, 0])
    assert torch.autograd.gradcheck(lambda t: _ExplicitAttention.apply(*t.permute(2, 0, 3, 1, 4).unbind(0), mask),
                                    (qkv,))


def test_explicit_attention_in_bf16_stays_close_to_fp32():
    q, k, v, grad = _inputs(torch.float32, b=4, h=4, n=64, m=64, d=32)
    mask = _mask("self", b=4, n=64, m=64)
    reference = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    ref_grads = torch.autograd.grad(reference, (q, k, v), grad)
    low = [t.detach().bfloat16().requires_grad_() for t in (q, k, v)]
    out = _ExplicitAttention.apply(*low, mask)
    assert out.dtype == torch.bfloat16
    # bf16 keeps 8 bits of mantissa: errors of a few 1e-3 relative to the values' scale (~1)
    assert (out.float() - reference).abs().max() < 0.05
    for ours, theirs in zip(torch.autograd.grad(out, low, grad.bfloat16()), ref_grads):
        assert (ours.float() - theirs).abs().max() < 0.05 * theirs.abs().max()


def test_the_cpu_takes_the_explicit_path_where_it_is_faster(monkeypatch):
    calls = []
    original = _ExplicitAttention.apply
    monkeypatch.setattr(_ExplicitAttention, "apply", lambda *a: calls.append(a[0].dtype) or original(*a))

    def explicit(q, k, v, grad_mode=True) -> bool:
        calls.clear()
        with torch.set_grad_enabled(grad_mode):
            attention(q, k, v, None)
        return bool(calls)

    small = _inputs(torch.float32)[:3]
    assert explicit(*small)  # fp32 training at short sequences
    assert not explicit(*small, grad_mode=False)  # fp32 inference: the fused kernel is as fast and lighter
    assert explicit(*(t.detach().bfloat16() for t in small), grad_mode=False)  # bf16: always
    monkeypatch.setattr(layers, "EXPLICIT_ATTENTION_MAX_SCORES", 3 * 2 * 5 * 7 - 1)
    assert not explicit(*small)  # scores above the bound: the fused kernel
    mask = _mask("self").float()  # an additive mask is the fused kernel's
    assert not layers._explicit_on_cpu(small[0], small[1], mask)
