"""Write aligned per-modality WebDataset shards: ``<split>/<modality>/shard-000000.tar``.

Shard ``i`` of every modality holds the same samples (``[i * samples_per_shard, (i + 1) * samples_per_shard)`` in
write order) with the same ``__key__`` order; a sample lacking a modality simply has no member in that modality's
shard. Each shard also has a key index, ``<split>/_keys/shard-000000.txt`` (its keys in order, one per line),
written after the shard's tars: it is how readers join the modalities by key (a key a modality lacks is absent
for that sample, never a dropped sample) and the marker that the shard is complete. A real-data source adds a
``_source`` tar beside the modalities (:data:`SOURCE_DIR`: each sample's original size). Tars are built in a local
spool file with fixed metadata (so equal content gives equal bytes) and uploaded through the
:class:`~fourm_kfp.storage.Store` in one atomic put each: the bytes ``tarfile`` writes, without its per-member cost
(:mod:`fourm_kfp.data.ustar`).
"""

from __future__ import annotations

import json
import os
import tempfile
from collections import Counter
from typing import Any, Callable, Mapping

from fourm_kfp.data.modalities import get_modality
from fourm_kfp.data.ustar import TarSpool
from fourm_kfp.storage import Store

#: The splits of a dataset, in the order stages walk them.
SPLITS = ("train", "val")
KEYS_DIR = "_keys"


def shard_name(index: int) -> str:
    """``shard-NNNNNN``: the name (without its extension) of shard ``index`` in every folder of a split."""
    return f"shard-{index:06d}"


def shard_key(split: str, modality: str, index: int) -> str:
    return f"{split}/{modality}/{shard_name(index)}.tar"


def keys_key(split: str, index: int) -> str:
    """The key index of shard ``index`` of ``split``."""
    return f"{split}/{KEYS_DIR}/{shard_name(index)}.txt"


#: Per-sample facts about the source a real-data sample came from (its original size before the centre crop):
#: ``<split>/_source/shard-NNNNNN.tar``, one ``<key>.json`` member per sample of the shard, in key-index order
#: (:func:`encode_source_info`; read back with :func:`fourm_kfp.data.shard_stream.iter_source_info`). A
#: :class:`ShardWriter` takes it as one more "modality" of the sample; it is no modality of the dataset (readers
#: pass over folders starting with ``_``).
SOURCE_DIR = "_source"


def encode_source_info(info: Mapping[str, Any]) -> bytes:
    """One sample's source facts as the bytes of its ``<key>.json`` member (sorted keys: equal facts, equal bytes)."""
    return json.dumps(dict(info), sort_keys=True, separators=(",", ":")).encode()


def _member_ext(modality: str) -> str:
    return "json" if modality == SOURCE_DIR else get_modality(modality).ext


#: Keys a later dataset layer (the label stage's gate) dropped from a shard: ``<split>/_dropped/shard-NNNNNN.txt``,
#: one key per line. Readers skip those keys' members in the lower layers' tars.
DROPPED_DIR = "_dropped"


def dropped_key(split: str, index: int) -> str:
    return f"{split}/{DROPPED_DIR}/{shard_name(index)}.txt"


class ShardWriter:
    """Streams encoded samples of one split into aligned per-modality shards.

    ``write(key, encoded)`` takes ``{modality: bytes}`` (see :func:`encode_sample`). Call :meth:`close` to flush
    the last shard; it returns counts per modality and the number of shards.
    """

    def __init__(self, store: Store, split: str, modalities: tuple[str, ...], samples_per_shard: int,
                 ext: Callable[[str], str] | None = None, first_index: int = 0):
        self.store, self.split, self.modalities = store, split, modalities
        self.samples_per_shard = samples_per_shard
        self.ext = ext or _member_ext
        self.first_index = first_index
        self._keys: list[str] = []
        self.counts: Counter[str] = Counter()
        self.samples = 0
        self.shards = 0
        self._spool = tempfile.TemporaryDirectory(prefix="fourm-shards-")
        self._open: dict[str, TarSpool] = {}
        self._seen: dict[str, int] = {}  # modality -> the shard (counted from 0) it was first seen in

    def write(self, key: str, encoded: Mapping[str, bytes]) -> None:
        if self.samples and self.samples % self.samples_per_shard == 0:
            self._flush()
        for modality, data in encoded.items():
            if modality not in self.modalities:
                continue
            if modality not in self._open:
                self._open[modality] = TarSpool(os.path.join(self._spool.name, f"{modality}.tar"))
            self._open[modality].add(f"{key}.{self.ext(modality)}", data)
            self.counts[modality] += 1
            self._seen.setdefault(modality, self.shards)
        self._keys.append(key)
        self.samples += 1

    def _flush(self) -> None:
        """Upload the current shard of every modality seen so far (an empty tar where a shard lacks it), then its
        key index."""
        index = self.first_index + self.shards
        for modality in sorted(self._seen):
            path = os.path.join(self._spool.name, f"{modality}.tar")
            (self._open.pop(modality, None) or TarSpool(path)).close()
            self.store.put_file(shard_key(self.split, modality, index), path)
            os.unlink(path)
        self.store.put_text(keys_key(self.split, index), "".join(f"{k}\n" for k in self._keys))
        self._keys = []
        self.shards += 1

    def close(self, commit_empty: bool = False) -> dict:
        """Flush the last shard; with ``commit_empty`` and no sample written, commit shard ``first_index`` empty
        (its key index lists no key), so that a shard someone planned is never missing."""
        if self.samples > self.shards * self.samples_per_shard:
            self._flush()
        elif commit_empty and not self.samples:
            self.store.put_text(keys_key(self.split, self.first_index), "")
            self.shards = 1
        self._backfill()
        self._spool.cleanup()
        return {"samples": self.samples, "shards": self.shards, "modalities": dict(sorted(self.counts.items()))}

    def _backfill(self) -> None:
        """A modality first seen after shard 0 gets empty tars for the earlier shards, so indices align."""
        late = {m: first for m, first in self._seen.items() if first}
        if not late:
            return
        empty = os.path.join(self._spool.name, "empty.tar")
        TarSpool(empty).close()
        for modality in sorted(late):
            for index in range(self.first_index, self.first_index + late[modality]):
                self.store.put_file(shard_key(self.split, modality, index), empty)


def encode_sample(sample: Mapping[str, object], modalities: tuple[str, ...]) -> dict[str, bytes]:
    """``{modality: value}`` → ``{modality: bytes}`` for the modalities kept (absent ones stay absent)."""
    return {m: get_modality(m).encode(sample[m]) for m in modalities if m in sample}
