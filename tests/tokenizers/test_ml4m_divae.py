"""The DiVAE port (``fourm_kfp.tokenizers.ml4m.divae``) against apple/ml-4m's own DiVAE.

``tests/tokenizers/ml4m_reference/divae_<name>/`` holds, for rgb, depth and edge (patched UNet decoders), for
``edge_uvit`` (the published edge tokenizer's structure: image size 512, the UViT decoder with concatenated codes,
used at 224 px) and ``uvit_xattn`` (ml-4m's UViT with cross-attended codes and long skips), a tokenizer folder that
ml-4m's ``save_pretrained`` wrote (random weights, scaled-down presets) and ml-4m's codes and decodes of it
(``bench/ml4m_divae_reference.py``, whose ``manifest.json`` says how and what was scaled): the port must give the
same codes and the same decodes from the same seeded noise, for ml-4m's DDPM pipeline (the DiVAE's default) and for
its DDIM scheduler. ``divae_keys.json``: ml-4m's own full-size DiVAEs' keys and shapes at the published folders'
configurations.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from fourm_kfp.tokenizers.ml4m import sampling
from fourm_kfp.tokenizers.ml4m.divae import DiVAE, load_divae
from fourm_kfp.tokenizers.ml4m.folder import TokenizerFolderError

REFERENCE = Path(__file__).parent / "ml4m_reference"
UNET_NAMES = ("rgb", "depth", "edge")
UVIT_NAMES = ("edge_uvit", "uvit_xattn")
NAMES = UNET_NAMES + UVIT_NAMES
TOLERANCE = 1e-3


def _manifest(name: str) -> dict:
    return json.loads((REFERENCE / f"divae_{name}" / "manifest.json").read_text())


def _reference(name: str) -> dict[str, torch.Tensor]:
    return load_file(str(REFERENCE / f"divae_{name}" / "reference.safetensors"))


_MODELS: dict[str, DiVAE] = {}


def _model(name: str) -> DiVAE:
    if name not in _MODELS:
        _MODELS[name] = load_divae(REFERENCE / f"divae_{name}", modality=name)
    return _MODELS[name]


def _generator(name: str) -> torch.Generator:
    return torch.Generator().manual_seed(_manifest(name)["noise_seed"])


@pytest.mark.parametrize("name", NAMES)
def test_codes_are_ml4ms(name):
    ref = _reference(name)
    codes = _model(name).encode(ref["images"])
    assert codes.dtype == torch.int64 and codes.shape == ref["codes"].shape
    assert torch.equal(codes, ref["codes"])


@pytest.mark.parametrize("scheduler", ["ddpm", "ddim"])
@pytest.mark.parametrize("name", NAMES)
def test_decode_is_ml4ms(name, scheduler):
    """ml-4m's ``decode_tokens`` with its DiVAE's own DDPM pipeline, and with its DDIM scheduler (trailing), from a
    generator seeded as the manifest says; the demos' step counts (25; 10 for edges) are the defaults here."""
    ref, model, manifest = _reference(name), _model(name), _manifest(name)
    assert model.default_steps == manifest["steps"] == (10 if "edge" in name else 25)
    out = model.decode_tokens(ref["codes"], generator=_generator(name), scheduler=scheduler)
    expected = ref[f"decode_{scheduler}"]
    assert out.shape == expected.shape
    assert (out - expected).abs().max().item() <= TOLERANCE


def test_decode_from_given_noise():
    """``noise=`` is the starting image: ml-4m's first draw from the seed, given explicitly, gives its DDIM decode
    (DDIM draws nothing else)."""
    ref, model = _reference("rgb"), _model("rgb")
    noise = torch.randn(ref["decode_ddim"].shape, generator=_generator("rgb"))
    out = model.decode_tokens(ref["codes"], 25, noise=noise, scheduler="ddim")
    assert (out - ref["decode_ddim"]).abs().max().item() <= TOLERANCE
    with pytest.raises(ValueError, match="noise has shape"):
        model.decode_tokens(ref["codes"], 25, noise=noise[:, :1], scheduler="ddim")


