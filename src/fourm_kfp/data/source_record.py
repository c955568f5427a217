"""One prepare-data source as a record: what it writes, what its address covers, its plan and its items.

A :class:`Source` is one value of ``prepare_data.source``. The prepare-data stage
(:mod:`fourm_kfp.stages.prepare_data`) does the same for every source: it asks the record for the
:class:`SourcePlan` (every job and the output shards it writes, from the config and the source's listing alone, so
the payload is the same bytes at any fan-out width), gives each fan-out worker its share of the jobs, writes the
:class:`EncodedSample` items the record's ``items`` yields for them into those shards, and collects. What differs
between sources is in the record:

* ``modalities`` — what the source writes, in the modality table's names; prepare-data's content address covers
  only these of ``data.modalities`` (the others come from later stages), so a modality the source writes but its
  record lacks would leave configs with and without it on one address;
* ``fingerprint`` — what the address covers of what it reads beyond the config (a digest of its listing); ``None``
  when the config describes the data wholly (synthetic scenes);
* ``processing`` — how it turns what it reads into samples where the config does not say (the photo crop): the
  address covers it beside the ``prepare_data`` section;
* ``external`` — it reads ``prepare_data.source_uri`` (then required): its samples may be unusable (skipped,
  counted, bounded by ``prepare_data.max_bad_fraction``), and its inputs are the run's lineage source;
* ``unique_keys`` — whether its sample keys are unique across the whole source by construction (else the collect
  step warns about a key two shards hold);
* ``render`` — the samples of some keys made again from the config, for the preview (the shards hold some
  modalities quantised); ``None``: the preview reads the samples back from the output.

The records of the shipped sources live with their code (:mod:`.synthetic_source`, :mod:`.photo_sources`) and are
listed in :data:`fourm_kfp.data.sources.SOURCES`.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping, NamedTuple

from fourm_kfp.data.modalities import MODALITIES


@dataclass(frozen=True)
class SourceJob:
    """One unit of a worker's work: the output shards it writes and what it reads for them."""

    #: ``(split, shard index)`` of each output shard the job writes
    shards: tuple[tuple[str, int], ...]
    #: what the source reads for them: scene indices, an image folder's entries, a WebDataset tar's key
    inputs: Any
    #: how many samples it reads, when that is known before reading them (a progress bar's total)
    samples: int | None = None


@dataclass
class SourcePlan:
    """Every job of the whole source, in order, and what its ``items`` need beyond the jobs."""

    jobs: list[SourceJob]
    #: an external source's inputs, in order (their digest is the run's lineage source)
    origins: list[str] = field(default_factory=list)
    #: what the source's ``items`` reads the jobs' inputs through (an image folder's listing), if anything
    reader: Any = None


class EncodedSample(NamedTuple):
    """One sample of a job, encoded for its shard, or the record of one that was skipped (``skipped`` set, no
    sample)."""

    split: str
    key: str
    sample: dict[str, Any] | None
    #: ``{modality or "_source": bytes}`` (:func:`fourm_kfp.data.shard_writer.encode_sample`)
    encoded: dict[str, bytes] | None
    #: a :class:`~fourm_kfp.data.image_normalize.BadSampleError`
    skipped: Any = None


#: ``plan(config)``: every job of the whole source
Planner = Callable[[Any], SourcePlan]
#: ``items(config, plan, jobs)``: ``(position of its job in jobs, sample)`` for every sample of ``jobs``, in job order
ItemReader = Callable[[Any, SourcePlan, list[SourceJob]], Iterator[tuple[int, EncodedSample]]]


@dataclass(frozen=True)
class Source:
    """One value of ``prepare_data.source`` (the module docstring says what each field is for)."""

    name: str
    #: what it is, in a few words (the config's description of ``prepare_data.source``)
    description: str
    modalities: tuple[str, ...]
    plan: Planner
    items: ItemReader
    fingerprint: Callable[[Any], str] | None = None
    processing: Mapping[str, str] = field(default_factory=dict)
    external: bool = False
    unique_keys: bool = True
    render: Callable[[Any, list[str]], list[dict[str, Any]]] | None = None
    #: what its progress bar counts
    unit: str = "samples"

    def __post_init__(self) -> None:
        unknown = [m for m in self.modalities if m not in MODALITIES]
        if unknown:
            raise ValueError(f"source {self.name!r}: modalities {unknown} are not in the modality table "
                             "(fourm_kfp.data.modalities)")
        if self.external and self.fingerprint is None:
            raise ValueError(f"source {self.name!r} reads outside the config (external) but has no fingerprint: "
                             "a changed input would keep its output's address")


def split_of(key: str, val_fraction: float) -> str:
    """The split of a sample by its key's hash: the same sample always lands in the same split."""
    return "val" if int(hashlib.sha1(key.encode()).hexdigest()[:8], 16) / 0x100000000 < val_fraction else "train"


def chunks(items: Any, size: int) -> list[Any]:
    """``items`` cut into consecutive slices of ``size`` (the last one shorter)."""
    return [items[first:first + size] for first in range(0, len(items), size)]
