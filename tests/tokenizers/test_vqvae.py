"""VQ-VAE tokenizers per modality: codec round trips, encode/decode shapes and dtypes, save → load, evaluation."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from fourm_kfp.data.modalities import CLASS_NAMES, MODALITIES
from fourm_kfp.tokenizers import (
    VQVAE,
    VQVAEConfig,
    evaluate_tokenizer,
    fit_normalisation,
    get_codec,
    load_image_tokenizer,
    save_image_tokenizer,
)


#: The image modalities of the prepared images' size (a feature map's tokenizer: tests/tokenizers/test_feature_maps.py).
PIXEL_MAPS = sorted(name for name, m in MODALITIES.items() if m.codec and not m.grid_sized)


def make_arrays(modality: str, n: int = 4, size: int = 16, seed: int = 0) -> np.ndarray:
    """Random in-memory arrays of ``modality`` with some invalid pixels where the modality has them."""
    rng = np.random.default_rng(seed)
    invalid = rng.random((n, size, size)) < 0.3
    if modality == "rgb":
        return rng.integers(0, 256, (n, size, size, 3), dtype=np.uint8)
    if modality == "depth":
        return np.where(invalid, 0.0, rng.uniform(0.5, 20.0, (n, size, size))).astype(np.float32)
    if modality == "normal":
        normal = rng.normal(size=(n, size, size, 3))
        normal /= np.linalg.norm(normal, axis=-1, keepdims=True)
        return np.where(invalid[..., None], 0.0, normal).astype(np.float32)
    if modality == "semseg":
        return rng.integers(0, len(CLASS_NAMES), (n, size, size), dtype=np.uint8)
    return (rng.random((n, size, size)) < 0.1).astype(np.uint8)


#: A decoder output that reproduces the input exactly: the codec's to_arrays must then give the arrays back.
IDEAL_OUTPUT = {
    "rgb": lambda x: x,
    "depth": lambda x: torch.stack([x[:, 0], 20 * x[:, 1] - 10], dim=1),
    "normal": lambda x: torch.cat([x, 20 * (x.abs().sum(1, keepdim=True) > 0) - 10.0], dim=1),
    "semseg": lambda x: 10 * x,
    "edge": lambda x: 20 * x - 10,
    "canny_edge": lambda x: 20 * x - 10,
}


def tiny_config(modality: str, **overrides) -> VQVAEConfig:
    fields = dict(image_size=16, patch_size=4, hidden_dim=16, depth=1, codebook_size=16, code_dim=8)
    fields.update(overrides)
    return VQVAEConfig.for_modality(modality, norm_stats=fit_normalisation(modality, make_arrays(modality)), **fields)


@pytest.mark.parametrize("modality", PIXEL_MAPS)
def test_codec_round_trip_of_an_ideal_output(modality):
    codec, arrays = get_codec(modality), make_arrays(modality)
    stats = codec.fit(arrays)
    x = codec.to_input(arrays, stats)
    assert x.shape == (4, codec.in_channels, 16, 16) and x.dtype == torch.float32
    back = codec.to_arrays(IDEAL_OUTPUT[modality](x), stats)
    assert back.dtype == arrays.dtype and back.shape == arrays.shape
    np.testing.assert_allclose(back, arrays, rtol=1e-4, atol=1e-5)
    assert codec.loss(IDEAL_OUTPUT[modality](x), x, stats) < 0.01


@pytest.mark.parametrize("architecture", ["conv", "vit"])
@pytest.mark.parametrize("modality", PIXEL_MAPS)
def test_encode_decode_shapes_and_dtypes(modality, architecture):
    torch.manual_seed(0)
    model = VQVAE(tiny_config(modality, architecture=architecture, heads=2)).eval()
    arrays = make_arrays(modality, n=3)
    tokens = model.encode(arrays)
    assert tokens.shape == (3, 4, 4) and tokens.dtype == torch.long
    assert int(tokens.min()) >= 0 and int(tokens.max()) < 16
    decoded = model.decode(tokens)
    assert decoded.shape == arrays.shape and decoded.dtype == arrays.dtype
    out, codes, losses = model.train()(model.prepare(arrays))
    assert out.shape == (3, get_codec(modality).out_channels, 16, 16) and codes.shape == (3, 4, 4)
    assert torch.isfinite(losses["loss"]) and losses["loss"].requires_grad


@pytest.mark.parametrize("modality", PIXEL_MAPS)
def test_a_conv_token_depends_on_its_own_patch_only(modality):
    """What the 4M model learns to predict must be a function of the scene where it is: a token that changed with
    pixels elsewhere (GroupNorm's image-wide statistics did) is noise no model can learn."""
    torch.manual_seed(0)
    model = VQVAE(tiny_config(modality, codebook_size=64)).eval()
    arrays = make_arrays(modality, n=2)
    tokens = model.encode(arrays)
    changed = arrays.copy()
    changed[:, 4:] = make_arrays(modality, n=2, seed=7)[:, 4:]  # every pixel outside the first row of patches
    after = model.encode(changed)
    assert torch.equal(after[:, 0], tokens[:, 0])
    assert not torch.equal(after[:, 1:], tokens[:, 1:])


def test_save_load_round_trip_gives_identical_tokens(tmp_path):
    torch.manual_seed(0)
    model = VQVAE(tiny_config("depth"))
    model(model.prepare(make_arrays("depth", seed=1)))  # a training step moves the codebook and EMA statistics
    model.eval()
    save_image_tokenizer(model, tmp_path / "depth")
    loaded = load_image_tokenizer(tmp_path / "depth")
    assert sorted(p.name for p in (tmp_path / "depth").iterdir()) == ["config.json", "model.safetensors"]
    assert loaded.config == model.config
    assert json.loads((tmp_path / "depth" / "config.json").read_text())["config"]["norm_stats"]["log_mean"]
    arrays = make_arrays("depth", seed=2)
    assert torch.equal(loaded.encode(arrays), model.encode(arrays))
    np.testing.assert_array_equal(loaded.decode(model.encode(arrays)), model.decode(model.encode(arrays)))
    assert torch.equal(loaded.quantizer.ema_cluster_size, model.quantizer.ema_cluster_size)


@pytest.mark.parametrize("modality", PIXEL_MAPS)
def test_evaluation_reports_errors_baseline_and_codebook_figures(modality):
    torch.manual_seed(0)
    model = VQVAE(tiny_config(modality)).eval()
    report = evaluate_tokenizer(model, make_arrays(modality, n=5, seed=3), make_arrays(modality, n=6), batch_size=2)
    assert {"error_ratio", "codebook_usage", "perplexity", "tokens_per_image"} <= set(report)
    assert any(key.startswith("baseline_") for key in report)
    assert 0 < report["codebook_usage"] <= 1 and report["tokens_per_image"] == 16
    assert all(np.isfinite(v) for v in report.values())


def test_config_validation():
    with pytest.raises(ValueError, match="power-of-two"):
        VQVAEConfig.for_modality("rgb", image_size=24, patch_size=6)
    with pytest.raises(ValueError, match="heads"):
        VQVAEConfig.for_modality("rgb", architecture="vit", hidden_dim=64, heads=5)
    with pytest.raises(ValueError, match="architecture"):
        VQVAEConfig.for_modality("rgb", architecture="mlp")
    with pytest.raises(KeyError, match="known"):
        VQVAEConfig.for_modality("caption")
