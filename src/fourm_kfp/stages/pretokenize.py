"""The ``pretokenize`` stage: every sample's aligned crops to VQ-VAE tokens, fanned out over shards, resumable.

Reads the dataset's shards (prepare-data's and the label stage's) and the tokenizer bundle by URI and writes the
pretokenized dataset (:mod:`fourm_kfp.data.pretokenized`): input shard ``i`` → output shard ``i``. The output's
shards are a :class:`~fourm_kfp.contract.shard_jobs.ShardLedger`'s, as prepare-data's and the label stage's are: a
fan-out worker (``run_part``) takes every ``parts``-th shard and skips those already committed (a key index and a
statistics record, which lives outside the payload, under ``_parts/shards/``), so a killed worker redoes only what
is missing. The collect step (``run``) checks the parts: every shard committed, the same keys in the same order as
the input, counts that match, and a sample of tokens decoded back through the tokenizers whose reconstruction error
matches the one train-tokenizers measured (a mismatch fails naming the modality); then it writes the index and the
report.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import numpy as np
import torch

from fourm_kfp.contract import StageContext, StageResult
from fourm_kfp.contract.manifest import MANIFEST_NAME
from fourm_kfp.contract.shard_jobs import ShardLedger, committed_shards, parts_stats_key
from fourm_kfp.data.modalities import IMAGE_MODALITIES, SEQUENCE_MODALITIES
from fourm_kfp.data.pretokenized import INDEX_FILE, decode_member, token_name
from fourm_kfp.data.shard_stream import available_modalities, iter_split
from fourm_kfp.data.shard_writer import SPLITS
from fourm_kfp.progress import LineProgress
from fourm_kfp.stages import TRAIN_TOKENIZERS
from fourm_kfp.storage import output_ref
from fourm_kfp.tokenizers.bundle import INDEX_FILE as TOKENIZERS_INDEX, load_tokenizers
from fourm_kfp.tokenizers.metrics import METRICS
from fourm_kfp.tokenizers.pretokenize_report import codebook_usage_png, report_markdown, token_statistics
from fourm_kfp.tokenizers.pretokenizer import Pretokenizer, output_names, pretokenize_shards
from fourm_kfp.tokenizers.shard_crops import CropSettings, decode_workers

log = logging.getLogger(__name__)
TOKENIZERS = TRAIN_TOKENIZERS.name


class PretokenizeCheckError(RuntimeError):
    """The collected parts do not reproduce the input (keys, counts) or the tokenizers' reconstruction quality."""


def _ledger(ctx: StageContext) -> ShardLedger:
    """The output's shards, one per input shard; each one's statistics record is kept outside the payload."""
    return ShardLedger(ctx, parts_stats_key)


def _plan(ctx: StageContext) -> dict[str, Any]:
    """What this dataset pretokenizes: input modalities, tokenizers, output names and shards (the input's)."""
    data = ctx.dataset
    index = json.loads(ctx.inputs[TOKENIZERS].store.get_bytes(TOKENIZERS_INDEX))
    present = set(available_modalities(data, "train"))
    image = [m for m in IMAGE_MODALITIES if m in present and m in index["image"]]
    text = [m for m in SEQUENCE_MODALITIES if m in present]
    keep_rgb = ctx.config.pretokenize.keep_rgb_pixels and "rgb" in present
    return {"image": image, "text": text, "keep_rgb": keep_rgb, "shards": committed_shards(data), "index": index,
            "read": sorted(set(image + text + (["rgb"] if keep_rgb else []))),
            "names": output_names(image, text, keep_rgb)}


def camera_resample(rgb_tokenizer: Any) -> str:
    """How rgb crops are resized: as the rgb tokenizer's inputs were (an ml-4m tokenizer's bicubic), else
    bilinearly. The address says so (``stages._pretokenize_view``)."""
    return getattr(rgb_tokenizer, "camera_resample", "bilinear")


