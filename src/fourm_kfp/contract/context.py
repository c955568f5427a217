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
from fourm_kfp.storage import Store

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

    def write_report(self, name: str, data: bytes) -> None:
        """Store a report file with the output (``reports/<name>``) and attach it to the stage's MLflow run."""
        self.output.put_bytes(f"reports/{name}", data)
        self.tracker.log_artifact(f"reports/{name}", data)

    def part_records(self) -> list[dict[str, Any]]:
        """The records the fan-out workers left (``part``, ``parts``, ``files``, ``counts``, ``metrics``)."""
        return [json.loads(self.output.get_bytes(part_key(i, self.parts))) for i in range(self.parts)]
