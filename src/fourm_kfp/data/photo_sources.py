"""The photo sources of prepare-data, ``image_folder`` and ``webdataset``: real images (with captions where there
are any) read from ``prepare_data.source_uri`` and normalised to RGB squares (:mod:`fourm_kfp.data.ingest`).

Unreadable samples are skipped and counted by reason; the stage fails when their fraction of the whole source
exceeds ``prepare_data.max_bad_fraction``. Each sample also gets its original size before the centre crop (the
``_source`` tar, :data:`~fourm_kfp.data.shard_writer.SOURCE_DIR`).

Plans (from the listing alone, so the payload is the same bytes at any fan-out width):

* image folder: the sorted listing gives every image its key and the key's hash its split; a split's images, in
  listing order, fill its shards of ``samples_per_shard`` (an unusable image leaves its shard one sample short);
* WebDataset: input tar ``t`` (in name order) becomes shard ``t`` of each split, its samples in tar order and split
  by key hash (``samples_per_shard`` does not apply: a tar's samples are not known before it is read). Keys are
  unique within a tar only, so the collect step looks for a key two tars hold.

Both share the fingerprint: the digest of the listing (keys and sizes of the images taken and the caption side
files, plus the captions file) and of the output layout, so a changed folder gets a new output address.
"""

from __future__ import annotations

import hashlib
import os
from typing import Any, Iterator

from fourm_kfp.data.ingest import (IMAGE_EXTENSIONS, ImageFolder, SourceItem, included, iter_webdataset_tar,
                                   ordered_map, webdataset_tars)
from fourm_kfp.data.shard_writer import SOURCE_DIR, SPLITS, encode_sample, encode_source_info
from fourm_kfp.data.source_record import (EncodedSample, ItemReader, Planner, Source, SourceJob, SourcePlan, chunks,
                                          split_of)
from fourm_kfp.errors import UserError
from fourm_kfp.storage import open_store

#: Photo outputs are laid out by the plans above (a split's shards filled from the listing, WebDataset tar ``t`` →
#: shard ``t``) and carry a ``_source`` tar, unlike the single-worker layout before: this salt in their
#: fingerprint moved their addresses.
REAL_DATA_LAYOUT = "layout 2: fan-out shards planned from the listing, _source tars"
PHOTO_MODALITIES = ("rgb", "caption")
#: how a photo becomes a sample where the config does not say: cropped as ml-4m crops it (whole-pixel centred
#: square, one bicubic resize: :mod:`fourm_kfp.data.image_normalize`)
PHOTO_PROCESSING = {"photo_crop": "ml4m"}


class NoSourceDataError(UserError, ValueError):
    """A source with nothing to prepare (a missing or empty folder, a wrong path)."""


def _no_source_data(cfg: Any, what: str) -> NoSourceDataError:
    """Fail at the start of prepare-data on a source with nothing to prepare: committed, an empty dataset would
    fail the run stages later, far from the cause."""
    return NoSourceDataError(f"prepare_data.source_uri={cfg.source_uri!r} ({cfg.source}): {what} there; is the "
                             "folder missing or empty, or the path wrong?")


def fingerprint(config: Any) -> str:
    """Digest of the source's listing (keys and sizes, plus the captions file) and of the output layout."""
    cfg = config.prepare_data
    digest = hashlib.sha256(f"{REAL_DATA_LAYOUT}\n".encode())
    for key, size in open_store(cfg.source_uri).list_sizes():
        if included(key, cfg.include) or key.endswith(".txt"):  # the images taken, and caption side files
            digest.update(f"{key}\t{size}\n".encode())
    if cfg.captions_file:
        digest.update(f"captions {cfg.captions_file}\n".encode())
    return "sha256:" + digest.hexdigest()


def _encoded(config: Any, split: str, item: SourceItem) -> EncodedSample:
    """A photo's sample (the modalities of ``data.modalities`` it has) and its original size, encoded."""
    if item.skipped is not None:
        return EncodedSample(split, item.key, None, None, item.skipped)
    sample = {m: v for m, v in item.sample.items() if m in config.data.modalities}
    width, height = item.original_size
    encoded = {**encode_sample(sample, config.data.modalities),
               SOURCE_DIR: encode_source_info({"original_width": width, "original_height": height})}
    return EncodedSample(split, item.key, sample, encoded)


