"""One image modality's training batches: the train split streamed epoch after epoch, with a position that a
checkpoint holds.

Each rank reads its own shards (every ``world``-th; all of them when there are fewer shards than ranks) through a
bounded shuffle seeded per rank and epoch, so memory does not grow with the dataset. An epoch's remainder is
dropped, but a split smaller than a batch fills it from the next epoch.

The position (:meth:`ImageBatches.state_dict`) is the epoch and how many of its arrays the batches drawn so far
took. A stream given a position (:meth:`ImageBatches.load_state_dict`) reads that epoch again from its start and
passes over the arrays already taken without decoding them, so its next batches are those the uninterrupted stream
would have drawn, at the cost of reading up to one epoch of this rank's shards once. Every position is taken just
after a batch was completed, so that epoch has completed one already: its remainder is dropped as it would have been.
"""

from __future__ import annotations

import itertools
from typing import Any, Iterator, Sequence

import numpy as np

from fourm_kfp import distributed
from fourm_kfp.data.modalities import get_modality
from fourm_kfp.data.shard_stream import MissingModalityError, iter_split, shard_indices
from fourm_kfp.storage import Store

#: Samples a training stream holds for shuffling (memory does not grow with the dataset).
SHUFFLE_BUFFER = 512
#: The split the batches come from.
TRAIN_SPLIT = "train"


def modality_values(data: Store, split: str, modality: str, limit: int | None = None, *, shuffle_buffer: int = 0,
                    seed: int = 0, shards: Sequence[int] | None = None) -> Iterator[bytes]:
    """The stored bytes of ``modality`` in ``split``, streamed (samples lacking it are passed over); ``limit``,
    ``shuffle_buffer``, ``seed`` and ``shards`` as :func:`~fourm_kfp.data.shard_stream.iter_split` takes them."""
    for _, sample in iter_split(data, split, [modality], decode=None, limit=limit, shuffle_buffer=shuffle_buffer,
                                seed=seed, shards=shards):
        if modality in sample:
            yield sample[modality]


def modality_arrays(data: Store, split: str, modality: str, limit: int | None = None, *, shuffle_buffer: int = 0,
                    seed: int = 0, shards: Sequence[int] | None = None) -> Iterator[np.ndarray]:
    """:func:`modality_values`, decoded by the modality's codec."""
    decode = get_modality(modality).decode
    return (decode(raw) for raw in modality_values(data, split, modality, limit, shuffle_buffer=shuffle_buffer,
                                                   seed=seed, shards=shards))


class ImageBatches:
    """Endless batches ``{modality: [batch_size, ...]}`` of the train split for this rank (see the module
    docstring); ``limit`` bounds the samples an epoch reads (``None``: all)."""

    def __init__(self, data: Store, modality: str, batch_size: int, seed: int, limit: int | None = None):
        self.data, self.modality, self.batch_size, self.seed, self.limit = data, modality, batch_size, seed, limit
        self.rank, self.world = distributed.rank(), distributed.world_size()
        self._epoch = self._taken = 0
        self._batches: Iterator[np.ndarray] | None = None

    def __iter__(self) -> "ImageBatches":
        return self

    def __next__(self) -> dict[str, np.ndarray]:
        if self._batches is None:
            self._batches = self._stream(self._epoch, self._taken)
        return {self.modality: next(self._batches)}

    def state_dict(self) -> dict[str, int]:
        """The position after the batches drawn so far: ``{"epoch": e, "taken": arrays of epoch e taken}``."""
        return {"epoch": self._epoch, "taken": self._taken}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state`` (:meth:`state_dict`); only before the first batch is drawn."""
        if self._batches is not None:
            raise RuntimeError(f"the {self.modality!r} batch stream's position can only be set before its first batch")
        self._epoch, self._taken = int(state["epoch"]), int(state["taken"])

    def _epoch_values(self, shards: list[int], epoch: int) -> Iterator[bytes]:
        return modality_values(self.data, TRAIN_SPLIT, self.modality, self.limit, shuffle_buffer=SHUFFLE_BUFFER,
                               seed=self.seed * 1_000_003 + self.rank * 7919 + epoch, shards=shards)

    def _stream(self, first_epoch: int, skip: int) -> Iterator[np.ndarray]:
        shards = shard_indices(self.data, TRAIN_SPLIT)
        mine = shards[self.rank :: self.world] or shards
        decode = get_modality(self.modality).decode
        batch: list[np.ndarray] = []
        for epoch in itertools.count(first_epoch):
            seen, completed = 0, skip > 0  # a position is taken where a batch was completed (module docstring)
            for raw in self._epoch_values(mine, epoch):
                seen += 1
                if seen <= skip:
                    continue
                batch.append(decode(raw))
                if len(batch) == self.batch_size:
                    self._epoch, self._taken = epoch, seen
                    yield np.stack(batch)
                    batch, completed = [], True
            if not seen:
                raise MissingModalityError(f"split {TRAIN_SPLIT!r} at {self.data.uri} has no {self.modality!r} "
                                           "samples")
            if completed:  # an epoch's remainder is dropped; a split smaller than a batch fills it from the next
                batch = []
            skip = 0
