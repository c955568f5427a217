"""The EMA cosine vector quantizer: normalised codes, EMA updates, dead-code restarts, straight-through gradient."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from fourm_kfp.tokenizers.vector_quantizer import VectorQuantizer


def identity_quantizer(codebook: torch.Tensor, decay: float = 0.5, dead_threshold: float = 0.0) -> VectorQuantizer:
    """A quantizer whose projections are the identity, with the given codebook."""
    k, d = codebook.shape
    vq = VectorQuantizer(d, k, code_dim=d, decay=decay, dead_threshold=dead_threshold, buffer_size=64)
    with torch.no_grad():
        for proj in (vq.proj_in, vq.proj_out):
            proj.weight.copy_(torch.eye(d).view(d, d, 1, 1))
            proj.bias.zero_()
        vq.codebook.copy_(F.normalize(codebook, dim=1))
    return vq


def as_features(vectors: torch.Tensor) -> torch.Tensor:
    """``[N, D]`` → ``[1, D, 1, N]``."""
    return vectors.t().reshape(1, vectors.shape[1], 1, -1)


def test_codes_are_unit_vectors_before_and_after_training_steps():
    torch.manual_seed(0)
    vq = VectorQuantizer(8, 16, code_dim=4, decay=0.9)
    assert torch.allclose(vq.codebook.norm(dim=1), torch.ones(16), atol=1e-5)
    for _ in range(3):
        quantized, codes, stats = vq(torch.randn(2, 8, 4, 4))
    assert quantized.shape == (2, 8, 4, 4) and codes.shape == (2, 4, 4) and codes.dtype == torch.long
    assert torch.allclose(vq.codebook.norm(dim=1), torch.ones(16), atol=1e-5)
    assert {"commit", "usage", "perplexity", "restarted"} <= set(stats)


def test_ema_moves_used_codes_towards_inputs_and_decays_unused_ones():
    vq = identity_quantizer(torch.eye(4))
    with torch.no_grad():
        vq.ema_cluster_size.fill_(2.0)
        vq.ema_embed_sum.copy_(vq.codebook * 2.0)
    inputs = F.normalize(torch.tensor([[1.0, 0.5, 0.0, 0.0], [1.0, 0.3, 0.0, 0.0]]), dim=1)
    before = vq.codebook.clone()
    _, codes, _ = vq(as_features(inputs))
    assert codes.flatten().tolist() == [0, 0]
    target = F.normalize(inputs.mean(0), dim=0)
    assert (vq.codebook[0] @ target) > (before[0] @ target)  # code 0 moved towards its inputs
    assert torch.allclose(vq.ema_cluster_size[1:], torch.full((3,), 1.0))  # 2.0 * decay
    assert torch.allclose(vq.ema_embed_sum[1:], before[1:] * 1.0)
    assert torch.allclose(vq.codebook[1:], before[1:])  # unused codes keep their direction


def test_dead_codes_restart_from_recent_inputs():
    torch.manual_seed(0)
    vq = identity_quantizer(torch.eye(4), dead_threshold=1.0)
    inputs = F.normalize(torch.tensor([[1.0, 0.2, 0.1, 0.0], [0.1, 1.0, 0.0, 0.3]]).repeat(4, 1), dim=1)
    _, codes, stats = vq(as_features(inputs))
    used = torch.zeros(4, dtype=torch.bool)
    used[codes.flatten()] = True
    assert used.sum() == 2 and stats["restarted"] == 2
    similarity = vq.codebook @ inputs.t()
    restarted = similarity[~used].max(dim=1).values
    assert torch.allclose(restarted, torch.ones_like(restarted), atol=1e-5)  # each is one of the inputs
    assert (vq.usage()[~used] >= vq.dead_threshold).all()  # and starts above the threshold


def test_straight_through_gradient_reaches_the_encoder():
    torch.manual_seed(0)
    vq = VectorQuantizer(8, 16, code_dim=4)
    x = torch.randn(2, 8, 3, 3, requires_grad=True)
    quantized, _, stats = vq(x)
    (quantized.square().sum() + stats["commit"]).backward()
    assert x.grad is not None and x.grad.abs().sum() > 0
    assert vq.proj_in.weight.grad.abs().sum() > 0 and vq.proj_out.weight.grad.abs().sum() > 0


def test_eval_mode_leaves_statistics_alone_and_is_deterministic_given_the_seed():
    def run() -> VectorQuantizer:
        torch.manual_seed(1)
        vq = VectorQuantizer(8, 16, code_dim=4, decay=0.9)
        for _ in range(3):
            vq(torch.randn(2, 8, 4, 4))
        return vq

    a, b = run(), run()
    assert torch.equal(a.codebook, b.codebook) and torch.equal(a.ema_cluster_size, b.ema_cluster_size)
    a.eval()
    state = {k: v.clone() for k, v in a.state_dict().items()}
    x = torch.randn(2, 8, 4, 4)
    _, codes, _ = a(x)
    assert all(torch.equal(v, a.state_dict()[k]) for k, v in state.items())
    assert torch.equal(codes, a.encode(x))
