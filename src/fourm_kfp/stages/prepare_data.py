"""The ``prepare-data`` stage: samples from a source → aligned per-modality shards, a report and a preview grid,
fanned out over the output shards, resumable.

Sources (``prepare_data.source``):

* ``synthetic`` — procedurally generated, exactly aligned 3-D scenes in all seven modalities
  (:mod:`fourm_kfp.data.synthetic_scenes`), rendered in worker processes; deterministic for a seed;
* ``image_folder`` / ``webdataset`` — real images (with captions where there are any), normalised to RGB squares
  (:mod:`fourm_kfp.data.ingest`); unreadable samples are skipped and counted by reason, and the stage fails when
  their fraction of the whole source exceeds ``prepare_data.max_bad_fraction``.

Output: ``<split>/<modality>/shard-NNNNNN.tar`` and the key indexes ``<split>/_keys/shard-NNNNNN.txt``
(:mod:`fourm_kfp.data.shard_writer`) for ``train`` and ``val``; for real data also ``<split>/_source/shard-NNNNNN.tar``,
each sample's original size before the centre crop (read it with
:func:`fourm_kfp.data.shard_stream.iter_source_info`); and ``reports/`` (JSON and Markdown report, preview grid and
histograms, also attached to the stage's MLflow run).

Which samples go into which output shard follows from the input alone, never from the number of workers, so the
payload is the same bytes at any width (:func:`plan`):

* synthetic: the train scenes ``0 .. num_train - 1``, then the val scenes, fill their split's shards of
  ``samples_per_shard`` in order;
* image folder: the sorted listing gives every image its key and the key's hash its split; a split's images, in
  listing order, fill its shards of ``samples_per_shard`` (an unusable image leaves its shard one sample short);
* WebDataset: input tar ``t`` (in name order) becomes shard ``t`` of each split, its samples in tar order and split
  by key hash (``samples_per_shard`` does not apply: a tar's samples are not known before it is read).

A job writes one output shard (a WebDataset job both shards of its tar): the shard's tars, its statistics and skips
(``_parts/shards/<split>/shard-NNNNNN.json``, beside the part records and like them outside the payload), then its
key index, which commits it. Fan-out worker ``part`` of ``parts`` (:func:`run_part`) takes every ``parts``-th job
and skips the committed ones, so a killed worker redoes only what is missing; inside a worker
``prepare_data.workers`` processes (synthetic scenes) or threads (real images) render or decode. The collect step
(:func:`run`) checks that every planned shard is committed, merges the shards' statistics and skips, applies
``max_bad_fraction`` to the whole source, gives every shard of a split a tar of each modality the split has (empty
where the shard has none of it), and writes the reports; the preview shows the first samples in shard order.
"""

from __future__ import annotations

import hashlib
import io
import itertools
import json
import logging
import multiprocessing
import os
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterable, Iterator, NamedTuple

import numpy as np

from fourm_kfp.config.fourm_config import FourMConfig
from fourm_kfp.contract import ExternalSource, StageContext, StageResult
from fourm_kfp.contract.shard_jobs import Shard, ShardLedger, parts_stats_key
from fourm_kfp.data.dataset_report import DatasetStats, render_histograms, render_preview_grid, report_markdown
from fourm_kfp.config.schema import ConfigError
from fourm_kfp.data.ingest import (IMAGE_EXTENSIONS, ImageFolder, SkipCounter, iter_webdataset_tar, ordered_map,
                                   webdataset_tars)
from fourm_kfp.data.shard_stream import iter_joined_shard
from fourm_kfp.data.shard_writer import (SOURCE_DIR, SPLITS, ShardWriter, encode_sample, encode_source_info, keys_key,
                                         shard_key)
from fourm_kfp.data.ustar import TarSpool
from fourm_kfp.progress import LineProgress
from fourm_kfp.storage import Store, open_store

if TYPE_CHECKING:
    from fourm_kfp.data.image_normalize import BadSampleError
    from fourm_kfp.data.ingest import SourceItem

