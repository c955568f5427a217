"""The ``label`` stage: pseudo-labels for the prepared images, fanned out over shards, and the data gate.

4M trains on images whose other modalities come from teachers. This stage runs the configured labelers
(``label.labelers``; :mod:`fourm_kfp.labelers`) over prepare-data's shards and writes each labelled modality as
shards with the same shard indices and keys: its output is a layer of the dataset, which the later stages read
together with prepare-data's (:attr:`fourm_kfp.contract.context.StageContext.dataset`). With no labelers the stage
is off, and every address is what it was without it.

A fan-out worker (``run_part``) labels every ``parts``-th input shard and skips the shards already committed, so a
killed worker redoes only what is missing, with the same bytes. Each output shard is committed by its key index,
written last after its tars, its gate statistics and its dropped keys.

The gate, per sample: every label is checked against its modality (:mod:`fourm_kfp.data.label_checks`): a bad
value fails the stage naming the shard, the key and the modality. A sample lacking one of the required modalities
(``label.required_modalities``; by default rgb and every labelled modality) is dropped from every modality
(``label.missing: drop``) or kept without it (``keep``); either way the stage fails when more than
``label.max_missing_fraction`` of the samples lack one. The collect step (``run``) checks the shards, sums the
statistics, applies that threshold, and writes the report: coverage per modality, which labeler made each modality,
and a preview grid of the photos beside their labels. It also writes the dataset's ``dataset_meta.json`` when a
labeler has a class vocabulary or makes relative depth (:func:`dataset_meta`; :mod:`fourm_kfp.data.vocabularies`).
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import time
from collections import Counter
from dataclasses import replace
from typing import Any, Iterator

from fourm_kfp.config.fourm_config import FourMConfig
from fourm_kfp.config.loader import load_config
from fourm_kfp.config.schema import ConfigError
from fourm_kfp.contract import StageContext, StageResult
from fourm_kfp.contract.addressing import canonical_json, stage_address
from fourm_kfp.contract.manifest import read_manifest
from fourm_kfp.contract.shard_jobs import Shard, ShardLedger, committed_shards, payload_stats_key
from fourm_kfp.data.dataset_report import render_preview_grid
from fourm_kfp.data.label_checks import CheckSettings, check_value
from fourm_kfp.data.modalities import get_modality
from fourm_kfp.data.shard_stream import available_modalities, iter_joined_shard, iter_source_info, shard_indices
from fourm_kfp.data.shard_writer import ShardWriter, dropped_key
from fourm_kfp.data.vocabularies import META_FILE, DatasetMeta, read_dataset_meta
from fourm_kfp.labelers.base import LabelBatch, Labeler, check_labels
from fourm_kfp.labelers.registry import build_labeler, labeler_class
from fourm_kfp.labelers.weights import folder_to_read, weights_digest
from fourm_kfp.progress import LineProgress
from fourm_kfp.stages import PREPARE_DATA, PRETRAIN
from fourm_kfp.storage import LayeredStore, Store, open_store, sibling_output_uri

log = logging.getLogger(__name__)
DATA = PREPARE_DATA.name
#: Where each output shard's gate statistics are, in the payload: ``<split>/_label_stats/shard-NNNNNN.json``.
STATS_DIR = "_label_stats"
#: What the labelers read of a prepared sample besides its rgb (when the dataset has it).
CONTEXT_MODALITIES = ("caption",)


class LabelGateError(RuntimeError):
    """A label failed its modality's value check, or too many samples lack a required modality."""


def _where(i: int) -> str:
    return f"label.labelers[{i}]"


#: ``weights: "preset:<name>"``: the pretrain output of that preset in the store this stage writes to (a teacher
#: that is one of this pipeline's models, found by its content address).
PRESET_REF = "preset:"


def _preset_address(weights: str) -> str:
    """The pretrain output address of the preset a ``preset:<name>`` reference names."""
    return stage_address(PRETRAIN, load_config(weights[len(PRESET_REF):]))


