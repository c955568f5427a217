"""Pretokenization of shards: every sample's aligned crops through the VQ-VAEs, shard by shard.

Input shard ``i`` of a split becomes output shard ``i`` (the layout of :mod:`fourm_kfp.data.pretokenized`), so
work splits into independent shards (:class:`~fourm_kfp.contract.shard_jobs.Shard`): which shards a fan-out worker
does, and which an earlier run committed already, is the stage's ledger's
(:class:`~fourm_kfp.contract.shard_jobs.ShardLedger`); :func:`pretokenize_shards` writes the ones it is given, each
committed by its key index, written last, after its statistics record (``commit_stats``). Inside a worker three
threads and a pool of processes keep the encoder busy:

* a reader thread streams each shard's stored bytes in chunks and submits them to the decode workers
  (:mod:`fourm_kfp.tokenizers.shard_crops`: ``pretokenize.decode_workers`` processes decode and crop in parallel
  and return each image modality's crops stacked in one tensor in shared memory; with 0 workers the reader thread
  does it), a bounded number of chunks ahead, in order;
* the main thread only feeds the encoders: each modality's crops go through in the batches the whole shard gives
  (``batch_size`` images in sample order, whatever the chunking, so the tokens do not depend on it) in inference
  mode (bf16 autocast on CUDA, batches copied from pinned memory), tokens kept on the device until a chunk is
  complete;
* a writer thread serialises each completed chunk's members and streams them into the shard's tars, then commits
  the shard (its statistics record, then its key index).
"""

from __future__ import annotations

import queue
import sys
import threading
import time
from collections import deque
from concurrent.futures import Executor
from functools import partial
from typing import Any, Callable, Iterator, Sequence

import numpy as np
import torch

from fourm_kfp.contract.shard_jobs import Shard
from fourm_kfp.data.pretokenized import CROP, encode_member, member_ext, token_dtype, token_name
from fourm_kfp.data.shard_writer import ShardWriter
from fourm_kfp.storage import Store
from fourm_kfp.tokenizers.shard_crops import (CropSettings, CroppedChunk, chunk_samples, crop_chunk, crop_executor,
                                              cropped, raw_chunks)

#: A chunk with the token grids of its image modalities (``[rows * n_crops, h, w]``, the codebook's dtype).
Encoded = tuple[CroppedChunk, dict[str, np.ndarray]]
#: Takes a written shard's statistics record (``samples``, ``members`` per output name) before its key index
#: commits it: :meth:`~fourm_kfp.contract.shard_jobs.ShardLedger.commit_stats`.
CommitStats = Callable[[Shard, dict[str, Any]], None]


def output_names(image_modalities: Sequence[str], text_modalities: Sequence[str], keep_rgb: bool) -> list[str]:
    """The pretokenized modalities written for a dataset holding these modalities."""
    names = [token_name(m) for m in image_modalities] + list(text_modalities)
    return names + (["rgb"] if keep_rgb else []) + [CROP]


def _take(pieces: list[torch.Tensor], n: int) -> torch.Tensor:
    """The first ``n`` rows of the concatenated ``pieces``, removed from them (a view when one piece holds them)."""
    parts = []
    while n:
        head = pieces[0]
        if len(head) <= n:
            parts.append(pieces.pop(0))
        else:
            parts.append(head[:n])
            pieces[0] = head[n:]
        n -= len(parts[-1])
    return parts[0] if len(parts) == 1 else torch.cat(parts)


def _by_sample(rows: Sequence[int], array: Any, n: int) -> dict[int, Any]:
    """Chunk position → its ``n`` crops in ``array`` (the crops of the samples at ``rows``, in order)."""
    return {i: array[j * n:(j + 1) * n] for j, i in enumerate(rows)}