log = logging.getLogger(__name__)
#: Real-data outputs are laid out by :func:`plan` (a split's shards filled from the listing, WebDataset tar ``t`` →
#: shard ``t``) and carry a ``_source`` tar, unlike the single-worker layout before: this salt in their source
#: fingerprint moves their addresses. Synthetic outputs keep their bytes, so their address stays.
REAL_DATA_LAYOUT = "layout 2: fan-out shards planned from the listing, _source tars"


@dataclass(frozen=True)
class Job:
    """One unit of a worker's work: the output shards it writes and what it reads for them."""

    shards: tuple[Shard, ...]
    #: synthetic: the scene indices; image folder: its :class:`~fourm_kfp.data.ingest.FolderEntry` tuple;
    #: WebDataset: the input tar's key
    inputs: Any


@dataclass
class Plan:
    """What the whole source gives: every job (in order) and every output shard (in shard order)."""

    jobs: list[Job]
    folder: ImageFolder | None = None  # an image folder source
    origins: list[str] = field(default_factory=list)  # a real source's inputs, in order (its lineage digest)

    @property
    def shards(self) -> list[Shard]:
        return sorted((s for job in self.jobs for s in job.shards), key=lambda s: s.order)


class _Item(NamedTuple):
    """One sample of a job, encoded, or the record of one that was skipped."""

    split: str
    key: str
    sample: dict[str, Any] | None
    encoded: dict[str, bytes] | None
    skipped: BadSampleError | None = None


def _split_of(key: str, fraction: float) -> str:
    """Deterministic split by key: the same sample always lands in the same split."""
    return "val" if int(hashlib.sha1(key.encode()).hexdigest()[:8], 16) / 0x100000000 < fraction else "train"


def _chunks(items: Any, size: int) -> list[Any]:
    return [items[first:first + size] for first in range(0, len(items), size)]


def plan(config: FourMConfig) -> Plan:
    """The jobs and output shards of the whole source, from the config and the source's listing alone."""
    cfg = config.prepare_data
    if cfg.source == "synthetic":
        jobs = []
        for split, start, count in (("train", 0, cfg.num_train), ("val", cfg.num_train, cfg.num_val)):
            scenes = range(start, start + count)
            jobs += [Job((Shard(split, i),), chunk) for i, chunk in enumerate(_chunks(scenes, cfg.samples_per_shard))]
        return Plan(jobs)
    source = open_store(cfg.source_uri)
    if cfg.source == "image_folder":
        folder = ImageFolder(source, config.data.image_size, cfg.captions_file or None, cfg.min_image_side,
                             cfg.include)
        if not folder.entries:
            _no_source_data(cfg, "no image (" + " ".join(sorted(IMAGE_EXTENSIONS)) + ")"
                            + (f" matching prepare_data.include {list(cfg.include)}" if cfg.include else ""))
        by_split: dict[str, list[Any]] = {split: [] for split in SPLITS}
        for entry in folder.entries:
            by_split[_split_of(entry.key, cfg.val_fraction)].append(entry)
        jobs = [Job((Shard(split, i),), tuple(chunk)) for split in SPLITS
                for i, chunk in enumerate(_chunks(by_split[split], cfg.samples_per_shard))]
        return Plan(jobs, folder, [source.uri_of(e.path) for e in folder.entries])
    tars = webdataset_tars(source)
    if not tars:
        _no_source_data(cfg, "no WebDataset shard (.tar)")
    return Plan([Job((Shard("train", t), Shard("val", t)), tar) for t, tar in enumerate(tars)], None,
                [source.uri_of(tar) for tar in tars])


def _no_source_data(cfg, what: str) -> None:
    """Fail at the start of prepare-data on a source with nothing to prepare (a missing or empty folder, a wrong
    path): committed, an empty dataset would fail the run stages later, far from the cause."""
    raise ConfigError(f"prepare_data.source_uri={cfg.source_uri!r} ({cfg.source}): {what} there; is the folder "
                      "missing or empty, or the path wrong?")