def labelers_fingerprint(config: FourMConfig) -> str | None:
    """What the address covers of the labelers beyond their config entries: each one's version and the digest of
    its weights (a missing file fails here, naming its URI, before anything runs); for a ``preset:<name>`` teacher,
    the content address of that preset's model, which its config alone decides."""
    if not config.label.labelers:
        return None
    parts = []
    for i, entry in enumerate(config.label.labelers):
        cls = labeler_class(entry.name)
        weights = _folder_or_uri(cls, entry, i)
        if entry.weights.startswith(PRESET_REF):
            digest = f"{PRETRAIN.name}/{_preset_address(entry.weights)}"
        elif cls.needs_weights or entry.weights:
            digest = weights_digest(cls.weights_kind, weights, _where(i))
        else:
            digest = None
        parts.append({"name": entry.name, "version": str(cls.version), "weights": digest})
    return "sha256:" + hashlib.sha256(canonical_json(parts)).hexdigest()


def _folder_or_uri(cls, entry, i: int) -> str:
    """A folder labeler's weights to read (:func:`folder_to_read`: a missing local folder whose ``source`` commit is
    in the Hugging Face cache is read from there; else an error with the command that fetches it); other weights as
    the entry names them."""
    return folder_to_read(entry.weights, entry.source, _where(i)) if cls.weights_kind == "folder" else entry.weights


def _weights_uri(weights: str, data_uri: str, where: str) -> str:
    """A labeler's weights as a URI: a ``preset:<name>`` reference becomes that preset's pretrain output in the store
    this run reads its data from (beside prepare-data's output: also when ``fourm-kfp verify`` recomputes the labels
    into a scratch store), which must be committed."""
    if not weights.startswith(PRESET_REF):
        return weights
    uri = sibling_output_uri(data_uri, PRETRAIN.name, _preset_address(weights))
    if read_manifest(open_store(uri)) is None:
        preset = weights[len(PRESET_REF):]
        raise ConfigError(f"{where}: the teacher {weights!r} is the {preset} preset's model, which is not committed "
                          f"at {uri}: run `fourm-kfp run --preset {preset}` first with the same --root/--store")
    return uri


def wants_accelerator(config: FourMConfig) -> bool:
    """Whether any configured labeler runs much faster on an accelerator (a teacher network)."""
    return any(labeler_class(entry.name).wants_accelerator for entry in config.label.labelers)


def _device(labeler_wants_accelerator: bool) -> str:
    if not labeler_wants_accelerator:
        return "cpu"
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def build_labelers(config: FourMConfig, present: list[str], data_uri: str,
                   skipped: list[str] | None = None) -> list[Labeler]:
    """The configured labelers, checked against the data: each makes a different modality that the data config
    lists (``data.modalities``). A labeler of a modality the prepared data already holds (captions that came with
    the photos) is not run: the data's own values win; ``skipped`` collects which, for the report."""
    labelers, made = [], {}
    for i, entry in enumerate(config.label.labelers):
        cls = labeler_class(entry.name)
        weights = _weights_uri(_folder_or_uri(cls, entry, i), data_uri, _where(i))
        labeler = build_labeler(entry.name, entry.params, weights, _device(cls.wants_accelerator), _where(i))
        modality = labeler.modality
        get_modality(modality)
        if modality in made:
            raise ConfigError(f"{_where(i)} ({entry.name}) makes {modality!r}, which {made[modality]} already makes")
        missing_reads = [m for m in labeler.reads if m not in made]
        if missing_reads:
            raise ConfigError(f"{_where(i)} ({entry.name}) reads the {', '.join(missing_reads)} labels of a labeler "
                              f"listed before it in label.labelers, and none makes them: add one above it")
        if modality in present and not labeler.fills_gaps:
            log.warning("%s (%s) is not run: the prepared data already holds %s", _where(i), entry.name, modality)
            if skipped is not None:
                skipped.append(f"{_where(i)} ({entry.name}): the data's own {modality}")
            continue
        if modality not in config.data.modalities:
            raise ConfigError(f"{_where(i)} ({entry.name}) makes {modality!r}, which data.modalities "
                              f"{list(config.data.modalities)} does not list: add it there")
        made[modality] = f"{_where(i)} ({entry.name})"
        labelers.append(labeler)
    return labelers


