"""Reference outputs of apple/ml-4m's own VQ tokenizer code (issue 56), for the port in
``fourm_kfp.tokenizers.ml4m`` to be checked against: run in ml-4m's environment (``bash bench/ml4m_env.sh``).

    FOURM_REFERENCE=/tmp/ml-4m .venv-ml4m/bin/python bench/ml4m_tokenizer_reference.py \\
        [--output tests/tokenizers/ml4m_reference] [--commit cda590f]

For each tokenizer of :data:`TOKENIZERS` (4M-21's VQ-VAEs: semseg, CLIP-B/16, DINOv2-B/14, DINOv2-B/14 global,
human poses; and the encoder half, ml-4m's ``VQ``, of the rgb DiVAE), it builds ml-4m's model (``VQVAE`` or ``VQ``)
in the published configuration's shape, scaled down so that it runs on a CPU and its weights fit in the repository
(each entry says what was scaled: width, depth, codebook size, channels, resolution; never the kind of layer),
sets every parameter to seeded random values at a trained network's scale (the position tables stay ml-4m's
sine-cosine ones), saves it with ml-4m's ``save_pretrained`` (``folder/``: ``config.json`` + ``model.safetensors``
+ the hub mixin's ``README.md``), tokenizes a seeded batch and decodes the codes with ml-4m's ``tokenize`` and
``decode_tokens``: ``inputs.npy``, ``codes.npy``, ``decoded.npy`` (a ``VQ`` has no decoder: no ``decoded.npy``).
The scaled ViTs are a preset ml-4m lacks (``vit_tiny_enc`` / ``vit_tiny_dec``, :data:`TINY`), added to ml-4m's
``vit_models`` module and built by ml-4m's own ``ViTEncoder`` / ``ViTDecoder``; the port has the same preset.

Also written: ``keys.json``, the state-dict keys and shapes of ml-4m's models at the *published* sizes (ViT-B,
8192-code codebooks, the 1024-wide MLPs) with the ``config.json`` its ``save_pretrained`` would write for them
(configs rebuilt from ml-4m's training configs, ``cfgs/default/tokenization``, and ``modality_info``: the Hugging
Face files are not reachable here); ``conventions.npz``, fixed inputs through ml-4m's own modality transforms
(``fourm.data.modality_transforms``: rgb, depth, normals, semseg); and ``manifest.json`` (the ml-4m commit, the
command, the environment, what was scaled).

ml-4m's package ``__init__`` files import far more than ``fourm/vq`` needs (``fourm/__init__``: nothing needed;
``fourm/utils/__init__``: timm, logging, distributed and checkpoint helpers; ``fourm/vq/__init__``: its hub loader).
:func:`load_vq` registers ``fourm``, ``fourm.utils`` and ``fourm.vq`` as packages without running those files,
gives ``fourm.utils`` the two names the VQ code imports from it (``denormalize``, ``to_2tuple``, from the real
``fourm.utils.misc``), and imports the real ``fourm.vq.vqvae`` (which imports ml-4m's quantizers, ViT, MLP, UNet,
UViT, ControlNet and scheduler modules, and diffusers). torchvision's ``_meta_registrations`` is an empty module
(see ``bench/ml4m_env.sh``). :data:`STAND_INS` lists what was stubbed; the manifest records it.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import shutil
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import torch

#: the scaled-down ViT preset, ``vit_tiny_enc`` / ``vit_tiny_dec`` (``fourm_kfp.tokenizers.ml4m.vit.PRESETS``)
TINY = {"dim_tokens": 16, "depth": 2, "num_heads": 2, "mlp_ratio": 4}
STAND_INS: list[str] = []
BATCH = 4
SEED = 56

# The published configurations (constructor arguments as ml-4m's run_training_vqvae.py / run_training_divae.py
# pass them for the 4M-21 tokenizers; ``patch_proj`` is off for feature maps and sequences, ``image_size`` is a
# 224-448 tokenizer's largest training size), and each reference's scaled one (what changes is listed in `scaled`).
_VIT = {"enc_type": "vit_b_enc", "dec_type": "vit_b_dec", "post_mlp": True, "quant_type": "lucid",
        "latent_dim": 32, "norm_codes": True, "num_codebooks": 1, "sync_codebook": False}
_MLP = {"enc_type": "BottleneckMLP/B_6-Wi_1024", "dec_type": "BottleneckMLP/B_6-Wi_1024", "patch_proj": False,
        "quant_type": "memcodes", "latent_dim": 1024, "num_codebooks": 8, "sync_codebook": False}
TOKENIZERS = {
    "semseg": {
        "hf": "EPFL-VILAB/4M_tokenizers_semseg_4k_224-448", "class": "VQVAE",
        "published": {**_VIT, "image_size": 448, "n_channels": 64, "n_labels": 134, "patch_size": 16,
                      "patch_proj": True, "codebook_size": 4096},
        "scaled": {"enc_type": "vit_tiny_enc", "dec_type": "vit_tiny_dec", "n_channels": 16, "patch_size": 2,
                   "image_size": 16, "codebook_size": 256},
        "input": ("ids", (8, 8)), "batch": 2,
    },
    "clip": {
        "hf": "EPFL-VILAB/4M_tokenizers_CLIP-B16_8k_224-448", "class": "VQVAE",
        "published": {**_VIT, "image_size": 448, "n_channels": 512, "patch_size": 16, "patch_proj": False,
                      "codebook_size": 8192},
        "scaled": {"enc_type": "vit_tiny_enc", "dec_type": "vit_tiny_dec", "n_channels": 64, "image_size": 128,
                   "codebook_size": 256},
        "input": ("feature_map", (4, 4)),
    },
    "dinov2": {
        "hf": "EPFL-VILAB/4M_tokenizers_DINOv2-B14_8k_224-448", "class": "VQVAE",
        "published": {**_VIT, "image_size": 448, "n_channels": 768, "patch_size": 14, "patch_proj": False,
                      "codebook_size": 8192},
        "scaled": {"enc_type": "vit_tiny_enc", "dec_type": "vit_tiny_dec", "n_channels": 48, "image_size": 112,
                   "codebook_size": 256},
        "input": ("feature_map", (4, 4)),
    },
    "dinov2_global": {
        "hf": "EPFL-VILAB/4M_tokenizers_DINOv2-B14-global_8k_16_224", "class": "VQVAE",
        "published": {**_MLP, "image_size": 224, "n_channels": 768, "patch_size": 14, "codebook_size": 8192},
        "scaled": {"enc_type": "BottleneckMLP/B_2-Wi_16", "dec_type": "BottleneckMLP/B_2-Wi_16", "n_channels": 48,
                   "latent_dim": 64, "codebook_size": 256},
        "input": ("feature_map", (1, 1)),
    },
    "human_poses": {
        "hf": "EPFL-VILAB/4M_tokenizers_human-poses_1k_8", "class": "VQVAE",
        "published": {**_MLP, "image_size": 224, "n_channels": 207, "patch_size": 16, "codebook_size": 1024},
        "scaled": {"enc_type": "BottleneckMLP/B_2-Wi_16", "dec_type": "BottleneckMLP/B_2-Wi_16", "latent_dim": 64,
                   "codebook_size": 128},
        "input": ("feature_map", (1, 1)),
    },
    "rgb_encoder": {
        "hf": "EPFL-VILAB/4M_tokenizers_rgb_16k_224-448 (its encoder and quantizer: ml-4m's VQ)", "class": "VQ",
        "published": {"enc_type": "vit_b_enc", "post_mlp": True, "quant_type": "lucid", "latent_dim": 32,
                      "norm_codes": True, "image_size": 448, "n_channels": 3, "patch_size": 16,
                      "codebook_size": 16384, "sync_codebook": False},
        "scaled": {"enc_type": "vit_tiny_enc", "image_size": 64, "patch_size": 8, "codebook_size": 256},
        "input": ("rgb", (32, 32)),
    },
}
#: published configurations whose keys are listed but that have no scaled reference (the same code paths as one
#: that has: ImageBind's are DINOv2's with 1280 channels; depth, normal and edge DiVAEs' encoders are rgb's)
KEYS_ONLY = {
    "imagebind": ("VQVAE", {**_VIT, "image_size": 448, "n_channels": 1280, "patch_size": 14, "patch_proj": False,
                            "codebook_size": 8192}),
    "imagebind_global": ("VQVAE", {**_MLP, "image_size": 224, "n_channels": 1280, "patch_size": 14,
                                   "codebook_size": 8192}),
    "depth_encoder": ("VQ", {**{k: v for k, v in _VIT.items() if k != "dec_type"}, "image_size": 448,
                             "n_channels": 1, "patch_size": 16, "codebook_size": 8192}),
    "normal_encoder": ("VQ", {**{k: v for k, v in _VIT.items() if k != "dec_type"}, "image_size": 448,
                              "n_channels": 3, "patch_size": 16, "codebook_size": 8192}),
    "edge_encoder": ("VQ", {**{k: v for k, v in _VIT.items() if k != "dec_type"}, "image_size": 512,
                            "n_channels": 1, "patch_size": 16, "codebook_size": 8192}),
}


def _package(name: str, path: Path) -> None:
    package = types.ModuleType(name)
    package.__path__ = [str(path / name.replace(".", "/"))]
    sys.modules[name] = package
    STAND_INS.append(f"{name} (package registered, its __init__.py not run)")


def load_vq(path: Path) -> types.SimpleNamespace:
    """ml-4m's ``fourm.vq.vqvae`` and friends from the checkout at ``path`` (see the module docstring)."""
    if "torchvision" not in sys.modules:
        sys.modules["torchvision._meta_registrations"] = types.ModuleType("torchvision._meta_registrations")
        STAND_INS.append("torchvision._meta_registrations (empty: the CUDA wheel's C++ ops do not load on CPU)")
    for name in ("fourm", "fourm.utils", "fourm.vq", "fourm.data"):
        _package(name, path)
    misc = importlib.import_module("fourm.utils.misc")
    utils = sys.modules["fourm.utils"]
    utils.denormalize, utils.to_2tuple = misc.denormalize, misc.to_2tuple
    vqvae = importlib.import_module("fourm.vq.vqvae")
    vit_models = importlib.import_module("fourm.vq.models.vit_models")

    def tiny_enc(in_channels, patch_size, resolution, patch_proj=True, post_mlp=False, **_):
        return vit_models.ViTEncoder(in_channels=in_channels, patch_size=patch_size, resolution=resolution,
                                     qkv_bias=True, patch_proj=patch_proj, post_mlp=post_mlp, **TINY)

    def tiny_dec(out_channels, patch_size, resolution, patch_proj=True, post_mlp=False, out_conv=False, **_):
        return vit_models.ViTDecoder(out_channels=out_channels, patch_size=patch_size, resolution=resolution,
                                     qkv_bias=True, patch_proj=patch_proj, post_mlp=post_mlp, out_conv=out_conv,
                                     **TINY)

    vit_models.vit_tiny_enc, vit_models.vit_tiny_dec = tiny_enc, tiny_dec
    return types.SimpleNamespace(vqvae=vqvae, vit_models=vit_models, path=path)