class Pretokenizer:
    """Turns cropped chunks of a shard into pretokenized members with a tokenizer bundle."""

    def __init__(self, tokenizers: dict[str, Any], image_size: int, crops: CropSettings, batch_size: int,
                 device: torch.device, text_modalities: Sequence[str], keep_rgb: bool):
        self.tokenizers, self.image_size, self.crops = tokenizers, image_size, crops
        self.batch_size, self.device = batch_size, device
        self.text_modalities, self.keep_rgb = tuple(text_modalities), keep_rgb
        self.dtypes = {m: token_dtype(t.config.codebook_size) for m, t in tokenizers.items()}
        self.encoded_images = 0

    @torch.inference_mode()
    def encode(self, modality: str, batch: torch.Tensor) -> torch.Tensor:
        """Token grids ``[B, h, w]`` (int64, on the device) of one batch of crops (bf16 autocast on CUDA)."""
        if self.device.type == "cuda":
            batch = batch.pin_memory().to(self.device, non_blocking=True)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=self.device.type == "cuda"):
            tokens = self.tokenizers[modality].encode(batch)
        self.encoded_images += len(batch)
        return tokens

    def to_host(self, modality: str, tokens: torch.Tensor) -> np.ndarray:
        return tokens.to("cpu", torch.int64).numpy().astype(self.dtypes[modality])

    def members(self, chunk: CroppedChunk, tokens: dict[str, np.ndarray]) -> Iterator[tuple[str, dict[str, bytes]]]:
        """``(key, {name: bytes})`` for the samples of an encoded chunk, in order."""
        n = self.crops.n_crops
        grids = {m: _by_sample(chunk.images[m].rows, grid, n) for m, grid in tokens.items()}
        keep_rgb = self.keep_rgb and "rgb" in chunk.images
        rgb = _by_sample(chunk.images["rgb"].rows, chunk.images["rgb"].crops.numpy(), n) if keep_rgb else {}
        for i, key in enumerate(chunk.keys):
            members = {token_name(m): encode_member(token_name(m), g[i]) for m, g in grids.items() if i in g}
            if i in rgb:
                members["rgb"] = encode_member("rgb", rgb[i])
            for modality in self.text_modalities:
                if modality in chunk.values[i]:
                    views = chunk.values[i][modality]
                    members[modality] = encode_member(modality, views if member_ext(modality) == "json" else views[0])
            members[CROP] = encode_member(CROP, chunk.crops[i])
            yield key, members


class ShardTokens:
    """Encodes one shard chunk by chunk, in the batches the whole shard gives, and hands back each chunk once all
    its crops are encoded."""

    def __init__(self, pretokenizer: Pretokenizer):
        self.pretokenizer = pretokenizer
        self.queued: dict[str, list[torch.Tensor]] = {m: [] for m in pretokenizer.tokenizers}  # crops to encode
        self.grids: dict[str, list[torch.Tensor]] = {m: [] for m in pretokenizer.tokenizers}  # tokens to hand back
        self.waiting: deque[tuple[CroppedChunk, dict[str, int]]] = deque()  # chunks and their crops per modality

    def add(self, chunk: CroppedChunk) -> list[Encoded]:
        counts = {}
        for modality, queued in self.queued.items():
            if modality in chunk.images:
                queued.append(chunk.images[modality].crops)
                counts[modality] = len(queued[-1])
        self.waiting.append((chunk, counts))
        self._encode(self.pretokenizer.batch_size)
        return self._completed()

    def finish(self) -> list[Encoded]:
        """The chunks still waiting: the last partial batches encoded."""
        self._encode(1)
        return self._completed()

    def _encode(self, at_least: int) -> None:
        size = self.pretokenizer.batch_size
        for modality, queued in self.queued.items():
            while (count := sum(len(t) for t in queued)) >= at_least:
                self.grids[modality].append(self.pretokenizer.encode(modality, _take(queued, min(size, count))))

    def _completed(self) -> list[Encoded]:
        done = []
        while self.waiting and all(sum(len(t) for t in self.grids[m]) >= n for m, n in self.waiting[0][1].items()):
            chunk, counts = self.waiting.popleft()
            done.append((chunk, {m: self.pretokenizer.to_host(m, _take(self.grids[m], n)) for m, n in counts.items()}))
        return done


def _reader(source: Store, shards: Sequence[Shard], modalities: Sequence[str], crop: Callable[..., CroppedChunk],
            size: int, executor: Executor, out: "queue.Queue[Any]", stop: threading.Event) -> None:
    """``(shard, its URI, future chunk)`` for every chunk, then ``(shard, URI, None)`` at the end of each shard."""
    try:
        for shard in shards:
            uri = source.uri_of(shard.keys_key)
            for chunk in raw_chunks(source, shard, modalities, size):
                if stop.is_set():
                    return
                out.put((shard, uri, executor.submit(crop, chunk)))
            out.put((shard, uri, None))
    except BaseException as exc:  # surfaced in the main thread
        out.put(exc)
    out.put(None)


