"""The 4M model: shapes and a finite loss, modality-restricted and causal decoder attention, padding that changes
nothing, gradients everywhere, the 4M-B trunk size, and SwiGLU's fused activation (autograd's numbers, compiles)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from fourm_kfp.batch import IGNORE_INDEX, MaskedBatch, ModalitySpec
from fourm_kfp.model.fourm import FourM, FourMArgs, trunk_parameters
from fourm_kfp.model.layers import SwiGLU

SPECS = (ModalitySpec("rgb", "image", 32, grid=(4, 4), pixel_input=True, patch_size=2),
         ModalitySpec("depth", "image", 24, grid=(4, 4)),
         ModalitySpec("caption", "sequence", 50, max_length=12))
ARGS = FourMArgs(SPECS, encoder_layers=2, decoder_layers=2, dim=32, heads=4)


def random_batch(b: int = 3, e: int = 10, d: int = 9, seed: int = 0, pad_from: int | None = None) -> MaskedBatch:
    """Slots: encoder random over the modalities; decoder = 3 depth slots, then 4 caption slots, then padding."""
    g = torch.Generator().manual_seed(seed)
    enc_mod = torch.randint(0, 3, (b, e), generator=g)
    enc_pos = torch.stack([torch.randint(0, 16, (b, e), generator=g), torch.randint(0, 16, (b, e), generator=g),
                           torch.randint(0, 12, (b, e), generator=g)])[enc_mod, torch.arange(b)[:, None],
                                                                          torch.arange(e)]
    enc_tok = torch.randint(0, 24, (b, e), generator=g) * (enc_mod != 0)
    enc_valid = torch.ones(b, e, dtype=torch.bool)
    if pad_from is not None:
        enc_valid[:, pad_from:] = False
    dec_mod = torch.tensor([1, 1, 1, 2, 2, 2, 2] + [0] * (d - 7)).expand(b, d).clone()
    dec_pos = torch.tensor([0, 5, 9, 0, 1, 2, 3] + [0] * (d - 7)).expand(b, d).clone()
    dec_valid = torch.tensor([True] * 7 + [False] * (d - 7)).expand(b, d).clone()
    targets = torch.randint(0, 24, (b, d), generator=g).masked_fill(~dec_valid, IGNORE_INDEX)
    dec_tok = torch.randint(0, 50, (b, d), generator=g) * (dec_mod == 2)
    flat_mod = dec_mod.masked_fill(~dec_valid, 99).reshape(-1)
    order = torch.argsort(flat_mod, stable=True)[: int(dec_valid.sum())]
    counts = [int((flat_mod == m).sum()) for m in range(3)]
    pixels = torch.randn(b, 3, 8, 8, generator=g)
    return MaskedBatch(enc_tok, enc_mod, enc_pos, enc_valid, dec_tok, targets, dec_mod, dec_pos, dec_valid,
                       order, counts, pixels)


@pytest.fixture(scope="module")
def model() -> FourM:
    torch.manual_seed(0)
    return FourM(ARGS).eval()


def test_forward_gives_a_finite_loss_per_present_modality(model):
    out = model(random_batch(), with_accuracy=True)
    assert out.loss.ndim == 0 and torch.isfinite(out.loss)
    assert set(out.modality_losses) == {"depth", "caption"} and out.token_counts == {"depth": 9, "caption": 12}
    assert torch.allclose(out.loss, (out.modality_losses["depth"] + out.modality_losses["caption"]) / 2)
    assert 0 <= float(out.modality_accuracy["depth"]) <= 1
    hidden = model.decode(model.encode(random_batch()), random_batch())
    assert hidden.shape == (3, 9, 32) and model.logits(hidden, "caption").shape == (3, 9, 50)


def test_per_sample_sums_add_up_to_the_same_loss(model):
    batch = random_batch()
    plain, out = model(batch, with_accuracy=True), model(batch, with_accuracy=True, per_sample=True)
    assert plain.sample_sums == {} and torch.allclose(out.loss, plain.loss, atol=1e-6)
    hidden = model.decode(model.encode(batch), batch)
    for name, slots in (("depth", slice(0, 3)), ("caption", slice(3, 7))):
        sums = out.sample_sums[name]
        assert sums.shape == (3, 3) and sums[:, 2].tolist() == [slots.stop - slots.start] * 3
        assert torch.allclose(sums[:, 0].sum() / sums[:, 2].sum(), plain.modality_losses[name], atol=1e-6)
        assert torch.allclose(sums[:, 1].sum() / sums[:, 2].sum(), plain.modality_accuracy[name])
        for i in range(3):  # each sample's own tokens, worked out from the decoder states
            logits = model.logits(hidden[i, slots], name).float()
            expected = torch.nn.functional.cross_entropy(logits, batch.dec_targets[i, slots], reduction="sum")
            assert torch.allclose(sums[i, 0], expected, atol=1e-5)
            assert sums[i, 1] == (logits.argmax(-1) == batch.dec_targets[i, slots]).sum()


def test_decoder_self_attention_stays_within_a_modality(model):
    base = random_batch()
    other = random_batch()
    other.dec_tokens[:, 3:7] = (other.dec_tokens[:, 3:7] + 7) % 50  # change the caption's decoder inputs
    other.dec_position[:, 3:7] = torch.tensor([2, 3, 4, 5])
    with torch.no_grad():
        a = model.decode(model.encode(base), base)
        b = model.decode(model.encode(other), other)
    assert torch.allclose(a[:, :3], b[:, :3], atol=1e-6)  # depth queries never see caption slots
    assert not torch.allclose(a[:, 3:7], b[:, 3:7])


def test_sequence_decoding_is_causal(model):
    base = random_batch()
    later = random_batch()
    later.dec_tokens[:, 6] = (later.dec_tokens[:, 6] + 1) % 50  # the last caption token
    with torch.no_grad():
        a = model.decode(model.encode(base), base)
        b = model.decode(model.encode(later), later)
    assert torch.allclose(a[:, :6], b[:, :6], atol=1e-6)
    assert not torch.allclose(a[:, 6], b[:, 6])


def test_padding_slots_change_nothing(model):
    base = random_batch(pad_from=8)
    noisy = random_batch(pad_from=8)
    noisy.enc_tokens[:, 8:] = (noisy.enc_tokens[:, 8:] + 3) % 24
    noisy.dec_tokens[:, 7:] = 5
    with torch.no_grad():
        assert torch.allclose(model(base).loss, model(noisy).loss, atol=1e-6)


def test_a_batch_flagged_all_valid_gives_the_masked_loss_and_gradients(model):
    """Attention without a mask when the loader says every encoder slot is valid: the numbers of the masked path."""
    plain, flagged = random_batch(), random_batch()
    flagged.enc_all_valid = True
    grads = []
    for batch in (plain, flagged):
        model.zero_grad()
        loss = model(batch).loss
        loss.backward()
        grads.append([p.grad.clone() for p in model.parameters() if p.grad is not None])
    assert torch.allclose(model(plain).loss, model(flagged).loss, atol=1e-6)
    assert len(grads[0]) == len(grads[1]) and all(torch.allclose(a, b, atol=1e-6) for a, b in zip(*grads))
    model.zero_grad()


def test_pixel_input_replaces_rgb_tokens(model):
    base = random_batch()
    other = random_batch()
    other.pixels = other.pixels + 1.0
    with torch.no_grad():
        assert not torch.allclose(model(base).loss, model(other).loss)


def test_backward_reaches_every_parameter_that_takes_part():
    torch.manual_seed(0)
    model = FourM(ARGS)
    model(random_batch()).loss.backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None or not torch.isfinite(p.grad).all()]
    assert missing == []


def test_untied_heads_and_token_weighting():
    model = FourM(FourMArgs(SPECS, dim=32, heads=4, tie_embeddings=False, loss_weighting="token"))
    out = model(random_batch())
    expected = (out.modality_losses["depth"] * 9 + out.modality_losses["caption"] * 12) / 21
    assert torch.allclose(out.loss, expected, atol=1e-6)


def test_4m_b_trunk_has_the_reference_size():
    specs = tuple(ModalitySpec(m, "image", 16384, grid=(14, 14)) for m in ("rgb", "depth", "normal"))
    with torch.device("meta"):
        model = FourM(FourMArgs(specs + (ModalitySpec("caption", "sequence", 30000, max_length=256),),
                                encoder_layers=12, decoder_layers=12, dim=768, heads=12))
    assert 198e6 <= trunk_parameters(model) <= 200e6


def test_swiglu_gives_autograds_values_and_gradients_bit_for_bit():
    """The fused activation's backward writes both halves into one tensor; the numbers are autograd's own."""
    torch.manual_seed(0)
    mlp = SwiGLU(32, 48)
    x = torch.randn(3, 7, 32, requires_grad=True)
    grad_out = torch.randn(3, 7, 32)

    def plain(inputs: torch.Tensor) -> torch.Tensor:
        gate, up = mlp.gate_up(inputs).chunk(2, dim=-1)
        return mlp.down(F.silu(gate) * up)

    results = []
    for forward in (mlp, plain):
        out = forward(x)
        x.grad, mlp.gate_up.weight.grad, mlp.down.weight.grad = None, None, None
        out.backward(grad_out)
        results.append((out.detach(), x.grad, mlp.gate_up.weight.grad, mlp.down.weight.grad))
    for ours, autograd in zip(*results):
        assert torch.equal(ours, autograd)


def test_swiglu_compiles():
    torch.manual_seed(0)
    mlp = SwiGLU(16, 24)
    x = torch.randn(2, 5, 16, requires_grad=True)
    eager = mlp(x)
    (eager_grad,) = torch.autograd.grad(eager.sum(), x)
    compiled = torch.compile(mlp)(x)
    (compiled_grad,) = torch.autograd.grad(compiled.sum(), x)
    assert torch.allclose(compiled, eager, atol=1e-6) and torch.allclose(compiled_grad, eager_grad, atol=1e-6)