def source_fingerprint(config: FourMConfig) -> str | None:
    """Digest of a real-data source's listing (keys and sizes, plus the captions file) and of the output layout: a
    changed folder gets a new output address. Synthetic data is fully described by the config."""
    cfg = config.prepare_data
    if cfg.source == "synthetic":
        return None
    from fourm_kfp.data.ingest import included

    digest = hashlib.sha256(f"{REAL_DATA_LAYOUT}\n".encode())
    for key, size in open_store(cfg.source_uri).list_sizes():
        if included(key, cfg.include) or key.endswith(".txt"):  # the images taken, and caption side files
            digest.update(f"{key}\t{size}\n".encode())
    if cfg.captions_file:
        digest.update(f"captions {cfg.captions_file}\n".encode())
    return "sha256:" + digest.hexdigest()


# ------------------------------------------------------------------------------------------------ the workers


def _scene(scene: tuple[int, int, int, tuple[str, ...]]) -> dict[str, Any]:
    """Synthetic scene ``(seed, index, image_size, modalities kept)``."""
    from fourm_kfp.data.synthetic_scenes import synthetic_sample

    seed, index, image_size, modalities = scene
    return {m: v for m, v in synthetic_sample(seed, index, image_size).items() if m in modalities}


def _render(scene: tuple[int, int, int, tuple[str, ...]]) -> tuple[str, dict[str, Any], dict[str, bytes]]:
    sample = _scene(scene)
    return f"{scene[1]:08d}", sample, encode_sample(sample, scene[3])


def _scenes(config: FourMConfig, indices: Iterable[int]) -> Iterator[tuple[int, int, int, tuple[str, ...]]]:
    for index in indices:
        yield config.prepare_data.seed, index, config.data.image_size, tuple(config.data.modalities)


