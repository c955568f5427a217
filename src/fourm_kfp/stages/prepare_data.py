"""The ``prepare-data`` stage: samples from a source → aligned per-modality shards, a report and a preview grid,
fanned out over the output shards, resumable.

The source (``prepare_data.source``) is a record of :data:`fourm_kfp.data.sources.SOURCES`: synthetic scenes
(:mod:`fourm_kfp.data.synthetic_source`), a folder of images or an image-text WebDataset
(:mod:`fourm_kfp.data.photo_sources`). This module does the same for every one; the record says what differs (its
plan and items, whether it reads outside the config, whether its keys are unique, how the preview gets its samples).

Output: ``<split>/<modality>/shard-NNNNNN.tar`` and the key indexes ``<split>/_keys/shard-NNNNNN.txt``
(:mod:`fourm_kfp.data.shard_writer`) for ``train`` and ``val``; for a source that records each sample's original
size before the centre crop (the photos) also ``<split>/_source/shard-NNNNNN.tar`` (read it with
:func:`fourm_kfp.data.shard_stream.iter_source_info`); and ``reports/`` (JSON and Markdown report, preview grid and
histograms, also attached to the stage's MLflow run).

Which samples go into which output shard follows from the input alone, never from the number of workers, so the
payload is the same bytes at any width: the source's plan lists every job and the output shards it writes.

A job writes its output shards (a WebDataset job both shards of its tar): the shard's tars, its statistics and
skips (``_parts/shards/<split>/shard-NNNNNN.json``, beside the part records and like them outside the payload),
then its key index, which commits it. Fan-out worker ``part`` of ``parts`` (:func:`run_part`) takes every
``parts``-th job and skips the committed ones, so a killed worker redoes only what is missing; inside a worker
``prepare_data.workers`` processes (synthetic scenes) or threads (real images) render or decode. The collect step
(:func:`run`) checks that every planned shard is committed, merges the shards' statistics and skips, applies
``max_bad_fraction`` to the whole of an external source, gives every shard of a split a tar of each modality the
split has (empty where the shard has none of it), and writes the reports; the preview shows the first samples in
shard order.
"""

from __future__ import annotations

import hashlib
import io
import itertools
import json
import logging
import os
import sys
import tempfile
import time
from collections import Counter
from typing import Any, Iterator

import numpy as np

from fourm_kfp.config.fourm_config import FourMConfig
from fourm_kfp.contract import ExternalSource, StageContext, StageResult
from fourm_kfp.contract.shard_jobs import Shard, ShardLedger, parts_stats_key
from fourm_kfp.data.dataset_report import DatasetStats, render_histograms, render_preview_grid, report_markdown
from fourm_kfp.data.ingest import SkipCounter
from fourm_kfp.data.shard_stream import iter_joined_shard
from fourm_kfp.data.shard_writer import SOURCE_DIR, SPLITS, ShardWriter, keys_key, shard_key
from fourm_kfp.data.source_record import EncodedSample, SourceJob
from fourm_kfp.data.sources import source_of
from fourm_kfp.data.ustar import TarSpool
from fourm_kfp.progress import LineProgress
from fourm_kfp.storage import Store

log = logging.getLogger(__name__)


def _shards(job: SourceJob) -> tuple[Shard, ...]:
    """The output shards ``job`` writes."""
    return tuple(Shard(split, index) for split, index in job.shards)


def _planned_shards(jobs: list[SourceJob]) -> list[Shard]:
    """Every output shard of the plan, in shard order."""
    return sorted((shard for job in jobs for shard in _shards(job)), key=lambda shard: shard.order)


def source_fingerprint(config: FourMConfig) -> str | None:
    """What the address covers of what the source reads beyond the config (its record's fingerprint): a changed
    folder gets a new output address. None for a source the config describes wholly."""
    source = source_of(config.prepare_data.source)
    return source.fingerprint(config) if source.fingerprint else None


def _ledger(ctx: StageContext) -> ShardLedger:
    """The output's shards; each one's statistics and skips are kept outside the payload, for the collect step."""
    return ShardLedger(ctx, parts_stats_key)


