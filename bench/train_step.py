"""Benchmark of the 4M training step, printing JSON (issue 8).

In one run, on one device:
* ``matmul``: the best FLOP/s of square matmuls of several sizes, best of 5 timings each (the reference for
  "fraction of matmul" on CPU);
* per model shape (``demo``: the demo preset's 4+4 layers at width 128, 64+64 tokens, batch 64 on a CPU;
  ``4m-b``: 12+12, width 768, 14x14 grids): tokens/s of a full step (forward, backward, AdamW), achieved model
  FLOP/s (``flops_per_token`` of :mod:`fourm_kfp.model.fourm`: 6 x matmul weights x tokens + attention + heads) as
  a fraction of the matmul's, and on CUDA MFU against the dense bf16 peak;
* ``attention``: the same step with the model's attention (:func:`fourm_kfp.model.layers.attention`: the fused
  ``scaled_dot_product_attention``, or on the CPU the explicit path where that is faster) and with an eager
  reference attention (softmax(QK^T/sqrt(d)) V in plain ops through autograd), and their ratio;
* ``loader``: samples/s of the token loader (14 worker processes on CUDA, 2 on the CPU) on synthetic pretokenized
  shards at the ``--loader-shape`` shapes (4m-b: 14x14 grids, 128/128 budgets) against what that shape's step
  consumes in this run, at the same batch (target >= 2x with at most 14 workers);
* with ``--batches``, each shape's step at each of these batch sizes from the smallest up, stopping at the first
  that runs out of memory (``batch_sweep``; the shape's main entry is the batch with the most model FLOP/s);
* with ``--profile``, where each shape's step spends its time (``profile``): the operators and kernels with the
  most self time on the device (the CPU's on a CPU) over a few profiled steps, per step and as a share.

    python bench/train_step.py [--device cpu|cuda] [--precision auto|fp32|bf16] [--steps 10] [--output f.json]
                               [--batches 128,256,512] [--profile]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from contextlib import contextmanager

import numpy as np
import torch

from fourm_kfp.allocator import reuse_freed_memory
from fourm_kfp.batch import ModalitySpec
from fourm_kfp.config.fourm_config import OptimizerConfig
from fourm_kfp.hardware import GPU_PEAKS, MAX_AUTO_LOADER_WORKERS, measured_matmul_flops, resolve_precision
from fourm_kfp.masking.dirichlet_masking import MixtureComponent
from fourm_kfp.masking.multimodal_masking import MaskingArgs, collate, mask_sample
from fourm_kfp.model import layers
from fourm_kfp.model.fourm import FourM, FourMArgs, flops_per_token
from fourm_kfp.model.parallelize import parallelize
from fourm_kfp.train.optimizer import build_optimizer
from fourm_kfp.train.step import StepSettings, train_step

from bench_output import emit

IMAGE = ("rgb", "depth", "normal", "semseg", "edge")
SHAPES = {
    #        layers  dim heads grid vocab text_vocab budgets  batch (cpu, cuda)
    "demo": (4, 4, 128, 4, 16, 512, 1000, 64, 64, (64, 256)),
    "4m-b": (12, 12, 768, 12, 14, 8192, 30000, 128, 128, (8, 128)),
}


def _specs(grid: int, vocab: int, text_vocab: int) -> tuple[ModalitySpec, ...]:
    return tuple(ModalitySpec(m, "image", vocab, grid=(grid, grid)) for m in IMAGE) + (
        ModalitySpec("det", "sequence", text_vocab, max_length=64),
        ModalitySpec("caption", "sequence", text_vocab, max_length=64))


def _masking(specs, enc: int, dec: int) -> MaskingArgs:
    ones = tuple(0.5 for _ in specs)
    return MaskingArgs(specs, enc, dec, (MixtureComponent(1.0, ones, ones),), tuple(range(4, 104)))


def _batch(masking: MaskingArgs, size: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    samples = []
    for _ in range(size):
        tokens = {s.name: rng.integers(0, s.vocab_size, s.grid) for s in masking.modalities if s.kind == "image"}
        tokens.update({s.name: rng.integers(104, s.vocab_size, 20).tolist() for s in masking.modalities
                       if s.kind == "sequence"})
        samples.append(mask_sample(rng, masking, tokens, None))
    return collate(samples, masking)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def matmul_flops(device: torch.device, dtype: torch.dtype, trials: int = 3) -> dict:
    """The best FLOP/s of a square matmul over several sizes, each the best of ``trials`` timings of the package's
    own matmul probe (:func:`fourm_kfp.hardware.measured_matmul_flops`, uncached; one timing is at the mercy of the
    machine's other work, the best over sizes and trials is what the matmul reaches).
    Returns ``{"flops_per_s": best, "by_size": {size: best FLOP/s}}``."""
    sizes = (2048, 4096, 8192) if device.type == "cuda" else (1024, 2048, 3072)
    by_size = {size: max(measured_matmul_flops.__wrapped__(device.type, dtype, size) for _ in range(trials))
               for size in sizes}
    return {"flops_per_s": max(by_size.values()), "by_size": by_size}


def _eager_sdpa(q, k, v, attn_mask=None, **_):
    scores = (q @ k.transpose(-2, -1)) / q.shape[-1] ** 0.5
    if attn_mask is not None:
        scores = scores.masked_fill(~attn_mask, float("-inf"))
    return torch.softmax(scores.float(), dim=-1).to(q.dtype) @ v


@contextmanager
def eager_attention():
    ours = layers.attention
    layers.attention = lambda q, k, v, mask: _eager_sdpa(q, k, v, attn_mask=mask)
    try:
        yield
    finally:
        layers.attention = ours


def time_steps(name: str, device: torch.device, dtype: torch.dtype | None, steps: int,
               compile: bool = False, batch_size: int | None = None, profile: bool = False) -> dict:
    enc_l, dec_l, dim, heads, grid, vocab, text_vocab, enc, dec, batches = SHAPES[name]
    batch_size = batch_size or (batches[1] if device.type == "cuda" else batches[0])
    specs = _specs(grid, vocab, text_vocab)
    args = FourMArgs(specs, enc_l, dec_l, dim, heads)
    torch.manual_seed(0)
    # as the pretrain stage builds it for one process (torch.compile per block with train.compile; on the CPU,
    # in-place token-table gradients)
    model = parallelize(FourM(args).to(device), mode="none", compile=compile)
    optimizer = build_optimizer(model, OptimizerConfig(), 1e-4)
    settings = StepSettings(dtype, 1.0, tuple(s.name for s in specs))
    batch = _batch(_masking(specs, enc, dec), batch_size).to(device)
    for _ in range(3 if compile else 2):
        train_step(model, optimizer, [batch], settings, device)
    _sync(device)
    start = time.perf_counter()
    for _ in range(steps):
        train_step(model, optimizer, [batch], settings, device)
    _sync(device)
    seconds = (time.perf_counter() - start) / steps
    tokens = batch_size * (enc + dec)
    result = {"batch": batch_size, "step_s": seconds, "tokens_per_s": tokens / seconds,
              "samples_per_s": batch_size / seconds,
              "model_flops_per_s": flops_per_token(args, enc, dec) * tokens / seconds,
              "parameters": sum(p.numel() for p in model.parameters())}
    if profile:
        result["profile"] = profile_steps(lambda: train_step(model, optimizer, [batch], settings, device), device)
    return result


def profile_steps(step, device: torch.device, steps: int = 3, top: int = 30) -> dict:
    """Where ``steps`` calls of ``step`` spend their time: the ``top`` operators and kernels by self time on the
    device (on a CPU, the CPU's), per step and as a share of the total."""
    from torch.profiler import ProfilerActivity, profile

    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        for _ in range(steps):
            step()
        _sync(device)
    attribute = "self_device_time_total" if cuda else "self_cpu_time_total"
    events = [(e.key, getattr(e, attribute), e.count) for e in prof.key_averages()]
    total = sum(t for _, t, _ in events) or 1.0
    events.sort(key=lambda e: -e[1])
    return {"basis": "device self time" if cuda else "CPU self time", "steps": steps,
            "total_ms_per_step": total / steps / 1e3,
            "top": [{"name": name, "ms_per_step": t / steps / 1e3, "calls_per_step": count / steps,
                     "share": t / total} for name, t, count in events[:top]]}


def sweep_batches(name: str, device: torch.device, dtype: torch.dtype | None, steps: int, compile: bool,
                  batches: list[int], profile: bool) -> dict:
    """The step at each batch size in ``batches`` (ascending) until one runs out of memory; the entry with the most
    model FLOP/s gains ``batch_sweep`` (batch -> step_s, model FLOP/s, or "out of memory")."""
    sweep, best = {}, None
    for size in sorted(batches):
        try:
            timing = time_steps(name, device, dtype, steps, compile, size, profile)
        except torch.OutOfMemoryError:
            sweep[str(size)] = "out of memory"
            break
        finally:
            if device.type == "cuda":
                torch.cuda.empty_cache()
        sweep[str(size)] = {"step_s": timing["step_s"], "model_flops_per_s": timing["model_flops_per_s"]}
        if best is None or timing["model_flops_per_s"] > best["model_flops_per_s"]:
            best = timing
    if best is None:
        raise RuntimeError(f"{name}: the smallest batch of --batches ({min(batches)}) ran out of memory")
    best["batch_sweep"] = sweep
    return best


def loader_samples_per_s(shape: str, batch_size: int, workers: int) -> float:
    """The token loader over synthetic pretokenized shards at ``shape``'s grids, vocabulary and token budgets (four
    crops per sample, five image modalities, caption and det), with ``workers`` worker processes."""
    from fourm_kfp.data.pretokenized import CROP, encode_member, member_ext
    from fourm_kfp.data.shard_writer import ShardWriter
    from fourm_kfp.masking.token_loader import DatasetRef, LoaderArgs, measure_loader_throughput
    from fourm_kfp.storage import open_store
    from fourm_kfp.tokenizers.text_tokenizer import train_text_tokenizer

    _, _, _, _, grid, vocab, _, enc, dec, _ = SHAPES[shape]
    rng = np.random.default_rng(0)
    words = ["a", "small", "red", "sphere", "left", "of", "large", "blue", "cube", "green", "cone"]
    captions = [" ".join(rng.choice(words, 8)) for _ in range(200)]
    tokenizer = train_text_tokenizer(captions, 200, num_sentinels=100)
    with tempfile.TemporaryDirectory() as tmp:
        store = open_store(tmp)
        names = tuple(f"tok_{m}" for m in IMAGE) + ("caption", "det", CROP)
        for shard in range(max(4, workers)):
            writer = ShardWriter(store, "train", names, 500, ext=member_ext, first_index=shard)
            for i in range(500):
                members = {f"tok_{m}": encode_member(f"tok_{m}", rng.integers(0, vocab, (4, grid, grid),
                                                                             dtype=np.uint16))
                           for m in IMAGE}
                members["caption"] = encode_member("caption", captions[i % 200])
                members["det"] = encode_member("det", ["v0=1 v1=2 v2=30 v3=40 sphere"] * 4)
                members[CROP] = encode_member(CROP, [{"x0": 0, "y0": 0, "width": 64, "height": 64, "flip": False}] * 4)
                writer.write(f"{shard:02d}{i:06d}", members)
            writer.close()
        specs = _specs(grid, vocab, tokenizer.get_vocab_size())
        args = LoaderArgs((DatasetRef(tmp),), _masking(specs, enc, dec), tokenizer.to_str(), batch_size,
                          num_workers=workers)
        return measure_loader_throughput(args, batches=max(20, 8 * workers))


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--precision", default="auto", choices=["auto", "fp32", "bf16"])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--shapes", default="demo,4m-b")
    parser.add_argument("--loader-workers", type=int, default=None,
                        help="loader worker processes (default: 14 on CUDA, the target's budget on a 16-core host; "
                             "2 on the CPU); -1: skip the loader")
    parser.add_argument("--loader-shape", default="4m-b", choices=sorted(SHAPES),
                        help="the loader's shapes and the step whose consumption it is compared with")
    parser.add_argument("--compile", action="store_true", help="torch.compile each block (train.compile)")
    parser.add_argument("--batches", help="batch sizes to sweep per shape (comma-separated; default: the shape's "
                                          "one batch for the device)")
    parser.add_argument("--profile", action="store_true", help="profile each shape's step (top operators)")
    parser.add_argument("--output")
    args = parser.parse_args(argv)
    if args.loader_workers is None:
        args.loader_workers = MAX_AUTO_LOADER_WORKERS if args.device.startswith("cuda") else 2
    device = torch.device(args.device)
    dtype = resolve_precision(args.precision, device)
    reused = reuse_freed_memory()  # as the stage runner does for every stage's process
    matmul = matmul_flops(device, dtype or torch.float32)
    peak_matmul = matmul["flops_per_s"]
    result = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
              "threads": torch.get_num_threads(), "precision": "bf16" if dtype else "fp32",
              "torch": torch.__version__, "compile": args.compile, "freed_memory_reused": reused,
              "matmul_flops_per_s": peak_matmul,
              "matmul_flops_per_s_by_size": matmul["by_size"],
              "shapes": {}}
    peak = next((bf16 for k, (bf16, _) in GPU_PEAKS.items() if k in result["device"]), None)
    batches = [int(b) for b in args.batches.split(",")] if args.batches else None
    for name in args.shapes.split(","):
        if batches:
            timing = sweep_batches(name, device, dtype, args.steps, args.compile, batches, args.profile)
        else:
            timing = time_steps(name, device, dtype, args.steps, args.compile, profile=args.profile)
        timing["fraction_of_matmul"] = timing["model_flops_per_s"] / peak_matmul
        if peak and dtype == torch.bfloat16:
            timing["mfu_vs_bf16_peak"] = timing["model_flops_per_s"] / peak
        result["shapes"][name] = timing
    with eager_attention():
        eager = time_steps("demo", device, dtype, args.steps)
    ours = result["shapes"].get("demo") or time_steps("demo", device, dtype, args.steps)
    result["attention"] = {"ours_step_s": ours["step_s"], "eager_step_s": eager["step_s"],
                           "ours_speedup": eager["step_s"] / ours["step_s"]}
    if args.loader_workers >= 0:
        shape = args.loader_shape
        step = result["shapes"].get(shape) or time_steps(shape, device, dtype, args.steps, args.compile)
        samples = loader_samples_per_s(shape, step["batch"], args.loader_workers)
        result["loader"] = {"shape": shape, "workers": args.loader_workers, "batch": step["batch"],
                            "samples_per_s": samples, "step_samples_per_s": step["samples_per_s"],
                            "ratio_to_consumption": samples / step["samples_per_s"], "target_ratio": 2.0}
    emit(result, args.output)
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
