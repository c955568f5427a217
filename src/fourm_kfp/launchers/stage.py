"""One launch path for a stage: the CLI's ``stage`` command, the KFP components and the training pod call this.

Every launcher passes a :class:`RunContext` (config, store, lineage).
:func:`launch_stage` (and :func:`launch_stage_part` for one fan-out worker) does, in one place, what every launcher
needs: logging, the S3 endpoint (passed on to child processes through ``AWS_ENDPOINT_URL``), joining a
``torch.distributed`` group when the environment describes one, loading the config with its overrides (a list end
to end, so values with spaces survive), opening the output store, and running the stage with lineage.
:func:`open_run` is the one place a run's config and store are loaded. :func:`clear_stage_output` clears a forced
fan-out stage's output once, before its workers start. :func:`plan_launch` and :func:`committed_outcome` frame a
launch on other machines (:mod:`.remote`): a plan that found the output committed is handed to :func:`launch_stage`,
which reports it without loading, opening or reading anything again.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from fourm_kfp.config.schema import ConfigError

if TYPE_CHECKING:
    from fourm_kfp.config.fourm_config import FourMConfig
    from fourm_kfp.contract.runner import StageOutcome
    from fourm_kfp.contract.spec import StageSpec
    from fourm_kfp.storage import Store

log = logging.getLogger(__name__)
#: Where outputs go when an S3 endpoint is given but no store.
DEFAULT_S3_STORE = "s3://fourm-kfp"


def setup_logging(debug: bool = False) -> None:
    """One format for every process of a run (``PYTHONUNBUFFERED`` is set in pods; lines are flushed)."""
    logging.basicConfig(level=logging.DEBUG if debug else logging.INFO, stream=sys.stderr, force=True,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for noisy in ("urllib3", "alembic", "botocore", "git", "mlflow"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def local_root(root: str | os.PathLike) -> Path:
    """The local run folder; an URI here is a user error (outputs go to S3 through ``--store``)."""
    text = str(root)
    if "://" in text:
        raise ConfigError(f"--root {text!r}: the run folder must be a local path (it holds the MLflow store and "
                          "KFP's files); send stage outputs to object storage with --store s3://bucket/prefix")
    return Path(text).expanduser().resolve()


def resolve_store_uri(root: Path, store: str | None, s3_endpoint: str | None) -> str:
    """``--store`` if given, else the S3 default bucket when an endpoint is given, else the run folder."""
    return store or (DEFAULT_S3_STORE if s3_endpoint else str(root))


def apply_s3_endpoint(s3_endpoint: str | None) -> None:
    """Make the endpoint the process default (child processes and the webdataset opener inherit it)."""
    if s3_endpoint:
        os.environ["AWS_ENDPOINT_URL"] = s3_endpoint


@dataclass(frozen=True)
class RunContext:
    """What every launcher passes down to a stage wherever it runs: the config (preset and ``section.key=value``
    overrides, later wins), where outputs go (the store and its S3 endpoint) and where lineage goes (the MLflow
    tracking URI and the pipeline's parent run). An empty string means "not given" (take the environment)."""

    preset: str
    overrides: tuple[str, ...] = ()
    store_uri: str = ""
    s3_endpoint: str = ""
    tracking_uri: str = ""
    parent_run_id: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "overrides", tuple(self.overrides))


def open_run(run: RunContext, *, create: bool = True) -> tuple[FourMConfig, Store]:
    """The run's config (its preset with the overrides) and its store root, the S3 endpoint made the process
    default first; ``create``: make the bucket or folder when missing (off for commands that only read)."""
    from fourm_kfp.config.loader import load_config
    from fourm_kfp.storage import open_store

    apply_s3_endpoint(run.s3_endpoint)
    config = load_config(run.preset, overrides=list(run.overrides))
    return config, open_store(run.store_uri, s3_endpoint=run.s3_endpoint or None, create=create)


def launch_stage(name: str, run: RunContext, *, root: str | os.PathLike | None = None, force: bool = False,
                 input_uris: dict[str, str] | None = None, parts: int = 1,
                 plan: LaunchPlan | None = None) -> StageOutcome:
    """Run stage ``name`` in this process (every rank of a ``torch.distributed`` group, rank 0 commits). ``plan``:
    :func:`plan_launch`'s for this stage and run, whose config, store and manifest are used as they are."""
    from fourm_kfp.contract import run_stage

    spec, config, store, tracking, inputs = _prepare(name, run, root, input_uris, plan)
    committed = plan.committed if plan is not None and not force else None
    return run_stage(spec, config, store, force=force, input_uris=inputs, tracking_uri=tracking,
                     parent_run_id=run.parent_run_id or None, parts=parts, committed=committed)