def run_part(ctx: StageContext, part: int, parts: int) -> StageResult:
    cfg = ctx.config.pretokenize
    plan = _plan(ctx)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    bundle = load_tokenizers(ctx.inputs[TOKENIZERS].store, device=str(device))
    crops = CropSettings(cfg.n_crops, tuple(cfg.crop_scale), tuple(cfg.crop_ratio), cfg.flip_probability, cfg.seed,
                         camera_resample=camera_resample(bundle.image.get("rgb")))
    pretokenizer = Pretokenizer({m: bundle.image[m] for m in plan["image"]}, ctx.config.data.image_size, crops,
                                cfg.batch_size, device, plan["text"], plan["keep_rgb"])
    ledger, data = _ledger(ctx), ctx.dataset
    shards = ledger.take(plan["shards"], part, parts)
    total = sum(len(data.get_text(shard.keys_key).split()) for shard in shards.todo)  # small key indexes
    bar = LineProgress(total, f"pretokenize part {part + 1}/{parts}", "samples", interval=10.0)
    workers = decode_workers(cfg.decode_workers, device)
    log.info("pretokenize part %d/%d: %d decode workers", part + 1, parts, workers)
    stats = pretokenize_shards(data, ctx.output, shards.todo, plan["read"], pretokenizer, plan["names"], workers,
                               progress=lambda n, total, s: bar.update(n), commit_stats=ledger.commit_stats)
    bar.close()
    stats["shards_skipped"] = float(len(shards.done))
    stats["encoded_images"], stats["decode_workers"] = float(pretokenizer.encoded_images), float(workers)
    stats["samples_per_s"] = stats["samples"] / max(stats["seconds"], 1e-9)
    return StageResult(counts={"shards": [[shard.split, shard.index] for shard in shards.mine]}, metrics=stats)


def _check_keys(ctx: StageContext, plan: dict[str, Any]) -> dict[str, int]:
    """Every shard committed (its statistics record read through the ledger), listing the input shard's keys in
    their order; the samples of each split."""
    data, out = ctx.dataset, ctx.output
    samples = {split: 0 for split in SPLITS}
    for shard, record in _ledger(ctx).records(plan["shards"]).items():
        expected, got = data.get_text(shard.keys_key).split(), out.get_text(shard.keys_key).split()
        if expected != got:
            raise PretokenizeCheckError(f"pretokenize: {out.uri_of(shard.keys_key)} does not list the keys of "
                                        f"{data.uri_of(shard.keys_key)} in the same order")
        if record["samples"] != len(got):
            raise PretokenizeCheckError(f"pretokenize: {shard}'s statistics record says {record['samples']} samples, "
                                        f"its key index {out.uri_of(shard.keys_key)} lists {len(got)}")
        samples[shard.split] += record["samples"]
    return samples


def _tokenizer_error(ctx: StageContext, modality: str, metric: str) -> float:
    """An error train-tokenizers measured on the val images (``metric`` of the tokenizer of ``modality``, or
    ``baseline_<metric>`` of the trivial baseline), as its manifest's metrics record it
    (``<modality>.<metric>``)."""
    tokenizers = ctx.inputs[TOKENIZERS]
    key = f"{modality}.{metric}"
    try:
        return tokenizers.manifest["metrics"][key]
    except KeyError:
        raise PretokenizeCheckError(f"pretokenize: {tokenizers.store.uri_of(MANIFEST_NAME)} records no metric "
                                    f"{key!r}: the tokenizers were not evaluated on {modality}") from None


