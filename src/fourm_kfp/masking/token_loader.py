"""The token data loader: pretokenized shards (local or S3) → masked batches, reproducible and resumable.

The datasets' train splits are listed once, when the stream is made (:class:`~fourm_kfp.data.shard_stream.SplitCatalog`):
a draw lists nothing and stats nothing, one GET for the shard's key index and one for each modality's tar.

Training stream, per rank and per loader worker: an endless sequence of *shard draws*; draw ``k`` picks a dataset
of the mixture by weight and one of its train shards at random (resampled shards), from a generator seeded by
``(seed, rank, worker, k)``. The shard's modalities are streamed joined by key
(:mod:`fourm_kfp.data.shard_stream`) through a bounded shuffle buffer; each sample gets one of its pre-computed
crops and is masked (:mod:`.multimodal_masking`) with a generator seeded by ``(seed, rank, worker, k, j)``;
batches are formed inside the worker. A batch is thus a function of ``(seed, rank, worker, draw, index)``, and the
loader's position is tiny: per worker the next ``(draw, index)``, plus which worker is next. Restoring it replays exactly the batches an uninterrupted loader
would give (a restored worker re-reads at most one shard to reach its index).

Validation stream: the val split once, in order, crop 0 (the full view), masking seeded by the sample key:
the same batches in every run and at every step.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import random
from dataclasses import dataclass, field
from typing import Any, Iterator

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from fourm_kfp.batch import MaskedBatch
from fourm_kfp.data.pretokenized import INDEX_FILE, decode_member, token_name
from fourm_kfp.data.shard_stream import SplitCatalog, bounded_shuffle, iter_joined_shard
from fourm_kfp.masking.multimodal_masking import MaskingArgs, collate, mask_sample
from fourm_kfp.storage import open_store

log = logging.getLogger(__name__)
#: Samples a worker holds to shuffle within a shard.
SHUFFLE_BUFFER = 256


@dataclass(frozen=True)
class DatasetRef:
    """A pretokenized dataset (the URI of a committed pretokenize output) and its sampling weight."""

    uri: str
    weight: float = 1.0


@dataclass(frozen=True)
class LoaderArgs:
    datasets: tuple[DatasetRef, ...]
    masking: MaskingArgs
    text_tokenizer_json: str  # the WordPiece tokenizer (tokenizers' JSON), for the text modalities
    batch_size: int  # samples per batch on this rank
    seed: int = 0
    rank: int = 0
    world_size: int = 1
    num_workers: int = 0
    split: str = "train"
    pin_memory: bool = False


def _names_to_read(masking: MaskingArgs) -> list[str]:
    names = []
    for spec in masking.modalities:
        if spec.kind == "image":
            names.append(token_name(spec.name))
            if spec.pixel_input:
                names.append("rgb")
        else:
            names.append(spec.name)
    return names


#: Texts whose token ids a loader worker remembers (least recently used first out): a scene's texts come back every
#: epoch, and encoding one costs ~30 µs (a caption and a det text a sample). Measured at ~420 bytes a text (a caption
#: of 6-30 words) before the cache's own bookkeeping: ~30 MB a worker when full, enough for the proof's texts
#: (16,000 scenes x 2 crops x caption and det: at most 64,000).
TEXT_CACHE_SIZE = 1 << 16


class _SampleEncoder:
    """Pretokenized members of one sample, one crop → the masker's token dict (text tokenized here, each distinct
    text once while the cache holds)."""

    def __init__(self, args: LoaderArgs):
        from tokenizers import Tokenizer

        self.args = args
        self.tokenizer = Tokenizer.from_str(args.text_tokenizer_json)
        self.max_len = {s.name: s.max_length - 2 for s in args.masking.modalities if s.kind == "sequence"}
        self._encode = functools.lru_cache(maxsize=TEXT_CACHE_SIZE)(self._encode_text)

    def _encode_text(self, modality: str, text: str) -> tuple[int, ...]:
        """The text's ids, with ``masking.text_eos`` appended (to a text that has any) before the cut to the
        modality's length: a cut text ends without it, as in ml-4m."""
        ids = self.tokenizer.encode(text).ids
        eos = self.args.masking.text_eos
        if eos is not None and ids:
            ids.append(eos)
        return tuple(ids[: self.max_len[modality]])

    def tokens(self, sample: dict[str, Any], crop: int) -> tuple[dict[str, Any], np.ndarray | None]:
        tokens: dict[str, Any] = {}
        pixels = None
        for spec in self.args.masking.modalities:
            if spec.kind == "image":
                grid = sample.get(token_name(spec.name))
                if grid is not None:
                    tokens[spec.name] = grid[min(crop, len(grid) - 1)]
                if spec.pixel_input and "rgb" in sample:
                    pixels = sample["rgb"][min(crop, len(sample["rgb"]) - 1)]
            elif spec.name in sample:
                value = sample[spec.name]
                text = value[min(crop, len(value) - 1)] if isinstance(value, list) else value
                ids = self._encode(spec.name, text)
                if ids:
                    tokens[spec.name] = ids
        return tokens, pixels


