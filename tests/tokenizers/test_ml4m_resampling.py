"""Pretokenizing with an ml-4m rgb tokenizer resizes the rgb crops as ml-4m's ``save_vq_tokens.py`` does by default.

``tests/tokenizers/ml4m_reference/crops.npz`` (``bench/ml4m_crop_reference.py``, run in ``.venv-ml4m``) holds a
photo, crop windows and what ml-4m's own rgb transform makes of them (``image_augment`` with ``resample_mode`` None:
a Pillow crop of the uint8 image, ``Image.resize``'s default filter, bicubic, then the flip; and ``postprocess``, the
tokenizer's input). The crops pretokenize cuts for an ml-4m rgb tokenizer must be those bytes; the bilinear crops it
cuts for our own tokenizers are not.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from fourm_kfp.config.loader import load_config
from fourm_kfp.contract.shard_jobs import Shard
from fourm_kfp.data.crops import Crop, apply_crop, draw_crops
from fourm_kfp.data.shard_writer import ShardWriter, encode_sample
from fourm_kfp.stages import PRETOKENIZE
from fourm_kfp.stages.pretokenize import camera_resample
from fourm_kfp.storage import open_store
from fourm_kfp.tokenizers.ml4m import conventions
from fourm_kfp.tokenizers.ml4m.adapter import describe, load_ml4m_tokenizer
from fourm_kfp.tokenizers.ml4m.folder import read_folder
from fourm_kfp.tokenizers.shard_crops import CropSettings, crop_chunk, raw_chunks

REFERENCE = Path(__file__).parent / "ml4m_reference"
CROPS = np.load(REFERENCE / "crops.npz")


def _windows():
    for i, (top, left, height, width, flip, side) in enumerate(CROPS["windows"].tolist()):
        yield i, Crop(x0=left, y0=top, width=width, height=height, flip=bool(flip)), side


@pytest.mark.parametrize("i, crop, side", list(_windows()))
def test_bicubic_crops_are_ml4ms_bytes(i, crop, side):
    ours = apply_crop({"rgb": CROPS["photo"]}, crop, side, camera_resample="bicubic")["rgb"]
    assert ours.dtype == np.uint8 and ours.shape == CROPS[f"crop_{i}"].shape
    assert np.array_equal(ours, CROPS[f"crop_{i}"])
    # and the tokenizer's input made of it is ml-4m's
    torch.testing.assert_close(conventions.rgb(ours), torch.from_numpy(CROPS[f"input_{i}"]), rtol=0, atol=1e-6)


def test_bilinear_crops_are_not_ml4ms():
    """The old resampling: every resized window differs from ml-4m's (the full view is not resized at all)."""
    differing = 0
    for i, crop, side in _windows():
        bilinear = apply_crop({"rgb": CROPS["photo"]}, crop, side)["rgb"]
        resized = (crop.width, crop.height) != (side, side)
        assert np.array_equal(bilinear, CROPS[f"crop_{i}"]) != resized, i
        differing += resized
    assert differing == len(CROPS["windows"]) - 1


def test_an_unknown_resampling_is_named():
    with pytest.raises(ValueError, match="camera_resample must be one of .*'lanczos'"):
        apply_crop({"rgb": CROPS["photo"]}, Crop(0, 0, 10, 10), 64, camera_resample="lanczos")


def test_pretokenize_resamples_bicubically_for_an_ml4m_rgb_tokenizer_only():
    folder = read_folder(REFERENCE / "divae_rgb")
    tokenizer = load_ml4m_tokenizer(folder, describe(folder, "rgb", 64, {}, "train_tokenizers.from_ml4m.rgb"))
    assert camera_resample(tokenizer) == "bicubic"
    assert camera_resample(None) == "bilinear"  # no rgb tokenizer (rgb pixels kept)
    from fourm_kfp.tokenizers.vqvae import VQVAE  # our own

    assert not hasattr(VQVAE, "camera_resample")


def test_crop_chunks_use_the_settings_resampling(tmp_path):
    """What the pretokenize reader hands the encoders: the rgb crops resized by the settings' filter."""
    side = 32
    rng = np.random.default_rng(3)
    store = open_store(str(tmp_path), create=True)
    writer = ShardWriter(store, "train", ("rgb",), samples_per_shard=10)
    photos = {f"{i:04d}": rng.integers(0, 256, (side, side, 3), np.uint8) for i in range(2)}
    for key, photo in photos.items():
        writer.write(key, encode_sample({"rgb": photo}, ("rgb",)))
    writer.close()
    (chunk,) = raw_chunks(store, Shard("train", 0), ("rgb",), size=2)
    bicubic = CropSettings(4, (0.3, 0.6), (0.75, 1.33), 0.5, 11, camera_resample="bicubic")
    bilinear = CropSettings(4, (0.3, 0.6), (0.75, 1.33), 0.5, 11)
    got, old = crop_chunk(bicubic, side, chunk).images["rgb"].crops, crop_chunk(bilinear, side, chunk).images["rgb"]
    crops = draw_crops("0001", 11, 4, side, (0.3, 0.6), (0.75, 1.33), 0.5)
    expected = [apply_crop({"rgb": photos["0001"]}, c, side, "bicubic")["rgb"] for c in crops]
    assert np.array_equal(got[4:8].numpy(), np.stack(expected))
    assert np.array_equal(got[4].numpy(), old.crops[4].numpy())  # crop 0, the full view: not resized
    assert not np.array_equal(got[5:8].numpy(), old.crops[5:8].numpy())


def test_the_address_says_when_rgb_crops_are_bicubic():
    """Only a config whose rgb tokenizer is ml-4m's (``train_tokenizers.from_ml4m.rgb``) has bicubic crops, and only
    its pretokenize address moves (the pinned presets' stay: tests/contract/test_preset_addresses.py)."""
    assert PRETOKENIZE.narrow_config(load_config("smoke")) == {}
    config = load_config("smoke", overrides=["train_tokenizers.from_ml4m={rgb: models/4M_tokenizers_rgb_16k_224-448}"])
    view = PRETOKENIZE.narrow_config(config)["pretokenize"]
    assert view["camera_resample"] == "bicubic" and view["n_crops"] == config.pretokenize.n_crops
    config = load_config("smoke", overrides=["train_tokenizers.from_ml4m={semseg: models/semseg_4k}"])
    assert PRETOKENIZE.narrow_config(config) == {}


def test_the_reference_says_what_made_it():
    manifest = json.loads((REFERENCE / "crops_manifest.json").read_text())
    assert manifest["ml4m_commit"].startswith("cda590f") and "bench/ml4m_crop_reference.py" in manifest["command"]
