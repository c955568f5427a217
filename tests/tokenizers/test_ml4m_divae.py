"""The DiVAE port (``fourm_kfp.tokenizers.ml4m.divae``) against apple/ml-4m's own DiVAE.

``tests/tokenizers/ml4m_reference/divae_<name>/`` holds, for rgb, depth and edge, a tokenizer folder that ml-4m's
``save_pretrained`` wrote (random weights, scaled-down presets) and ml-4m's codes and decodes of it
(``bench/ml4m_divae_reference.py``, whose ``manifest.json`` says how): the port must give the same codes and the same
decodes from the same seeded noise, for ml-4m's DDPM pipeline (the DiVAE's default) and for its DDIM scheduler.
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
NAMES = ("rgb", "depth", "edge")
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
    assert model.default_steps == manifest["steps"] == (10 if name == "edge" else 25)
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
        assert sum(p.stat().st_size for p in folder.iterdir()) < 1.5e6
        manifest = _manifest(name)
        assert manifest["ml4m_commit"].startswith("cda590f")
        assert "bench/ml4m_divae_reference.py" in manifest["command"]
        assert manifest["environment"]["diffusers"] == "0.20.0"
        assert set(json.loads((folder / "config.json").read_text())) >= {"enc_type", "dec_type", "codebook_size"}


def test_the_references_scaled_presets_are_the_ports():
    """The reference folders name presets ml-4m lacks; the port's tables must build the same networks."""
    from fourm_kfp.tokenizers.ml4m import unet, vit

    for name in NAMES:
        presets = _manifest(name)["scaled_presets"]
        enc = presets["enc_type"]["vit_tiny_enc"]
        size = vit.preset("vit_tiny_enc", "enc")
        assert (size.dim, size.depth, size.heads, float(size.mlp_ratio)) == (
            enc["dim_tokens"], enc["depth"], enc["num_heads"], float(enc["mlp_ratio"])), (
            "vit.PRESETS['tiny'] no longer matches the DiVAE references: rerun bench/ml4m_divae_reference.py")
        dec = presets["dec_type"]["unet_patched_tiny"]
        assert unet.UNET_PRESETS["unet_patched_tiny"].as_dict() == {
            key: tuple(value) if isinstance(value, list) else value for key, value in dec.items()}
