"""Benchmark the image tokenizers: encode (and decode) throughput in images/s per modality.

    .venv/bin/python bench/tokenizer_throughput.py [--preset demo] [--bundle URI] [--batch 64] [--output bench.json]

With ``--bundle`` it measures a committed train-tokenizers output; otherwise it builds the preset's tokenizers
(same architecture and sizes, freshly initialised: encode cost does not depend on the weights' values) with
normalisation fitted on synthetic scenes. Runs on CUDA when available (bf16 autocast), else CPU. Prints JSON.
"""

from __future__ import annotations

import argparse
import os
import platform
import time

import numpy as np
import torch

from fourm_kfp.config.loader import load_config
from fourm_kfp.data.synthetic_scenes import synthetic_sample
from fourm_kfp.hardware import cpu_matmul_rate
from fourm_kfp.tokenizers.bundle import load_tokenizers
from fourm_kfp.tokenizers.modality_codecs import fit_normalisation
from fourm_kfp.tokenizers.vqvae import VQVAE, VQVAEConfig

from bench_output import emit


def preset_tokenizers(preset: str, images: dict[str, np.ndarray], device: str) -> dict[str, VQVAE]:
    config = load_config(preset)
    cfg = config.train_tokenizers
    models = {}
    for modality in cfg.image_modalities:
        s = cfg.image_config(modality)
        vq = VQVAEConfig.for_modality(
            modality, image_size=config.data.image_size, patch_size=s.patch_size, architecture=s.architecture,
            hidden_dim=s.hidden_dim, depth=s.depth, heads=s.heads, codebook_size=s.codebook_size,
            code_dim=s.code_dim, norm_stats=fit_normalisation(modality, images[modality]))
        models[modality] = VQVAE(vq).to(device).eval()
    return models


def throughput(fn, batch: np.ndarray, repeats: int, device: str) -> float:
    fn(batch)  # warm-up
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(repeats):
        out = fn(batch)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    del out
    return repeats * len(batch) / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="demo")
    parser.add_argument("--bundle", help="URI of a committed train-tokenizers output")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--output")
    args = parser.parse_args()

    device = "cuda" if torch.cuda.is_available() else "cpu"
    image_size = load_config(args.preset).data.image_size
    samples = [synthetic_sample(0, i, image_size) for i in range(args.batch)]
    images = {m: np.stack([s[m] for s in samples]) for m in ("rgb", "depth", "normal", "semseg", "edge")}
    models = load_tokenizers(args.bundle, device).image if args.bundle else preset_tokenizers(args.preset, images,
                                                                                              device)
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if device == "cuda" else torch.autocast("cpu",
                                                                                                   enabled=False)
    results = {}
    with torch.inference_mode(), autocast:
        for modality, model in models.items():
            batch = images[modality]
            tokens = model.encode(batch)
            results[modality] = {
                "encode_images_per_s": round(throughput(model.encode, batch, args.repeats, device), 1),
                "decode_images_per_s": round(throughput(lambda _: model.decode(tokens), batch, args.repeats,
                                                        device), 1),
                "tokens_per_image": int(tokens[0].numel()),
            }
    result = {"benchmark": "tokenizers", "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
              "torch_threads": torch.get_num_threads(), "cpus": os.cpu_count(), "python": platform.python_version(),
              "source": args.bundle or f"preset {args.preset} (fresh weights)", "image_size": image_size,
              "batch": args.batch, "modalities": results}
    if device == "cpu":  # the yardstick beside the rates: 2-core machines differ up to 2x (measured after them)
        result["machine"] = cpu_matmul_rate()
    emit(result, args.output)


if __name__ == "__main__":
    main()