def _required(config: FourMConfig, labelers: list[Labeler]) -> tuple[str, ...]:
    return config.label.required_modalities or ("rgb", *(labeler.modality for labeler in labelers))


def _ledger(ctx: StageContext) -> ShardLedger:
    """The output's shards, one per input shard; each one's gate statistics are part of the payload."""
    return ShardLedger(ctx, payload_stats_key(STATS_DIR))


def _source_sizes(data: Store, job: Shard) -> dict[str, tuple[int, int]]:
    """The original ``(width, height)`` per key that a real-data source recorded before the centre crop."""
    return {key: (int(info["original_width"]), int(info["original_height"]))
            for key, info in iter_source_info(data, job.split, job.index) if info}


def _batches(samples: Iterator[tuple[str, dict[str, Any]]], size: int
             ) -> Iterator[list[tuple[str, dict[str, Any]]]]:
    batch: list[tuple[str, dict[str, Any]]] = []
    for item in samples:
        batch.append(item)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def _label_shard(ctx: StageContext, ledger: ShardLedger, labelers: list[Labeler], job: Shard,
                 settings: dict[str, CheckSettings], bar: LineProgress, present: list[str]) -> dict[str, Any]:
    """Label one input shard and commit its output shard (tars, statistics, dropped keys, then the key index);
    ``present``: the modalities of the shard's split (listed once per part, not once per shard)."""
    cfg, data, out = ctx.config.label, ctx.inputs[DATA].store, ctx.output
    context = [m for m in CONTEXT_MODALITIES if m in present]
    sizes = _source_sizes(data, job)
    required = _required(ctx.config, labelers)
    modalities = tuple(labeler.modality for labeler in labelers)
    made_by = {labeler.modality: labeler.name for labeler in labelers}
    writer = ShardWriter(out, job.split, modalities, samples_per_shard=1 << 62, first_index=job.index)
    labelled: Counter[str] = Counter()
    missing: Counter[str] = Counter()
    dropped: list[str] = []
    samples = incomplete = 0
    for batch in _batches(iter_joined_shard(data, job.split, job.index, ["rgb", *context]), cfg.batch_size):
        with_rgb = [(key, sample) for key, sample in batch if "rgb" in sample]
        labels: dict[str, list[Any]] = {}
        if with_rgb:
            label_batch = LabelBatch(tuple(k for k, _ in with_rgb), tuple(s["rgb"] for _, s in with_rgb),
                                     tuple(s.get("caption") for _, s in with_rgb),
                                     tuple(sizes.get(k) for k, _ in with_rgb))
            for labeler in labelers:
                reading = replace(label_batch, labels={m: tuple(labels[m]) for m in labeler.reads})
                labels[labeler.modality] = check_labels(labeler, reading, labeler.label(reading))
        position = {key: i for i, (key, _) in enumerate(with_rgb)}
        for key, sample in batch:
            samples += 1
            values = {m: labels[m][position[key]] for m in modalities if key in position}
            values = {m: v for m, v in values.items() if v is not None}
            for modality, value in values.items():
                problem = check_value(modality, value, settings[modality])
                if problem:
                    raise LabelGateError(
                        f"label: labeler {made_by[modality]!r}: the {modality} label of key {key!r} in shard "
                        f"{job.index} of {job.split} "
                        f"({data.uri_of(job.keys_key)}) fails its check: {problem}")
            lacking = [m for m in required if m not in values and m not in sample]
            missing.update(lacking)
            incomplete += bool(lacking)
            if lacking and cfg.missing == "drop":
                dropped.append(key)
                continue
            labelled.update(values.keys())
            writer.write(key, {m: get_modality(m).encode(v) for m, v in values.items()})
        bar.update(len(batch))
    stats = {"samples": samples, "kept": samples - len(dropped), "dropped": len(dropped), "incomplete": incomplete,
             "labelled": dict(sorted(labelled.items())), "missing": dict(sorted(missing.items()))}
    ledger.commit_stats(job, stats)
    out.put_text(dropped_key(job.split, job.index), "".join(f"{k}\n" for k in dropped))
    writer.close()
    if not writer.samples:  # every sample dropped: the shard is still committed, by an empty key index
        out.put_text(job.keys_key, "")
    return stats


