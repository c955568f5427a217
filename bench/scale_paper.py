"""CC12M and COYO-700M on paper: each stage's worker-hours, workers for a 24-hour wall clock, shards, S3 objects and
bytes, S3 requests and MLflow rows, computed from the benches' committed JSON and the figures cited below.

    .venv/bin/python bench/scale_paper.py [--output bench/results/scale_paper-2026-12-02.json]

Nothing is measured here: every input is a committed bench result (``bench/results/``, named in ``inputs``) or a
cited figure (``cited``), and every output is arithmetic on them, so docs/scale.md can show how each number was
made. Where a rate is an estimate (a GPU figure not yet measured on the stage itself) the output says so in
``basis``.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from bench_output import emit

RESULTS = Path(__file__).parent / "results"
INPUTS = {
    "scale": "scale-cpu-2026-12-02.json",
    "sample_bytes": "sample_bytes-cpu-2026-12-02.json",
    "teacher_flops": "teacher_flops-cpu-2026-12-02.json",
    "prepare_data": "prepare_data-cpu-2026-11-27.json",
    "labelers": "labelers-cpu-2026-11-28-all.json",
    "pretokenize_gpu": "pretokenize-h100-2026-11-22.json",
    "train_step_gpu": "train_step-4m-b-compile-h100-2026-11-23.json",
}
CITED = {
    "cc12m_pairs": (12_423_374, "huggingface.co/datasets/google-research-datasets/conceptual_12m README.md, "
                                "dataset_info.splits.train.num_examples"),
    "coyo_pairs": (747_000_000, "github.com/kakaobrain/coyo-dataset README.md, line 3: '747M image-text pairs'"),
}
#: The 4m-b preset's layout (src/fourm_kfp/configs/4m-b/): shard size, crops, and pretrain's budget.
SAMPLES_PER_SHARD = 2000
N_CROPS = 10
PRETRAIN_STEPS, GLOBAL_BATCH, LOG_EVERY = 238_000, 8192, 100
#: 4M-21's labels for a photo with alt-text, as the photos-4m21 preset makes them (configs/photos-4m21/label.yaml):
#: the networks whose FLOPs bench/teacher_flops.py counts (normals come from depth: normal_from_depth, no network).
TEACHERS = ("dpt_hybrid_384", "mask2former_swin_b_384", "clip_b16_224", "dinov2_b14_224")
#: Image modalities pretokenize encodes for such a sample (rgb, depth, normal, semseg, canny_edge, clip, dinov2),
#: each with a ViT-B/16-shaped encoder (feature maps have smaller inputs: an upper bound).
TOKENIZED_IMAGES = 7
#: Feature maps in the store: float16 [grid, grid, channels] (data/modalities.py): CLIP-B/16 14x14x512, DINOv2-B/14
#: 16x16x768 at 224 px, plus the .npy header and the tar header.
FEATURE_MAP_BYTES = {"clip": 14 * 14 * 512 * 2 + 128 + 512, "dinov2": 16 * 16 * 768 * 2 + 128 + 512}


def load(name: str) -> dict:
    return json.loads((RESULTS / INPUTS[name]).read_text())


def per_sample_rate(rates: list[float]) -> float:
    """Samples/s of one worker doing several jobs in turn on each sample."""
    return 1.0 / sum(1.0 / r for r in rates)


def stage_rows(samples: int) -> dict:
    scale, sample_bytes, flops = load("scale"), load("sample_bytes"), load("teacher_flops")["gflops_per_image"]
    labelers = load("labelers")["labelers"]
    gpu = load("train_step_gpu")
    matmul = gpu["matmul_flops_per_s"]  # measured bf16 matmul FLOP/s of that H100
    utilisation = gpu["shapes"]["4m-b"]["fraction_of_matmul"]  # what our 4m-b step reached of it
    largest = scale["sizes"][-1]["stages"]
    shards = math.ceil(samples / SAMPLES_PER_SHARD)
    photo = sample_bytes["photos"]
    synthetic = sample_bytes["synthetic_4m_b"]["prepare-data"]["bytes_per_sample"]  # depth, normal, semseg
    tokens = sample_bytes["pretokenized_4m_b_layout"]["bytes_per_sample"]

    def row(rate: float, basis: str, bytes_per_sample: float, modalities: int, s3_stage: str | None) -> dict:
        hours = samples / rate / 3600
        # requests are per shard (a tar per modality, its key index, a few stats): the bench's per shard of 250
        per_shard = largest[s3_stage]["s3_requests_total"] / scale["sizes"][-1]["shards"] if s3_stage else None
        return {"rate_per_worker": round(rate, 1), "basis": basis, "worker_hours": round(hours, 1),
                "workers_for_24h": math.ceil(hours / 24), "shards": shards,
                "s3_objects": shards * (modalities + 1), "bytes": round(bytes_per_sample * samples),
                "s3_requests": round(per_shard * shards) if per_shard else None}

    prepare_bytes = sum(photo["prepare-data"]["bytes_per_sample"].values())
    builtin_bytes = sum(photo["label"]["bytes_per_sample"].values())
    teacher_bytes = (sum(v for k, v in synthetic.items() if k in ("depth", "normal", "semseg"))
                     + sum(FEATURE_MAP_BYTES.values()))
    teacher_gflops = sum(flops[name] for name in TEACHERS if flops.get(name))
    per_gpu = matmul * utilisation
    token_gflops = TOKENIZED_IMAGES * N_CROPS * flops["vq_encoder_vit_b16_224"]
    # bytes of one image modality's 10 crops of 14 x 14 two-byte tokens in the store, averaged over the measured ones
    token_bytes_per_image = (sum(v for k, v in tokens.items() if k.startswith("tok_"))
                             / sum(1 for k in tokens if k.startswith("tok_")))
    measured_gap = load("pretokenize_gpu")["ratio"]
    train_rate = gpu["shapes"]["4m-b"]["samples_per_s"]
    seen = PRETRAIN_STEPS * GLOBAL_BATCH
    return {
        "prepare-data (2-core CPU worker, a WebDataset of JPEGs at 224 px)": row(
            load("prepare_data")["stage_workers"]["webdataset"]["images_per_s_per_worker"],
            "measured: bench/prepare_data.py", prepare_bytes, len(photo["prepare-data"]["bytes_per_sample"]),
            "prepare-data"),
        "label, built-ins (canny_edge, color_palette, metadata; 2-core CPU worker)": row(
            per_sample_rate([labelers[n]["images_per_s_per_worker"] for n in ("canny_edge", "color_palette",
                                                                                 "metadata")]),
            "measured: bench/labelers.py", builtin_bytes, len(photo["label"]["bytes_per_sample"]), "label"),
        "label, teachers (depth, semseg, CLIP, DINOv2; one H100)": row(
            per_gpu / (teacher_gflops * 1e9),
            f"estimate: {teacher_gflops:.0f} GFLOPs an image (bench/teacher_flops.py) at {utilisation:.3f} of the "
            f"H100's measured {matmul / 1e12:.0f} TFLOP/s (the fraction our 4m-b step reaches)",
            teacher_bytes, 5, "label"),
        "pretokenize (one H100)": row(
            per_gpu / (token_gflops * 1e9),
            f"estimate: {TOKENIZED_IMAGES} images x {N_CROPS} crops x {flops['vq_encoder_vit_b16_224']:.0f} GFLOPs "
            f"at {utilisation:.3f} of {matmul / 1e12:.0f} TFLOP/s; the stage measured {measured_gap:.3f} of its "
            "bare encoder on an H100 (2026-11-22), so today it needs about "
            f"{1 / measured_gap:.0f}x these hours; bytes with each crop's rgb pixels (pretokenize.keep_rgb_pixels, "
            "on by default)", TOKENIZED_IMAGES * token_bytes_per_image + tokens["rgb"] + tokens["crop"]
            + tokens["caption"] + tokens["det"], TOKENIZED_IMAGES + 5, "pretokenize"),
        "pretokenize without rgb pixels (keep_rgb_pixels: false)": {
            "bytes": round((TOKENIZED_IMAGES * token_bytes_per_image + tokens["crop"] + tokens["caption"]
                            + tokens["det"]) * samples)},
        "pretrain 4m-b (one H100)": {
            "rate_per_worker": round(train_rate, 1),
            "basis": "measured: bench/train_step.py, 4m-b bf16 compiled, batch 128 (the step, not the stage)",
            "worker_hours": round(seen / train_rate / 3600, 1),
            "workers_for_24h": math.ceil(seen / train_rate / 3600 / 24),
            "samples_seen": seen, "epochs": round(seen / samples, 2), "log_lines": PRETRAIN_STEPS // LOG_EVERY},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", default=None)
    args = parser.parse_args()
    datasets = {"cc12m": CITED["cc12m_pairs"][0], "coyo_700m": CITED["coyo_pairs"][0]}
    emit({"benchmark": "scale_paper", "inputs": INPUTS, "cited": {k: {"value": v, "source": s}
                                                                 for k, (v, s) in CITED.items()},
          "samples_per_shard": SAMPLES_PER_SHARD,
          "datasets": {name: {"samples": n, "stages": stage_rows(n)} for name, n in datasets.items()}}, args.output)


if __name__ == "__main__":
    main()