def launch_stage_part(name: str, run: RunContext, part: int, parts: int, *, root: str | os.PathLike | None = None,
                      input_uris: dict[str, str] | None = None) -> str:
    """Run fan-out worker ``part`` of ``parts`` of stage ``name``; returns the stage's output URI."""
    from fourm_kfp.contract import run_stage_part

    spec, config, store, tracking, inputs = _prepare(name, run, root, input_uris)
    return run_stage_part(spec, config, store, part, parts, input_uris=inputs, tracking_uri=tracking,
                          parent_run_id=run.parent_run_id or None)


def clear_stage_output(name: str, run: RunContext) -> int:
    """Clear fan-out stage ``name``'s output under ``run``'s config before its workers start (a forced stage whose
    workers run as separate steps: the pipeline's fan-out step does this once, so no worker finds the old manifest
    and skips, and none deletes what another wrote); a stage that is off has no output. Returns the number of
    objects removed."""
    from fourm_kfp.contract.runner import clear_output, output_store
    from fourm_kfp.stages import get_stage

    setup_logging()
    config, store = open_run(run)
    spec = get_stage(name)
    if spec.run_part is None:
        raise ConfigError(f"stage {name!r} does not fan out: only a fan-out stage's output is cleared before its "
                          "workers (the others are cleared by the forced run itself)")
    if not spec.is_enabled(config):
        return 0
    return clear_output(name, output_store(spec, config, store))


def _prepare(name: str, run: RunContext, root: str | os.PathLike | None, input_uris: dict[str, str] | None,
             plan: LaunchPlan | None = None):
    from fourm_kfp import distributed
    from fourm_kfp.contract import lineage
    from fourm_kfp.stages import get_stage

    setup_logging()
    distributed.init_from_env()  # under torchrun: every rank runs the stage, rank 0 commits
    if plan is None:
        config, store = open_run(run)
        spec = get_stage(name)
    else:
        if plan.stage != name:
            raise ValueError(f"a plan of stage {plan.stage!r} handed to stage {name!r}")
        config, store, spec = plan.config, plan.store, plan.spec
    tracking = lineage.resolve_tracking_uri(run.tracking_uri or None, root)
    return spec, config, store, tracking, {k: v for k, v in (input_uris or {}).items() if v}


@dataclass(frozen=True)
class LaunchPlan:
    """What a launcher of one stage on other machines (a PyTorchJob, torchx) knows before it starts anything: the
    stage's address and output, and the output's manifest and its digest when it is committed already (else None)."""

    stage: str
    config: FourMConfig
    spec: StageSpec
    store: Store
    address: str
    output: Store
    committed: tuple[dict, str] | None
    started: float


def plan_launch(stage: str, run: RunContext) -> LaunchPlan:
    """Load the config, open the store, and find ``stage``'s content address and whether it is committed."""
    from fourm_kfp.contract.addressing import stage_address
    from fourm_kfp.contract.manifest import read_manifest
    from fourm_kfp.contract.runner import output_store
    from fourm_kfp.stages import get_stage

    setup_logging()
    started = time.monotonic()
    config, store = open_run(run)
    spec = get_stage(stage)
    output = output_store(spec, config, store)
    return LaunchPlan(stage, config, spec, store, stage_address(spec, config), output, read_manifest(output),
                      started)


def committed_outcome(plan: LaunchPlan, what: str) -> StageOutcome:
    """The outcome of a stage that ran elsewhere, read from its committed manifest (``what`` ran it: the job)."""
    from fourm_kfp.contract import StageOutcome
    from fourm_kfp.contract.manifest import read_manifest
    from fourm_kfp.errors import UserError

    committed = read_manifest(plan.output)
    if committed is None:
        raise UserError(f"{what} succeeded but {plan.stage}'s output is not committed at {plan.output.uri}: it ran "
                        f"something else than the {plan.stage} stage (image, command)")
    manifest, digest = committed
    log.info("%s: %s committed %s", plan.stage, what, plan.output.uri)
    return StageOutcome(plan.stage, "ran", plan.output.uri, round(time.monotonic() - plan.started, 3), digest,
                        manifest.get("mlflow_run_id"), manifest.get("metrics", {}))
