"""Stream aligned per-modality shards back as samples, never holding a shard whole (local disk or S3).

Shard ``i`` of a split is one tar per modality plus the key index ``<split>/_keys/shard-NNNNNN.txt`` that
:mod:`fourm_kfp.data.shard_writer` writes. :func:`iter_joined_shard` streams the key index and every modality's
tar in lockstep (:func:`fourm_kfp.data.ustar.read_members`) over the store's own streaming readers
(:meth:`fourm_kfp.storage.Store.open_read`: a local file, or one S3 GET): each key yields one sample
holding the modalities that have a member for it; a modality lacking the key is absent from that sample, and the
members of keys listed in the shard's dropped-keys file (a later layer's gate: ``shard_writer.DROPPED_DIR``) are
passed over. A member whose key is not the next expected one (a corrupt or foreign shard) is a
:class:`ShardMismatchError` naming both shards and the key; a tar that cannot be read is a
:class:`~fourm_kfp.data.ustar.ShardReadError` naming it.

:func:`iter_source_info` reads a shard's ``_source`` tar the same way: what a real-data source knew of each sample
(its original size before the centre crop).

Memory holds one member per modality at a time, or ``shuffle_buffer`` samples with :func:`iter_split`'s bounded
shuffle.
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass, field
from typing import Any, BinaryIO, Callable, Iterator, Sequence

from fourm_kfp.data.modalities import get_modality
from fourm_kfp.data.shard_writer import DROPPED_DIR, KEYS_DIR, SOURCE_DIR, dropped_key, keys_key, shard_key
from fourm_kfp.data.ustar import read_members
from fourm_kfp.errors import UserError
from fourm_kfp.storage import Store

_KEY_INDEX = re.compile(r"shard-(\d{6})\.txt$")
Decode = Callable[[str, bytes], Any]


class ShardMismatchError(UserError):
    """A modality's shard does not line up with its key index (corrupt, foreign or out-of-order shard)."""


class MissingModalityError(UserError, LookupError):
    """A requested modality has no shards in a split."""


class _StoreStream:
    """A file object over ``Store.open_read`` whose ``close`` releases the underlying stream."""

    def __init__(self, store: Store, key: str):
        self._context = store.open_read(key)
        self._stream: BinaryIO = self._context.__enter__()

    def read(self, size: int = -1) -> bytes:
        return self._stream.read(size)

    def close(self) -> None:
        self._context.__exit__(None, None, None)


def shard_indices(store: Store, split: str) -> list[int]:
    """Indices of the complete shards of ``split`` (those with a key index)."""
    return sorted(int(m.group(1)) for key in store.list(f"{split}/{KEYS_DIR}") if (m := _KEY_INDEX.search(key)))


def available_modalities(store: Store, split: str) -> list[str]:
    """Modalities with shards in ``split``: its folders but the bookkeeping ones (``_keys``, ``_dropped``, ...), from
    one listing of folder names (not of every shard)."""
    return [name for name in store.list_folders(split) if not name.startswith("_")]


_SHARD_OBJECT = re.compile(r"^([^/]+)/shard-(\d{6})\.(tar|txt)$")


@dataclass(frozen=True)
class SplitCatalog:
    """What one listing of a split holds: its complete shards (those with a key index), the modalities with a tar in
    any of them, the shards each modality lacks, and the shards with a dropped-keys file. A reader that draws shards
    over and over (the token loader) lists once at start-up and never lists or stats again: its draws cost one GET
    of the key index and one of each modality's tar. Its size grows with the shards, not with the samples."""

    split: str
    shards: tuple[int, ...]
    modalities: tuple[str, ...]
    missing: dict[str, frozenset[int]] = field(default_factory=dict)
    dropped: frozenset[int] = frozenset()

    @classmethod
    def read(cls, store: Store, split: str) -> "SplitCatalog":
        tars: dict[str, set[int]] = {}
        indexed: set[int] = set()
        dropped: set[int] = set()
        for key in store.list(split):
            match = _SHARD_OBJECT.match(key[len(split) + 1:])
            if not match:
                continue
            folder, index, ext = match.group(1), int(match.group(2)), match.group(3)
            if ext == "txt" and folder == KEYS_DIR:
                indexed.add(index)
            elif ext == "txt" and folder == DROPPED_DIR:
                dropped.add(index)
            elif ext == "tar" and not folder.startswith("_"):
                tars.setdefault(folder, set()).add(index)
        shards = tuple(sorted(indexed))
        missing = {m: frozenset(indexed - present) for m, present in sorted(tars.items()) if indexed - present}
        return cls(split, shards, tuple(sorted(tars)), missing, frozenset(dropped & indexed))

    def has_tar(self, modality: str, index: int) -> bool:
        return modality in self.modalities and index not in self.missing.get(modality, ())


def _default_decode(modality: str, data: bytes) -> Any:
    return get_modality(modality).decode(data)


