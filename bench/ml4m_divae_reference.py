"""apple/ml-4m's own DiVAE tokenizers (random weights, scaled down) and their decodes, for the port to match.

Runs in ml-4m's environment, not ours (ml-4m's code needs diffusers 0.20 and huggingface_hub <= 0.24)::

    bash bench/ml4m_env.sh     # .venv-ml4m; or any env with torch, diffusers==0.20.0, huggingface_hub<=0.24, einops,
                               # numpy<2, safetensors
    FOURM_REFERENCE=/tmp/ml-4m .venv-ml4m/bin/python bench/ml4m_divae_reference.py

For each tokenizer (rgb, depth, edge) it builds ml-4m's ``DiVAE`` with the published configurations' settings
(ViT encoder with a tanh post-MLP, lucid cosine VQ with 32-dim codes, the patched UNet decoder predicting x0,
1000 linear-beta training steps with zero terminal SNR, thresholding) at a size a CPU test can run: an encoder
and a decoder preset registered here (:data:`SCALED_PRESETS`, written into the manifest; the port's preset
tables hold the same names and sizes), 64-px images (4x4 codes), a smaller codebook. Weights are random; the
decoder's zero-initialised output convolutions are re-drawn so the decode depends on every layer. It saves each
tokenizer with ml-4m's
``save_pretrained`` (``config.json`` + ``model.safetensors``) under ``tests/tokenizers/ml4m_reference/divae_<name>/``
and beside it ``reference.safetensors``: the input images, the codes ml-4m's encoder gives them, and ml-4m's decodes
of those codes (``decode_tokens`` with its own DDPM pipeline, and with its DDIM scheduler in ``trailing`` mode), with
the demos' step counts (25; 10 for edges) from a seeded generator. ``manifest.json`` says what made them.

ml-4m's packages are registered without running ``fourm/__init__``-level imports it does not need here
(``fourm.utils``' data pipeline): ``fourm.utils`` gets ``to_2tuple`` and ``denormalize`` from ``fourm/utils/misc.py``
when torchvision imports, else equivalents defined below (the manifest says which).
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import os
import platform
import subprocess
import sys
import types
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "tokenizers" / "ml4m_reference"

#: the scaled-down presets the reference tokenizers name (ml-4m has ``vit_b_enc`` and ``unet_patched``); the port
#: holds the same ones (``fourm_kfp.tokenizers.ml4m.vit.PRESETS["tiny"]``, ``unet.UNET_PRESETS``)
SCALED_PRESETS = {
    "enc_type": {"vit_tiny_enc": {"dim_tokens": 16, "depth": 2, "num_heads": 2, "mlp_ratio": 4.0}},
    "dec_type": {
        "unet_patched_tiny": {
            "patch_size": 4, "model_channels": 32, "num_res_blocks": 0, "attention_resolutions": [2],
            "channel_mult": [1, 1],
        }
    },
}

#: the scaled-down UViT decoders (ml-4m's ``UViT`` class; its published edge decoder is ``uvit_b_p4_f16``: patch 4,
#: UNet widths (128, 256) of 2 residual blocks each, a downsampling before the Transformer, 12 blocks of width 768 and
#: 12 heads). Scaled: the UNet widths to (32, 32), the Transformer to 2 blocks of width 32 and 2 heads; patch size,
#: levels, blocks per level, the extra downsampling, the MLP ratio and the qkv bias are kept (the long-skip one, for
#: the cross-attention reference: 1 block per level, 5 Transformer blocks, two long skips so that their order
#: shows). The port's ``uvit.UVIT_PRESETS`` holds the same names and sizes.
UVIT_PRESETS = {
    "uvit_tiny_p4_f16": {
        "patch_size": 4, "block_out_channels": [32, 32], "layers_per_block": 2, "downsample_before_mid": True,
        "mid_layers": 2, "mid_num_heads": 2, "mid_dim": 32, "mid_mlp_ratio": 4, "mid_qkv_bias": True,
        "mid_use_long_skip": False,
    },
    "uvit_tiny_p4_f16_longskip": {
        "patch_size": 4, "block_out_channels": [32, 32], "layers_per_block": 1, "downsample_before_mid": True,
        "mid_layers": 5, "mid_num_heads": 2, "mid_dim": 32, "mid_mlp_ratio": 4, "mid_qkv_bias": True,
        "mid_use_long_skip": True,
    },
}
SCALED_PRESETS["dec_type"].update(UVIT_PRESETS)

#: name -> (channels, codebook size, demo steps, seed); the published ones: rgb 3 ch / 16384, depth and edge 1 ch / 8192
TOKENIZERS = {
    "rgb": (3, 512, 25, 0),
    "depth": (1, 256, 25, 1),
    "edge": (1, 256, 10, 2),
}
IMAGE_SIZE = 64
BATCH = 2

#: name -> (channels, codebook size, demo steps, seed, the config's differences from :data:`PUBLISHED`' DiVAE
#: settings, the size the reference images are encoded and decoded at). ``edge_uvit`` is the published edge
#: tokenizer's structure (``4M_tokenizers_edge_8k_224-512``: 1 channel, ``image_size`` 512, a patch-16 encoder, the
#: UViT decoder with concatenated codes) with the scaled-down presets and a 512-code codebook (published: 8192), at
#: 224 px, the size 4M uses it at (14x14 codes); ``uvit_xattn`` covers ml-4m's other UViT paths (codes by
#: cross-attention, long skips) at 64 px.
UVIT_TOKENIZERS = {
    "edge_uvit": (1, 512, 10, 3, {"image_size": 512, "dec_type": "uvit_tiny_p4_f16", "conditioning": "concat"},
                  224),
    "uvit_xattn": (3, 256, 25, 4, {"image_size": IMAGE_SIZE, "dec_type": "uvit_tiny_p4_f16_longskip",
                                   "conditioning": "xattn"}, IMAGE_SIZE),
}

#: the settings 4M-21's DiVAE tokenizers were trained with (cfgs/default/tokenization/divae/*_224-448_predx0.yaml,
#: run_training_divae.py's defaults for what those leave out)
PUBLISHED = dict(
    patch_size=16, post_mlp=True, quant_type="lucid", latent_dim=32, norm_codes=True, norm_latents=False,
    num_train_timesteps=1000, prediction_type="sample", beta_schedule="linear", thresholding=True,
    zero_terminal_snr=True, cls_free_guidance_dropout=0.0, undo_std=False,
)


def _utils_module(path: Path) -> str:
    """``fourm.utils`` with what ``fourm.vq`` imports from it; returns where those came from."""
    utils = types.ModuleType("fourm.utils")
    utils.__path__ = [str(path / "fourm" / "utils")]
    sys.modules["fourm.utils"] = utils
    try:
        misc = importlib.import_module("fourm.utils.misc")
        utils.to_2tuple, utils.denormalize = misc.to_2tuple, misc.denormalize
        return "fourm/utils/misc.py"
    except Exception:  # noqa: BLE001 - no usable torchvision (absent, or a build whose ops cannot load)
        # equivalents: neither is on the decode path, but both are imported
        def to_2tuple(x):
            return tuple(x) if isinstance(x, (list, tuple)) else (x, x)

        def denormalize(img, mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225)):
            mean_t = torch.tensor(mean, dtype=img.dtype).view(-1, 1, 1)
            std_t = torch.tensor(std, dtype=img.dtype).view(-1, 1, 1)
            return img * std_t + mean_t

        utils.to_2tuple, utils.denormalize = to_2tuple, denormalize
        return "stand-ins (torchvision not importable)"


def load_ml4m(path: Path) -> types.SimpleNamespace:
    fourm = types.ModuleType("fourm")
    fourm.__path__ = [str(path / "fourm")]
    sys.modules["fourm"] = fourm
    utils_from = _utils_module(path)
    vqvae = importlib.import_module("fourm.vq.vqvae")
    vit_models = importlib.import_module("fourm.vq.models.vit_models")
    unet = importlib.import_module("fourm.vq.models.unet.unet")
    uvit = importlib.import_module("fourm.vq.models.uvit")
    scheduling = importlib.import_module("fourm.vq.scheduling")

    enc = SCALED_PRESETS["enc_type"]["vit_tiny_enc"]
    dec = SCALED_PRESETS["dec_type"]["unet_patched_tiny"]

    def vit_tiny_enc(in_channels, patch_size, resolution, patch_proj=True, post_mlp=False, **kwargs):
        return vit_models.ViTEncoder(
            in_channels=in_channels, patch_size=patch_size, resolution=resolution, dim_tokens=enc["dim_tokens"],
            depth=enc["depth"], num_heads=enc["num_heads"], mlp_ratio=enc["mlp_ratio"], qkv_bias=True,
            patch_proj=patch_proj, post_mlp=post_mlp,
        )

    def unet_patched_tiny(**kwargs):
        return unet.PatchedUNetCondCat(
            patch_size=dec["patch_size"], model_channels=dec["model_channels"], num_res_blocks=dec["num_res_blocks"],
            attention_resolutions=list(dec["attention_resolutions"]), channel_mult=tuple(dec["channel_mult"]), **kwargs
        )

    def uvit_factory(settings):
        def make(**kwargs):
            return uvit.UViT(**{**settings, "block_out_channels": tuple(settings["block_out_channels"])}, **kwargs)
        return make

    vit_models.vit_tiny_enc = vit_tiny_enc
    unet.unet_patched_tiny = unet_patched_tiny
    for name, settings in UVIT_PRESETS.items():
        setattr(uvit, name, uvit_factory(settings))
    return types.SimpleNamespace(vqvae=vqvae, scheduling=scheduling, utils_from=utils_from)


def redraw_decoder(decoder: torch.nn.Module, generator: torch.Generator) -> None:
    """Random values for every decoder parameter (ml-4m zero-initialises its output convolutions)."""
    with torch.no_grad():
        for name, param in decoder.named_parameters():
            if not param.requires_grad:  # the UViT's fixed sine-cosine position embedding
                continue
            if param.ndim == 1:
                base = 1.0 if name.endswith("weight") else 0.0  # GroupNorm scales near 1, biases near 0
                param.copy_(base + 0.1 * torch.randn(param.shape, generator=generator))
            else:
                fan_in = param[0].numel()
                param.copy_(torch.randn(param.shape, generator=generator) / math.sqrt(fan_in))


def _uvit_scaling(config: dict) -> str:
    """What a UViT reference scales down, against the published edge tokenizer (``vit_b_enc`` + ``uvit_b_p4_f16``,
    8192 codes)."""
    enc = SCALED_PRESETS["enc_type"]["vit_tiny_enc"]
    dec = UVIT_PRESETS[config["dec_type"]]
    return (f"encoder vit_tiny_enc: width {enc['dim_tokens']}, {enc['depth']} blocks, {enc['num_heads']} heads "
            f"(vit_b_enc: 768, 12, 12); decoder {config['dec_type']}: UNet widths {dec['block_out_channels']} "
            f"with {dec['layers_per_block']} residual block(s) a level (uvit_b_p4_f16: [128, 256], 2), Transformer "
            f"{dec['mid_layers']} blocks of width {dec['mid_dim']}, {dec['mid_num_heads']} heads (12 of 768, 12 "
            f"heads); codebook {config['codebook_size']} codes (8192); kept as published: patch sizes (16 encoder, "
            "4 decoder), two UNet levels, the downsampling before the Transformer, MLP ratio 4, qkv bias, latent "
            "dim 32, the diffusion settings; image_size and conditioning as config_changes say")


def spec(name: str) -> tuple[int, int, int, int, dict, int]:
    """(channels, codebook size, steps, seed, config changes, image size) of a reference tokenizer."""
    if name in UVIT_TOKENIZERS:
        return UVIT_TOKENIZERS[name]
    return (*TOKENIZERS[name], {}, IMAGE_SIZE)


def build(ml4m, name: str) -> tuple[torch.nn.Module, dict]:
    channels, codebook_size, _, seed, changes, _ = spec(name)
    config = dict(
        PUBLISHED, image_size=IMAGE_SIZE, n_channels=channels, enc_type="vit_tiny_enc", dec_type="unet_patched_tiny",
        codebook_size=codebook_size, sync_codebook=False,
    )
    config.update(changes)
    torch.manual_seed(seed)
    model = ml4m.vqvae.DiVAE(**config)
    redraw_decoder(model.decoder, torch.Generator().manual_seed(1000 + seed))
    return model.eval(), config


#: the published DiVAE folders' configurations as rebuilt from ml-4m's training configs
#: (cfgs/default/tokenization/divae/*/ViTB-UNetP4_*_224-448_predx0.yaml; edges: 224-512 and the UViT decoder, from
#: its listed file size, see tests/tokenizers/test_ml4m_published_sizes.py)
PUBLISHED_FOLDERS = {
    "rgb_16k_224-448": dict(n_channels=3, codebook_size=16384, image_size=448, dec_type="unet_patched"),
    "depth_8k_224-448": dict(n_channels=1, codebook_size=8192, image_size=448, dec_type="unet_patched"),
    "normal_8k_224-448": dict(n_channels=3, codebook_size=8192, image_size=448, dec_type="unet_patched"),
    "edge_8k_224-512": dict(n_channels=1, codebook_size=8192, image_size=512, dec_type="uvit_b_p4_f16",
                            conditioning="concat"),
}


def published_keys(ml4m) -> dict:
    """The state-dict keys and shapes of ml-4m's own DiVAE at each published configuration (full size)."""
    out = {}
    for name, changes in PUBLISHED_FOLDERS.items():
        config = dict(PUBLISHED, enc_type="vit_b_enc", sync_codebook=False, **changes)
        model = ml4m.vqvae.DiVAE(**config)
        out[name] = {"class": "DiVAE", "config_json": config,
                     "keys": {k: list(v.shape) for k, v in sorted(model.state_dict().items())}}
        del model
    return out


