"""The port of ml-4m's VQ tokenizers (``fourm_kfp.tokenizers.ml4m``) against outputs of ml-4m's own code.

``tests/tokenizers/ml4m_reference/`` was made by ``bench/ml4m_tokenizer_reference.py`` in ml-4m's environment
(its ``manifest.json`` gives the ml-4m commit, the command and the versions): scaled-down random tokenizers saved
by ml-4m's ``save_pretrained``, a seeded batch, ml-4m's codes and decoded outputs; ``keys.json``, the keys and
shapes of ml-4m's models at the published sizes; ``conventions.npz``, fixed inputs through ml-4m's transforms.
Nothing here needs ml-4m.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from fourm_kfp.errors import UserError
from fourm_kfp.storage import open_store
from fourm_kfp.tokenizers.ml4m import (VQVAE, TokenizerFolderError, VQConfig, VQEncoder, conventions,
                                       load_vq_encoder, load_vqvae, read_folder)
from fourm_kfp.tokenizers.ml4m.vit import PRESETS

REFERENCE = Path(__file__).parent / "ml4m_reference"
BENCH = Path(__file__).resolve().parents[2] / "bench"
MANIFEST = json.loads((REFERENCE / "manifest.json").read_text())
NAMES = sorted(MANIFEST["tokenizers"])
DECODERS = [n for n in NAMES if MANIFEST["tokenizers"][n]["class"] == "VQVAE"]


def _load(name: str):
    folder = REFERENCE / name / "folder"
    return load_vqvae(folder) if name in DECODERS else load_vq_encoder(folder)


def _inputs(name: str) -> torch.Tensor:
    return torch.from_numpy(np.load(REFERENCE / name / "inputs.npy"))


def test_the_references_cover_the_vqvae_family():
    assert {"semseg", "clip", "dinov2", "dinov2_global", "human_poses", "rgb_encoder"} <= set(NAMES)
    assert MANIFEST["ml4m_commit"].startswith("cda590f")
    tiny = MANIFEST["scaled_vit_preset"]["vit_tiny"]
    assert (PRESETS["tiny"].dim, PRESETS["tiny"].depth, PRESETS["tiny"].heads) == (
        tiny["dim_tokens"], tiny["depth"], tiny["num_heads"])


@pytest.mark.parametrize("name", NAMES)
def test_codes_equal_ml4m_s(name):
    model = _load(name)
    codes = model.encode(_inputs(name))
    expected = torch.from_numpy(np.load(REFERENCE / name / "codes.npy"))
    assert codes.dtype == torch.int64 and codes.shape == expected.shape
    assert torch.equal(codes, expected)


@pytest.mark.parametrize("name", DECODERS)
def test_decoded_outputs_equal_ml4m_s(name):
    model = _load(name)
    codes = torch.from_numpy(np.load(REFERENCE / name / "codes.npy"))
    decoded = model.decode_tokens(codes)
    expected = torch.from_numpy(np.load(REFERENCE / name / "decoded.npy"))
    assert decoded.shape == expected.shape
    assert float((decoded - expected).abs().max()) <= 1e-4


@pytest.mark.parametrize("name", DECODERS)
def test_round_trip_shapes_ranges_and_sensitivity(name):
    model = _load(name)
    x = _inputs(name)
    codes = model.encode(x)
    assert int(codes.min()) >= 0 and int(codes.max()) < model.codebook_size
    out = model.decode_tokens(codes)
    channels = model.config.n_labels or model.config.n_channels
    assert out.dtype == torch.float32 and out.shape[:2] == (x.shape[0], channels)
    assert out.shape[-2:] == x.shape[-2:]  # pixels back at the input's size (feature maps: its grid)
    assert torch.allclose(model.autoencode(x), out, atol=1e-5)
    assert torch.allclose(model.tokens_to_embedding(codes), model.encode_quant(x)[0], atol=1e-6)
    generator = torch.Generator().manual_seed(0)
    if x.dtype == torch.int64:
        moved = torch.randint(0, model.config.n_labels, x.shape, generator=generator)
    else:
        moved = -x + 0.5 * torch.randn(x.shape, generator=generator)
    assert not torch.equal(model.encode(moved), codes)  # the codes follow the input


@pytest.mark.parametrize("name", sorted(MANIFEST["full_size_quantizers"]))
def test_quantizers_at_the_published_codebook_sizes_pick_ml4m_s_codes(name, monkeypatch):
    """Lucid with 16384 / 8192 / 4096 codes and Memcodes with 8 x 8192 / 8 x 1024: seeded codebooks and latents
    regenerated here as the reference made them (their checksums are checked first)."""
    monkeypatch.syspath_prepend(str(BENCH))
    import ml4m_tokenizer_compare

    result = ml4m_tokenizer_compare.compare_quantizer(REFERENCE, name, MANIFEST["full_size_quantizers"][name])
    assert result["codes_identical"], result
    assert result["codes"] == int(np.prod(np.load(REFERENCE / "quantizers" / f"{name}_codes.npy").shape))


def test_keys_and_shapes_of_the_published_configurations():
    keys = json.loads((REFERENCE / "keys.json").read_text())
    assert {"semseg", "clip", "dinov2", "imagebind", "dinov2_global", "imagebind_global", "human_poses",
            "rgb_encoder", "depth_encoder"} <= set(keys)
    for name, entry in keys.items():
        config = VQConfig.from_dict(entry["config_json"])
        assert config.kind == ("vq" if entry["class"] == "VQ" else "vqvae"), name
        with torch.device("meta"):
            model = (VQEncoder if entry["class"] == "VQ" else VQVAE)(config)
        assert {k: list(v.shape) for k, v in model.state_dict().items()} == entry["keys"], name


@pytest.mark.parametrize("name", NAMES)
def test_the_saved_folder_has_the_keys_its_config_makes(name):
    folder = read_folder(REFERENCE / name / "folder")
    cls = VQVAE if name in DECODERS else VQEncoder
    with torch.device("meta"):
        model = cls(folder.config)
    assert folder.shapes() == {k: list(v.shape) for k, v in sorted(model.state_dict().items())}
    assert len(folder.digest) == 64 and set(folder.files) == {"config.json", "model.safetensors"}


def _copy(name: str, tmp_path: Path) -> Path:
    target = tmp_path / name
    shutil.copytree(REFERENCE / name / "folder", target)
    return target


def test_a_missing_key_is_named_with_the_folder(tmp_path):
    folder = _copy("semseg", tmp_path)
    tensors = load_file(folder / "model.safetensors")
    del tensors["quantize._codebook.embed"]
    save_file(tensors, folder / "model.safetensors")
    with pytest.raises(TokenizerFolderError, match=r"semseg.*missing key 'quantize._codebook.embed'") as error:
        load_vqvae(folder)
    assert isinstance(error.value, UserError) and str(folder) in str(error.value)


def test_an_unused_tensor_is_reported_and_ignored_as_ml4m_does(tmp_path, caplog):
    """ml-4m loads its folders with ``strict=False``: a tensor its architecture does not use is ignored. The port
    ignores it too, in one warning naming the folder and the key; an encoder-only load skips the decoder's quietly."""
    folder = _copy("semseg", tmp_path)
    tensors = load_file(folder / "model.safetensors")
    tensors["loss.perceptual.weight"] = torch.ones(2)
    save_file(tensors, folder / "model.safetensors")
    with caplog.at_level("WARNING", logger="fourm_kfp.tokenizers.ml4m.folder"):
        model = load_vqvae(folder)
        load_vq_encoder(folder)
    warnings = [r.getMessage() for r in caplog.records if r.name == "fourm_kfp.tokenizers.ml4m.folder"]
    assert len(warnings) == 2 and all("'loss.perceptual.weight'" in w and str(folder) in w for w in warnings)
    assert "decoder" not in warnings[1]
    x = _inputs("semseg")
    assert torch.equal(model.encode(x), load_vqvae(REFERENCE / "semseg" / "folder").encode(x))


