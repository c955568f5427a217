"""Reference CLIP and DINOv2 feature maps made by apple/ml-4m's own code (issue 64), for the ``hf_clip`` and
``hf_dinov2`` labelers to be checked against: run in ml-4m's environment (``bash bench/ml4m_env.sh``).

    FOURM_REFERENCE=/tmp/ml-4m DINOV2_REFERENCE=/path/to/facebookresearch/dinov2 \\
        .venv-ml4m/bin/python bench/ml4m_feature_reference.py [--output tests/labelers/ml4m_feature_maps] \\
        [--commit cda590f] [--dinov2-commit <sha>]

What ml-4m does to make the maps its CLIP-B/16 and DINOv2-B/14 tokenizers were trained on (``run_training_vqvae.py``
with ``cfgs/default/tokenization/vqvae/{CLIP-B16,DINOv2-B14}/*.yaml``; ``save_vq_tokens.py`` runs the same
steps at pre-tokenization), done here with ml-4m's own classes:

* the photo's centred square, ``fourm.data.image_augmenter.CenterCropImageAugmenter`` (offsets floored), resized to
  224 px by ``fourm.data.modality_transforms.RGBTransform.image_augment`` with ``resample_mode=None`` (both
  scripts' default: Pillow's bicubic), and ``RGBTransform(imagenet_default_mean_and_std=True).postprocess``
  (ImageNet mean and std, as the tokenizers' training configs set it; ``save_vq_tokens.py`` itself takes
  ``MODALITY_TRANSFORMS_DIVAE['rgb']``, Inception's 0.5 / 0.5, which the published tokenizers never saw);
* CLIP: ml-4m's OpenAI-CLIP ``VisionTransformer`` (``fourm/utils/clip/model.py``; ml-4m loads ``ViT-B/16`` into
  it), ``forward(x, return_final_tokens_no_cls=True)``: ``ln_post(x)[:, 1:] @ proj``;
* DINOv2: facebookresearch/dinov2's ``DinoVisionTransformer`` (what ml-4m's ``torch.hub.load('facebookresearch/
  dinov2', 'dinov2_vitb14')`` builds: a 518 px position table resized to the input's grid, ``interpolate_offset``
  0.1), ``forward(x, is_training=True)['x_norm_patchtokens']``;
* both laid out as ml-4m's tokenizers take them: ``rearrange(t, 'b (nh nw) d -> b d nh nw')``.

The networks are the published ones' kind of layer at a small width and depth (:data:`CLIP`, :data:`DINOV2`; 224 px
input, so 14 x 14 and 16 x 16 grids as published), with seeded random weights at a trained network's scale (the
tokenizer reference's :func:`ml4m_tokenizer_reference.randomise`). The photos (:data:`PHOTOS`, from scikit-image's
sample images) are none of them square, and are saved as PNG so the test reads exactly what was put through.

Also a DINOv2 with registers (:data:`DINOV2_REG`, the hub's ``dinov2_vitb14_reg`` arguments: not an ml-4m teacher,
but what ``hf_dinov2`` also reads) on the same inputs.

Written to ``--output``: ``<photo>.png``, ``clip.safetensors`` / ``dinov2.safetensors`` / ``dinov2_reg.safetensors``
(the networks' state dicts under ml-4m's and DINOv2's own names), ``maps.safetensors`` (``clip/<photo>``,
``dinov2/<photo>``, ``dinov2_reg/<photo>``: ``D x nh x nw`` float32) and ``manifest.json`` (commits, command,
environment, configs).
"""

from __future__ import annotations

import argparse
import functools
import importlib
import json
import os
import platform
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ml4m_tokenizer_reference import STAND_INS, _commit, _package, load_vq, randomise  # noqa: E402