def ddim_scheduler(ml4m, config: dict):
    return ml4m.scheduling.DDIMScheduler(
        num_train_timesteps=config["num_train_timesteps"], thresholding=config["thresholding"],
        clip_sample=config.get("clip_sample", False), beta_schedule=config["beta_schedule"],
        prediction_type=config["prediction_type"], zero_terminal_snr=config["zero_terminal_snr"],
    )


def environment() -> dict:
    versions = {"python": platform.python_version()}
    for module in ("torch", "diffusers", "huggingface_hub", "einops", "numpy", "safetensors"):
        try:
            versions[module] = importlib.import_module(module).__version__
        except ImportError:
            versions[module] = None
    versions["executable"] = interpreter()
    return versions


#: the ml-4m commit these references were made from, when the checkout is an archive without git metadata
ML4M_COMMIT = "cda590faa3b9f022c28537193d3e1650527646a3"


def ml4m_commit(path: Path) -> str:
    try:
        return subprocess.run(["git", "-C", str(path), "rev-parse", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return os.environ.get("FOURM_REFERENCE_COMMIT", ML4M_COMMIT)


def interpreter() -> str:
    """The Python that runs this, relative to the repository when it lives there (``.venv-ml4m/bin/python``)."""
    exe = Path(sys.executable)
    try:
        return str(exe.relative_to(ROOT))
    except ValueError:
        return str(exe)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reference", default=os.environ.get("FOURM_REFERENCE", "/tmp/ml-4m"))
    parser.add_argument("--out", default=str(OUT))
    parser.add_argument("--only", nargs="*", default=sorted(TOKENIZERS) + sorted(UVIT_TOKENIZERS))
    parser.add_argument("--keys", action="store_true",
                        help="also write divae_keys.json: ml-4m's full-size DiVAEs' keys and shapes")
    args = parser.parse_args()
    from safetensors.torch import save_file

    path = Path(args.reference)
    ml4m = load_ml4m(path)
    torch.set_num_threads(min(2, torch.get_num_threads()))
    if args.keys:
        keys = {"what": "state-dict keys and shapes of ml-4m's DiVAE at the published folders' configurations",
                "ml4m_commit": ml4m_commit(path),
                "command": f"FOURM_REFERENCE={args.reference} {interpreter()} bench/ml4m_divae_reference.py --keys",
                "folders": published_keys(ml4m)}
        (Path(args.out) / "divae_keys.json").write_text(json.dumps(keys, indent=1) + "\n")
    for name in args.only:
        model, config = build(ml4m, name)
        channels, _, steps, seed, _, image_size = spec(name)
        folder = Path(args.out) / f"divae_{name}"
        folder.mkdir(parents=True, exist_ok=True)
        model.save_pretrained(folder, config=config)
        reloaded = ml4m.vqvae.DiVAE.from_pretrained(str(folder)).eval()  # what a user of the folder gets

        batch = BATCH if image_size == IMAGE_SIZE else 1  # one 224-px image keeps the reference small
        images = torch.rand(batch, channels, image_size, image_size, generator=torch.Generator().manual_seed(seed))
        images = images * 2 - 1
        with torch.no_grad():
            codes = reloaded.tokenize(images)
            noise_seed = 100 + seed
            ddpm = reloaded.decode_tokens(codes, timesteps=steps, generator=torch.Generator().manual_seed(noise_seed),
                                          image_size=image_size, verbose=False)
            ddim = reloaded.decode_tokens(codes, timesteps=steps, scheduler=ddim_scheduler(ml4m, config),
                                          generator=torch.Generator().manual_seed(noise_seed), image_size=image_size,
                                          verbose=False, scheduler_timesteps_mode="trailing")
        save_file(
            {"images": images.contiguous(), "codes": codes.contiguous(), "decode_ddpm": ddpm.contiguous(),
             "decode_ddim": ddim.contiguous()},
            str(folder / "reference.safetensors"),
        )
        manifest = {
            "what": f"ml-4m's DiVAE ({name}), random weights, scaled down; its codes and decodes",
            "ml4m_commit": ml4m_commit(path),
            "command": f"FOURM_REFERENCE={args.reference} {interpreter()} bench/ml4m_divae_reference.py",
            "environment": environment(),
            "fourm_utils_from": ml4m.utils_from,
            "scaled_presets": SCALED_PRESETS,
            "published_shapes": {"rgb": "vit_b_enc + unet_patched, 16384 codes, 3 channels",
                                 "depth": "vit_b_enc + unet_patched, 8192 codes, 1 channel",
                                 "edge": "vit_b_enc + unet_patched, 8192 codes, 1 channel",
                                 "edge_uvit": "4M_tokenizers_edge_8k_224-512: vit_b_enc + uvit_b_p4_f16 (concat), "
                                              "image_size 512, 8192 codes, 1 channel",
                                 "uvit_xattn": "none published: ml-4m's UViT with codes by cross-attention and "
                                               "long skips"}[name],
            "scaled": (_uvit_scaling(config) if name in UVIT_TOKENIZERS else
                       "encoder vit_tiny_enc, decoder unet_patched_tiny, smaller codebook, 64-px images"),
            "config_changes": spec(name)[4],
            "image_size": image_size,
            "steps": steps,
            "noise_seed": noise_seed,
            "decodes": {
                "decode_ddpm": "model.decode_tokens(codes, timesteps=steps, image_size=image_size, "
                               "generator=torch.Generator().manual_seed(noise_seed)): the DiVAE's own pipeline "
                               "(scheduler 'ddpm', its default)",
                "decode_ddim": "the same with scheduler=fourm.vq.scheduling.DDIMScheduler(<the config's schedule>), "
                               "scheduler_timesteps_mode='trailing'",
                "noise": "not stored: torch.randn(shape, generator=torch.Generator().manual_seed(noise_seed)) is "
                         "the pipelines' first draw (the DDPM steps then draw theirs from the same generator)",
            },
            "images": f"torch.rand(B, C, H, W, generator=manual_seed({seed})) * 2 - 1",
            "codes": "model.tokenize(images)",
        }
        (folder / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
        size = sum(p.stat().st_size for p in folder.iterdir())
        print(f"{name}: {folder} ({size / 1e6:.2f} MB), codes {tuple(codes.shape)}, decode range "
              f"[{ddpm.min():.3f}, {ddpm.max():.3f}]")


if __name__ == "__main__":
    main()
