"""Pretokenization of shards: every sample's aligned crops through the VQ-VAEs, shard by shard.

Input shard ``i`` of a split becomes output shard ``i`` (the layout of :mod:`fourm_kfp.data.pretokenized`), so
work splits into independent shards: a fan-out worker takes some of them, and a shard whose key index already
exists in the output is committed and skipped (the shard writer puts the key index last). Inside a worker a
reader thread streams and crops the next shard while the main thread encodes batches in inference mode (bf16
autocast on CUDA) and a writer thread builds and uploads the finished shard, so the encoder is the bottleneck.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

import numpy as np
import torch

from fourm_kfp.data.crops import apply_crop, draw_crops
from fourm_kfp.data.pretokenized import CROP, encode_member, member_ext, token_dtype, token_name
from fourm_kfp.data.shard_stream import iter_joined_shard
from fourm_kfp.data.shard_writer import ShardWriter, keys_key
from fourm_kfp.storage import Store

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CropSettings:
    n_crops: int
    scale: tuple[float, float]
    ratio: tuple[float, float]
    flip_probability: float
    seed: int


@dataclass
class ShardJob:
    """One input shard to pretokenize."""

    split: str
    index: int


def output_names(image_modalities: Sequence[str], text_modalities: Sequence[str], keep_rgb: bool) -> list[str]:
    """The pretokenized modalities written for a dataset holding these modalities."""
    names = [token_name(m) for m in image_modalities] + list(text_modalities)
    return names + (["rgb"] if keep_rgb else []) + [CROP]


class Pretokenizer:
    """Turns the samples of a shard into pretokenized members with a tokenizer bundle."""

    def __init__(self, tokenizers: dict[str, Any], image_size: int, crops: CropSettings, batch_size: int,
                 device: torch.device, text_modalities: Sequence[str], keep_rgb: bool):
        self.tokenizers, self.image_size, self.crops = tokenizers, image_size, crops
        self.batch_size, self.device = batch_size, device
        self.text_modalities, self.keep_rgb = tuple(text_modalities), keep_rgb
        self.dtypes = {m: token_dtype(t.config.codebook_size) for m, t in tokenizers.items()}
        self.encoded_images = 0

    def crop_sample(self, key: str, sample: dict[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        crops = draw_crops(key, self.crops.seed, self.crops.n_crops, self.image_size, self.crops.scale,
                           self.crops.ratio, self.crops.flip_probability)
        return [apply_crop(sample, c, self.image_size) for c in crops], [c.to_dict() for c in crops]

    @torch.inference_mode()
    def encode(self, modality: str, arrays: list[np.ndarray]) -> np.ndarray:
        """Token grids ``[N, h, w]`` of ``arrays`` in batches (bf16 autocast on CUDA)."""
        out = []
        tokenizer = self.tokenizers[modality]
        for start in range(0, len(arrays), self.batch_size):
            batch = np.stack(arrays[start:start + self.batch_size])
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=self.device.type == "cuda"):
                tokens = tokenizer.encode(batch)
            out.append(tokens.to("cpu", torch.int64).numpy())
            self.encoded_images += len(batch)
        return np.concatenate(out).astype(self.dtypes[modality])

    def members(self, cropped: list[tuple[str, list[dict[str, Any]], list[dict[str, Any]]]]
                ) -> list[tuple[str, dict[str, bytes]]]:
        """``(key, {name: bytes})`` for the cropped samples of one shard, in order."""
        n = self.crops.n_crops
        out: list[tuple[str, dict[str, bytes]]] = [(key, {}) for key, _, _ in cropped]
        for modality in self.tokenizers:
            rows = [i for i, (_, views, _) in enumerate(cropped) if modality in views[0]]
            if not rows:
                continue
            grids = self.encode(modality, [view[modality] for i in rows for view in cropped[i][1]])
            for j, i in enumerate(rows):
                out[i][1][token_name(modality)] = encode_member(token_name(modality), grids[j * n:(j + 1) * n])
        for i, (key, views, crop_params) in enumerate(cropped):
            members = out[i][1]
            if self.keep_rgb and "rgb" in views[0]:
                members["rgb"] = encode_member("rgb", np.stack([v["rgb"] for v in views]).astype(np.uint8))
            for modality in self.text_modalities:
                if modality in views[0]:
                    value = [v[modality] for v in views] if member_ext(modality) == "json" else views[0][modality]
                    members[modality] = encode_member(modality, value)
            members[CROP] = encode_member(CROP, crop_params)
        return out


def _reader(source: Store, jobs: Sequence[ShardJob], modalities: Sequence[str], pretokenizer: Pretokenizer,
            out: "queue.Queue[Any]") -> None:
    try:
        for job in jobs:
            cropped = [(key, *pretokenizer.crop_sample(key, sample))
                       for key, sample in iter_joined_shard(source, job.split, job.index, modalities)]
            out.put((job, cropped))
    except BaseException as exc:  # surfaced in the main thread
        out.put(exc)
    out.put(None)


def _writer(target: Store, names: Sequence[str], todo: "queue.Queue[Any]", errors: list[BaseException]) -> None:
    while (item := todo.get()) is not None:
        job, members = item
        try:
            writer = ShardWriter(target, job.split, tuple(names), max(len(members), 1), ext=member_ext,
                                 first_index=job.index)
            for key, encoded in members:
                writer.write(key, encoded)
            if not members:
                target.put_text(keys_key(job.split, job.index), "")
            writer.close()
        except BaseException as exc:
            errors.append(exc)


def pretokenize_shards(source: Store, target: Store, jobs: Sequence[ShardJob], modalities: Sequence[str],
                       pretokenizer: Pretokenizer, names: Sequence[str],
                       progress: Callable[[int, int, float], None] | None = None) -> dict[str, float]:
    """Pretokenize ``jobs`` (shards already committed in ``target`` are skipped); returns counts and timings."""
    todo = [job for job in jobs if not target.exists(keys_key(job.split, job.index))]
    skipped = len(jobs) - len(todo)
    if skipped:
        log.info("pretokenize: %d of %d shards already committed, %d to do", skipped, len(jobs), len(todo))
        if hasattr(target, "record_existing"):  # their files still belong in the manifest
            done = {(j.split, j.index) for j in jobs} - {(j.split, j.index) for j in todo}
            for key in target.list():
                parts = key.split("/")
                if len(parts) == 3 and parts[2][:13].startswith("shard-") and (parts[0], int(parts[2][6:12])) in done:
                    target.record_existing(key)
    read: "queue.Queue[Any]" = queue.Queue(maxsize=2)
    write: "queue.Queue[Any]" = queue.Queue(maxsize=2)
    errors: list[BaseException] = []
    reader = threading.Thread(target=_reader, args=(source, todo, modalities, pretokenizer, read), daemon=True)
    writer = threading.Thread(target=_writer, args=(target, names, write, errors), daemon=True)
    reader.start()
    writer.start()
    started, samples, encode_seconds = time.monotonic(), 0, 0.0
    try:
        while (item := read.get()) is not None:
            if isinstance(item, BaseException):
                raise item
            job, cropped = item
            t0 = time.monotonic()
            members = pretokenizer.members(cropped)
            encode_seconds += time.monotonic() - t0
            write.put((job, members))
            samples += len(cropped)
            if errors:
                raise errors[0]
            if progress:
                progress(len(cropped), samples, time.monotonic() - started)
    finally:
        write.put(None)
        writer.join()
    if errors:
        raise errors[0]
    return {"shards_done": float(len(todo)), "shards_skipped": float(skipped), "samples": float(samples),
            "seconds": time.monotonic() - started, "encode_seconds": encode_seconds}
