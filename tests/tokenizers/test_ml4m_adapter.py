"""ml-4m's tokenizers behind our tokenizers' interface (:mod:`fourm_kfp.tokenizers.ml4m.adapter`): each codec
family's conventions against :mod:`fourm_kfp.tokenizers.ml4m.conventions` (ml-4m's transforms), the fit checks, and
the two decoder families through one interface (a VQ-VAE's and a DiVAE's, on the committed reference folders)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from fourm_kfp.tokenizers.ml4m import conventions, load_vqvae, read_folder
from fourm_kfp.tokenizers.ml4m.adapter import (CONVENTIONS, DECODE_SEED, describe, folder_digest, index_entry,
                                               load_ml4m_tokenizer)
from fourm_kfp.tokenizers.ml4m.folder import TokenizerFolderError

REFERENCE = Path(__file__).parent / "ml4m_reference"
RNG = np.random.default_rng(56)


def _unit_normals(shape):
    v = RNG.normal(size=(*shape, 3)).astype(np.float32)
    v /= np.linalg.norm(v, axis=-1, keepdims=True)
    v[:, 0, 0] = 0.0  # an invalid pixel
    return v


def test_rgb_is_ml4ms_inception_input_and_back():
    rgb = RNG.integers(0, 256, (2, 8, 8, 3), dtype=np.uint8)
    x = CONVENTIONS["rgb"].to_input(torch.from_numpy(rgb), {})
    torch.testing.assert_close(x, conventions.rgb(rgb), rtol=0, atol=0)
    np.testing.assert_array_equal(CONVENTIONS["rgb"].to_arrays(x, {}), rgb)


def test_normals_go_to_omnidatas_frame_and_8_bit_encoding_and_back():
    ours = _unit_normals((2, 8, 8))
    x = CONVENTIONS["normal"].to_input(ours, {})
    png = np.clip(np.round(((ours * [1, -1, 1]) * 0.5 + 0.5) * 255), 0, 255).astype(np.uint8)  # y down
    torch.testing.assert_close(x, conventions.normal(png), rtol=0, atol=0)
    assert float(x[0, 1, 3, 3]) == pytest.approx(-ours[0, 3, 3, 1], abs=1 / 255)  # y flipped
    back = CONVENTIONS["normal"].to_arrays(x, {})
    valid = np.any(ours != 0, axis=-1)
    cosine = np.sum(back * ours, axis=-1)[valid]
    assert cosine.min() > 0.999 and back.dtype == np.float32


def test_depth_is_standardised_as_ml4m_does_its_pngs():
    depth = RNG.uniform(1.0, 20.0, (2, 8, 8)).astype(np.float32)
    depth[0, :2] = 0.0  # invalid: zeros, as ml-4m's PNGs hold them
    depth[1, 0, 0] = np.nan
    x = CONVENTIONS["depth"].to_input(depth, {})
    png = np.nan_to_num(depth) * 1000.0  # any unit: standardisation is affine
    torch.testing.assert_close(x, conventions.depth(png), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(CONVENTIONS["depth"].reference(depth), x[:, 0].numpy(), rtol=1e-6)
    np.testing.assert_array_equal(CONVENTIONS["depth"].to_arrays(x, {}), x[:, 0].numpy())


def test_semseg_ids_shift_by_one_and_decode_to_the_vocabulary():
    ids = RNG.integers(0, 6, (2, 8, 8), dtype=np.uint8)
    x = CONVENTIONS["semseg"].to_input(ids, {"classes": 6})
    torch.testing.assert_close(x, conventions.semseg(ids), rtol=0, atol=0)
    logits = torch.nn.functional.one_hot(x, 134).permute(0, 3, 1, 2).float()
    logits[:, 0] = 5.0  # "no class" is never given
    logits[:, 100] = 4.0  # nor a class past the vocabulary
    np.testing.assert_array_equal(CONVENTIONS["semseg"].to_arrays(logits, {"classes": 6}), ids)


def test_edges_are_plus_minus_one_and_features_change_layout():
    edges = RNG.integers(0, 2, (2, 8, 8), dtype=np.uint8)
    x = CONVENTIONS["edge"].to_input(edges, {})
    assert x.shape == (2, 1, 8, 8) and set(x.unique().tolist()) <= {-1.0, 1.0}
    np.testing.assert_array_equal(CONVENTIONS["edge"].to_arrays(x, {}), edges)
    features = RNG.normal(size=(2, 4, 4, 16)).astype(np.float32)
    x = CONVENTIONS["features"].to_input(features, {})
    torch.testing.assert_close(x, conventions.feature_map(features.reshape(2, 16, 16), (4, 4)), rtol=0, atol=0)
    np.testing.assert_array_equal(CONVENTIONS["features"].to_arrays(x, {}), features)


def test_a_vqvae_plugs_in_at_the_pipelines_side():
    folder = read_folder(REFERENCE / "semseg" / "folder")
    assert folder_digest(str(folder.uri)) == folder.digest
    config = describe(folder, "semseg", 32, {"classes": 6}, "here")
    assert (config.family, config.image_size, config.grid_size, config.codebook_size) == ("vqvae", 32, 16, 256)
    tokenizer = load_ml4m_tokenizer(folder, config)
    ids = RNG.integers(0, 6, (2, 32, 32), dtype=np.uint8)
    codes = tokenizer.encode(ids)
    torch.testing.assert_close(codes, load_vqvae(folder).encode(conventions.semseg(ids)), rtol=0, atol=0)
    decoded = tokenizer.decode(codes)
    assert decoded.shape == (2, 32, 32) and decoded.dtype == np.uint8 and decoded.max() < 6
    entry = index_entry(folder, "somewhere", config)
    assert entry["kind"] == "ml4m" and entry["digest"] == folder.digest and entry["ml4m_config"] == folder.config


@pytest.mark.parametrize("modality, side, settings, reason", [
    ("semseg", 31, {"classes": 6}, "31-px values are not a multiple of its patch size 2"),
    ("semseg", 32, {"classes": 200}, "200 classes, the tokenizer's n_labels 134 hold 133"),
    ("clip", 4, {"channels": 64, "grid": 4}, "patch_proj is on: an image tokenizer"),
    ("rgb", 32, {}, "a rgb tokenizer takes 3 channel"),
])
def test_a_folder_that_does_not_fit_says_why(modality, side, settings, reason):
    folder = read_folder(REFERENCE / "semseg" / "folder")
    with pytest.raises(TokenizerFolderError, match=rf"^train_tokenizers.from_ml4m.{modality}: .*{reason}"):
        describe(folder, modality, side, settings, f"train_tokenizers.from_ml4m.{modality}")


def test_an_encoder_only_folder_is_refused_it_cannot_decode():
    folder = read_folder(REFERENCE / "rgb_encoder" / "folder")
    with pytest.raises(TokenizerFolderError, match=r"a 'vq' tokenizer .* needs a decoder"):
        describe(folder, "rgb", 64, {}, "train_tokenizers.from_ml4m.rgb")


def test_a_divae_plugs_in_with_the_same_interface():
    pytest.importorskip("diffusers")
    from fourm_kfp.tokenizers.ml4m.divae import load_divae

    folder = read_folder(REFERENCE / "divae_edge")
    config = describe(folder, "edge", 32, {}, "here")
    assert (config.family, config.grid_size) == ("divae", 2)
    tokenizer = load_ml4m_tokenizer(folder, config)
    edges = RNG.integers(0, 2, (2, 32, 32), dtype=np.uint8)
    codes = tokenizer.encode(edges)
    network = load_divae(folder, modality="edge")
    torch.testing.assert_close(codes, network.encode(CONVENTIONS["edge"].to_input(edges, {})), rtol=0, atol=0)
    decoded = tokenizer.decode(codes)
    assert decoded.shape == (2, 32, 32) and decoded.dtype == np.uint8 and set(np.unique(decoded)) <= {0, 1}
    np.testing.assert_array_equal(tokenizer.decode(codes), decoded)  # a seeded sampler: the same arrays
    expected = network.decode_tokens(codes, generator=torch.Generator().manual_seed(DECODE_SEED))
    np.testing.assert_array_equal(decoded, (expected[:, 0] > 0).numpy().astype(np.uint8))