def _workers(config: Any) -> int:
    return config.prepare_data.workers or os.cpu_count() or 1


def _photo_source(name: str, description: str, plan: Planner, items: ItemReader, **more: Any) -> Source:
    """A photo source's record: its name, plan and items, and what every photo source shares (it writes rgb and
    caption, reads outside the config, is fingerprinted by its listing, crops as ml-4m does)."""
    return Source(name=name, description=description, modalities=PHOTO_MODALITIES, plan=plan, items=items,
                  fingerprint=fingerprint, processing=PHOTO_PROCESSING, external=True, unit="images", **more)


# ------------------------------------------------------------------------------------------------ image folder


def plan_folder(config: Any) -> SourcePlan:
    """A split's images, in listing order, in shards of ``samples_per_shard``; a job is one shard."""
    cfg = config.prepare_data
    source = open_store(cfg.source_uri)
    folder = ImageFolder(source, config.data.image_size, cfg.captions_file or None, cfg.min_image_side, cfg.include)
    if not folder.entries:
        raise _no_source_data(cfg, "no image (" + " ".join(sorted(IMAGE_EXTENSIONS)) + ")"
                              + (f" matching prepare_data.include {list(cfg.include)}" if cfg.include else ""))
    by_split: dict[str, list[Any]] = {split: [] for split in SPLITS}
    for entry in folder.entries:
        by_split[split_of(entry.key, cfg.val_fraction)].append(entry)
    jobs = [SourceJob(((split, i),), tuple(chunk), len(chunk)) for split in SPLITS
            for i, chunk in enumerate(chunks(by_split[split], cfg.samples_per_shard))]
    return SourcePlan(jobs, [source.uri_of(e.path) for e in folder.entries], folder)


def folder_items(config: Any, the_plan: SourcePlan, jobs: list[SourceJob]) -> Iterator[tuple[int, EncodedSample]]:
    """The images of ``jobs``, decoded and encoded on ``prepare_data.workers`` threads, in job order."""
    folder: ImageFolder = the_plan.reader

    def load(work: tuple[int, str, Any]) -> tuple[int, EncodedSample]:
        pos, split, entry = work
        return pos, _encoded(config, split, folder.load(entry))

    work = ((pos, job.shards[0][0], entry) for pos, job in enumerate(jobs) for entry in job.inputs)
    yield from ordered_map(load, work, _workers(config))


IMAGE_FOLDER = _photo_source("image_folder", "a folder of images", plan_folder, folder_items)


# -------------------------------------------------------------------------------------------------- WebDataset


def plan_webdataset(config: Any) -> SourcePlan:
    """Input tar ``t`` is one job, writing shard ``t`` of each split."""
    cfg = config.prepare_data
    source = open_store(cfg.source_uri)
    tars = webdataset_tars(source)
    if not tars:
        raise _no_source_data(cfg, "no WebDataset shard (.tar)")
    return SourcePlan([SourceJob((("train", t), ("val", t)), tar) for t, tar in enumerate(tars)],
                      [source.uri_of(tar) for tar in tars])


def webdataset_items(config: Any, the_plan: SourcePlan,
                     jobs: list[SourceJob]) -> Iterator[tuple[int, EncodedSample]]:
    """The samples of each job's tar, in tar order, split by key hash; decoded and encoded on threads."""
    cfg = config.prepare_data
    source, workers = open_store(cfg.source_uri), _workers(config)

    def encode(item: SourceItem) -> EncodedSample:  # on a worker thread too: a 224-px PNG costs about its decode
        return _encoded(config, split_of(item.key, cfg.val_fraction), item)

    for pos, job in enumerate(jobs):
        tar_items = iter_webdataset_tar(source, job.inputs, config.data.image_size, cfg.min_image_side, workers)
        for item in ordered_map(encode, tar_items, workers):
            yield pos, item


WEBDATASET = _photo_source("webdataset", "an image-text WebDataset", plan_webdataset, webdataset_items,
                           unique_keys=False)