@pytest.mark.parametrize("scheduler", ["ddpm", "ddim"])
def test_decode_moves_when_the_codes_move(scheduler):
    ref, model = _reference("rgb"), _model("rgb")
    codes = ref["codes"]
    noise = torch.randn(ref["decode_ddim"].shape, generator=torch.Generator().manual_seed(5))

    def decode(c):
        return model.decode_tokens(c, 10, noise=noise, generator=torch.Generator().manual_seed(6), scheduler=scheduler)

    base = decode(codes)
    assert torch.equal(base, decode(codes.clone()))  # the same codes, noise and generator: the same image
    moved = codes.clone()
    moved[0, 1, 2] = (moved[0, 1, 2] + 1) % model.codebook_size  # one code of the first image
    out = decode(moved)
    first, second = (out[0] - base[0]).abs(), (out[1] - base[1]).abs()
    assert first.max().item() > 0.1 and first.mean().item() > 1e-3
    assert second.max().item() <= 1e-6  # the other image's codes did not move


@pytest.mark.parametrize("scheduler", ["ddpm", "ddim"])
@pytest.mark.parametrize("steps", [None, 25, 10, 4])
def test_one_unet_pass_per_step(steps, scheduler):
    model = _model("edge" if steps is None else "depth")
    calls = []
    handle = model.decoder.register_forward_hook(lambda module, args, output: calls.append(int(args[1])))
    try:
        model.decode_tokens(_reference("depth")["codes"], steps, generator=torch.Generator().manual_seed(0),
                            scheduler=scheduler)
    finally:
        handle.remove()
    expected = 10 if steps is None else steps  # the edge tokenizer's default
    assert len(calls) == expected
    assert calls == sorted(calls, reverse=True) and len(set(calls)) == expected


def test_timesteps_are_ml4ms():
    """ml-4m's DDPM spaces its steps ``leading`` whatever mode is asked; its DDIM ``trailing``, with the integer
    step ratio."""
    ddpm = sampling.ml4m_scheduler({"scheduler": "ddpm", "beta_schedule": "linear"})
    ddim = sampling.ml4m_scheduler({"scheduler": "ddim", "beta_schedule": "linear"})
    assert sampling.prepare(ddpm, 25).tolist() == list(range(960, -1, -40))
    assert sampling.prepare(ddim, 25).tolist() == list(range(999, 0, -40))
    assert sampling.prepare(ddim, 10).tolist() == list(range(999, 0, -100))
    assert ddim.alphas_cumprod[-1].item() == 0.0  # zero terminal SNR, exactly
    assert sampling.default_steps("tok_sam_edge@224") == 10 and sampling.default_steps("rgb") == 25


def _copy(tmp_path: Path, name: str = "rgb") -> Path:
    folder = tmp_path / f"bad_{name}"
    shutil.copytree(REFERENCE / f"divae_{name}", folder)
    return folder


def _edit_config(folder: Path, **changes) -> None:
    config = json.loads((folder / "config.json").read_text())
    config.update(changes)
    (folder / "config.json").write_text(json.dumps(config))


@pytest.mark.parametrize(
    ("changes", "key"),
    [
        ({"dec_type": "unet_patched_huge"}, "dec_type"),
        ({"prediction_type": "noise"}, "prediction_type"),
        ({"beta_schedule": "cubic"}, "beta_schedule"),
        ({"codebook_size": "many"}, "codebook_size"),
    ],
)
def test_a_bad_config_names_the_folder_and_key(tmp_path, changes, key):
    folder = _copy(tmp_path)
    _edit_config(folder, **changes)
    with pytest.raises(TokenizerFolderError) as caught:
        load_divae(folder)
    assert str(folder) in str(caught.value) and key in str(caught.value)


