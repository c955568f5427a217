"""Multimodal masking: exact budgets, Dirichlet proportions, disjoint inputs and targets, span masking that
decodes back, absent modalities without budget, reproducible draws, and collation for the model."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fourm_kfp.batch import IGNORE_INDEX, ModalitySpec
from fourm_kfp.masking.dirichlet_masking import MixtureComponent, split_budget
from fourm_kfp.masking.multimodal_masking import MaskingArgs, collate, mask_sample
from fourm_kfp.masking.span_masking import span_mask, unmask, whole_target
from fourm_kfp.model.fourm import FourM, FourMArgs

SENTINELS = tuple(range(4, 24))
SPECS = (ModalitySpec("rgb", "image", 64, grid=(4, 4)), ModalitySpec("depth", "image", 64, grid=(4, 4)),
         ModalitySpec("caption", "sequence", 100, max_length=20))
ALL = MixtureComponent(1.0, (0.5, 0.5, 0.5), (0.5, 0.5, 0.5))
ARGS = MaskingArgs(SPECS, input_budget=12, target_budget=10, mixture=(ALL,), sentinels=SENTINELS)


def _tokens(rng, caption_len=9, with_depth=True):
    tokens = {"rgb": rng.integers(0, 64, (4, 4)), "caption": list(range(30, 30 + caption_len))}
    if with_depth:
        tokens["depth"] = rng.integers(0, 64, (4, 4))
    return tokens


def test_budgets_are_filled_exactly_and_inputs_and_targets_are_disjoint():
    for seed in range(200):
        rng = np.random.default_rng(seed)
        sample = mask_sample(rng, ARGS, _tokens(np.random.default_rng(1000 + seed)), None)
        assert len(sample.enc) == 12 and len(sample.dec) == 10, seed
        for modality in (0, 1):
            inputs = {p for _, m, p in sample.enc if m == modality}
            targets = {p for _, _, m, p in sample.dec if m == modality}
            assert not inputs & targets
            assert len(inputs) == len([1 for _, m, _ in sample.enc if m == modality])  # no cell twice


def test_input_shares_follow_the_dirichlet_mean():
    alphas = np.array([3.0, 1.0, 2.0])
    rng = np.random.default_rng(0)
    draws = np.array([split_budget(rng, 60, alphas, np.array([100, 100, 100])) for _ in range(4000)])
    assert (draws.sum(1) == 60).all()
    assert np.allclose(draws.mean(0) / 60, alphas / alphas.sum(), atol=0.01)


def test_caps_move_the_leftover_and_zero_alpha_never_gets_budget():
    rng = np.random.default_rng(0)
    for _ in range(200):
        alloc = split_budget(rng, 20, np.array([1.0, 1.0, 0.0]), np.array([5, 100, 100]))
        assert alloc.sum() == 20 and alloc[0] <= 5 and alloc[2] == 0


def test_missing_modality_gets_nothing():
    for seed in range(50):
        sample = mask_sample(np.random.default_rng(seed), ARGS, _tokens(np.random.default_rng(seed), 9, False), None)
        assert all(m != 1 for _, m, _ in sample.enc) and all(m != 1 for _, _, m, _ in sample.dec)
        assert len(sample.enc) == 12 and len(sample.dec) == 10


@pytest.mark.parametrize("length, masked", [(2, 1), (9, 3), (20, 10), (30, 29)])
def test_span_masking_decodes_back_to_the_text(length, masked):
    tokens = list(range(100, 100 + length))
    for seed in range(20):
        inputs, target = span_mask(np.random.default_rng(seed), tokens, masked, 3.0, SENTINELS)
        assert unmask(inputs, target, SENTINELS) == tokens
        assert target[0] == SENTINELS[0] and target[-1] in SENTINELS
        assert sum(t not in SENTINELS for t in target) == masked
    assert whole_target(tokens, SENTINELS) == [SENTINELS[0], *tokens, SENTINELS[1]]


def test_text_target_is_teacher_forced():
    only_text_target = MixtureComponent(1.0, (1.0, 0.0, 0.0), (0.0, 0.0, 1.0))
    args = MaskingArgs(SPECS, 4, 6, (only_text_target,), SENTINELS)
    sample = mask_sample(np.random.default_rng(0), args, _tokens(np.random.default_rng(0), 9), None)
    text = [(tok, tgt, p) for tok, tgt, m, p in sample.dec if m == 2]
    assert [p for _, _, p in text] == list(range(len(text)))
    assert all(text[i][1] == text[i + 1][0] for i in range(len(text) - 1))  # the next input is this target
    assert text[0][0] == SENTINELS[0] and [t for _, t, _ in text] == [30, 31, 32, 33, 34, 35]


def test_same_seed_same_masking():
    a = mask_sample(np.random.default_rng(7), ARGS, _tokens(np.random.default_rng(1)), None)
    b = mask_sample(np.random.default_rng(7), ARGS, _tokens(np.random.default_rng(1)), None)
    c = mask_sample(np.random.default_rng(8), ARGS, _tokens(np.random.default_rng(1)), None)
    assert np.array_equal(a.enc, b.enc) and np.array_equal(a.dec, b.dec)
    assert not (np.array_equal(a.enc, c.enc) and np.array_equal(a.dec, c.dec))


def test_collated_batch_feeds_the_model():
    samples = [mask_sample(np.random.default_rng(s), ARGS, _tokens(np.random.default_rng(s), 3 + s), None)
               for s in range(4)]
    batch = collate(samples, ARGS)
    assert batch.enc_tokens.shape == (4, 12) and batch.dec_targets.shape == (4, 10)
    assert sum(batch.target_counts) == int(batch.dec_valid.sum()) == len(batch.target_order)
    flat = batch.dec_modality.reshape(-1)[batch.target_order]
    assert (flat.diff() >= 0).all()  # grouped by modality
    assert (batch.dec_targets[~batch.dec_valid] == IGNORE_INDEX).all()
    assert batch.enc_all_valid and batch.enc_valid.all()  # the input budget filled: attention needs no mask
    short = mask_sample(np.random.default_rng(9), ARGS, {"caption": [30, 31, 32]}, None)  # 2 inputs at most
    padded = collate([samples[0], short], ARGS)
    assert not padded.enc_all_valid and not padded.enc_valid[1].all()
    model = FourM(FourMArgs(SPECS, dim=32, heads=4))
    out = model(batch)
    assert torch.isfinite(out.loss)


def test_collated_pixels_are_the_stored_pixels_normalised_and_zeros_where_a_sample_has_none():
    specs = (ModalitySpec("rgb", "image", 64, grid=(4, 4), pixel_input=True, patch_size=2), *SPECS[1:])
    args = MaskingArgs(specs, input_budget=12, target_budget=10, mixture=(ALL,), sentinels=SENTINELS)
    rng = np.random.default_rng(0)
    images = [rng.integers(0, 256, (8, 8, 3), dtype=np.uint8), None, rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)]
    samples = [mask_sample(np.random.default_rng(s), args, _tokens(np.random.default_rng(s)), image)
               for s, image in enumerate(images)]
    pixels = collate(samples, args).pixels
    assert pixels.shape == (3, 3, 8, 8) and pixels.dtype == torch.float32
    for image, got in zip(images, pixels):
        want = torch.zeros(3, 8, 8) if image is None else torch.from_numpy(image).permute(2, 0, 1) / 127.5 - 1
        assert torch.allclose(got, want, atol=1e-6)
    assert pixels[0].min() < -0.9 and pixels[0].max() > 0.9  # the full uint8 range maps to [-1, 1]


def test_without_fill_budgets_what_text_cannot_use_stays_empty():
    """ml-4m's rule: a text's share is capped by the model's max_length, not by this caption's tokens, and what the
    caption cannot use is left empty; so a caption-heavy draw keeps the caption nearly alone among the inputs."""
    caption_heavy = MixtureComponent(1.0, (0.05, 0.05, 5.0), (0.5, 0.5, 0.0))
    filled = MaskingArgs(SPECS, 12, 10, (caption_heavy,), SENTINELS)
    empty = MaskingArgs(SPECS, 12, 10, (caption_heavy,), SENTINELS, fill_budgets=False)
    image_inputs = {True: [], False: []}
    for seed in range(200):
        for fill, args in ((True, filled), (False, empty)):
            sample = mask_sample(np.random.default_rng(seed), args, _tokens(np.random.default_rng(seed), 4), None)
            caption = [t for t, m, _ in sample.enc if m == 2]
            assert caption == [30, 31, 32, 33]  # the whole caption: it is not a target in this component
            image_inputs[fill].append(sum(m != 2 for _, m, _ in sample.enc))
            assert len(sample.dec) == 10  # the image targets fill the target budget either way
    assert all(n == 8 for n in image_inputs[True])  # 12 - 4: the caption's unused share went to the images
    assert np.mean(image_inputs[False]) < 1.5  # only the images' own small shares
    # A text target's share is not capped by its length either: the unused target slots stay empty too.
    text_target = MaskingArgs(SPECS, 4, 10, (MixtureComponent(1.0, (1.0, 0.0, 0.0), (0.0, 0.0, 1.0)),), SENTINELS,
                              fill_budgets=False)
    sample = mask_sample(np.random.default_rng(0), text_target, _tokens(np.random.default_rng(0), 4), None)
    assert len(sample.enc) == 4 and len(sample.dec) == 5  # [S_0] and 4 tokens in; 4 tokens and [S_1] out