class _ShardOutput:
    """One output shard as its job writes it: samples, statistics and skips. :meth:`commit` writes the statistics
    (outside the payload: written past the recording store), then the tars and, last, the key index."""

    def __init__(self, ctx: StageContext, ledger: ShardLedger, shard: Shard, modalities: tuple[str, ...]):
        self.ledger, self.shard = ledger, shard
        self.writer = ShardWriter(ctx.output, shard.split, modalities, sys.maxsize, first_index=shard.index)
        self.stats, self.skips = DatasetStats(), SkipCounter()

    def add(self, item: EncodedSample) -> None:
        if item.skipped is not None:
            self.skips.add(item.skipped)
            return
        self.writer.write(item.key, item.encoded)
        self.stats.add(item.split, item.sample)

    def commit(self) -> int:
        split, index = self.shard.split, self.shard.index
        files = [shard_key(split, m, index) for m in sorted(self.writer.counts)] + [keys_key(split, index)]
        record = {"samples": self.writer.samples, "members": dict(sorted(self.writer.counts.items())),
                  "files": files, "stats": self.stats.state(), "skipped": self.skips.as_dict()}
        self.ledger.commit_stats(self.shard, record)
        self.writer.close(commit_empty=True)
        return self.writer.samples


def _write_jobs(ctx: StageContext, ledger: ShardLedger, jobs: list[SourceJob],
                items: Iterator[tuple[int, EncodedSample]], bar: LineProgress) -> int:
    """Route each job's items (in job order) into its output shards and commit them; returns the samples written."""
    # and the per-sample source facts (SOURCE_DIR), for the samples whose source records them
    modalities = (*ctx.config.data.modalities, SOURCE_DIR)
    written, pending = 0, next(items, None)
    for pos, job in enumerate(jobs):
        outputs = {shard.split: _ShardOutput(ctx, ledger, shard, modalities) for shard in _shards(job)}
        while pending is not None and pending[0] == pos:
            item = pending[1]
            if item.split not in outputs:
                raise RuntimeError(f"prepare-data: sample {item.key!r} of {item.split} came with the job of "
                                   f"{', '.join(map(str, _shards(job)))}")
            outputs[item.split].add(item)
            bar.update()
            pending = next(items, None)
        written += sum(output.commit() for output in outputs.values())
    return written


def run_part(ctx: StageContext, part: int, parts: int) -> StageResult:
    """Fan-out worker ``part`` of ``parts``: every ``parts``-th job of the plan, the committed ones skipped."""
    config = ctx.config
    source = source_of(config.prepare_data.source)
    the_plan, ledger = source.plan(config), _ledger(ctx)
    jobs = ledger.take(the_plan.jobs, part, parts, _shards)
    todo = jobs.todo
    sizes = [job.samples for job in todo]
    total = None if None in sizes else sum(sizes)
    started = time.monotonic()
    bar = LineProgress(total, f"prepare-data part {part + 1}/{parts}", source.unit, interval=10.0)
    written = _write_jobs(ctx, ledger, todo, source.items(config, the_plan, todo), bar)
    bar.close()
    seconds = time.monotonic() - started
    return StageResult(counts={"jobs": len(jobs.mine), "jobs_skipped": len(jobs.done),
                               "shards": [list(shard) for job in todo for shard in job.shards]},
                       metrics={"samples": float(written), "seconds": seconds,
                                "samples_per_s": written / max(seconds, 1e-9)})


# ------------------------------------------------------------------------------------------ the collect step


def _backfill(ctx: StageContext, records: dict[Shard, dict[str, Any]]) -> None:
    """Every shard of a split gets a tar of each modality (and ``_source``) the split has: an empty one where the
    shard has none of its samples."""
    members = {split: {m for shard, r in records.items() if shard.split == split for m in r["members"]}
               for split in SPLITS}
    with tempfile.TemporaryDirectory(prefix="fourm-empty-") as spool:
        empty = os.path.join(spool, "empty.tar")
        TarSpool(empty).close()
        for shard, record in records.items():
            for modality in sorted(members[shard.split] - set(record["members"])):
                ctx.output.put_file(shard_key(shard.split, modality, shard.index), empty)


def _key_hash(key: str) -> int:
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "little")


