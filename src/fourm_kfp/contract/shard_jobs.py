"""The output shards of a resumable fan-out stage (prepare-data, label, pretokenize): which a worker does, which an
earlier run committed already, and each shard's statistics record for the collect step.

Such a stage writes shards of each split (:mod:`fourm_kfp.data.shard_writer`: ``<split>/<folder>/shard-NNNNNN.*``),
each committed by its key index, written last; before the index its job writes the shard's statistics record, which
the collect step reads. Where that record lives is the stage's: prepare-data and pretokenize keep it outside the
payload, beside the part records (``_parts/shards/<split>/shard-NNNNNN.json``, :func:`parts_stats_key`: anything
under ``_parts/`` is written past the recording store), the label stage in it
(``<split>/_label_stats/shard-NNNNNN.json``, the gate's counts; :func:`payload_stats_key`). A :class:`ShardLedger`
over the stage's output does the rest the same way for all three:

* :meth:`~ShardLedger.take`: fan-out worker ``part`` of ``parts`` takes every ``parts``-th job and leaves the
  committed ones (a shard is committed when its key index and its statistics record are there); the files of the
  shards an earlier, killed run committed are recorded in this run's manifest (the same bytes this run would write);
* :meth:`~ShardLedger.commit_stats`: a shard's statistics record, as sorted-key JSON;
* :meth:`~ShardLedger.records`: the collect step's read of every planned shard's record; a shard no worker
  committed is an :class:`IncompleteShardsError` naming it.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any, Callable, Generic, Iterable, Sequence, TypeVar

from fourm_kfp.contract.context import PARTS_DIR, StageContext
from fourm_kfp.data.shard_stream import shard_indices
from fourm_kfp.data.shard_writer import SPLITS, keys_key, shard_name
from fourm_kfp.storage import Store

log = logging.getLogger(__name__)
J = TypeVar("J")


class IncompleteShardsError(RuntimeError):
    """The collect step found a planned output shard that no worker committed."""


@dataclass(frozen=True)
class Shard:
    """Shard ``index`` of ``split``."""

    split: str
    index: int

    def __str__(self) -> str:
        return f"{self.split} shard {self.index}"

    @property
    def name(self) -> str:
        """``shard-NNNNNN``, its files' name in every folder of its split."""
        return shard_name(self.index)

    @property
    def keys_key(self) -> str:
        """Its key index, which commits it."""
        return keys_key(self.split, self.index)

    @property
    def order(self) -> tuple[int, int]:
        """Its place in shard order: split by split (:data:`~fourm_kfp.data.shard_writer.SPLITS`), then by index."""
        return SPLITS.index(self.split), self.index


def committed_shards(store: Store) -> list[Shard]:
    """Every committed shard of a dataset store (those with a key index), in shard order."""
    return [Shard(split, index) for split in SPLITS for index in shard_indices(store, split)]


def parts_stats_key(shard: Shard) -> str:
    """``_parts/shards/<split>/shard-NNNNNN.json``: a statistics record outside the payload."""
    return f"{PARTS_DIR}/shards/{shard.split}/{shard.name}.json"


def payload_stats_key(folder: str) -> Callable[[Shard], str]:
    """``<split>/<folder>/shard-NNNNNN.json``: a statistics record in the payload."""
    return lambda shard: f"{shard.split}/{folder}/{shard.name}.json"


@dataclass(frozen=True)
class WorkerJobs(Generic[J]):
    """A fan-out worker's share of the jobs: all of them (``mine``), those to do, those committed before."""

    mine: list[J]
    todo: list[J]
    done: list[J]


def _single(job: Any) -> tuple[Shard, ...]:
    return (job,)


class ShardLedger:
    """The shards of a stage's output (see the module docstring); ``stats_key`` places a shard's statistics record
    (:func:`parts_stats_key`, :func:`payload_stats_key`)."""

    def __init__(self, ctx: StageContext, stats_key: Callable[[Shard], str]):
        self.stage, self.output, self.stats_key = ctx.stage, ctx.output, stats_key

    def _stats_store(self, shard: Shard) -> Store:
        """Where the record is written: past the recording store under ``_parts/`` (outside the payload)."""
        return self.output.inner if self.stats_key(shard).startswith(f"{PARTS_DIR}/") else self.output

    def committed(self, shard: Shard) -> bool:
        return self.output.exists(shard.keys_key) and self.output.exists(self.stats_key(shard))

    def take(self, jobs: Sequence[J], part: int, parts: int,
             shards: Callable[[J], Iterable[Shard]] = _single) -> WorkerJobs[J]:
        """Worker ``part`` of ``parts``: every ``parts``-th job, split into those to do and those whose shards
        (``shards(job)``; a job is one :class:`Shard` by default) are all committed; the files of those are
        recorded in this run's manifest."""
        mine = list(jobs[part::parts])
        committed = [all(self.committed(shard) for shard in shards(job)) for job in mine]
        done = [job for job, c in zip(mine, committed, strict=True) if c]
        todo = [job for job, c in zip(mine, committed, strict=True) if not c]
        if done:
            log.info("%s part %d/%d: %d of %d jobs already committed, %d to do", self.stage, part + 1, parts,
                     len(done), len(mine), len(todo))
            self._record_files([shard for job in done for shard in shards(job)])
        return WorkerJobs(mine, todo, done)

    def _record_files(self, shards: list[Shard]) -> None:
        """Record every payload file of ``shards`` (``<split>/<folder>/shard-NNNNNN.*``) as this run's."""
        wanted = {(shard.split, shard.name) for shard in shards}
        for key in self.output.list():
            split, name = key.split("/", 1)[0], key.rsplit("/", 1)[-1].split(".", 1)[0]
            if (split, name) in wanted:
                self.output.record_existing(key)

    def commit_stats(self, shard: Shard, record: dict[str, Any]) -> None:
        """Write ``shard``'s statistics record (before its key index, which commits the shard)."""
        self._stats_store(shard).put_bytes(self.stats_key(shard), json.dumps(record, sort_keys=True).encode())

    def records(self, shards: Iterable[Shard]) -> dict[Shard, dict[str, Any]]:
        """Every planned shard's statistics record (the collect step); a shard no worker committed is an error
        naming it."""
        found = {}
        for shard in shards:
            if not self.committed(shard):
                raise IncompleteShardsError(
                    f"{self.stage}: {shard} is not committed at {self.output.uri} (no {shard.keys_key} or "
                    f"{self.stats_key(shard)}): the worker that writes it did not finish; run the stage (or that "
                    "part) again")
            found[shard] = json.loads(self.output.get_bytes(self.stats_key(shard)))
        return found
