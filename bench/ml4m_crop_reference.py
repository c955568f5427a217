"""apple/ml-4m's own crop-and-resize of rgb (``save_vq_tokens.py``'s default), for pretokenize's rgb crops to match.

Runs in ml-4m's environment (``bash bench/ml4m_env.sh`` makes ``.venv-ml4m``)::

    FOURM_REFERENCE=/tmp/ml-4m .venv-ml4m/bin/python bench/ml4m_crop_reference.py

``save_vq_tokens.py`` cuts each crop of a photo with its rgb transform's ``image_augment(img, (top, left, h, w),
flip, ..., (size, size), None, resample_mode)``, ``resample_mode`` None by default: a Pillow crop of the uint8 RGB
image, ``Image.resize`` with Pillow's default filter (bicubic for RGB), then the flip; ``postprocess`` makes the
tokenizer's input (``RGBTransform(imagenet_default_mean_and_std=False)``, as ``MODALITY_TRANSFORMS_DIVAE``). This
writes ``tests/tokenizers/ml4m_reference/crops.npz``: a seeded 64 x 64 photo, crop windows (with and without a
flip, smaller than and as large as the photo, resized back to 64 px as pretokenize does and to 48 px), ml-4m's
resized uint8 crops and its tokenizer inputs of them, with ``crops_manifest.json`` (the ml-4m commit, the command,
the versions of Pillow and torch).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import subprocess
import sys
import types
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "tokenizers" / "ml4m_reference"
SEED = 64
SIDE = 64
#: (top, left, height, width, flip, output side): ml-4m's crop coordinates
WINDOWS = [
    (0, 0, 64, 64, 0, 64),  # the full view: no resize
    (5, 9, 40, 40, 0, 64),
    (11, 2, 50, 37, 1, 64),  # not square: the aspect ratio changes, as a random resized crop's does
    (0, 20, 33, 44, 0, 64),
    (7, 7, 57, 57, 1, 48),  # shrinking: Pillow's filter widens with the scale (antialiased)
]


def load_transforms(path: Path):
    """ml-4m's ``fourm.data.modality_transforms``, its packages registered without running their ``__init__``; the
    CUDA torchvision wheel of ``.venv-ml4m`` gets an empty ``_meta_registrations`` (its C++ ops do not load on a CPU
    torch; nothing here uses them), as ``bench/ml4m_tokenizer_reference.py`` does."""
    if "torchvision" not in sys.modules:
        sys.modules["torchvision._meta_registrations"] = types.ModuleType("torchvision._meta_registrations")
    for name in ("fourm", "fourm.utils", "fourm.data"):
        package = types.ModuleType(name)
        package.__path__ = [str(path / name.replace(".", "/"))]
        sys.modules[name] = package
    misc = importlib.import_module("fourm.utils.misc")
    sys.modules["fourm.utils"].to_2tuple, sys.modules["fourm.utils"].denormalize = misc.to_2tuple, misc.denormalize
    return importlib.import_module("fourm.data.modality_transforms")


def commit(path: Path) -> str:
    try:
        return subprocess.run(["git", "-C", str(path), "rev-parse", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return os.environ.get("FOURM_REFERENCE_COMMIT", "cda590faa3b9f022c28537193d3e1650527646a3")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reference", default=os.environ.get("FOURM_REFERENCE", "/tmp/ml-4m"))
    parser.add_argument("--out", default=str(OUT))
    args = parser.parse_args()
    import PIL
    import torch
    from PIL import Image

    path = Path(args.reference)
    transforms = load_transforms(path)
    rgb = transforms.RGBTransform(imagenet_default_mean_and_std=False)
    photo = np.random.default_rng(SEED).integers(0, 256, size=(SIDE, SIDE, 3)).astype(np.uint8)
    crops, inputs = {}, {}
    for i, (top, left, h, w, flip, side) in enumerate(WINDOWS):
        img = rgb.preprocess(Image.fromarray(photo).copy())
        img = rgb.image_augment(img, (top, left, h, w), bool(flip), None, (side, side), None, None)
        crops[f"crop_{i}"] = np.asarray(img)
        inputs[f"input_{i}"] = rgb.postprocess(img).numpy()
    out = Path(args.out)
    np.savez(out / "crops.npz", photo=photo, windows=np.array(WINDOWS, np.int64), **crops, **inputs)
    manifest = {
        "what": "ml-4m's rgb crop-and-resize as save_vq_tokens.py does it by default (resample_mode None) and the "
                "tokenizer input it makes (RGBTransform(imagenet_default_mean_and_std=False))",
        "ml4m_commit": commit(path),
        "command": f"FOURM_REFERENCE={args.reference} .venv-ml4m/bin/python bench/ml4m_crop_reference.py",
        "environment": {"python": platform.python_version(), "Pillow": PIL.__version__, "torch": torch.__version__,
                        "numpy": np.__version__},
        "photo": f"np.random.default_rng({SEED}).integers(0, 256, size=({SIDE}, {SIDE}, 3)).astype(np.uint8)",
        "windows": "rows of (top, left, height, width, flip, output side); crop_<i>: the resized uint8 crop, "
                   "input_<i>: the tokenizer's input (C x H x W)",
    }
    (out / "crops_manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    print(f"wrote {out / 'crops.npz'} ({(out / 'crops.npz').stat().st_size} bytes)")


if __name__ == "__main__":
    main()
