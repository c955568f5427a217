"""What a stage function gets: a :class:`StageContext` (its guarded config, committed inputs, output store and
lineage tracker) with one :class:`StageInput` per upstream stage, and where fan-out workers leave their records.
The runner builds it (:mod:`.runner`); :mod:`.spec` names it in a stage's signature."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from fourm_kfp import distributed
from fourm_kfp.contract import lineage
from fourm_kfp.contract.guarded_config import GuardedConfig
from fourm_kfp.contract.manifest import RecordingStore
from fourm_kfp.storage import LayeredStore, Store

PARTS_DIR = "_parts"


def part_key(part: int, parts: int) -> str:
    return f"{PARTS_DIR}/part-{part:04d}-of-{parts:04d}.json"


@dataclass(frozen=True)
class StageInput:
    """A committed upstream output: where it is, its manifest and the manifest's digest."""

    name: str
    uri: str
    store: Store
    manifest: dict[str, Any]
    digest: str
    #: a layer of the dataset (prepare-data's images, the label stage's modalities): see :attr:`StageContext.dataset`
    dataset_layer: bool = False


@dataclass
class StageContext:
    """What a stage function gets: its (guarded) config, inputs, where to write, and where lineage goes."""

    stage: str
    config: GuardedConfig
    output: RecordingStore
    inputs: dict[str, StageInput]
    tracker: lineage.Tracker
    parts: int = 1

    @property
    def is_primary(self) -> bool:
        """Whether this process writes the shared output (rank 0, or the only process)."""
        return distributed.is_primary()

    @property
    def dataset_layers(self) -> list[StageInput]:
        """The inputs that make up the dataset, lowest layer first (pipeline order)."""
        layers = [item for item in self.inputs.values() if item.dataset_layer]
        if not layers:
            raise ValueError(f"stage {self.stage!r} reads no dataset (none of its inputs is a dataset layer)")
        return layers

    @property
    def dataset(self) -> Store:
        """The dataset as one read-only store: every layer's shards, a later layer's key indexes over an earlier's
        (the label stage's, which leave out the samples its gate dropped)."""
        layers = [item.store for item in self.dataset_layers]
        return layers[0] if len(layers) == 1 else LayeredStore(layers)

    @property
    def dataset_manifest(self) -> dict[str, Any]:
        """The manifest of the dataset's top layer: its ``counts["splits"]`` are the dataset's samples."""
        return self.dataset_layers[-1].manifest

    def write_report(self, name: str, data: bytes) -> None:
        """Store a report file with the output (``reports/<name>``) and attach it to the stage's MLflow run."""
        self.output.put_bytes(f"reports/{name}", data)
        self.tracker.log_artifact(f"reports/{name}", data)

    def part_records(self) -> list[dict[str, Any]]:
        """The records the fan-out workers left (``part``, ``parts``, ``files``, ``counts``, ``metrics``)."""
        return [json.loads(self.output.get_bytes(part_key(i, self.parts))) for i in range(self.parts)]
