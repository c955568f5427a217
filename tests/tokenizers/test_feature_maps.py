"""Feature maps (``clip``, ``dinov2``): the shard codec's bytes and precision, how a crop cuts a map of the teacher's
grid, and the feature tokenizer (a ViT VQ-VAE over single cells, sized by the dataset's channels and grid), which
overfits a few maps and whose codes follow its input."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fourm_kfp.data.crops import Crop, apply_crop
from fourm_kfp.data.modalities import MODALITIES, decode_feature_map, encode_feature_map
from fourm_kfp.data.vocabularies import DatasetMeta
from fourm_kfp.tokenizers import VQVAE, VQVAEConfig, evaluate_tokenizer, fit_normalisation, get_codec, train_vqvae

GRID, CHANNELS = 4, 8
SETTINGS = {"channels": CHANNELS, "grid": GRID}


def _maps(n: int = 4, seed: int = 0) -> np.ndarray:
    return (np.random.default_rng(seed).normal(size=(n, GRID, GRID, CHANNELS)) * 2 + 1).astype(np.float32)


@pytest.mark.parametrize("name", ["clip", "dinov2"])
def test_the_shard_codec_round_trips_within_float16_and_its_bytes_are_the_array_s(name):
    modality = MODALITIES[name]
    features = _maps(1)[0] * 10
    data = modality.encode(features)
    back = modality.decode(data)
    assert back.dtype == np.float32 and back.shape == features.shape
    np.testing.assert_allclose(back, features, rtol=2.0 ** -11, atol=1e-7)
    assert modality.encode(back) == data == modality.encode(features.copy())  # deterministic, and stable re-encoded
    assert data.startswith(b"\x93NUMPY\x01\x00") and modality.ext == "npy"


def test_the_shard_codec_refuses_what_float16_cannot_hold():
    for bad in (np.full((2, 2, 3), np.nan, np.float32), np.full((2, 2, 3), 1e5, np.float32)):
        with pytest.raises(ValueError, match="finite and within"):
            encode_feature_map(bad)
    with pytest.raises(ValueError, match=r"\[H, W, C\]"):
        encode_feature_map(np.zeros((4, 4), np.float32))
    assert decode_feature_map(encode_feature_map(np.zeros((1, 1, 1), np.float32))).shape == (1, 1, 1)


def test_a_crop_cuts_the_cells_under_its_window_and_keeps_the_grid():
    features = np.arange(GRID * GRID * 2, dtype=np.float32).reshape(GRID, GRID, 2)
    size = 64
    assert np.array_equal(apply_crop({"clip": features}, Crop(0, 0, size, size), size)["clip"], features)
    flipped = apply_crop({"clip": features}, Crop(0, 0, size, size, flip=True), size)["clip"]
    assert np.array_equal(flipped, features[:, ::-1])
    quarter = apply_crop({"clip": features}, Crop(32, 0, 32, 32), size)["clip"]  # the top right quarter
    assert quarter.shape == features.shape
    assert np.array_equal(quarter, features[:2, 2:].repeat(2, 0).repeat(2, 1))


def test_the_codec_is_sized_by_the_dataset_s_settings():
    meta = DatasetMeta.from_json({"modality_settings": {"dinov2": SETTINGS}}, "test")
    assert get_codec("dinov2").settings_for(meta, "dinov2") == SETTINGS
    assert get_codec("dinov2", SETTINGS).in_channels == get_codec("dinov2", SETTINGS).out_channels == CHANNELS
    with pytest.raises(ValueError, match="clip: the dataset's modality_settings give no channels and grid"):
        get_codec("clip").settings_for(meta, "clip")
    with pytest.raises(ValueError, match="features codec has no settings"):
        get_codec("clip", {"classes": 3})
    assert MODALITIES["dinov2"].shape(224, SETTINGS) == (GRID, GRID, CHANNELS)  # not the image's size


@pytest.fixture(scope="module")
def trained():
    maps = _maps()
    torch.manual_seed(0)
    config = VQVAEConfig.for_modality("clip", SETTINGS, image_size=GRID, patch_size=1, architecture="vit",
                                      hidden_dim=32, depth=1, heads=2, codebook_size=64, code_dim=8,
                                      norm_stats=fit_normalisation("clip", maps, SETTINGS))
    model, _ = train_vqvae(config, lambda step: {"clip": maps}, steps=100, lr=5e-3, warmup_steps=5)
    return model, maps


def test_the_feature_tokenizer_overfits_a_few_maps(trained):
    model, maps = trained
    assert model.encode(maps).shape == (len(maps), GRID, GRID)  # one token per cell of the teacher's grid
    decoded = model.decode(model.encode(maps))
    assert decoded.dtype == np.float32 and decoded.shape == maps.shape
    report = evaluate_tokenizer(model, maps, maps)
    assert report["mse"] < 0.1 * maps.var() and report["cosine"] > 0.9
    assert report["error_ratio"] < 0.1 and report["tokens_per_image"] == GRID * GRID


def test_the_codes_move_with_the_input(trained):
    model, maps = trained
    codes = model.encode(maps)
    assert torch.equal(model.encode(maps), codes)  # the same map, the same codes
    moved = maps.copy()
    moved[0, 0, 0] = maps[1, 2, 2]  # one cell takes another cell's features
    after = model.encode(moved)
    assert after[0, 0, 0] != codes[0, 0, 0] and torch.equal(after[1:], codes[1:])
    assert (model.encode(maps[::-1].copy()) != codes).any()


def test_a_saved_feature_tokenizer_keeps_its_settings(trained, tmp_path):
    from fourm_kfp.tokenizers import load_image_tokenizer, save_image_tokenizer

    model, maps = trained
    loaded = load_image_tokenizer(save_image_tokenizer(model, tmp_path / "clip"))
    assert loaded.config.codec_settings == SETTINGS and loaded.codec.in_channels == CHANNELS
    assert torch.equal(loaded.encode(maps), model.encode(maps))
    assert isinstance(VQVAE(loaded.config), VQVAE)