def test_a_state_that_does_not_fit_names_the_folder_and_key(tmp_path):
    folder = _copy(tmp_path)
    weights = load_file(str(folder / "model.safetensors"))
    missing = "decoder.middle_block.1.qkv.weight"
    del weights[missing]
    save_file(weights, str(folder / "model.safetensors"))
    with pytest.raises(TokenizerFolderError) as caught:
        load_divae(folder)
    assert str(folder) in str(caught.value) and missing in str(caught.value)

    folder = _copy(tmp_path, "depth")
    _edit_config(folder, n_channels=3)  # the weights are a 1-channel tokenizer's
    with pytest.raises(TokenizerFolderError) as caught:
        load_divae(folder)
    assert str(folder) in str(caught.value) and "decoder.input_blocks.0.0.weight" in str(caught.value)


def test_a_folder_without_weights_names_the_file(tmp_path):
    folder = _copy(tmp_path)
    (folder / "model.safetensors").unlink()
    with pytest.raises(TokenizerFolderError, match="model.safetensors") as caught:
        load_divae(folder)
    assert str(folder) in str(caught.value)


def test_the_references_are_small_and_say_what_made_them():
    for name in NAMES:
        folder = REFERENCE / f"divae_{name}"
        assert sum(p.stat().st_size for p in folder.iterdir()) < (3e6 if name in UVIT_NAMES else 1.5e6)
        manifest = _manifest(name)
        assert manifest["ml4m_commit"].startswith("cda590f")
        assert "bench/ml4m_divae_reference.py" in manifest["command"]
        assert manifest["environment"]["diffusers"] == "0.20.0"
        assert set(json.loads((folder / "config.json").read_text())) >= {"enc_type", "dec_type", "codebook_size"}


def test_the_references_scaled_presets_are_the_ports():
    """The reference folders name presets ml-4m lacks; the port's tables must build the same networks."""
    from fourm_kfp.tokenizers.ml4m import unet, vit

    for name in UNET_NAMES:
        presets = _manifest(name)["scaled_presets"]
        enc = presets["enc_type"]["vit_tiny_enc"]
        size = vit.preset("vit_tiny_enc", "enc")
        assert (size.dim, size.depth, size.heads, float(size.mlp_ratio)) == (
            enc["dim_tokens"], enc["depth"], enc["num_heads"], float(enc["mlp_ratio"])), (
            "vit.PRESETS['tiny'] no longer matches the DiVAE references: rerun bench/ml4m_divae_reference.py")
        dec = presets["dec_type"]["unet_patched_tiny"]
        assert unet.UNET_PRESETS["unet_patched_tiny"].as_dict() == {
            key: tuple(value) if isinstance(value, list) else value for key, value in dec.items()}


def test_the_uvit_references_scaled_presets_are_the_ports():
    from fourm_kfp.tokenizers.ml4m import uvit

    for name in UVIT_NAMES:
        manifest = _manifest(name)
        dec_type = json.loads((REFERENCE / f"divae_{name}" / "config.json").read_text())["dec_type"]
        expected = manifest["scaled_presets"]["dec_type"][dec_type]
        assert uvit.UVIT_PRESETS[dec_type].as_dict() == {
            key: tuple(value) if isinstance(value, list) else value for key, value in expected.items()}, (
            f"uvit.UVIT_PRESETS[{dec_type!r}] no longer matches the reference: rerun bench/ml4m_divae_reference.py")


def test_the_edge_uvit_reference_has_the_published_edge_structure():
    """Patch-16 encoder, 1 channel, image size 512, ml-4m's UViT decoder with concatenated codes (its factory's
    structure: patch 4, two UNet levels of two blocks, a downsampling before the Transformer), used at 224 px."""
    from fourm_kfp.tokenizers.ml4m import uvit

    config = json.loads((REFERENCE / "divae_edge_uvit" / "config.json").read_text())
    assert (config["patch_size"], config["n_channels"], config["image_size"], config["conditioning"]) == (
        16, 1, 512, "concat")
    tiny, published = uvit.UVIT_PRESETS[config["dec_type"]], uvit.UVIT_PRESETS["uvit_b_p4_f16"]
    for field in ("patch_size", "layers_per_block", "downsample_before_mid", "mid_mlp_ratio", "mid_qkv_bias",
                  "mid_use_long_skip"):
        assert getattr(tiny, field) == getattr(published, field), field
    assert len(tiny.block_out_channels) == len(published.block_out_channels)
    assert tuple(_reference("edge_uvit")["codes"].shape[-2:]) == (14, 14)
    assert _model("edge_uvit").decoder.mid_block.cond_type == "concat"