def test_a_wrong_shape_is_named_with_the_folder(tmp_path):
    folder = _copy("clip", tmp_path)
    tensors = load_file(folder / "model.safetensors")
    tensors["decoder.out_proj.weight"] = tensors["decoder.out_proj.weight"][:-1].contiguous()
    save_file(tensors, folder / "model.safetensors")
    with pytest.raises(TokenizerFolderError, match=r"clip.*'decoder.out_proj.weight' has shape \[63, 16\]"):
        load_vqvae(folder)


def test_a_config_that_disagrees_with_the_weights_is_named(tmp_path):
    folder = _copy("dinov2_global", tmp_path)
    config = json.loads((folder / "config.json").read_text())
    config["codebook_size"] = 512
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(TokenizerFolderError, match=r"dinov2_global.*'quantize.codes' has shape \[8, 256, 8\]"):
        load_vqvae(folder)


def test_a_folder_without_weights_or_with_a_bad_config_is_refused(tmp_path):
    folder = _copy("human_poses", tmp_path)
    (folder / "model.safetensors").unlink()
    with pytest.raises(TokenizerFolderError, match=r"human_poses: no model.safetensors"):
        read_folder(folder)
    folder = _copy("rgb_encoder", tmp_path / "other")
    (folder / "config.json").write_text(json.dumps({"enc_type": "vit_huge_enc"}))
    with pytest.raises(TokenizerFolderError, match=r"rgb_encoder/config.json: 'vit_huge_enc' is no ViT encoder"):
        load_vq_encoder(folder)


