"""Benchmark the label stage's built-in labelers: images/s of one worker, and the workers a 10-million-image dataset
needs to be labelled in an hour.

    .venv/bin/python bench/labelers.py [--image-size 224] [--images 64] [--teacher runs/demo/pretrain/<address>]
                                       [--labelers color_palette,...] [--quick] [--output x.json]

Each labeler labels the same images (the photographs scikit-image ships, centre-cropped and resized to
``--image-size``, repeated to ``--images``; random pixels when scikit-image is not installed) in batches of
``--batch-size``, in this one process with torch's default threads (one label worker as the pipeline runs it), after
one warm-up batch. ``workers_for_10m_images_in_1h`` is ``ceil(1e7 / (rate * 3600))``. ``--teacher`` adds
``fourm_model`` reading depth off the photos with that model (a GPU when there is one); ``--labelers`` times only the
built-ins named (comma-separated). Prints one JSON object, with the machine's matmul rate measured after the timings.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import time

import numpy as np
from PIL import Image

from fourm_kfp.hardware import cpu_matmul_rate
from fourm_kfp.labelers.base import LabelBatch
from fourm_kfp.labelers.registry import build_labeler

from bench_output import emit

PHOTOS = ("astronaut.png", "brick.png", "camera.png", "chelsea.png", "coffee.png", "coins.png", "grass.png",
          "gravel.png", "hubble_deep_field.jpg", "ihc.png", "moon.png", "motorcycle_left.png",
          "motorcycle_right.png", "retina.jpg", "rocket.jpg")


def photos(count: int, size: int) -> tuple[list[np.ndarray], str]:
    """``count`` RGB squares of ``size`` px: the sample photos, centre-cropped (else random pixels)."""
    try:
        from fourm_kfp.storage import package_folder

        folder = package_folder("pkg://skimage/data")
        source = "scikit-image sample photos"
        base = []
        for name in PHOTOS:
            with Image.open(os.path.join(folder, name)) as im:
                im = im.convert("RGB")
                side = min(im.size)
                left, top = (im.width - side) // 2, (im.height - side) // 2
                base.append(np.asarray(im.crop((left, top, left + side, top + side)).resize((size, size))))
    except Exception:  # noqa: BLE001 - no scikit-image: random pixels still time the labelers
        source = "random pixels"
        rng = np.random.default_rng(0)
        base = [rng.integers(0, 256, (size, size, 3), dtype=np.uint8) for _ in range(len(PHOTOS))]
    return [base[i % len(base)] for i in range(count)], source


def rate(labeler, images: list[np.ndarray], batch_size: int) -> dict[str, float]:
    batches = [LabelBatch(tuple(f"k{i + j}" for j in range(len(chunk))), tuple(chunk),
                          tuple("a photo of something" for _ in chunk), tuple((640, 480) for _ in chunk))
               for i in range(0, len(images), batch_size) if (chunk := images[i:i + batch_size])]
    labeler.label(batches[0])  # warm-up: first-call costs (caches, kernels) are not the steady state
    start = time.perf_counter()
    for batch in batches:
        labeler.label(batch)
    seconds = time.perf_counter() - start
    per_s = len(images) / seconds
    return {"images": len(images), "seconds": round(seconds, 3), "images_per_s_per_worker": round(per_s, 1),
            "workers_for_10m_images_in_1h": math.ceil(1e7 / (per_s * 3600))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--images", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--teacher", default="", help="a pretrain output's URI: also time fourm_model (depth)")
    parser.add_argument("--labelers", default="canny_edge,color_palette,metadata",
                        help="the built-in labelers to time, comma-separated (default: all three)")
    parser.add_argument("--quick", action="store_true", help="a few images: checks the bench runs")
    parser.add_argument("--output", help="also write the JSON here")
    args = parser.parse_args()
    if args.quick:
        args.images = 8
    images, source = photos(args.images, args.image_size)
    labelers = {name: build_labeler(name) for name in args.labelers.split(",") if name}
    if args.teacher:
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
        labelers["fourm_model(depth)"] = build_labeler("fourm_model", {"modality": "depth"}, args.teacher, device)
    rates = {name: rate(labeler, images, args.batch_size) for name, labeler in labelers.items()}
    emit({"benchmark": "labelers", "images": source, "image_size": args.image_size, "batch_size": args.batch_size,
          "labelers": rates,
          "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), **cpu_matmul_rate()}},
         args.output)


if __name__ == "__main__":
    main()