SIDE = 224  # ml-4m's --input_size for both teachers
SEED = 64
#: ml-4m's CLIP VisionTransformer: ViT-B/16's layers at width 32, depth 2 (published: 768, 12, 12 heads, 512 out)
CLIP = {"input_resolution": 224, "patch_size": 16, "width": 32, "layers": 2, "heads": 2, "output_dim": 16}
#: DINOv2's hub ``dinov2_vitb14`` arguments (``_make_dinov2_model``'s defaults) at width 32, depth 2
#: (published: 768, 12, 12 heads)
DINOV2 = {"img_size": 518, "patch_size": 14, "init_values": 1.0, "ffn_layer": "mlp", "block_chunks": 0,
          "num_register_tokens": 0, "interpolate_antialias": False, "interpolate_offset": 0.1,
          "embed_dim": 32, "depth": 2, "num_heads": 2, "mlp_ratio": 4}
#: DINOv2's hub ``dinov2_vitb14_reg`` arguments at the same scale (not an ml-4m teacher: it checks ``hf_dinov2`` on
#: a registers model against DINOv2's own code, on ml-4m's inputs)
DINOV2_REG = {**DINOV2, "num_register_tokens": 4, "interpolate_antialias": True, "interpolate_offset": 0.0}
#: name → (scikit-image sample, (width, height) it is resized to before being saved): none square; two with a
#: shorter side of 224 and an even margin (prepare-data at 224 only crops them), two that ml-4m resizes (down and
#: up) with an odd margin (the crop's offset floored)
PHOTOS = {"wide_224": ("chelsea", (338, 224)), "tall_224": ("rocket", (224, 336)),
          "wide_odd": ("coffee", (451, 300)), "tall_small": ("astronaut", (150, 201))}


def load_ml4m_parts(path: Path) -> dict:
    """ml-4m's image augmenter, modality transforms and CLIP model module (the tokenizer reference's loader registers
    the packages; ``fourm.utils.clip``'s ``__init__`` would import its text tokenizer's dependencies)."""
    load_vq(path)
    _package("fourm.utils.clip", path)
    return {"augmenter": importlib.import_module("fourm.data.image_augmenter"),
            "transforms": importlib.import_module("fourm.data.modality_transforms"),
            "clip": importlib.import_module("fourm.utils.clip.model")}


def load_dinov2(path: Path):
    sys.path.insert(0, str(path))
    vits = importlib.import_module("dinov2.models.vision_transformer")
    layers = importlib.import_module("dinov2.layers")
    return functools.partial(vits.DinoVisionTransformer, block_fn=functools.partial(
        layers.NestedTensorBlock, attn_class=layers.MemEffAttention))


def save_photos(out: Path) -> dict[str, Path]:
    from PIL import Image
    from skimage import data

    paths = {}
    for name, (sample, size) in PHOTOS.items():
        image = Image.fromarray(getattr(data, sample)()).convert("RGB").resize(size, Image.Resampling.LANCZOS)
        paths[name] = out / f"{name}.png"
        image.save(paths[name], optimize=True)
    return paths


def ml4m_input(parts: dict, path: Path) -> torch.Tensor:
    """``SaveVQDataset.__getitem__``'s steps for one centre crop, with the training configs' normalisation."""
    from PIL import Image

    image = Image.open(path).convert("RGB")
    augmenter = parts["augmenter"].CenterCropImageAugmenter(target_size=SIDE, hflip=0.0, main_domain="rgb")
    crop, flip, _, target, _ = augmenter({"rgb": image}, None)
    transform = parts["transforms"].RGBTransform(imagenet_default_mean_and_std=True)
    x = transform.preprocess(image.copy())
    x = transform.image_augment(x, crop, flip, None, (SIDE, SIDE), None, None)
    return transform.postprocess(x)


