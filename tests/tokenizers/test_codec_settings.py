"""What an image tokenizer takes from the dataset (its codec settings): a semseg tokenizer sized by a 300-class
vocabulary, saved and loaded with it, and a relative depth standardised per image, while the default codecs (six
classes, metric depth) and their saved configs stay as they were."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from fourm_kfp.data.vocabularies import DatasetMeta
from fourm_kfp.tokenizers import (
    CODECS,
    VQVAE,
    VQVAEConfig,
    evaluate_tokenizer,
    fit_normalisation,
    get_codec,
    load_image_tokenizer,
    save_image_tokenizer,
    train_vqvae,
)
from fourm_kfp.tokenizers.modality_codecs import standardize_depth

TINY = dict(image_size=16, patch_size=4, hidden_dim=16, depth=1, codebook_size=16, code_dim=8)
META_300 = DatasetMeta.from_json({"vocabularies": {"semseg": [f"c{i}" for i in range(300)]},
                                  "modality_settings": {"depth": {"relative": True}}}, "test")


def _maps_300(n: int, seed: int) -> np.ndarray:
    """Blocky class maps (4x4 blocks) over ids 0..299, most blocks above 255."""
    rng = np.random.default_rng(seed)
    return rng.integers(0, 300, (n, 4, 4)).repeat(4, 1).repeat(4, 2).astype(np.uint16)


def test_the_codec_settings_come_from_the_dataset():
    assert get_codec("semseg").settings_for(META_300) == {"classes": 300}
    assert get_codec("depth").settings_for(META_300) == {"relative": True}
    assert get_codec("semseg").settings_for(DatasetMeta()) == {} == get_codec("depth").settings_for(DatasetMeta())
    assert get_codec("rgb").settings_for(META_300) == {}
    assert get_codec("semseg", {}) is CODECS["semseg"] and CODECS["semseg"].in_channels == 6
    with pytest.raises(ValueError, match="semseg codec has no settings \\['relative'\\]"):
        get_codec("semseg", {"relative": True})
    with pytest.raises(ValueError, match="rgb codec takes no settings"):
        get_codec("rgb", {"classes": 3})


def test_a_300_class_semseg_tokenizer_trains_saves_loads_and_decodes_ids_in_range(tmp_path):
    settings = get_codec("semseg").settings_for(META_300)
    config = VQVAEConfig.for_modality("semseg", settings, **TINY)
    assert (config.in_channels, config.out_channels) == (300, 300)
    model, _ = train_vqvae(config, lambda step: {"semseg": _maps_300(4, step)}, steps=3, lr=1e-2, warmup_steps=1)
    assert model.encoder[0].in_channels == 300
    val = _maps_300(3, 99)
    decoded = model.decode(model.encode(val))
    assert decoded.dtype == np.uint16 and decoded.shape == val.shape
    assert decoded.min() >= 0 and decoded.max() <= 299
    assert 0.0 <= evaluate_tokenizer(model, val, _maps_300(8, 7))["pixel_acc"] <= 1.0

    folder = save_image_tokenizer(model, tmp_path / "semseg")
    saved = json.loads((folder / "config.json").read_text())["config"]
    assert saved["codec_settings"] == {"classes": 300} and saved["in_channels"] == 300
    loaded = load_image_tokenizer(folder)
    assert loaded.codec.in_channels == 300
    assert np.array_equal(loaded.decode(loaded.encode(val)), decoded)


def test_a_tokenizer_saved_without_codec_settings_is_the_six_class_one(tmp_path):
    model = VQVAE(VQVAEConfig.for_modality("semseg", **TINY))
    folder = save_image_tokenizer(model, tmp_path / "semseg")
    saved = json.loads((folder / "config.json").read_text())["config"]
    assert "codec_settings" not in saved  # the bytes of a default tokenizer are those saved before settings
    loaded = load_image_tokenizer(folder)
    assert loaded.codec is CODECS["semseg"] and loaded.config.in_channels == 6
    assert loaded.decode(loaded.encode(np.full((1, 16, 16), 5, np.uint8))).dtype == np.uint8
    mismatched = dict(saved, in_channels=300, out_channels=300)
    with pytest.raises(ValueError, match="semseg tokenizer: the config has 300 input .* its codec .* 6"):
        VQVAE(VQVAEConfig.from_dict(mismatched))


def test_relative_depth_is_standardised_per_image_robustly():
    rng = np.random.default_rng(0)
    depth = rng.uniform(2.0, 4.0, (2, 16, 16)).astype(np.float32)
    depth[1] = depth[0] * 50 + 7  # another scale and shift: the same standardised map
    depth[:, 0, 0] = 0.0  # invalid
    valid = torch.as_tensor(depth > 0)
    z = standardize_depth(torch.as_tensor(depth), valid)
    assert torch.allclose(z[0], z[1], atol=1e-4) and z[0, 0, 0] == 0 == z[1, 0, 0]
    assert abs(float(z[0][valid[0]].mean())) < 0.05 and 0.8 < float(z[0][valid[0]].std()) < 1.3

    outliers = depth[:1].copy()
    outliers[0, 5, :3] = 1e4  # three wild pixels, inside the trimmed tail
    z_out = standardize_depth(torch.as_tensor(outliers), torch.as_tensor(outliers > 0))
    rest = valid[0].clone()
    rest[5, :3] = False
    assert float((z_out[0][rest] - z[0][rest]).abs().max()) < 0.1  # the other pixels barely move ...
    kept = torch.as_tensor(outliers[0][outliers[0] > 0])
    plain = (torch.as_tensor(outliers[0]) - kept.mean()) / kept.std()
    assert float((plain[rest] - z[0][rest]).abs().max()) > 1.0  # ... where a plain standardisation is thrown off

    codec = get_codec("depth", {"relative": True})
    assert codec.fit(depth) == {}
    x = codec.to_input(depth, {})
    assert torch.allclose(x[:, 0], z) and torch.equal(x[:, 1], valid.float())
    assert np.allclose(codec.reference(depth), z.numpy())
    ideal = torch.stack([x[:, 0], 20 * x[:, 1] - 10], dim=1)
    assert np.allclose(codec.to_arrays(ideal, {}), z.numpy())  # decodes to the standardised map


def test_metric_depth_is_coded_as_before():
    depth = np.array([[[0.0, 1.0], [2.0, 20.0]]], np.float32)
    codec = get_codec("depth")
    assert codec is CODECS["depth"] and get_codec("depth", {}) is codec
    stats = fit_normalisation("depth", depth)
    logs = np.log([1.0, 2.0, 20.0])
    assert stats == {"log_mean": [float(logs.mean())], "log_std": [float(logs.std())]}
    x = codec.to_input(depth, stats)
    expected = np.array([0.0, *((logs - logs.mean()) / logs.std())], np.float32).reshape(2, 2)
    assert np.allclose(x[0, 0].numpy(), expected) and x[0, 1].tolist() == [[0.0, 1.0], [1.0, 1.0]]
    assert codec.reference(depth) is depth
    config = VQVAEConfig.for_modality("depth", norm_stats=stats, **TINY)
    assert config.codec_settings == {} and "codec_settings" not in config.to_dict()