def _check_reconstruction(ctx: StageContext, plan: dict[str, Any]) -> dict[str, float]:
    """Decode crop 0 of the first val samples; its error must match the one train-tokenizers measured (relative to
    the trivial baseline's error, within ``check_tolerance``)."""

    cfg = ctx.config.pretokenize
    if not cfg.check_samples or not plan["image"]:
        return {}
    bundle = load_tokenizers(ctx.inputs[TOKENIZERS].store)
    names = [token_name(m) for m in plan["image"]]
    tokens = {m: [] for m in plan["image"]}
    for _, sample in iter_split(ctx.output, "val", names, decode=decode_member, limit=cfg.check_samples):
        for m in plan["image"]:
            tokens[m].append(sample[token_name(m)][0] if token_name(m) in sample else None)
    originals = {m: [] for m in plan["image"]}
    for _, sample in iter_split(ctx.dataset, "val", plan["image"], limit=cfg.check_samples):
        for m in plan["image"]:
            originals[m].append(sample.get(m))
    metrics = {}
    for m in plan["image"]:
        pairs = [(t, o) for t, o in zip(tokens[m], originals[m]) if t is not None and o is not None]
        if not pairs:
            continue
        decoded = bundle.image[m].decode(np.stack([t.astype(np.int64) for t, _ in pairs]))
        primary = METRICS[m].primary
        error = METRICS[m].errors(decoded, bundle.image[m].codec.reference(np.stack([o for _, o in pairs])))[primary]
        expected, baseline = _tokenizer_error(ctx, m, primary), _tokenizer_error(ctx, m, f"baseline_{primary}")
        deviation = abs(error - expected) / max(baseline, 1e-12)
        metrics[f"check.{m}.{primary}"], metrics[f"check.{m}.deviation"] = error, deviation
        if deviation > cfg.check_tolerance:
            raise PretokenizeCheckError(
                f"pretokenize: decoded {m} tokens give {primary}={error:.4g}, train-tokenizers measured "
                f"{expected:.4g} (deviation {deviation:.1%} of the baseline error, more than "
                f"pretokenize.check_tolerance={cfg.check_tolerance}): the tokens do not match their tokenizer")
    return metrics


def _dataset_refs(ctx: StageContext) -> dict[str, Any]:
    """Where the dataset came from, as the index records it: prepare-data's output (``data_uri``) and, when there
    are more layers (the label stage's), every layer by stage name."""
    layers = ctx.dataset_layers
    refs: dict[str, Any] = {"data_uri": output_ref(layers[0].uri)}
    if len(layers) > 1:
        refs["dataset_layers"] = {layer.name: output_ref(layer.uri) for layer in layers}
    return refs


def run(ctx: StageContext) -> StageResult:
    """The collect step: check the parts, then write the index and the report."""
    plan = _plan(ctx)
    samples = _check_keys(ctx, plan)
    records = ctx.part_records()
    expected = ctx.dataset_manifest["counts"]["splits"]
    for split in SPLITS:
        if samples[split] != expected[split]["samples"]:
            raise PretokenizeCheckError(f"pretokenize: {samples[split]} {split} samples written, the input has "
                                        f"{expected[split]['samples']}")
    metrics = _check_reconstruction(ctx, plan)
    stats = token_statistics(ctx.output, plan, ctx.config.pretokenize.n_crops)
    seconds = sum(r["metrics"]["seconds"] for r in records)
    encoded = sum(r["metrics"]["samples"] for r in records)
    cfg = ctx.config.pretokenize
    index = {
        "n_crops": cfg.n_crops, "image_size": ctx.config.data.image_size,
        "tokenizers_uri": output_ref(ctx.inputs[TOKENIZERS].uri),
        **_dataset_refs(ctx),
        "modalities": {token_name(m): {"vocab_size": plan["index"]["image"][m]["codebook_size"],
                                       "grid": [plan["index"]["image"][m]["grid_size"]] * 2,
                                       "dtype": stats["dtypes"][m]} for m in plan["image"]},
        "text": {"modalities": plan["text"], **(plan["index"].get("text") or {})},
        "rgb_pixels": plan["keep_rgb"], "splits": samples,
    }
    ctx.output.put_bytes(INDEX_FILE, json.dumps(index, indent=2, sort_keys=True).encode())
    report = {"samples": samples, "crops": cfg.n_crops, "tokens_per_sample": stats["tokens_per_sample"],
              "codebook_usage": stats["usage"], "check": metrics}
    ctx.write_report("pretokenize_report.json", json.dumps(report, indent=2, sort_keys=True).encode())
    ctx.write_report("pretokenize_report.md", report_markdown(report).encode())
    if stats["histograms"]:
        ctx.write_report("codebook_usage.png", codebook_usage_png(stats["histograms"]))
    flat = {f"{m}.codebook_usage": v for m, v in stats["usage"].items()}
    # How the work was split and how fast it went: the manifest's and MLflow's, not the report's (the payload).
    flat.update(metrics, samples_per_s=encoded / max(seconds, 1e-9), parts=float(len(records)),
                parts_seconds=seconds, samples=float(sum(samples.values())))
    return StageResult(counts={"splits": samples, "crops": cfg.n_crops, "modalities": plan["names"]}, metrics=flat)
