"""Plan before run: each stage's address and whether its output is already committed, without running anything.

``fourm-kfp status`` prints this plan; a launcher calls :func:`plan_stages` to skip a committed stage before it
asks a cluster for GPUs.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Iterator, Sequence

from fourm_kfp.config.fourm_config import FourMConfig
from fourm_kfp.contract.addressing import stage_address
from fourm_kfp.contract.manifest import read_manifest
from fourm_kfp.contract.spec import StageSpec
from fourm_kfp.storage import Store


@dataclass(frozen=True)
class StagePlan:
    """One stage of a plan: its address and output URI, and who committed it (``None``: not committed)."""

    name: str
    address: str
    output_uri: str
    committed: bool
    mlflow_run_id: str | None = None
    finished_at: str | None = None
    #: the stage is off under this config (it has no address or output; see ``StageSpec.enabled``)
    off: bool = False

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def plan_stage(spec: StageSpec, config: FourMConfig, store_root: Store, memo: dict[str, str] | None = None
               ) -> StagePlan:
    if not spec.is_enabled(config):
        return StagePlan(spec.name, "", "", False, off=True)
    address = stage_address(spec, config, memo)
    output = store_root.child(spec.name, address)
    found = read_manifest(output)
    manifest = found[0] if found else {}
    return StagePlan(spec.name, address, output.uri, found is not None, manifest.get("mlflow_run_id"),
                     manifest.get("timings", {}).get("finished_at"))


def iter_plans(specs: Sequence[StageSpec], config: FourMConfig, store_root: Store) -> Iterator[StagePlan]:
    """Each stage's plan in turn, ``specs`` in pipeline order: a caller that stops early addresses no later stage
    (and imports no later stage's module)."""
    memo: dict[str, str] = {}
    for spec in specs:
        yield plan_stage(spec, config, store_root, memo)


def plan_stages(specs: Sequence[StageSpec], config: FourMConfig, store_root: Store) -> list[StagePlan]:
    """The plan of ``specs`` (pipeline order) under ``config`` against the outputs in ``store_root``."""
    return list(iter_plans(specs, config, store_root))
