"""Benchmark of pretokenization, printing JSON (issue 7): is the encoder the bottleneck?

In one run, on the same data: samples/s of the whole pretokenize worker (the reader thread streams shards in
chunks, ``--decode-workers`` processes decode and crop them, the main thread encodes, a writer thread builds and
writes the shards) against samples/s of the bare encoder forward passes over the same crops, already stacked in
memory, in the same batches; their ratio (target >= 0.8: decoding, cropping and writing hidden behind compute).
``feed_samples_per_s`` is the whole worker again with every encoder replaced by a free one (zero tokens of the right
shape; only here, never in the stage): how fast the CPU side feeds an encoder, measurable without a GPU. The
dataset is prepared with the synthetic source, and tokenizers are trained for a few steps (their quality does not
change their speed).

    python bench/pretokenize.py [--samples 1024] [--crops 4] [--decode-workers -1] [--device cpu|cuda] [--output f.json]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from types import SimpleNamespace

import torch

from fourm_kfp.config.loader import load_config
from fourm_kfp.contract import run_stage
from fourm_kfp.contract.shard_jobs import Shard
from fourm_kfp.data.shard_stream import shard_indices
from fourm_kfp.stages import get_stage
from fourm_kfp.storage import open_store
from fourm_kfp.tokenizers.bundle import load_tokenizers
from fourm_kfp.tokenizers.pretokenizer import Pretokenizer, ShardTokens, output_names, pretokenize_shards
from fourm_kfp.tokenizers.shard_crops import CropSettings, chunk_samples, crop_chunk, decode_workers, raw_chunks

from bench_output import emit

IMAGE = ("rgb", "depth", "normal", "semseg", "edge")
TEXT = ["caption", "det"]
IMAGE_SIZE = 64  # the demo preset's


class FreeEncoder:
    """A stand-in for a VQ-VAE that costs nothing: zero tokens of the real one's grid and codebook."""

    def __init__(self, tokenizer):
        self.config = tokenizer.config
        self.grid = tokenizer.config.image_size // tokenizer.config.patch_size

    def encode(self, batch: torch.Tensor) -> torch.Tensor:
        return torch.zeros(len(batch), self.grid, self.grid, dtype=torch.int64)


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def bare_encoder_seconds(pretokenizer: Pretokenizer, data, jobs, modalities) -> float:
    """Seconds of the encoder forward passes alone over the crops of ``jobs``, cropped and stacked beforehand."""
    size = chunk_samples(pretokenizer.crops.n_crops, IMAGE_SIZE)
    shards = [[crop_chunk(pretokenizer.crops, IMAGE_SIZE, raw) for raw in raw_chunks(data, job, modalities, size)]
              for job in jobs]
    for m in IMAGE:  # warm-up (allocations, cuDNN autotuning)
        pretokenizer.encode(m, shards[0][0].images[m].crops[:pretokenizer.batch_size])
    _synchronize(pretokenizer.device)
    start = time.perf_counter()
    for chunks in shards:
        tokens = ShardTokens(pretokenizer)
        for chunk in chunks:
            tokens.add(chunk)
        tokens.finish()
    _synchronize(pretokenizer.device)
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=1024)
    parser.add_argument("--crops", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--decode-workers", type=int, default=-1, help="-1: as pretokenize.decode_workers: -1")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--output")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    workers = decode_workers(args.decode_workers, device)
    with tempfile.TemporaryDirectory() as tmp:
        store = open_store(tmp)
        config = load_config("demo", overrides=[
            f"prepare_data.num_train={args.samples}", "prepare_data.num_val=8", "prepare_data.samples_per_shard=256",
            "train_tokenizers.image.steps=5", "train_tokenizers.per_modality={}", "train_tokenizers.max_val_images=8"])
        data = open_store(run_stage(get_stage("prepare-data"), config, store).output_uri)
        tokenizers = load_tokenizers(run_stage(get_stage("train-tokenizers"), config, store).output_uri,
                                     device=str(device))
        crops = CropSettings(args.crops, (0.6, 1.0), (0.75, 1.33), 0.5, 0)
        make = lambda encoders: Pretokenizer(encoders, IMAGE_SIZE, crops, args.batch_size,  # noqa: E731
                                             device, TEXT, keep_rgb=True)
        modalities = list(IMAGE) + TEXT
        jobs = [Shard("train", i) for i in shard_indices(data, "train")]
        names = output_names(IMAGE, TEXT, True)

        encoder_seconds = bare_encoder_seconds(make({m: tokenizers.image[m] for m in IMAGE}), data, jobs, modalities)
        runs = {}
        for name, encoders in (("stage", {m: tokenizers.image[m] for m in IMAGE}),
                               ("feed", {m: FreeEncoder(tokenizers.image[m]) for m in IMAGE})):
            start = time.perf_counter()
            stats = pretokenize_shards(data, open_store(f"{tmp}/{name}"), jobs, modalities, make(encoders), names,
                                       workers)
            runs[name] = SimpleNamespace(seconds=time.perf_counter() - start, samples=stats["samples"])
    samples = runs["stage"].samples
    result = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
              "samples": samples, "crops": args.crops, "images_per_sample": args.crops * len(IMAGE),
              "decode_workers": workers,
              "stage_samples_per_s": samples / runs["stage"].seconds,
              "encoder_samples_per_s": samples / encoder_seconds,
              "ratio": encoder_seconds / runs["stage"].seconds,
              "feed_samples_per_s": runs["feed"].samples / runs["feed"].seconds}
    emit(result, args.output)
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