def _crop_count(sample: dict[str, Any]) -> int:
    return len(sample["crop"]) if "crop" in sample else 1


class TrainStream(IterableDataset):
    """Yields ``(batch, worker, next position, samples per dataset)``; see the module docstring."""

    def __init__(self, args: LoaderArgs, start: dict[int, tuple[int, int]] | None = None, first_worker: int = 0):
        super().__init__()
        self.args, self.start, self.first_worker = args, start or {}, first_worker
        # One listing per dataset, here (before the workers start): a draw then lists nothing and stats nothing
        self.catalogs = {i: SplitCatalog.read(open_store(d.uri), args.split) for i, d in enumerate(args.datasets)}
        self.shards = {i: list(c.shards) for i, c in self.catalogs.items()}
        empty = [args.datasets[i].uri for i, s in self.shards.items() if not s]
        if empty:
            raise ValueError(f"no {args.split} shards in {empty}")

    def _logical_worker(self) -> tuple[int, int]:
        info = get_worker_info()
        count = info.num_workers if info else 1
        return ((info.id if info else 0) + self.first_worker) % count, count

    def __iter__(self) -> Iterator[tuple[MaskedBatch, int, tuple[int, int], dict[int, int]]]:
        args = self.args
        worker, _ = self._logical_worker()
        encoder = _SampleEncoder(args)
        names = _names_to_read(args.masking) + ["crop"]
        weights = np.array([d.weight for d in args.datasets], dtype=np.float64)
        draw, skip = self.start.get(worker, (0, 0))
        batch, per_dataset = [], {}
        while True:
            rng = np.random.default_rng([args.seed, args.rank, worker, draw])
            dataset = int(rng.choice(len(weights), p=weights / weights.sum()))
            shard = int(rng.choice(self.shards[dataset]))
            store, catalog = open_store(args.datasets[dataset].uri), self.catalogs[dataset]
            available = [n for n in names if n in catalog.modalities]
            stream = iter_joined_shard(store, args.split, shard, available, decode=decode_member, catalog=catalog)
            ordered = bounded_shuffle(stream, SHUFFLE_BUFFER, random.Random(int(rng.integers(1 << 62))))
            for index, (key, sample) in enumerate(ordered):
                if index < skip:
                    continue
                sample_rng = np.random.default_rng([args.seed, args.rank, worker, draw, index])
                tokens, pixels = encoder.tokens(sample, int(sample_rng.integers(_crop_count(sample))))
                batch.append(mask_sample(sample_rng, args.masking, tokens, pixels, key))
                per_dataset[dataset] = per_dataset.get(dataset, 0) + 1
                if len(batch) == args.batch_size:
                    yield collate(batch, args.masking), worker, (draw, index + 1), per_dataset
                    batch, per_dataset = [], {}
            draw, skip = draw + 1, 0