def test_a_uvit_folder_stores_the_shared_downsampling_once_and_loads():
    """diffusers' ``Downsample2D`` holds one convolution as ``conv`` and ``Conv2d_0``; ml-4m's save stores it once
    (safetensors drops the alias): the port loads it under both names from the one stored."""
    stored = load_file(str(REFERENCE / "divae_edge_uvit" / "model.safetensors"))
    assert "decoder.downsample_mid.Conv2d_0.weight" in stored and "decoder.downsample_mid.conv.weight" not in stored
    model = _model("edge_uvit")
    assert model.decoder.downsample_mid.conv is model.decoder.downsample_mid.Conv2d_0
    assert torch.equal(model.decoder.downsample_mid.conv.weight, stored["decoder.downsample_mid.Conv2d_0.weight"])


DIVAE_KEYS = json.loads((REFERENCE / "divae_keys.json").read_text())


@pytest.mark.parametrize("folder", sorted(DIVAE_KEYS["folders"]))
def test_keys_and_shapes_of_the_published_divae_configurations(folder):
    """ml-4m's own full-size DiVAE at each published folder's configuration (rgb, depth, normal: the patched UNet;
    edge: ``uvit_b_p4_f16`` at 512 px) has the keys and shapes the port builds."""
    entry = DIVAE_KEYS["folders"][folder]
    with torch.device("meta"):
        model = DiVAE(entry["config_json"])
    assert {k: list(v.shape) for k, v in sorted(model.state_dict().items())} == entry["keys"]


def test_unused_tensors_are_reported_and_ignored(tmp_path, caplog):
    """As ml-4m's non-strict ``from_pretrained``: a tensor the architecture does not use is ignored, and the
    warning names the folder and the key."""
    folder = _copy(tmp_path, "edge_uvit")
    weights = load_file(str(folder / "model.safetensors"))
    weights["decoder.loss.ema_weight"] = torch.ones(3)
    weights["encoder.pos_emb_448"] = torch.zeros(2, 2)
    save_file(weights, str(folder / "model.safetensors"))
    with caplog.at_level("WARNING", logger="fourm_kfp.tokenizers.ml4m.folder"):
        model = load_divae(folder, modality="edge")
    messages = [r.getMessage() for r in caplog.records if r.name == "fourm_kfp.tokenizers.ml4m.folder"]
    assert len(messages) == 1
    assert str(folder) in messages[0] and "'decoder.loss.ema_weight'" in messages[0]
    assert "'encoder.pos_emb_448'" in messages[0]
    ref = _reference("edge_uvit")
    assert torch.equal(model.encode(ref["images"]), ref["codes"])


def test_a_missing_uvit_tensor_is_refused_by_name(tmp_path):
    folder = _copy(tmp_path, "edge_uvit")
    weights = load_file(str(folder / "model.safetensors"))
    missing = ("decoder.mid_block.mid_block.1.adaLN_gate.weight", "decoder.downsample_mid.Conv2d_0.bias")
    for key in missing:
        del weights[key]
    save_file(weights, str(folder / "model.safetensors"))
    with pytest.raises(TokenizerFolderError) as caught:
        load_divae(folder)
    message = str(caught.value)
    assert str(folder) in message and all(key in message for key in missing[:1])
    assert "decoder.downsample_mid.conv.bias" in message or "decoder.downsample_mid.Conv2d_0.bias" in message


def test_an_unknown_conditioning_is_named(tmp_path):
    folder = _copy(tmp_path, "edge_uvit")
    _edit_config(folder, conditioning="film")
    with pytest.raises(TokenizerFolderError, match="conditioning 'film'") as caught:
        load_divae(folder)
    assert str(folder) in str(caught.value)
