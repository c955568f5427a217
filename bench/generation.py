"""Generation throughput: MaskGIT image targets (samples/s) and autoregressive text with the KV cache against
recomputing the whole prefix every token (tokens/s, and their ratio), measured in one run on random weights.

    .venv/bin/python bench/generation.py                       # demo shapes on this machine
    python3 bench/generation.py --shape 4m-b --batch 64        # on a GPU (bf16 autocast)

Prints one JSON object. Needs only torch and numpy (``PYTHONPATH=src`` from a checkout).
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from bench_output import emit
from fourm_kfp.batch import ModalitySpec
from fourm_kfp.model.fourm import FourM, FourMArgs
from fourm_kfp.model.generation import Generator, SamplingArgs

SHAPES = {  # grid, image vocab, text vocab, text length, (enc layers, dec layers, dim, heads)
    "demo": ((16, 16), 512, 1000, 64, (4, 4, 128, 4)),
    "4m-b": ((14, 14), 8192, 30000, 64, (12, 12, 768, 12)),
}
SENTINELS = (5, 6)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def _timed(fn, device: torch.device, repeats: int) -> float:
    fn()  # warm-up
    _sync(device)
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    _sync(device)
    return (time.perf_counter() - start) / repeats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="demo")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--steps", type=int, default=8, help="MaskGIT steps")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--output")
    args = parser.parse_args()
    device = torch.device(args.device)
    grid, image_vocab, text_vocab, text_len, (enc, dec, dim, heads) = SHAPES[args.shape]
    specs = (ModalitySpec("rgb", "image", image_vocab, grid=grid),
             ModalitySpec("depth", "image", image_vocab, grid=grid),
             ModalitySpec("caption", "sequence", text_vocab, max_length=text_len))
    torch.manual_seed(0)
    model = FourM(FourMArgs(specs, encoder_layers=enc, decoder_layers=dec, dim=dim, heads=heads)).to(device).eval()
    gen = Generator(model, SENTINELS)
    rng = np.random.default_rng(0)
    samples = [{"rgb": rng.integers(0, image_vocab, grid[0] * grid[1])} for _ in range(args.batch)]
    length = text_len - 1
    maskgit = SamplingArgs(steps=args.steps, temperature=1.0)
    # Random weights never emit the end sentinel on purpose, so text always runs the full length.
    text_args = SamplingArgs(temperature=1.0, max_text_tokens=length)

    image_s = _timed(lambda: gen.generate(samples, "depth", maskgit), device, args.repeats)
    cached_s = _timed(lambda: gen.generate(samples, "caption", text_args), device, args.repeats)

    @torch.inference_mode()
    def recompute() -> None:
        """The same decoding without a cache: the decoder reruns the whole prefix for every new token."""
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            cond = gen._conditioning(samples)
            probe = gen._batch(cond, torch.zeros(args.batch, 1, dtype=torch.long, device=device), 2,
                               torch.zeros(args.batch, 1, dtype=torch.long, device=device))
            memory = model.encode(probe)
            tokens = torch.full((args.batch, 1), SENTINELS[0], dtype=torch.long, device=device)
            for p in range(length):
                positions = torch.arange(p + 1, device=device).expand(args.batch, p + 1)
                batch = gen._batch(cond, tokens, 2, positions)
                logits = model.logits(model.decode(memory, batch)[:, -1], 2).float()
                tokens = torch.cat([tokens, logits.argmax(-1, keepdim=True)], 1)

    recompute_s = _timed(recompute, device, args.repeats)
    text_tokens = args.batch * length
    emit({
        "bench": "generation", "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "shape": args.shape, "batch": args.batch, "parameters": sum(p.numel() for p in model.parameters()),
        "maskgit_steps": args.steps, "image_tokens": grid[0] * grid[1],
        "maskgit_samples_per_s": round(args.batch / image_s, 1),
        "text_tokens": length,
        "text_tokens_per_s_kv_cache": round(text_tokens / cached_s, 1),
        "text_tokens_per_s_recompute": round(text_tokens / recompute_s, 1),
        "kv_cache_speedup": round(recompute_s / cached_s, 2),
    }, args.output)


if __name__ == "__main__":
    main()