def as_grid(tokens: torch.Tensor, grid: int) -> torch.Tensor:
    from einops import rearrange

    return rearrange(tokens, "b (nh nw) d -> b d nh nw", nh=grid, nw=grid)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reference", default=os.environ.get("FOURM_REFERENCE", "/tmp/ml-4m"))
    parser.add_argument("--dinov2", default=os.environ.get("DINOV2_REFERENCE", "/tmp/dinov2-src"),
                        help="a facebookresearch/dinov2 checkout (what torch.hub fetches for ml-4m)")
    parser.add_argument("--output", default=str(Path(__file__).resolve().parent.parent
                                                / "tests/labelers/ml4m_feature_maps"))
    parser.add_argument("--commit", help="the ml-4m commit of the checkout (read with git when it is a clone)")
    parser.add_argument("--dinov2-commit", help="the dinov2 commit of its checkout (read with git when a clone)")
    args = parser.parse_args()
    from safetensors.torch import save_file

    torch.set_num_threads(1)
    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    parts = load_ml4m_parts(Path(args.reference))
    clip = parts["clip"].VisionTransformer(**CLIP).eval()
    randomise(clip, SEED)
    dinov2 = load_dinov2(Path(args.dinov2))(**DINOV2).eval()
    randomise(dinov2, SEED + 1)
    dinov2_reg = load_dinov2(Path(args.dinov2))(**DINOV2_REG).eval()
    randomise(dinov2_reg, SEED + 3)
    with torch.no_grad():  # the tokenizer reference's rule gives a [1, N, D] table a tiny scale: a ViT's instead
        for index, model in enumerate((dinov2, dinov2_reg)):
            model.pos_embed.copy_(0.5 * torch.randn(model.pos_embed.shape, generator=torch.Generator().manual_seed(
                SEED + 10 + index)))
    photos = save_photos(out)
    maps = {}
    with torch.no_grad():
        batch = torch.stack([ml4m_input(parts, path) for path in photos.values()])
        clip_maps = as_grid(clip(batch, return_final_tokens_no_cls=True), SIDE // CLIP["patch_size"])
        dino_maps = as_grid(dinov2(batch, is_training=True)["x_norm_patchtokens"], SIDE // DINOV2["patch_size"])
        reg_maps = as_grid(dinov2_reg(batch, is_training=True)["x_norm_patchtokens"], SIDE // DINOV2["patch_size"])
    for index, name in enumerate(photos):
        maps[f"clip/{name}"] = clip_maps[index].contiguous()
        maps[f"dinov2/{name}"] = dino_maps[index].contiguous()
        maps[f"dinov2_reg/{name}"] = reg_maps[index].contiguous()
    for name, model in (("clip", clip), ("dinov2", dinov2), ("dinov2_reg", dinov2_reg)):
        save_file({k: v.contiguous() for k, v in model.state_dict().items()}, out / f"{name}.safetensors")
    save_file(maps, out / "maps.safetensors")
    import einops
    import PIL
    import safetensors
    import skimage

    command = ("FOURM_REFERENCE=/tmp/ml-4m DINOV2_REFERENCE=/tmp/dinov2-src .venv-ml4m/bin/python "
               "bench/ml4m_feature_reference.py"
               + (f" --commit {args.commit}" if args.commit else "")
               + (f" --dinov2-commit {args.dinov2_commit}" if args.dinov2_commit else ""))
    manifest = {
        "what": "CLIP and DINOv2 feature maps as apple/ml-4m computes the inputs of its CLIP-B/16 and DINOv2-B/14 "
                "tokenizers (ml-4m's centre crop, Pillow bicubic to 224 px, ImageNet mean/std; ml-4m's CLIP "
                "VisionTransformer, DINOv2's DinoVisionTransformer), scaled-down random networks, non-square photos",
        "ml4m_commit": _commit(Path(args.reference), args.commit),
        "dinov2_commit": _commit(Path(args.dinov2), args.dinov2_commit),
        "command": command,
        "environment": {"python": platform.python_version(), "platform": platform.platform(),
                        "torch": torch.__version__, "numpy": np.__version__, "pillow": PIL.__version__,
                        "einops": einops.__version__, "safetensors": safetensors.__version__,
                        "scikit-image": skimage.__version__, "threads": 1, "made_by": "bash bench/ml4m_env.sh"},
        "stand_ins": STAND_INS,
        "side": SIDE, "seed": SEED,
        "clip": CLIP, "dinov2": DINOV2, "dinov2_reg": DINOV2_REG,
        "photos": {name: {"sample": sample, "size": list(size)} for name, (sample, size) in PHOTOS.items()},
        "maps": {k: list(v.shape) for k, v in maps.items()},
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    total = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    print(f"wrote {out} ({total} bytes)")


if __name__ == "__main__":
    main()