def randomise(model: torch.nn.Module, seed: int) -> None:
    """Every parameter and the codebook at a trained network's scale: weights N(0, 1/fan_in), biases N(0, 0.1),
    norm weights 1 + 0.2 N, embeddings, codebooks and Memcodes' codes N(0, 1) (a lucid codebook is left
    un-normalised: ml-4m quantizes to the stored vector); the position tables and the codebook's bookkeeping
    buffers (``initted``, ``cluster_size``) as ml-4m made them."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, value in model.state_dict().items():
            leaf = name.rsplit(".", 1)[-1]
            if leaf in ("pos_emb", "initted", "cluster_size") or not value.is_floating_point():
                continue
            noise = torch.randn(value.shape, generator=generator)
            if leaf == "bias":
                new = 0.1 * noise
            elif "norm" in name and value.dim() == 1:
                new = 1.0 + 0.2 * noise
            elif leaf in ("embed", "embed_avg", "codes") or name.startswith("cls_emb"):
                new = noise
            elif leaf == "gamma":
                new = 0.5 * noise
            elif name.endswith(("to_k.weight", "to_v.weight")):
                new = noise / value.shape[1] ** 0.5
            else:
                new = noise / float(np.prod(value.shape[1:])) ** 0.5
            value.copy_(new)


def make_input(kind: str, grid: tuple[int, int], config: dict, rng: np.random.Generator,
               batch: int = BATCH) -> np.ndarray:
    if kind == "ids":  # semseg class ids as ml-4m's SemsegTransform gives them: 0 (no class) .. n_labels - 1
        return rng.integers(0, config["n_labels"], size=(batch, *grid)).astype(np.int64)
    if kind == "rgb":  # pixels in [-1, 1] (Inception mean/std), as the tokenizers' RGBTransform gives them
        return (rng.integers(0, 256, size=(batch, 3, *grid)) / 255.0 * 2 - 1).astype(np.float32)
    # a teacher's feature map (B x C x N_H x N_W; B x C x 1 x 1 for a global feature or a pose vector)
    return rng.standard_normal((batch, config["n_channels"], *grid)).astype(np.float32)


def build(ref: types.SimpleNamespace, cls: str, config: dict) -> torch.nn.Module:
    return getattr(ref.vqvae, cls)(**config).eval()


def reference(ref: types.SimpleNamespace, name: str, entry: dict, out: Path, seed: int) -> dict:
    config = {**entry["published"], **entry["scaled"]}
    torch.manual_seed(seed)
    model = build(ref, entry["class"], config)
    randomise(model, seed)
    folder = out / name / "folder"
    if folder.exists():
        shutil.rmtree(folder)
    model.save_pretrained(str(folder))
    reloaded = getattr(ref.vqvae, entry["class"]).from_pretrained(str(folder)).eval()  # what a user loads
    rng = np.random.default_rng(seed)
    inputs = make_input(*entry["input"], config, rng, entry.get("batch", BATCH))
    x = torch.from_numpy(inputs)
    with torch.no_grad():
        codes = reloaded.tokenize(x)
        np.save(out / name / "inputs.npy", inputs)
        np.save(out / name / "codes.npy", codes.numpy().astype(np.int64))
        decoded = None
        if entry["class"] != "VQ":
            decoded = reloaded.decode_tokens(codes).float().numpy()
            np.save(out / name / "decoded.npy", decoded)
    return {"hf_folder": entry["hf"], "class": entry["class"], "published": entry["published"],
            "scaled": entry["scaled"], "input": {"kind": entry["input"][0], "shape": list(inputs.shape),
                                                 "dtype": str(inputs.dtype)},
            "codes_shape": list(codes.shape), "distinct_codes": int(codes.unique().numel()),
            "decoded_shape": None if decoded is None else list(decoded.shape),
            "weights_bytes": (folder / "model.safetensors").stat().st_size}


#: ml-4m's quantizers at the published codebook sizes, with seeded codebooks and latents that both sides regenerate
#: (``torch.randn`` from a seeded generator, in this order: codebook (or Memcodes' codes, then to_k, to_v), then
#: latents); only the codes are stored. The argmax over 4096..16384 codes is where near-ties live.
FULL_QUANTIZERS = {
    "lucid_16384": {"quant_type": "lucid", "codebook_size": 16384, "latent_dim": 32, "num_codebooks": 1,
                    "latents": [4, 32, 14, 14], "seed": 1},
    "lucid_8192": {"quant_type": "lucid", "codebook_size": 8192, "latent_dim": 32, "num_codebooks": 1,
                   "latents": [4, 32, 14, 14], "seed": 2},
    "lucid_4096": {"quant_type": "lucid", "codebook_size": 4096, "latent_dim": 32, "num_codebooks": 1,
                   "latents": [4, 32, 14, 14], "seed": 3},
    "memcodes_8x8192": {"quant_type": "memcodes", "codebook_size": 8192, "latent_dim": 1024, "num_codebooks": 8,
                        "latents": [64, 1024, 1, 1], "seed": 4},
    "memcodes_8x1024": {"quant_type": "memcodes", "codebook_size": 1024, "latent_dim": 1024, "num_codebooks": 8,
                        "latents": [64, 1024, 1, 1], "seed": 5},
}


def full_size_tensors(spec: dict) -> dict[str, torch.Tensor]:
    """The seeded tensors of a :data:`FULL_QUANTIZERS` entry (the port's tests regenerate the same)."""
    generator = torch.Generator().manual_seed(spec["seed"])
    k, d, h = spec["codebook_size"], spec["latent_dim"], spec["num_codebooks"]
    if spec["quant_type"] == "lucid":
        out = {"embed": torch.nn.functional.normalize(torch.randn(k, d, generator=generator), dim=-1)}
    else:
        out = {"codes": torch.randn(h, k, d // h, generator=generator),
               "to_k": torch.randn(h, d // h, d // h, generator=generator) / (d // h) ** 0.5,
               "to_v": torch.randn(h, d // h, d // h, generator=generator) / (d // h) ** 0.5}
    out["latents"] = torch.randn(spec["latents"], generator=generator)
    return out


def full_size_quantizers(ref: types.SimpleNamespace, out: Path) -> dict:
    quantizers = importlib.import_module("fourm.vq.quantizers")
    folder = out / "quantizers"
    folder.mkdir(exist_ok=True)
    table = {}
    for name, spec in FULL_QUANTIZERS.items():
        tensors = full_size_tensors(spec)
        if spec["quant_type"] == "lucid":
            q = quantizers.VectorQuantizerLucid(dim=spec["latent_dim"], codebook_size=spec["codebook_size"],
                                                codebook_dim=spec["latent_dim"], heads=1, use_cosine_sim=True,
                                                sync_codebook=False).eval()
            q._codebook.embed.copy_(tensors["embed"])
        else:
            q = quantizers.Memcodes(dim=spec["latent_dim"], codebook_size=spec["codebook_size"],
                                    heads=spec["num_codebooks"]).eval()
            with torch.no_grad():
                q.codes.copy_(tensors["codes"])
                q.to_k.weight.copy_(tensors["to_k"])
                q.to_v.weight.copy_(tensors["to_v"])
        with torch.no_grad():
            _, _, codes = q(tensors["latents"])
        np.save(folder / f"{name}_codes.npy", codes.numpy().astype(np.int64))
        table[name] = {**spec, "codes_shape": list(codes.shape),
                       "checksums": {k: float(v.double().sum()) for k, v in tensors.items()}}
    return table


def published_keys(ref: types.SimpleNamespace) -> dict:
    """ml-4m's state-dict keys and shapes, and its ``config.json``, for each published configuration."""
    table = {}
    entries = {name: (e["class"], e["published"], e["hf"]) for name, e in TOKENIZERS.items()}
    entries.update({name: (cls, cfg, None) for name, (cls, cfg) in KEYS_ONLY.items()})
    for name, (cls, config, hf) in entries.items():
        torch.manual_seed(0)
        model = build(ref, cls, config)
        table[name] = {"class": cls, "hf_folder": hf, "config_json": _jsonable(model._hub_mixin_config),
                       "keys": {k: list(v.shape) for k, v in model.state_dict().items()}}
        del model
    return table


def _jsonable(config) -> dict:
    return json.loads(json.dumps(dict(config), default=str))


def conventions(path: Path, seed: int) -> dict[str, np.ndarray]:
    """Fixed inputs through ml-4m's own modality transforms (``fourm.data.modality_transforms``)."""
    from PIL import Image

    transforms = importlib.import_module("fourm.data.modality_transforms")
    rng = np.random.default_rng(seed)
    rgb = rng.integers(0, 256, size=(6, 5, 3)).astype(np.uint8)
    depth = rng.integers(0, 2 ** 16, size=(7, 6)).astype(np.uint16)
    depth[0, :3] = 0  # invalid pixels, as a depth map has them
    normal = rng.integers(0, 256, size=(5, 4, 3)).astype(np.uint8)
    semseg = rng.integers(0, 133, size=(6, 7)).astype(np.uint8)
    semseg[1, :4] = 255  # COCO's unlabelled id
    tok_rgb = transforms.RGBTransform(imagenet_default_mean_and_std=False)  # MODALITY_TRANSFORMS_DIVAE['rgb']
    fm_rgb = transforms.RGBTransform(imagenet_default_mean_and_std=True)  # MODALITY_TRANSFORMS['rgb']
    seg = transforms.SemsegTransform(shift_idx_by_one=True)
    return {
        "rgb_in": rgb, "rgb_tokenizer": tok_rgb.postprocess(tok_rgb.preprocess(Image.fromarray(rgb))).numpy(),
        "rgb_fm": fm_rgb.postprocess(fm_rgb.preprocess(Image.fromarray(rgb))).numpy(),
        "depth_in": depth,
        "depth": transforms.DepthTransform(standardize_depth=True).postprocess(Image.fromarray(depth)).numpy(),
        "normal_in": normal,
        "normal": transforms.NormalTransform(standardize_surface_normals=False).postprocess(
            Image.fromarray(normal)).numpy(),
        "semseg_in": semseg,
        "semseg": seg.postprocess(seg.preprocess(Image.fromarray(semseg, mode="P"))).numpy(),
    }


def _commit(path: Path, given: str | None) -> str:
    if given:
        return given
    try:
        return subprocess.run(["git", "-C", str(path), "rev-parse", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown (pass --commit)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reference", default=os.environ.get("FOURM_REFERENCE", "/tmp/ml-4m"))
    parser.add_argument("--output", default=str(Path(__file__).resolve().parent.parent
                                                / "tests/tokenizers/ml4m_reference"))
    parser.add_argument("--commit", help="the ml-4m commit of the checkout (read with git when it is a clone)")
    parser.add_argument("--only", nargs="*", help="tokenizer names (default: all)")
    args = parser.parse_args()
    path = Path(args.reference)
    ref = load_vq(path)
    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)  # the same reductions whatever the machine
    names = args.only or list(TOKENIZERS)
    manifest_path = out / "manifest.json"
    previous = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
    results = dict(previous.get("tokenizers", {}))
    for index, name in enumerate(TOKENIZERS):
        if name in names:
            results[name] = reference(ref, name, TOKENIZERS[name], out, SEED + index)
            print(f"{name}: {results[name]['codes_shape']} codes, {results[name]['distinct_codes']} distinct, "
                  f"weights {results[name]['weights_bytes']} bytes", flush=True)
    (out / "keys.json").write_text(json.dumps(published_keys(ref), indent=1) + "\n")
    np.savez(out / "conventions.npz", **conventions(path, SEED))
    import diffusers
    import einops
    import huggingface_hub
    import safetensors
    manifest = {
        "what": "apple/ml-4m's own VQ tokenizer code: scaled-down random tokenizers saved with save_pretrained, "
                "their codes and decoded outputs on a seeded batch; keys.json: the published sizes' keys; "
                "conventions.npz: ml-4m's modality transforms on fixed inputs",
        "ml4m_commit": _commit(path, args.commit),
        "command": "FOURM_REFERENCE=/tmp/ml-4m .venv-ml4m/bin/python bench/ml4m_tokenizer_reference.py"
                   + (f" --commit {args.commit}" if args.commit else ""),
        "environment": {"python": platform.python_version(), "platform": platform.platform(),
                        "torch": torch.__version__, "diffusers": diffusers.__version__,
                        "huggingface_hub": huggingface_hub.__version__, "einops": einops.__version__,
                        "numpy": np.__version__, "safetensors": safetensors.__version__, "threads": 1,
                        "made_by": "bash bench/ml4m_env.sh"},
        "stand_ins": STAND_INS,
        "scaled_vit_preset": {"vit_tiny": TINY},
        "batch": BATCH, "seed": SEED,
        "tokenizers": results,
        "full_size_quantizers": full_size_quantizers(ref, out),
    }
    manifest_path.write_text(json.dumps(manifest, indent=1) + "\n")
    total = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    print(f"wrote {out} ({total} bytes)")


if __name__ == "__main__":
    main()
