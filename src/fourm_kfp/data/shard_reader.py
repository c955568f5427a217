"""Read aligned per-modality shards back: ``<split>/<modality>/shard-NNNNNN.tar`` → samples.

The inverse of :mod:`fourm_kfp.data.shard_writer`, for stages that consume a dataset (tokenizer training,
pretokenization, evaluation). Shard ``i`` of every modality covers the same samples, so the reader opens shard ``i``
of each requested modality, streams it from the store (local or S3), and joins members by ``__key__``. A modality
absent for a sample is absent from that sample's dict; a modality absent from the whole split is an error naming
the URI it looked at.
"""

from __future__ import annotations

import re
import tarfile
from typing import Any, Iterator, Sequence

import numpy as np

from fourm_kfp.data.modalities import get_modality
from fourm_kfp.storage import Store

_SHARD = re.compile(r"shard-(\d{6})\.tar$")


class MissingModalityError(LookupError):
    """A requested modality has no shards in a split."""


def available_modalities(store: Store, split: str) -> list[str]:
    """Modalities with at least one shard in ``split``."""
    return sorted({key.split("/")[1] for key in store.list(split) if _SHARD.search(key)})


def shard_indices(store: Store, split: str, modality: str) -> list[int]:
    indices = [int(m.group(1)) for key in store.list(f"{split}/{modality}") if (m := _SHARD.search(key))]
    if not indices:
        raise MissingModalityError(f"no shards of modality {modality!r} at {store.uri_of(f'{split}/{modality}')}")
    return sorted(indices)


def _read_tar(store: Store, key: str) -> dict[str, bytes]:
    """``{__key__: bytes}`` of one modality shard, in member order (dicts keep insertion order)."""
    members: dict[str, bytes] = {}
    with store.open_read(key) as stream, tarfile.open(fileobj=stream, mode="r|") as tar:
        for info in tar:
            if info.isfile():
                members[info.name.split(".", 1)[0]] = tar.extractfile(info).read()
    return members


def iter_split(store: Store, split: str, modalities: Sequence[str], decode: bool = True,
               limit: int | None = None) -> Iterator[tuple[str, dict[str, Any]]]:
    """Yield ``(key, {modality: value})`` for every sample of ``split`` in shard order.

    ``decode=False`` yields the stored bytes. ``limit`` stops after that many samples.
    """
    indices = shard_indices(store, split, modalities[0])
    for modality in modalities[1:]:
        if shard_indices(store, split, modality) != indices:
            raise MissingModalityError(f"shards of {modality!r} and {modalities[0]!r} in {store.uri_of(split)} "
                                       "do not line up")
    count = 0
    for index in indices:
        per_modality = {m: _read_tar(store, f"{split}/{m}/shard-{index:06d}.tar") for m in modalities}
        order = max(per_modality.values(), key=len)
        for key in order:
            sample = {}
            for modality, members in per_modality.items():
                if key in members:
                    data = members[key]
                    sample[modality] = get_modality(modality).decode(data) if decode else data
            yield key, sample
            count += 1
            if limit is not None and count >= limit:
                return


def load_image_modality(store: Store, split: str, modality: str, limit: int | None = None) -> np.ndarray:
    """Every sample's value of one image modality, stacked: ``[N, H, W(, C)]``."""
    values = [sample[modality] for _, sample in iter_split(store, split, [modality], limit=limit)]
    if not values:
        raise MissingModalityError(f"split {split!r} at {store.uri} has no {modality!r} samples")
    return np.stack(values)


def load_texts(store: Store, split: str, modalities: Sequence[str], limit: int | None = None) -> list[str]:
    """All strings of the given sequence modalities (e.g. captions and det) in ``split``."""
    texts = []
    for modality in modalities:
        texts += [s[modality] for _, s in iter_split(store, split, [modality], limit=limit) if modality in s]
    return texts