@dataclass
class TokenLoader:
    """The trainer's view of the training stream: batches, and a position it can save and restore."""

    args: LoaderArgs
    positions: dict[int, tuple[int, int]] = field(default_factory=dict)
    consumed_batches: int = 0
    samples_per_dataset: dict[int, int] = field(default_factory=dict)
    _sizes: dict[int, int] = field(default_factory=dict)

    def batches(self) -> Iterator[MaskedBatch]:
        workers = max(self.args.num_workers, 1)
        stream = TrainStream(self.args, dict(self.positions), first_worker=self.consumed_batches % workers)
        # The DataLoader draws its workers' base seed from ``generator``: its own, so that making an iterator (at the
        # start, and again after a resume) takes nothing from the global RNG the checkpoints save. The stream seeds
        # its own generators and never reads the workers' torch seed.
        loader = DataLoader(stream, batch_size=None, num_workers=self.args.num_workers,
                            pin_memory=self.args.pin_memory, persistent_workers=False,
                            prefetch_factor=2 if self.args.num_workers else None,
                            generator=torch.Generator().manual_seed(self.args.seed))
        for batch, worker, position, per_dataset in loader:
            self.positions[worker] = position
            self.consumed_batches += 1
            for d, n in per_dataset.items():
                self.samples_per_dataset[d] = self.samples_per_dataset.get(d, 0) + n
            yield batch

    def metrics(self) -> dict[str, float]:
        """Examples seen and epochs per dataset of the mixture, over all ranks (``data/<i>/seen``, ``/epoch``)."""
        out = {}
        for d, seen in sorted(self.samples_per_dataset.items()):
            total = seen * self.args.world_size
            if d not in self._sizes:
                self._sizes[d] = read_index(self.args.datasets[d].uri)["splits"][self.args.split]
            size = self._sizes[d]
            out[f"data/{d}/seen"], out[f"data/{d}/epoch"] = float(total), total / max(size, 1)
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"positions": {str(w): list(p) for w, p in self.positions.items()},
                "consumed_batches": self.consumed_batches, "workers": max(self.args.num_workers, 1),
                "samples_per_dataset": {str(d): n for d, n in self.samples_per_dataset.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state["workers"] != max(self.args.num_workers, 1):
            log.warning("loader: the checkpoint had %d workers, this run has %d: the data order restarts",
                        state["workers"], max(self.args.num_workers, 1))
            return
        self.positions = {int(w): tuple(p) for w, p in state["positions"].items()}
        self.consumed_batches = state["consumed_batches"]
        self.samples_per_dataset = {int(d): n for d, n in state.get("samples_per_dataset", {}).items()}


def validation_batches(args: LoaderArgs, max_batches: int) -> list[MaskedBatch]:
    """The first ``max_batches`` validation batches of the first dataset (see the module docstring)."""
    store = open_store(args.datasets[0].uri)
    catalog = SplitCatalog.read(store, "val")
    encoder = _SampleEncoder(args)
    names = [n for n in _names_to_read(args.masking) + ["crop"] if n in catalog.modalities]
    batches, current = [], []
    for index in catalog.shards:
        for key, sample in iter_joined_shard(store, "val", index, names, decode=decode_member, catalog=catalog):
            seed = int.from_bytes(hashlib.sha256(f"{args.seed}:{key}".encode()).digest()[:8], "little")
            rng = np.random.default_rng(seed)
            tokens, pixels = encoder.tokens(sample, 0)
            current.append(mask_sample(rng, args.masking, tokens, pixels, key))
            if len(current) == args.batch_size:
                batches.append(collate(current, args.masking))
                current = []
                if len(batches) == max_batches:
                    return batches
    if current:
        batches.append(collate(current, args.masking))
    return batches


def read_index(uri: str) -> dict[str, Any]:
    """The ``pretokenized.json`` of a committed pretokenize output."""
    return json.loads(open_store(uri).get_bytes(INDEX_FILE))


def measure_loader_throughput(args: LoaderArgs, batches: int = 20) -> float:
    """Samples per second the training stream delivers, after one warm-up batch per worker (their start-up)."""
    import time

    iterator = TokenLoader(args).batches()
    for _ in range(max(args.num_workers, 1)):
        next(iterator)
    start = time.perf_counter()
    for _ in range(batches):
        next(iterator)
    return batches * args.batch_size / (time.perf_counter() - start)