def _writer(target: Store, names: Sequence[str], pretokenizer: Pretokenizer, todo: "queue.Queue[Any]",
            errors: list[BaseException], commit_stats: CommitStats | None) -> None:
    """Writes ``(shard, encoded chunk)`` items into the shard, committed by ``(shard, None)``: its statistics record
    to ``commit_stats``, then its key index (an empty one when it has no sample)."""
    writer = None
    while (item := todo.get()) is not None:
        shard, encoded = item
        if errors:
            continue  # the main thread raises the first; drain
        try:
            # one output shard per input shard: it never splits (sys.maxsize samples per shard)
            writer = writer or ShardWriter(target, shard.split, tuple(names), sys.maxsize, ext=member_ext,
                                           first_index=shard.index)
            if encoded is not None:
                for key, members in pretokenizer.members(*encoded):
                    writer.write(key, members)
                continue
            if commit_stats is not None:
                commit_stats(shard, {"samples": writer.samples, "members": dict(sorted(writer.counts.items()))})
            writer.close(commit_empty=True)
            writer = None
        except BaseException as exc:
            errors.append(exc)


def pretokenize_shards(source: Store, target: Store, shards: Sequence[Shard], modalities: Sequence[str],
                       pretokenizer: Pretokenizer, names: Sequence[str], decode_workers: int = 0,
                       progress: Callable[[int, int, float], None] | None = None,
                       commit_stats: CommitStats | None = None) -> dict[str, float]:
    """Pretokenize ``shards`` of ``source`` into ``target`` (every one of them: leaving out those an earlier run
    committed is the caller's, :meth:`~fourm_kfp.contract.shard_jobs.ShardLedger.take`) with ``decode_workers``
    decode processes (0: the reader thread decodes); ``commit_stats`` gets each shard's statistics record before
    its key index is written. Returns counts and timings."""
    executor = crop_executor(decode_workers)
    read: "queue.Queue[Any]" = queue.Queue(maxsize=max(2, 2 * decode_workers))  # chunks in flight
    write: "queue.Queue[Any]" = queue.Queue(maxsize=4)
    errors: list[BaseException] = []
    stop = threading.Event()
    crop = partial(crop_chunk, pretokenizer.crops, pretokenizer.image_size)
    size = chunk_samples(pretokenizer.crops.n_crops, pretokenizer.image_size)
    reader = threading.Thread(target=_reader, args=(source, shards, modalities, crop, size, executor, read, stop),
                              daemon=True)
    writer = threading.Thread(target=_writer, args=(target, names, pretokenizer, write, errors, commit_stats),
                              daemon=True)
    reader.start()
    writer.start()
    started, samples, encode_seconds = time.monotonic(), 0, 0.0
    tokens = ShardTokens(pretokenizer)
    try:
        while (item := read.get()) is not None:
            if isinstance(item, BaseException):
                raise item
            shard, uri, future = item
            chunk = cropped(future, uri) if future is not None else None
            t0 = time.monotonic()
            encoded = tokens.add(chunk) if chunk is not None else tokens.finish()
            encode_seconds += time.monotonic() - t0
            for done in encoded:
                write.put((shard, done))
            if chunk is None:  # the end of the shard: commit it, start the next
                write.put((shard, None))
                tokens = ShardTokens(pretokenizer)
            if errors:
                raise errors[0]
            if chunk is not None:
                samples += len(chunk.keys)
                if progress:
                    progress(len(chunk.keys), samples, time.monotonic() - started)
    finally:
        stop.set()
        while reader.is_alive():  # unblock the reader's put; it stops before its next chunk
            try:
                read.get(timeout=0.1)
            except queue.Empty:
                pass
        executor.shutdown(wait=True, cancel_futures=True)
        write.put(None)
        writer.join()
    if errors:
        raise errors[0]
    return {"shards_done": float(len(shards)), "samples": float(samples), "seconds": time.monotonic() - started,
            "encode_seconds": encode_seconds}
