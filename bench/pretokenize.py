"""Benchmark of pretokenization, printing JSON (issue 7): is the encoder the bottleneck?

In one run, on the same data: samples/s of the whole pretokenize worker (stream and crop shards in a reader
thread, encode in the main thread, build and write shards in a writer thread) against samples/s of the bare
encoder forward passes over the same cropped arrays; their ratio (target >= 0.8: I/O and bookkeeping hidden behind
compute). The dataset is prepared with the synthetic source, and tokenizers are trained for a few steps (their
quality does not change their speed).

    python bench/pretokenize.py [--samples 1024] [--crops 4] [--device cpu|cuda] [--output f.json]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time

import torch

from fourm_kfp.config.loader import load_config
from fourm_kfp.contract import run_stage
from fourm_kfp.data.shard_stream import iter_joined_shard, shard_indices
from fourm_kfp.stages import get_stage
from fourm_kfp.storage import open_store
from fourm_kfp.tokenizers.bundle import load_tokenizers
from fourm_kfp.tokenizers.pretokenizer import CropSettings, Pretokenizer, ShardJob, output_names, pretokenize_shards

from bench_output import emit

IMAGE = ("rgb", "depth", "normal", "semseg", "edge")


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=1024)
    parser.add_argument("--crops", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--output")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    with tempfile.TemporaryDirectory() as tmp:
        store = open_store(tmp)
        config = load_config("demo", overrides=[
            f"prepare_data.num_train={args.samples}", "prepare_data.num_val=8", "prepare_data.samples_per_shard=256",
            "train_tokenizers.image.steps=5", "train_tokenizers.per_modality={}", "train_tokenizers.max_val_images=8"])
        data = open_store(run_stage(get_stage("prepare-data"), config, store).output_uri)
        tokenizers = load_tokenizers(run_stage(get_stage("train-tokenizers"), config, store).output_uri,
                                     device=str(device))
        crops = CropSettings(args.crops, (0.6, 1.0), (0.75, 1.33), 0.5, 0)
        make = lambda: Pretokenizer({m: tokenizers.image[m] for m in IMAGE}, 64, crops,  # noqa: E731
                                    args.batch_size, device, ["caption", "det"], keep_rgb=True)
        modalities = list(IMAGE) + ["caption", "det"]
        jobs = [ShardJob("train", i) for i in shard_indices(data, "train")]

        # The bare encoder: the same crops, already in memory, straight through the VQ-VAE encoders.
        bare = make()
        cropped = [[(k, *bare.crop_sample(k, s)) for k, s in iter_joined_shard(data, "train", j.index, modalities)]
                   for j in jobs]
        for m in IMAGE:  # warm-up (allocations, cuDNN autotuning)
            bare.encode(m, [cropped[0][0][1][0][m]] * args.batch_size)
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        for shard in cropped:
            for m in IMAGE:
                bare.encode(m, [view[m] for _, views, _ in shard for view in views])
        if device.type == "cuda":
            torch.cuda.synchronize()
        encoder_seconds = time.perf_counter() - start

        # The whole worker, reading, cropping, encoding and writing.
        target = open_store(f"{tmp}/out")
        start = time.perf_counter()
        stats = pretokenize_shards(data, target, jobs, modalities + ["rgb"], make(),
                                   output_names(IMAGE, ["caption", "det"], True))
        stage_seconds = time.perf_counter() - start
    samples = stats["samples"]
    result = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
              "samples": samples, "crops": args.crops, "images_per_sample": args.crops * len(IMAGE),
              "stage_samples_per_s": samples / stage_seconds, "encoder_samples_per_s": samples / encoder_seconds,
              "ratio": encoder_seconds / stage_seconds}
    emit(result, args.output)
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