def _members(store: Store, key: str, present: bool | None = None) -> Iterator[tuple[str, bytes]]:
    """``(sample key, bytes)`` of one modality tar, streamed; a missing tar has no members (``present``: whether it
    exists, when the caller knows; else the store is asked)."""
    if not (store.exists(key) if present is None else present):
        return
    stream = _StoreStream(store, key)
    try:
        for name, data in read_members(stream, store.uri_of(key)):
            yield name.rsplit("/", 1)[-1].split(".", 1)[0], data
    finally:
        stream.close()


def iter_joined_shard(store: Store, split: str, index: int, modalities: Sequence[str],
                      decode: Decode | None = _default_decode,
                      catalog: SplitCatalog | None = None) -> Iterator[tuple[str, dict[str, Any]]]:
    """``(key, {modality: value})`` for every sample of one shard, in key-index order (see module docstring).

    ``decode=None`` yields the stored bytes. With the split's ``catalog``, which objects exist is read from it, not
    asked of the store.
    """
    index_key = keys_key(split, index)
    keys = store.get_text(index_key).split()
    position = {key: i for i, key in enumerate(keys)}
    has_dropped = index in catalog.dropped if catalog else store.exists(dropped_key(split, index))
    dropped = set(store.get_text(dropped_key(split, index)).split()) if has_dropped else ()
    streams = {m: _members(store, shard_key(split, m, index), catalog.has_tar(m, index) if catalog else None)
               for m in modalities}
    pending: dict[str, tuple[str, bytes] | None] = {m: next(streams[m], None) for m in modalities}

    def mismatch(modality: str, member: str, expected: str) -> ShardMismatchError:
        return ShardMismatchError(
            f"{store.uri_of(shard_key(split, modality, index))} is out of step with its key index "
            f"{store.uri_of(index_key)}: member {member!r} where {expected} was expected (a corrupt or foreign "
            "shard; re-run the stage that wrote it)")

    try:
        for i, key in enumerate(keys):
            sample: dict[str, Any] = {}
            for modality in modalities:
                member = pending[modality]
                while member is not None and member[0] in dropped:  # a sample a later layer's gate dropped
                    member = pending[modality] = next(streams[modality], None)
                if member is None:
                    continue
                if member[0] == key:
                    sample[modality] = decode(modality, member[1]) if decode else member[1]
                    pending[modality] = next(streams[modality], None)
                elif position.get(member[0], -1) <= i:
                    raise mismatch(modality, member[0], f"{key!r} or a later key")
            yield key, sample
        for modality, member in pending.items():
            while member is not None and member[0] in dropped:
                member = next(streams[modality], None)
            if member is not None:
                raise mismatch(modality, member[0], "the end of the shard")
    finally:
        for stream in streams.values():
            stream.close()


def iter_source_info(store: Store, split: str, index: int) -> Iterator[tuple[str, dict[str, Any]]]:
    """``(key, source facts)`` for every sample of one shard, in key-index order: what a real-data source recorded
    in the shard's ``_source`` tar (``{"original_width": W, "original_height": H}``), ``{}`` for a sample without
    (synthetic data has no ``_source`` tar)."""
    for key, sample in iter_joined_shard(store, split, index, [SOURCE_DIR], decode=None):
        yield key, json.loads(sample[SOURCE_DIR]) if SOURCE_DIR in sample else {}


def iter_split(store: Store, split: str, modalities: Sequence[str], *, decode: Decode | None = _default_decode,
               limit: int | None = None, shuffle_buffer: int = 0, seed: int = 0,
               shards: Sequence[int] | None = None) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every sample of ``split`` (or of the given shard indices), in shard order, or through a bounded shuffle
    buffer of ``shuffle_buffer`` samples (shard order shuffled too). ``limit`` stops after that many samples."""
    indices = list(shard_indices(store, split) if shards is None else shards)
    if not indices:
        raise MissingModalityError(f"no shards at {store.uri_of(split)} (no key index under {KEYS_DIR}/)")
    available = available_modalities(store, split)
    missing = [m for m in modalities if m not in available]
    if missing:
        raise MissingModalityError(f"no shards of modalities {missing} at {store.uri_of(split)} "
                                   f"(it has {available})")
    rng = random.Random(seed)
    if shuffle_buffer:
        rng.shuffle(indices)
    samples = (s for i in indices for s in iter_joined_shard(store, split, i, modalities, decode))
    if shuffle_buffer:
        samples = bounded_shuffle(samples, shuffle_buffer, rng)
    for count, sample in enumerate(samples):
        if limit is not None and count >= limit:
            return
        yield sample


def bounded_shuffle(samples: Iterator[Any], size: int, rng: random.Random) -> Iterator[Any]:
    """A bounded shuffle: at most ``size`` samples are held at once."""
    buffer: list[Any] = []
    for sample in samples:
        if len(buffer) < size:
            buffer.append(sample)
            continue
        i = rng.randrange(size)
        yield buffer[i]
        buffer[i] = sample
    rng.shuffle(buffer)
    yield from buffer


def iter_texts(store: Store, split: str, modalities: Sequence[str], limit: int | None = None) -> Iterator[str]:
    """Every string of the given sequence modalities in ``split``, streamed."""
    for _, sample in iter_split(store, split, modalities, limit=limit):
        for modality in modalities:
            if modality in sample:
                yield sample[modality]