def test_an_encoder_only_load_leaves_out_the_decoder_and_a_vq_folder_is_not_a_vqvae():
    encoder = load_vq_encoder(REFERENCE / "semseg" / "folder")
    assert not hasattr(encoder, "decoder")
    full = load_vqvae(REFERENCE / "semseg" / "folder")
    x = _inputs("semseg")
    assert torch.equal(encoder.encode(x), full.encode(x))
    with pytest.raises(TokenizerFolderError, match="a vq tokenizer, not a VQ-VAE"):
        load_vqvae(REFERENCE / "rgb_encoder" / "folder")
    assert VQConfig.from_dict({"dec_type": "unet_patched", "beta_schedule": "linear"}).kind == "divae"


def test_a_folder_reads_from_s3_with_the_same_digest(s3_uri):
    local = read_folder(REFERENCE / "dinov2" / "folder")
    store = open_store(f"{s3_uri}/dinov2", create=True)
    for name in ("config.json", "model.safetensors"):
        store.put_file(name, REFERENCE / "dinov2" / "folder" / name)
    model = load_vqvae(f"{s3_uri}/dinov2")
    assert model.folder_digest == local.digest
    assert torch.equal(model.encode(_inputs("dinov2")), torch.from_numpy(np.load(REFERENCE / "dinov2" / "codes.npy")))


# -- input conventions, against ml-4m's own transforms on fixed inputs ---------------------------------------------

CONVENTIONS = np.load(REFERENCE / "conventions.npz")


@pytest.mark.parametrize("name, convert, source", [
    ("rgb_tokenizer", conventions.rgb, "rgb_in"),
    ("rgb_fm", conventions.rgb_imagenet, "rgb_in"),
    ("depth", conventions.depth, "depth_in"),
    ("normal", conventions.normal, "normal_in"),
    ("semseg", conventions.semseg, "semseg_in"),
])
def test_input_conventions_equal_ml4m_s_transforms(name, convert, source):
    ours = convert(CONVENTIONS[source])
    expected = torch.from_numpy(CONVENTIONS[name])
    assert ours.dtype == expected.dtype and ours.shape == expected.shape
    assert torch.equal(ours, expected)


def test_depth_is_standardised_on_its_middle_80_percent():
    depth = conventions.depth(CONVENTIONS["depth_in"])[0]
    values = torch.sort(depth.reshape(-1)).values
    n = values.numel()
    middle = values[int(0.1 * n): int(0.9 * n)]
    assert abs(float(middle.mean())) < 1e-5 and abs(float(middle.var()) - 1) < 1e-3
    batch = np.stack([CONVENTIONS["depth_in"], CONVENTIONS["depth_in"] * 0 + 7])
    out = conventions.depth(batch)
    assert out.shape == (2, 1, *CONVENTIONS["depth_in"].shape) and torch.equal(out[0, 0], depth)
    metres = conventions.standardise_depth(CONVENTIONS["depth_in"].astype(np.float32) / 1000.0)
    assert torch.allclose(metres, depth, atol=1e-3)  # affine: the unit changes only the 1e-6 in the variance


def test_semseg_ids_shift_by_one_and_back():
    ids = CONVENTIONS["semseg_in"]
    inputs = conventions.semseg(ids)
    assert int(inputs[1, 0]) == 0 and int(inputs.max()) <= 133  # 255 (unlabelled) is class 0
    logits = torch.nn.functional.one_hot(inputs, 134).permute(2, 0, 1)[None].float()
    assert np.array_equal(conventions.semseg_ids(logits)[0], ids)
    with pytest.raises(ValueError, match="COCO has 133 classes"):
        conventions.semseg(np.full((2, 2), 140, np.uint8))


def test_feature_maps_and_global_features_take_the_tokenizers_layout():
    tokens = torch.arange(2 * 6 * 5, dtype=torch.float32).reshape(2, 6, 5)
    grid = conventions.feature_map(tokens, (2, 3))
    assert grid.shape == (2, 5, 2, 3) and torch.equal(grid[1, :, 1, 2], tokens[1, 5])
    assert conventions.global_feature(tokens[:, 0]).shape == (2, 5, 1, 1)
    image = CONVENTIONS["rgb_in"]
    assert np.array_equal(conventions.rgb_image(conventions.rgb(image)), image)
