"""Generation: the unmasking schedule, sampling filters, MaskGIT with one greedy step = one argmax pass, ROAR,
determinism for a seed, KV-cached text decoding = full teacher-forced decoding, guidance, chains, and the same
rgb input path as training."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from fourm_kfp.batch import PIXEL_MEAN, PIXEL_STD, ModalitySpec
from fourm_kfp.masking.dirichlet_masking import MixtureComponent
from fourm_kfp.masking.multimodal_masking import MaskingArgs, collate, mask_sample
from fourm_kfp.model.fourm import FourM, FourMArgs
from fourm_kfp.model.generation import Generator, SamplingArgs, sample_logits, unmasking_schedule

SPECS = (ModalitySpec("rgb", "image", 32, grid=(4, 4)),
         ModalitySpec("depth", "image", 24, grid=(4, 4)),
         ModalitySpec("caption", "sequence", 50, max_length=12))
SENTINELS = (5, 6)
#: caption -> rgb where rgb enters the encoder as 4x4 pixel patches (a 16x16 image): the read-back tests
PIXEL_RGB_FROM_CAPTION = (ModalitySpec("rgb", "image", 32, grid=(4, 4), pixel_input=True, patch_size=4),
                          ModalitySpec("caption", "sequence", 50, max_length=12))


@pytest.fixture(scope="module")
def model() -> FourM:
    torch.manual_seed(0)
    return FourM(FourMArgs(SPECS, encoder_layers=2, decoder_layers=2, dim=32, heads=4)).eval()


def _samples(n: int = 3, seed: int = 0) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [{"rgb": rng.integers(0, 32, 16), "caption": rng.integers(10, 50, int(rng.integers(3, 8)))}
            for _ in range(n)]


@pytest.mark.parametrize("n,steps", [(16, 8), (256, 12), (5, 10), (7, 1)])
@pytest.mark.parametrize("schedule", ["cosine", "linear"])
def test_unmasking_schedule_fixes_every_token_at_least_one_per_step(n, steps, schedule):
    counts = unmasking_schedule(n, steps, schedule)
    assert sum(counts) == n and min(counts) >= 1 and len(counts) == min(n, steps)
    if schedule == "cosine" and steps > 1 and n >= 4 * steps:
        assert counts[0] < counts[-1]  # cosine: few tokens first, many at the end


def test_sampling_filters():
    logits = torch.tensor([[0.0, 3.0, 1.0, 2.9]]).repeat(500, 1)
    g = torch.Generator().manual_seed(0)
    greedy, lp = sample_logits(logits, SamplingArgs(temperature=0), g)
    assert (greedy == 1).all() and torch.allclose(lp, logits.log_softmax(-1)[:, 1])
    top1, _ = sample_logits(logits, SamplingArgs(temperature=1.0, top_k=1), g)
    assert (top1 == 1).all()
    top2, _ = sample_logits(logits, SamplingArgs(temperature=1.0, top_k=2), g)
    assert set(top2.tolist()) == {1, 3}
    nucleus, _ = sample_logits(logits, SamplingArgs(temperature=1.0, top_p=0.3), g)
    assert (nucleus == 1).all()  # the most likely token alone already holds 30% of the mass
    free, _ = sample_logits(logits, SamplingArgs(temperature=1.0), g)
    assert set(free.tolist()) == {0, 1, 2, 3}


def test_one_greedy_maskgit_step_equals_one_argmax_pass(model):
    samples = _samples()
    out = Generator(model, SENTINELS).generate(samples, "depth", SamplingArgs(steps=1, temperature=0))
    gen = Generator(model, SENTINELS)
    with torch.inference_mode():
        cond = gen._conditioning(samples)
        positions = torch.arange(16).expand(3, 16)
        batch = gen._batch(cond, torch.zeros_like(positions), 1, positions)
        expected = model.logits(model.decode(model.encode(batch), batch), "depth").argmax(-1).reshape(3, 4, 4)
    assert np.array_equal(np.stack([o.tokens for o in out]), expected.numpy())


@pytest.mark.parametrize("order", ["maskgit", "roar"])
def test_image_generation_is_deterministic_for_a_seed(model, order):
    gen = Generator(model, SENTINELS)
    args = SamplingArgs(steps=4, order=order, temperature=1.0)
    first = gen.generate(_samples(), "depth", args, seed=3)
    again = gen.generate(_samples(), "depth", args, seed=3)
    other = gen.generate(_samples(), "depth", args, seed=4)
    assert all(np.array_equal(a.tokens, b.tokens) for a, b in zip(first, again))
    assert not all(np.array_equal(a.tokens, b.tokens) for a, b in zip(first, other))
    assert first[0].tokens.shape == (4, 4) and first[0].tokens.max() < 24
    assert np.all(first[0].logprobs <= 0)


def test_maskgit_keeps_the_most_confident_tokens_of_each_step(model):
    """With greedy sampling, the tokens fixed in the first of two steps are the most confident of that pass."""
    samples = _samples(1)
    gen = Generator(model, SENTINELS)
    two = gen.generate(samples, "depth", SamplingArgs(steps=2, temperature=0, schedule="linear"))[0]
    one = gen.generate(samples, "depth", SamplingArgs(steps=1, temperature=0))[0]
    first_pass = np.argsort(-one.logprobs.reshape(-1), kind="stable")[:8]
    assert np.array_equal(two.tokens.reshape(-1)[first_pass], one.tokens.reshape(-1)[first_pass])


def test_kv_cached_text_equals_full_teacher_forced_decoding(model):
    samples = _samples()
    gen = Generator(model, SENTINELS, precision="fp32")  # the values to 1e-4: no bf16 rounding on any machine
    out = gen.generate(samples, "caption", SamplingArgs(temperature=0, max_text_tokens=8))
    for sample, result in zip(samples, out):
        # Recompute every position from scratch with the generated prefix as the teacher-forced decoder input.
        sequence = [SENTINELS[0], *result.tokens.tolist()]
        length = min(len(sequence), 8)
        with torch.inference_mode():
            cond = gen._conditioning([{"rgb": sample["rgb"]}])
            dec_tokens = torch.tensor([sequence[:length]])
            batch = gen._batch(cond, dec_tokens, 2, torch.arange(length)[None])
            logits = model.logits(model.decode(model.encode(batch), batch), "caption")
        greedy = logits.argmax(-1)[0].tolist()
        expected = (result.tokens.tolist() + [SENTINELS[1]])[:length]
        assert greedy == expected
        n = min(len(result.tokens), length)
        full = logits.log_softmax(-1)[0, torch.arange(n), torch.tensor(expected[:n], dtype=torch.long)]
        assert np.allclose(result.logprobs[:n], full.numpy(), atol=1e-4)


def test_guidance_changes_the_logits_and_works_without_any_input(model):
    gen = Generator(model, SENTINELS)
    plain = gen.generate(_samples(), "depth", SamplingArgs(steps=1, temperature=0))
    guided = gen.generate(_samples(), "depth", SamplingArgs(steps=1, temperature=0, guidance=3.0))
    assert not all(np.allclose(a.logprobs, b.logprobs) for a, b in zip(plain, guided))
    empty = gen.generate([{}, {}], "caption", SamplingArgs(temperature=1.0, guidance=2.0, max_text_tokens=6))
    assert all(np.isfinite(e.logprobs).all() for e in empty)
    unconditional = gen.generate([{}, {}], "depth", SamplingArgs(steps=2))
    assert all(np.isfinite(u.logprobs).all() for u in unconditional)


def test_a_chain_feeds_each_output_to_the_next_target(model):
    gen = Generator(model, SENTINELS)
    args = SamplingArgs(steps=3, temperature=1.0, max_text_tokens=6)
    start = [{"rgb": s["rgb"]} for s in _samples()]
    chained = gen.chain(start, ["caption", "depth"], args, seed=7)
    captions = gen.generate(start, "caption", args, seed=7)
    with_caption = [{**s, "caption": c.tokens} for s, c in zip(start, captions)]
    depth = gen.generate(with_caption, "depth", args, seed=8)
    for c, cap, d in zip(chained, captions, depth):
        assert np.array_equal(c["caption"], cap.tokens)
        assert np.array_equal(c["depth"], d.tokens.reshape(-1))
    # The depth really depends on the caption it was chained from.
    no_caption = gen.generate(start, "depth", args, seed=8)
    assert not all(np.array_equal(a.tokens, b.tokens) for a, b in zip(no_caption, depth))


def test_bad_requests_name_the_problem(model):
    gen = Generator(model, SENTINELS)
    with pytest.raises(ValueError, match="no modality 'normal'"):
        gen.generate(_samples(), "normal")
    with pytest.raises(ValueError, match="'rgb' has 5 tokens"):
        gen.generate([{"rgb": np.zeros(5, np.int64)}], "depth")


def test_cross_mask_keeps_an_empty_sample_finite():
    valid = torch.tensor([[False, False], [True, False]])
    mask = FourM.cross_mask(valid)
    assert mask[:, 0, 0].tolist() == [[True, False], [True, False]]


def test_generation_reads_an_image_as_training_does():
    """The rgb input path of generation (``pixels`` + the rgb grid) and of training (the loader's masking and
    collation) give the same logits for every target position: same pixel normalisation, patch order and
    positions. A mismatch here is a model that learns one image and is shown another."""
    specs = (ModalitySpec("rgb", "image", 32, grid=(4, 4), pixel_input=True, patch_size=4),
             ModalitySpec("depth", "image", 24, grid=(4, 4)))
    torch.manual_seed(0)
    model = FourM(FourMArgs(specs, encoder_layers=2, decoder_layers=2, dim=32, heads=4)).eval()
    rng = np.random.default_rng(0)
    image = rng.integers(0, 256, (16, 16, 3), dtype=np.uint8)
    rgb_tokens, depth_tokens = rng.integers(0, 32, (4, 4)), rng.integers(0, 24, (4, 4))
    masking = MaskingArgs(specs, input_budget=16, target_budget=16,
                          mixture=(MixtureComponent(1.0, (1.0, 0.0), (0.0, 1.0)),), sentinels=())
    batch = collate([mask_sample(rng, masking, {"rgb": rgb_tokens, "depth": depth_tokens}, image)], masking)
    with torch.no_grad():
        trained = model.logits(model.decode(model.encode(batch), batch), "depth")[0].log_softmax(-1)
    trained = trained[batch.dec_position[0].argsort()]  # the loader's slots are in random order
    [generated] = Generator(model, precision="fp32").generate(  # as the fp32 forward above, on every machine
        [{"rgb": rgb_tokens.reshape(-1), "pixels": image}], "depth", SamplingArgs(steps=1, temperature=0.0))
    assert np.array_equal(generated.tokens.reshape(-1), trained.argmax(-1).numpy())
    np.testing.assert_allclose(generated.logprobs.reshape(-1), trained.max(-1).values.numpy(), atol=1e-5)


def test_a_generated_image_the_model_reads_as_pixels_is_read_back_between_steps():
    """caption → rgb with rgb read as pixel patches: each step's kept tokens join the inputs as the pixels of the
    decoded grid (the tokenizer's decoder), so what the decoder draws changes the later steps."""
    torch.manual_seed(0)
    model = FourM(FourMArgs(PIXEL_RGB_FROM_CAPTION, encoder_layers=2, decoder_layers=2, dim=32, heads=4)).eval()
    samples = [{"caption": np.array([11, 12, 13])}, {"caption": np.array([20, 21])}]
    greedy = SamplingArgs(steps=4, temperature=0.0)
    calls = []

    def drawing(value: int):
        def decode(grids: torch.Tensor) -> np.ndarray:
            calls.append(grids.clone())
            return np.full((len(grids), 16, 16, 3), value, np.uint8)
        return decode

    dark = Generator(model, pixel_decoders={"rgb": drawing(0)}).generate(samples, "rgb", greedy)
    assert len(calls) == 3 and all(c.shape == (2, 4, 4) and c.dtype == torch.long for c in calls)
    # Each decoded grid holds every token kept so far: the final tokens where the grids of later steps agree.
    assert all((calls[i] == calls[-1]).sum() >= (calls[i - 1] == calls[-1]).sum() for i in range(1, 3))
    light = Generator(model, pixel_decoders={"rgb": drawing(255)}).generate(samples, "rgb", greedy)
    assert any(not np.array_equal(d.tokens, l.tokens) for d, l in zip(dark, light))
    assert len(calls) == 6
    one_step = Generator(model, pixel_decoders={"rgb": drawing(0)}).generate(samples, "rgb", replace(greedy, steps=1))
    assert len(calls) == 6 and all(o.tokens.shape == (4, 4) for o in one_step)  # nothing kept before the last step


def test_the_pixels_read_back_for_a_kept_token_are_its_own_patch():
    """Between steps, every rgb slot the encoder reads sits at a kept token's position, and the pixel patch at that
    position of the image read back is the one the kept token decodes to: the grid is filled, decoded and cut into
    patches in the order positions count them (a transposed or shifted image fails)."""
    torch.manual_seed(0)
    model = FourM(FourMArgs(PIXEL_RGB_FROM_CAPTION, encoder_layers=1, decoder_layers=1, dim=32, heads=4)).eval()
    seen, encode = [], model.encode

    def spy(batch):
        seen.append((batch.enc_modality.clone(), batch.enc_position.clone(), batch.enc_valid.clone(),
                     None if batch.pixels is None else batch.pixels.clone()))
        return encode(batch)

    def paint(grids: torch.Tensor) -> np.ndarray:  # each 4x4 patch one grey level, 8 x its token
        grey = np.repeat(np.repeat(8 * np.asarray(grids, np.int64), 4, axis=1), 4, axis=2).astype(np.uint8)
        return np.repeat(grey[..., None], 3, axis=-1)

    model.encode = spy
    samples = [{"caption": np.array([11, 12, 13])}, {"caption": np.array([20, 21])}, {"caption": np.array([7])}]
    out = Generator(model, pixel_decoders={"rgb": paint}, precision="fp32").generate(
        samples, "rgb", SamplingArgs(steps=5, order="roar", temperature=1.0))
    final = np.stack([o.tokens.reshape(-1) for o in out])
    rgb, checked = model.args.names.index("rgb"), 0
    for modality, position, valid, pixels in seen:
        slots = (modality == rgb) & valid
        if not slots.any():
            continue
        values = pixels.numpy() * PIXEL_STD + PIXEL_MEAN
        for b, j in zip(*np.nonzero(slots.numpy())):
            where = int(position[b, j])
            row, col = divmod(where, 4)
            patch = values[b, :, 4 * row:4 * row + 4, 4 * col:4 * col + 4]
            np.testing.assert_allclose(patch, 8 * final[b, where], atol=0.01)
            checked += 1
    assert checked == 3 * sum(np.cumsum(unmasking_schedule(16, 5))[:-1])  # every kept slot of every later step
