"""Bytes a sample costs in the store at the 4m-b size (224 px), per modality: what docs/scale.md multiplies by CC12M's
and COYO-700M's sample counts.

    .venv/bin/python bench/sample_bytes.py [--scenes 512] [--output bench/results/sample_bytes-cpu-<date>.json]

Runs prepare-data and label (the built-in labelers) in this process on a local store: the 4m-b preset's synthetic
scenes (``--scenes`` of them, one shard) and the photos preset's 15 photographs (224 px), and reads each output's
manifest: bytes per sample of every modality's tars, of the key indexes and of the rest; then pretokenize in
4m-b's token layout (:func:`pretokenized`). Synthetic scenes are flat
colours and compress better than photographs; the photos give rgb and the labels of real pictures.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
import tempfile
from collections import defaultdict

from fourm_kfp.config.loader import load_config
from fourm_kfp.contract import run_stage
from fourm_kfp.stages import get_stage
from fourm_kfp.storage import open_store

from bench_output import emit

BUILTINS = "[{name: canny_edge}, {name: color_palette}, {name: metadata}]"


def per_modality(output_uri: str, samples: int) -> dict[str, float]:
    """Bytes per train sample of each folder of ``train/`` in a committed output (a modality, ``_keys``, ...)."""
    manifest = json.loads(open_store(output_uri).get_bytes("_MANIFEST.json"))
    sizes: dict[str, int] = defaultdict(int)
    for record in manifest["files"]:
        parts = record["key"].split("/")
        if parts[0] == "train" and len(parts) == 3:
            sizes[parts[1]] += record["bytes"]
    return {name: round(size / samples, 1) for name, size in sorted(sizes.items())}


def measure(preset: str, overrides: list[str]) -> dict:
    """prepare-data then label; the train samples are prepare-data's (the label stage keeps them all)."""
    store = open_store(tempfile.mkdtemp(prefix=f"fourm-bytes-{preset}-"), create=True)
    config = load_config(preset, overrides=overrides)
    out, samples = {}, 0
    for stage in ("prepare-data", "label"):
        outcome = run_stage(get_stage(stage), config, store)
        samples = samples or int(outcome.metrics["samples_train"])
        out[stage] = {"train_samples": samples, "bytes_per_sample": per_modality(outcome.output_uri, samples)}
    return out


def pretokenized(samples: int) -> dict:
    """The pretokenized layout at 4m-b's sizes: 224 px, 16-px patches (14 x 14 tokens), 10 crops a sample and codebooks
    of 8,192 codes (two bytes a token, as ml-4m's depth/normal/edge tokenizers), from the smoke preset's tiny
    tokenizers trained a few steps (their quality does not change a token's bytes)."""
    store = open_store(tempfile.mkdtemp(prefix="fourm-bytes-tokens-"), create=True)
    config = load_config("smoke", overrides=[
        f"prepare_data.num_train={samples}", "prepare_data.num_val=8", f"prepare_data.samples_per_shard={samples}",
        "data.image_size=224", "train_tokenizers.image.patch_size=16", "train_tokenizers.image.codebook_size=8192",
        "pretokenize.n_crops=10"])
    for stage in ("prepare-data", "train-tokenizers"):
        run_stage(get_stage(stage), config, store)
    outcome = run_stage(get_stage("pretokenize"), config, store)
    return {"train_samples": samples, "n_crops": 10, "grid": 14, "codebook_size": 8192,
            "bytes_per_sample": per_modality(outcome.output_uri, samples)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenes", type=int, default=512)
    parser.add_argument("--output", default=None)
    args = parser.parse_args()
    modalities = "[rgb, depth, normal, semseg, edge, det, caption, canny_edge, color_palette, metadata]"
    synthetic = measure("4m-b", [f"prepare_data.num_train={args.scenes}", "prepare_data.num_val=16",
                                 f"prepare_data.samples_per_shard={args.scenes}", f"label.labelers={BUILTINS}",
                                 f"data.modalities={modalities}"])
    own = "[rgb, caption, canny_edge, color_palette, metadata]"  # the photos' own and the built-in labels
    photos = measure("photos", ["data.image_size=224", f"label.labelers={BUILTINS}", f"data.modalities={own}",
                                f"data.input_modalities={own}", f"data.target_modalities={own}"])
    tokens = pretokenized(64)
    emit({"benchmark": "sample_bytes", "date": dt.date.today().isoformat(),
          "command": "python bench/sample_bytes.py " + " ".join(sys.argv[1:]),
          "image_size": 224, "synthetic_4m_b": synthetic, "photos": photos, "pretokenized_4m_b_layout": tokens},
         args.output)


if __name__ == "__main__":
    main()
