"""The ``prepare-data`` stage: samples from a source → aligned per-modality shards, a report and a preview grid.

Sources (``prepare_data.source``):

* ``synthetic`` — procedurally generated, exactly aligned 3-D scenes in all seven modalities
  (:mod:`fourm_kfp.data.synthetic_scenes`), rendered in worker processes; deterministic for a seed;
* ``image_folder`` / ``webdataset`` — real images (with captions where there are any), normalised to RGB squares
  (:mod:`fourm_kfp.data.ingest`); unreadable samples are skipped and counted by reason, and the stage fails when
  their fraction exceeds ``prepare_data.max_bad_fraction``.

Output: ``<split>/<modality>/shard-NNNNNN.tar`` for ``train`` and ``val`` plus ``reports/`` (JSON and Markdown
report, preview grid and histograms, also attached to the stage's MLflow run).
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import multiprocessing
import os
import time
from typing import Any, Iterator

from fourm_kfp.config.fourm_config import FourMConfig
from fourm_kfp.contract import ExternalSource, StageContext, StageResult
from fourm_kfp.data.dataset_report import DatasetStats, render_histograms, render_preview_grid, report_markdown
from fourm_kfp.data.shard_writer import ShardWriter, encode_sample
from fourm_kfp.progress import progress
from fourm_kfp.storage import open_store

log = logging.getLogger(__name__)
SPLITS = ("train", "val")


def _render(job: tuple[int, int, int, tuple[str, ...]]) -> tuple[str, dict[str, Any], dict[str, bytes]]:
    from fourm_kfp.data.synthetic_scenes import synthetic_sample

    seed, index, image_size, modalities = job
    sample = {m: v for m, v in synthetic_sample(seed, index, image_size).items() if m in modalities}
    return f"{index:08d}", sample, encode_sample(sample, modalities)


def _synthetic(config: FourMConfig, split: str) -> Iterator[tuple[str, dict[str, Any], dict[str, bytes]]]:
    cfg = config.prepare_data
    start, count = (0, cfg.num_train) if split == "train" else (cfg.num_train, cfg.num_val)
    jobs = [(cfg.seed, i, config.data.image_size, config.data.modalities) for i in range(start, start + count)]
    workers = min(cfg.workers or os.cpu_count() or 1, max(count // 64, 1))
    if workers <= 1:
        yield from map(_render, jobs)
        return
    with multiprocessing.get_context("forkserver").Pool(workers) as pool:
        yield from pool.imap(_render, jobs, chunksize=16)


def _val_split(key: str, fraction: float) -> bool:
    """Deterministic split by key: the same sample always lands in the same split."""
    return int(hashlib.sha1(key.encode()).hexdigest()[:8], 16) / 0x100000000 < fraction


def _real(config: FourMConfig, skips, listing) -> Iterator[tuple[str, str, dict[str, Any], dict[str, bytes]]]:
    from fourm_kfp.data.ingest import iter_image_folder, iter_webdataset

    cfg = config.prepare_data
    source = open_store(cfg.source_uri)
    workers = cfg.workers or os.cpu_count() or 1
    if cfg.source == "image_folder":
        items = iter_image_folder(source, config.data.image_size, cfg.captions_file or None, cfg.min_image_side,
                                  workers=workers)
    else:
        items = iter_webdataset(source, config.data.image_size, cfg.min_image_side, workers=workers)
    for item in items:
        listing.update(f"{item.origin}\n".encode())
        if item.skipped is not None:
            skips.add(item.skipped)
            continue
        sample = {m: v for m, v in item.sample.items() if m in config.data.modalities}
        split = "val" if _val_split(item.key, cfg.val_fraction) else "train"
        yield split, item.key, sample, encode_sample(sample, config.data.modalities)


def source_fingerprint(config: FourMConfig) -> str | None:
    """Digest of a real-data source's listing (keys and sizes, plus the captions file): a changed folder gets a
    new output address. Synthetic data is fully described by the config."""
    cfg = config.prepare_data
    if cfg.source == "synthetic":
        return None
    digest = hashlib.sha256()
    for key, size in open_store(cfg.source_uri).list_sizes():
        digest.update(f"{key}\t{size}\n".encode())
    if cfg.captions_file:
        digest.update(f"captions {cfg.captions_file}\n".encode())
    return "sha256:" + digest.hexdigest()


def run(ctx: StageContext) -> StageResult:
    config, cfg = ctx.config, ctx.config.prepare_data
    writers = {s: ShardWriter(ctx.output, s, config.data.modalities, cfg.samples_per_shard) for s in SPLITS}
    stats = DatasetStats()
    preview: list[dict[str, Any]] = []
    started = time.monotonic()

    def consume(split: str, key: str, sample: dict[str, Any], encoded: dict[str, bytes]) -> None:
        writers[split].write(key, encoded)
        stats.add(split, sample)
        if len(preview) < cfg.preview_samples:
            preview.append(sample)

    skips = None
    if cfg.source == "synthetic":
        for split in SPLITS:
            total = cfg.num_train if split == "train" else cfg.num_val
            for key, sample, encoded in progress(_synthetic(config, split), total, f"prepare-data {split}", "scenes"):
                consume(split, key, sample, encoded)
    else:
        from fourm_kfp.data.ingest import SkipCounter

        skips, listing = SkipCounter(), hashlib.sha256()
        for split, key, sample, encoded in progress(_real(config, skips, listing), None, "prepare-data", "images"):
            consume(split, key, sample, encoded)
        seen = sum(w.samples for w in writers.values()) + skips.total
        stats.add_skipped(skips.as_dict()["by_reason"])
        skips.check(seen, cfg.max_bad_fraction, where=f"prepare-data source {cfg.source_uri}")

    shards = {split: writer.close() for split, writer in writers.items()}
    seconds = time.monotonic() - started
    report = {"source": cfg.source, "source_uri": cfg.source_uri, "image_size": config.data.image_size,
              "shards": shards, **stats.to_dict()}
    _write_reports(ctx, report, preview)

    total = sum(s["samples"] for s in shards.values())
    skipped = skips.total if skips else 0
    metrics = {
        "samples_train": shards["train"]["samples"],
        "samples_val": shards["val"]["samples"],
        "samples_skipped": skipped,
        "bad_fraction": skipped / max(total + skipped, 1),
        "samples_per_second": total / max(seconds, 1e-9),
    }
    counts = {"splits": shards, "skipped": skips.as_dict() if skips else {"total": 0}}
    sources = [] if skips is None else [ExternalSource(cfg.source, cfg.source_uri, listing.hexdigest())]
    return StageResult(counts=counts, metrics=metrics, sources=sources)


def _write_reports(ctx: StageContext, report: dict[str, Any], preview: list[dict[str, Any]]) -> None:
    ctx.write_report("dataset_report.json", json.dumps(report, indent=2, sort_keys=True).encode())
    ctx.write_report("dataset_report.md", report_markdown(report).encode())
    modalities = [m for m in ctx.config.data.modalities if any(m in s for s in preview)]
    for name, image in (("preview.png", render_preview_grid(preview, modalities) if preview else None),
                        ("histograms.png", render_histograms(report))):
        if image is not None:
            buf = io.BytesIO()
            image.save(buf, format="PNG")
            ctx.write_report(name, buf.getvalue())
