"""The DiVAE port against apple/ml-4m's own DiVAE tokenizers, and what a decode costs on this machine.

    .venv/bin/python bench/ml4m_divae_compare.py --output bench/results/ml4m_divae-cpu-2026-12-02.json

Reads ``tests/tokenizers/ml4m_reference/divae_<name>/`` (made by ``bench/ml4m_divae_reference.py`` in ml-4m's
environment: ml-4m's ``save_pretrained`` folders with random weights at scaled-down sizes, the codes ml-4m's
encoder gives a seeded batch, and ml-4m's ``decode_tokens`` of those codes from a seeded generator with its DDPM
pipeline and with its DDIM scheduler), loads each folder with ``fourm_kfp.tokenizers.ml4m.divae.load_divae``
(main environment: diffusers' current schedulers, no ml-4m code) and reports whether the codes are identical and
the largest decode difference (target: 1e-3).

Decode cost: images per second of ``decode_tokens`` per tokenizer (their decoders at the references' small shapes,
the demos' step counts, median of ``--rounds``), and the time of one pass of ml-4m's full-size ``unet_patched``
decoder and of the edge tokenizer's ``uvit_b_p4_f16`` (random weights) on one 224-px image, from which a decode's
cost follows; printed with the machine's square-matmul rate, since 2-core machines differ.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch
from safetensors.torch import load_file

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_output import emit  # noqa: E402

from fourm_kfp.hardware import cpu_matmul_rate  # noqa: E402
from fourm_kfp.tokenizers.ml4m.divae import load_divae  # noqa: E402
from fourm_kfp.tokenizers.ml4m.unet import build_unet  # noqa: E402
from fourm_kfp.tokenizers.ml4m.uvit import build_uvit  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "tests" / "tokenizers" / "ml4m_reference"
TOLERANCE = 1e-3


def compare(name: str) -> dict:
    folder = REFERENCE / f"divae_{name}"
    manifest = json.loads((folder / "manifest.json").read_text())
    ref = load_file(str(folder / "reference.safetensors"))
    model = load_divae(folder, modality=name)
    codes = model.encode(ref["images"])
    errors = {}
    for scheduler in ("ddpm", "ddim"):
        generator = torch.Generator().manual_seed(manifest["noise_seed"])
        out = model.decode_tokens(ref["codes"], manifest["steps"], generator=generator, scheduler=scheduler)
        errors[scheduler] = (out - ref[f"decode_{scheduler}"]).abs().max().item()
    identical = bool(torch.equal(codes, ref["codes"]))
    return {
        "codes_identical": identical,
        "codes_shape": list(codes.shape),
        "codebook_size": model.codebook_size,
        "decode_max_abs_error": errors,
        "decode_range": [ref["decode_ddpm"].min().item(), ref["decode_ddpm"].max().item()],
        "tolerance": TOLERANCE,
        "met": identical and max(errors.values()) <= TOLERANCE,
        "steps": manifest["steps"],
        "config_scheduler": model.schedule["scheduler"],
        "ml4m_commit": manifest["ml4m_commit"],
        "reference_environment": manifest["environment"],
    }


def decode_cost(name: str, rounds: int) -> dict:
    folder = REFERENCE / f"divae_{name}"
    model = load_divae(folder, modality=name)
    codes = load_file(str(folder / "reference.safetensors"))["codes"]
    model.decode_tokens(codes, generator=torch.Generator().manual_seed(0))  # warm-up
    times = []
    for i in range(rounds):
        start = time.perf_counter()
        model.decode_tokens(codes, generator=torch.Generator().manual_seed(i))
        times.append(time.perf_counter() - start)
    median = statistics.median(times)
    return {
        "decoder": model.config.dec_type,
        "unet_parameters": sum(p.numel() for p in model.decoder.parameters()),
        "image_size": codes.shape[-1] * model.config.patch_size,
        "channels": model.config.n_channels,
        "steps": model.default_steps,
        "batch": codes.shape[0],
        "decode_s_median": round(median, 4),
        "images_per_s": round(codes.shape[0] / median, 2),
    }


def full_size_pass(decoder: str = "unet_patched", channels: int = 3, image_size: int = 224) -> dict:
    """One forward of ml-4m's full-size ``decoder`` (``unet_patched``, or the edge tokenizer's ``uvit_b_p4_f16``;
    random weights) on one image: the unit a real decode repeats."""
    torch.manual_seed(0)
    if decoder.startswith("uvit"):
        net = build_uvit(decoder, channels=channels, cond_dim=32, image_size=image_size).eval()
    else:
        net = build_unet(decoder, channels=channels, cond_channels=32, image_size=image_size).eval()
    x = torch.randn(1, channels, image_size, image_size)
    cond = torch.randn(1, 32, image_size // 16, image_size // 16)
    times = []
    with torch.no_grad():
        for _ in range(2):  # the first includes allocation
            start = time.perf_counter()
            net(x, torch.tensor(999), cond)
            times.append(time.perf_counter() - start)
    one = times[-1]
    return {
        "decoder": decoder, "unet_parameters": sum(p.numel() for p in net.parameters()),
        "image_size": image_size, "channels": channels, "batch": 1, "one_pass_s": round(one, 3),
        "decode_s_at_25_steps": round(25 * one, 2), "images_per_s_at_25_steps": round(1 / (25 * one), 4),
        "decode_s_at_10_steps": round(10 * one, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--names", nargs="*", default=["rgb", "depth", "edge", "edge_uvit", "uvit_xattn"])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--no-full-size", action="store_true", help="skip the full-size UNet pass")
    parser.add_argument("--output")
    args = parser.parse_args()

    names = [n for n in args.names if (REFERENCE / f"divae_{n}").is_dir()]
    result: dict = {
        "benchmark": "ml4m_divae",
        "command": "python bench/ml4m_divae_compare.py" + (f" --output {args.output}" if args.output else ""),
        "reference": "tests/tokenizers/ml4m_reference/divae_<name>/ (bench/ml4m_divae_reference.py)",
        "tokenizers": {name: compare(name) for name in names},
    }
    result["met"] = all(r["met"] for r in result["tokenizers"].values())
    result["decode_cost"] = {name: decode_cost(name, args.rounds) for name in names}
    if not args.no_full_size:
        result["decode_cost"]["unet_patched@224"] = full_size_pass()
        result["decode_cost"]["uvit_b_p4_f16@224"] = full_size_pass("uvit_b_p4_f16", channels=1)
    import diffusers

    result["environment"] = {"torch": torch.__version__, "diffusers": diffusers.__version__,
                             "torch_threads": torch.get_num_threads()}
    result["machine"] = {"cpus": os.cpu_count(), "python": platform.python_version(), **cpu_matmul_rate()}
    emit(result, args.output)


if __name__ == "__main__":
    main()