def _settings(config: FourMConfig, labelers: list[Labeler]) -> dict[str, CheckSettings]:
    cfg = config.label
    return {labeler.modality: CheckSettings(config.data.image_size, cfg.max_invalid_fraction, cfg.max_depth_m,
                                            labeler.relative_depth, labeler.classes, labeler.modality_settings)
            for labeler in labelers}


def run_part(ctx: StageContext, part: int, parts: int) -> StageResult:
    data = ctx.inputs[DATA].store
    labelers = build_labelers(ctx.config, available_modalities(data, "train"), ctx.inputs[DATA].uri)
    settings = _settings(ctx.config, labelers)
    ledger = _ledger(ctx)
    jobs = ledger.take(committed_shards(data), part, parts).todo
    total = sum(len(data.get_text(job.keys_key).split()) for job in jobs)
    bar = LineProgress(total, f"label part {part + 1}/{parts}", "images", interval=10.0)
    started = time.monotonic()
    present = {split: available_modalities(data, split) for split in sorted({job.split for job in jobs})}
    done = [_label_shard(ctx, ledger, labelers, job, settings, bar, present[job.split]) for job in jobs]
    bar.close()
    seconds = time.monotonic() - started
    images = sum(s["samples"] for s in done)
    return StageResult(counts={"shards": [[j.split, j.index] for j in jobs]},
                       metrics={"images": float(images), "seconds": seconds,
                                "images_per_s": images / max(seconds, 1e-9)})


def _gather(ctx: StageContext, jobs: list[Shard]) -> dict[str, Any]:
    """The committed shards' statistics, summed per split in shard order."""
    totals: dict[str, Any] = {}
    for job, stats in _ledger(ctx).records(jobs).items():
        split = totals.setdefault(job.split, {"samples": 0, "kept": 0, "dropped": 0, "incomplete": 0, "shards": 0,
                                              "labelled": Counter(), "missing": Counter()})
        for name in ("samples", "kept", "dropped", "incomplete"):
            split[name] += stats[name]
        split["shards"] += 1
        split["labelled"].update(stats["labelled"])
        split["missing"].update(stats["missing"])
    return {split: {**v, "labelled": dict(sorted(v["labelled"].items())), "missing": dict(sorted(v["missing"].items()))}
            for split, v in totals.items()}


def _preview(ctx: StageContext, modalities: list[str], count: int) -> bytes | None:
    """The first photos of val (else train) beside their labels."""
    dataset = LayeredStore([ctx.inputs[DATA].store, ctx.output])
    rows, keys = [], []
    for split in ("val", "train"):
        for index in shard_indices(dataset, split):
            for key, sample in iter_joined_shard(dataset, split, index, modalities):
                rows.append(sample)
                keys.append(key)
                if len(rows) == count:
                    break
            if len(rows) == count:
                break
        if rows:
            break
    if not rows:
        return None
    buf = io.BytesIO()
    render_preview_grid(rows, modalities, row_labels=keys).save(buf, format="PNG")
    return buf.getvalue()


def dataset_meta(data: Store, labelers: list[Labeler]) -> DatasetMeta:
    """The labelled dataset's vocabularies and modality settings (:mod:`fourm_kfp.data.vocabularies`): the
    prepared data's file with each labeler's vocabulary and relative depth on top, so that this layer's file
    (which a reader of the dataset finds first) carries the lower layer's entries too."""
    own = {"vocabularies": {labeler.modality: list(labeler.classes) for labeler in labelers if labeler.classes},
           "modality_settings": {labeler.modality: labeler.modality_settings for labeler in labelers
                                 if labeler.modality_settings}}
    where = "label.labelers (" + ", ".join(f"{labeler.name} -> {labeler.modality}" for labeler in labelers) + ")"
    return read_dataset_meta(data).merged(DatasetMeta.from_json(own, where))