def _synthetic_items(config: FourMConfig, jobs: list[Job]) -> Iterator[tuple[int, _Item]]:
    work = [(pos, job.shards[0].split, index) for pos, job in enumerate(jobs) for index in job.inputs]
    scenes = _scenes(config, (index for _, _, index in work))
    workers = min(config.prepare_data.workers or os.cpu_count() or 1, max(len(work) // 64, 1))
    pool = multiprocessing.get_context("forkserver").Pool(workers) if workers > 1 else None
    try:
        rendered = pool.imap(_render, scenes, chunksize=16) if pool else map(_render, scenes)
        for (pos, split, _), (key, sample, encoded) in zip(work, rendered, strict=True):
            yield pos, _Item(split, key, sample, encoded)
    finally:
        if pool:
            pool.terminate()


def _real_item(config: FourMConfig, split: str, item: SourceItem) -> _Item:
    if item.skipped is not None:
        return _Item(split, item.key, None, None, item.skipped)
    sample = {m: v for m, v in item.sample.items() if m in config.data.modalities}
    width, height = item.original_size
    encoded = {**encode_sample(sample, config.data.modalities),
               SOURCE_DIR: encode_source_info({"original_width": width, "original_height": height})}
    return _Item(split, item.key, sample, encoded)


def _folder_items(config: FourMConfig, folder: ImageFolder, jobs: list[Job]) -> Iterator[tuple[int, _Item]]:
    def load(work: tuple[int, str, Any]) -> tuple[int, _Item]:  # decoded and encoded on a worker thread
        pos, split, entry = work
        return pos, _real_item(config, split, folder.load(entry))

    work = ((pos, job.shards[0].split, entry) for pos, job in enumerate(jobs) for entry in job.inputs)
    yield from ordered_map(load, work, config.prepare_data.workers or os.cpu_count() or 1)


def _webdataset_items(config: FourMConfig, jobs: list[Job]) -> Iterator[tuple[int, _Item]]:
    cfg = config.prepare_data
    source, workers = open_store(cfg.source_uri), cfg.workers or os.cpu_count() or 1

    def encode(item: SourceItem) -> _Item:  # on a worker thread too: a 224-px PNG costs about what its decode does
        return _real_item(config, _split_of(item.key, cfg.val_fraction), item)

    for pos, job in enumerate(jobs):
        items = iter_webdataset_tar(source, job.inputs, config.data.image_size, cfg.min_image_side, workers)
        for item in ordered_map(encode, items, workers):
            yield pos, item


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

    def add(self, item: _Item) -> None:
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


def _write_jobs(ctx: StageContext, ledger: ShardLedger, jobs: list[Job], items: Iterator[tuple[int, _Item]],
                bar: LineProgress) -> int:
    """Route each job's items (in job order) into its output shards and commit them; returns the samples written."""
    modalities = tuple(ctx.config.data.modalities)
    if ctx.config.prepare_data.source != "synthetic":
        modalities += (SOURCE_DIR,)
    written, pending = 0, next(items, None)
    for pos, job in enumerate(jobs):
        outputs = {shard.split: _ShardOutput(ctx, ledger, shard, modalities) for shard in job.shards}
        while pending is not None and pending[0] == pos:
            item = pending[1]
            if item.split not in outputs:
                raise RuntimeError(f"prepare-data: sample {item.key!r} of {item.split} came with the job of "
                                   f"{', '.join(map(str, job.shards))}")
            outputs[item.split].add(item)
            bar.update()
            pending = next(items, None)
        written += sum(output.commit() for output in outputs.values())
    return written


def run_part(ctx: StageContext, part: int, parts: int) -> StageResult:
    """Fan-out worker ``part`` of ``parts``: every ``parts``-th job of the plan, the committed ones skipped."""
    config, cfg = ctx.config, ctx.config.prepare_data
    the_plan, ledger = plan(config), _ledger(ctx)
    jobs = ledger.take(the_plan.jobs, part, parts, lambda job: job.shards)
    todo = jobs.todo
    if cfg.source == "synthetic":
        items, total, unit = _synthetic_items(config, todo), sum(len(job.inputs) for job in todo), "scenes"
    elif cfg.source == "image_folder":
        items, total, unit = _folder_items(config, the_plan.folder, todo), sum(len(j.inputs) for j in todo), "images"
    else:
        items, total, unit = _webdataset_items(config, todo), None, "images"
    started = time.monotonic()
    bar = LineProgress(total, f"prepare-data part {part + 1}/{parts}", unit, interval=10.0)
    written = _write_jobs(ctx, ledger, todo, items, bar)
    bar.close()
    seconds = time.monotonic() - started
    return StageResult(counts={"jobs": len(jobs.mine), "jobs_skipped": len(jobs.done),
                               "shards": [[s.split, s.index] for job in todo for s in job.shards]},
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
    """Keys that more than one shard lists (up to ``limit``) with those shards. WebDataset keys are unique within
    a tar; across tars only this tells (a set of 8-byte hashes, not of the keys: a big dataset has millions)."""
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
    """The first ``preview_samples`` samples in shard order: synthetic scenes rendered again (the shards hold depth
    and normals quantised), real samples read back (their rgb and caption are stored losslessly)."""
    config, out = ctx.config, ctx.output
    want = config.prepare_data.preview_samples
    samples: list[dict[str, Any]] = []
    for shard in shards:
        if len(samples) >= want:
            break
        if config.prepare_data.source == "synthetic":
            keys = out.get_text(shard.keys_key).split()[:want - len(samples)]
            samples += map(_scene, _scenes(config, map(int, keys)))
        else:
            joined = iter_joined_shard(out, shard.split, shard.index, config.data.modalities)
            samples += [sample for _, sample in itertools.islice(joined, want - len(samples))]
    return samples


def run(ctx: StageContext) -> StageResult:
    """The collect step: check the parts' shards, merge their statistics, check the bad fraction, write the
    reports."""
    config, cfg = ctx.config, ctx.config.prepare_data
    the_plan = plan(config)
    shards = the_plan.shards
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
    real = cfg.source != "synthetic"
    if real:
        stats.add_skipped(skips.as_dict()["by_reason"])
        skips.check(total + skips.total, cfg.max_bad_fraction, where=f"prepare-data source {cfg.source_uri}")
    if cfg.source == "webdataset":
        for key, where in _duplicate_keys(ctx.output, shards):
            log.warning("prepare-data: key %r is in %s (two tars of %s hold samples of that name)", key,
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
    counts = {"splits": shard_counts, "skipped": skips.as_dict() if real else {"total": 0}}
    sources = []
    if real:
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