def _duplicate_keys(store: Store, shards: list[Shard], limit: int = 5) -> list[tuple[str, list[Shard]]]:
    """Keys that more than one shard lists (up to ``limit``) with those shards. A source's keys may be unique
    within an input only (a WebDataset's within a tar); across inputs only this tells (a set of 8-byte hashes, not
    of the keys: a big dataset has millions)."""
    hashes, owners = [], []
    for pos, shard in enumerate(shards):
        keys = store.get_text(shard.keys_key).split()
        hashes.append(np.fromiter((_key_hash(k) for k in keys), np.uint64, len(keys)))
        owners.append(np.full(len(keys), pos))
    if not hashes:
        return []
    flat, owner = np.concatenate(hashes), np.concatenate(owners)
    ordered = np.sort(flat)
    repeated = set(ordered[1:][ordered[1:] == ordered[:-1]].tolist()[:limit])
    if not repeated:
        return []
    found: dict[str, list[Shard]] = {}
    for pos in sorted(set(owner[np.isin(flat, list(repeated))].tolist())):  # read the shards that hold them again
        shard = shards[pos]
        for key in store.get_text(shard.keys_key).split():
            if _key_hash(key) in repeated:
                found.setdefault(key, []).append(shard)
    return [(key, where) for key, where in found.items() if len(where) > 1]


def _preview_samples(ctx: StageContext, shards: list[Shard]) -> list[dict[str, Any]]:
    """The first ``preview_samples`` samples in shard order: made again by the source where its record can
    (synthetic scenes: the shards hold depth and normals quantised), else read back (photos: their rgb and caption
    are stored losslessly)."""
    config, out = ctx.config, ctx.output
    render = source_of(config.prepare_data.source).render
    want = config.prepare_data.preview_samples
    samples: list[dict[str, Any]] = []
    for shard in shards:
        if len(samples) >= want:
            break
        if render:
            samples += render(config, out.get_text(shard.keys_key).split()[:want - len(samples)])
        else:
            joined = iter_joined_shard(out, shard.split, shard.index, config.data.modalities)
            samples += [sample for _, sample in itertools.islice(joined, want - len(samples))]
    return samples


def run(ctx: StageContext) -> StageResult:
    """The collect step: check the parts' shards, merge their statistics, check the bad fraction, write the
    reports."""
    config, cfg = ctx.config, ctx.config.prepare_data
    source = source_of(cfg.source)
    the_plan = source.plan(config)
    shards = _planned_shards(the_plan.jobs)
    records = _ledger(ctx).records(shards)
    stats, skips = DatasetStats(), SkipCounter()
    splits = {split: {"samples": 0, "shards": 0, "members": Counter()} for split in SPLITS}
    for shard in shards:
        record = records[shard]
        stats.merge(record["stats"])
        skips.merge(record["skipped"])
        split = splits[shard.split]
        split["samples"] += record["samples"]
        split["shards"] += 1
        split["members"].update({m: n for m, n in record["members"].items() if not m.startswith("_")})
    shard_counts = {split: {"samples": s["samples"], "shards": s["shards"],
                            "modalities": dict(sorted(s["members"].items()))} for split, s in splits.items()}
    total = sum(s["samples"] for s in shard_counts.values())
    if source.external:
        stats.add_skipped(skips.as_dict()["by_reason"])
        skips.check(total + skips.total, cfg.max_bad_fraction, where=f"prepare-data source {cfg.source_uri}")
    if not source.unique_keys:
        for key, where in _duplicate_keys(ctx.output, shards):
            log.warning("prepare-data: key %r is in %s (two inputs of %s hold samples of that name)", key,
                        " and ".join(map(str, where)), cfg.source_uri)
    _backfill(ctx, records)

    report = {"source": cfg.source, "source_uri": cfg.source_uri, "image_size": config.data.image_size,
              "shards": shard_counts, **stats.to_dict()}
    _write_reports(ctx, report, _preview_samples(ctx, shards))

    parts = ctx.part_records()
    seconds = sum(r["metrics"]["seconds"] for r in parts)
    metrics = {
        "samples_train": shard_counts["train"]["samples"],
        "samples_val": shard_counts["val"]["samples"],
        "samples_skipped": skips.total,
        "bad_fraction": skips.total / max(total + skips.total, 1),
        # how the work was split and how fast it went (per worker): the manifest's and MLflow's, not the payload's
        "samples_per_second": sum(r["metrics"]["samples"] for r in parts) / max(seconds, 1e-9),
        "parts": float(len(parts)),
        "parts_seconds": seconds,
    }
    counts = {"splits": shard_counts, "skipped": skips.as_dict() if source.external else {"total": 0}}
    sources = []
    if source.external:
        listing = hashlib.sha256("".join(f"{origin}\n" for origin in the_plan.origins).encode())
        sources = [ExternalSource(cfg.source, cfg.source_uri, listing.hexdigest())]
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