def run(ctx: StageContext) -> StageResult:
    """The collect step: check the shards, sum the gate's statistics, apply its threshold, write the report."""
    cfg, data = ctx.config.label, ctx.inputs[DATA].store
    skipped: list[str] = []
    labelers = build_labelers(ctx.config, available_modalities(data, "train"), ctx.inputs[DATA].uri, skipped)
    splits = _gather(ctx, committed_shards(data))
    samples = sum(s["samples"] for s in splits.values())
    incomplete = sum(s["incomplete"] for s in splits.values())
    fraction = incomplete / max(samples, 1)
    if fraction > cfg.max_missing_fraction:
        missing = Counter()
        for s in splits.values():
            missing.update(s["missing"])
        raise LabelGateError(
            f"label: {incomplete} of {samples} samples ({fraction:.1%}) lack a required modality "
            f"({dict(missing)}), more than label.max_missing_fraction={cfg.max_missing_fraction} "
            f"(label.missing={cfg.missing}); nothing was committed")
    made_by = {labeler.modality: labeler.identity() for labeler in labelers}
    meta = dataset_meta(data, labelers)
    if meta:
        ctx.output.put_bytes(META_FILE, meta.to_json())
    coverage = {m: sum(s["labelled"].get(m, 0) for s in splits.values()) / max(samples, 1) for m in made_by}
    report = {"labelers": made_by, "splits": splits, "coverage": coverage, "missing_policy": cfg.missing,
              "incomplete_fraction": fraction, "required_modalities": list(_required(ctx.config, labelers)),
              "not_run": skipped}
    ctx.write_report("label_report.json", json.dumps(report, indent=2, sort_keys=True).encode())
    ctx.write_report("label_report.md", _markdown(report).encode())
    preview = _preview(ctx, ["rgb", *made_by], cfg.preview_samples)
    if preview:
        ctx.write_report("label_preview.png", preview)
    ctx.tracker.set_tags({f"fourm.label.{m}": f"{i['name']} v{i['version']}" for m, i in made_by.items()})
    records = ctx.part_records()
    seconds = sum(r["metrics"].get("seconds", 0.0) for r in records)
    images = sum(r["metrics"].get("images", 0.0) for r in records)
    metrics = {f"coverage.{m}": v for m, v in coverage.items()}
    metrics.update(samples=float(samples), dropped=float(sum(s["dropped"] for s in splits.values())),
                   incomplete_fraction=fraction, parts=float(len(records)), parts_seconds=seconds,
                   images_per_s=images / max(seconds, 1e-9))
    counts = {"splits": {split: {"samples": s["kept"], "shards": s["shards"]} for split, s in splits.items()},
              "labelers": made_by, "gate": {split: {k: s[k] for k in ("samples", "dropped", "missing")}
                                            for split, s in splits.items()}}
    return StageResult(counts=counts, metrics=metrics)


def _markdown(report: dict[str, Any]) -> str:
    lines = ["# Labels", "", "| modality | labeler | version | params | weights | coverage |",
             "|---|---|---|---|---|---|"]
    for modality, who in report["labelers"].items():
        params = ", ".join(f"{k}={v}" for k, v in who["params"].items()) or "-"
        lines.append(f"| {modality} | {who['name']} | {who['version']} | {params} | {who['weights'] or '-'} | "
                     f"{report['coverage'][modality]:.1%} |")
    if report["not_run"]:
        lines += ["", "Not run, the data had the modality already: " + "; ".join(report["not_run"]) + "."]
    lines += ["", f"Required in every sample: {', '.join(report['required_modalities'])}; a sample lacking one is "
              f"{'dropped' if report['missing_policy'] == 'drop' else 'kept without it'} "
              f"({report['incomplete_fraction']:.2%} of the samples).", "",
              "| split | samples | kept | dropped | missing (by modality) |", "|---|---|---|---|---|"]
    for split, s in sorted(report["splits"].items()):
        missing = ", ".join(f"{m}: {n}" for m, n in s["missing"].items()) or "-"
        lines.append(f"| {split} | {s['samples']} | {s['kept']} | {s['dropped']} | {missing} |")
    lines += ["", "![photos and their labels](label_preview.png)", ""]
    return "\n".join(lines)
