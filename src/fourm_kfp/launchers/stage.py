"""One launch path for a stage: the CLI's ``stage`` command, the KFP components and the training pod call this.

:func:`launch_stage` does, in one place, what every launcher needs: logging, the S3 endpoint (passed on to child
processes through ``AWS_ENDPOINT_URL``), joining a ``torch.distributed`` group when the environment describes
one, loading the config with its overrides (a list end to end, so values with spaces survive), opening the output
store, and running the stage (or one fan-out part of it) with lineage.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from fourm_kfp.config.schema import ConfigError

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


def launch_stage(name: str, *, preset: str, overrides: Sequence[str], store_uri: str, s3_endpoint: str = "",
                 tracking_uri: str | None = None, root: str | os.PathLike | None = None,
                 parent_run_id: str | None = None, force: bool = False,
                 input_uris: dict[str, str] | None = None, parts: int = 1, part: int | None = None):
    """Run stage ``name`` (or, with ``part``, one of its ``parts`` fan-out workers).

    Returns the :class:`~fourm_kfp.contract.StageOutcome` (a part returns the stage's output URI).
    """
    from fourm_kfp import distributed
    from fourm_kfp.config.loader import load_config
    from fourm_kfp.contract import lineage, run_stage, run_stage_part
    from fourm_kfp.stages import get_stage
    from fourm_kfp.storage import open_store

    setup_logging()
    apply_s3_endpoint(s3_endpoint)
    distributed.init_from_env()  # under torchrun: every rank runs the stage, rank 0 commits
    config = load_config(preset, overrides=list(overrides))
    spec = get_stage(name)
    store = open_store(store_uri, s3_endpoint=s3_endpoint or None, create=True)
    tracking = lineage.resolve_tracking_uri(tracking_uri, root)
    inputs = {k: v for k, v in (input_uris or {}).items() if v}
    if part is not None:
        return run_stage_part(spec, config, store, part, parts, input_uris=inputs, tracking_uri=tracking,
                              parent_run_id=parent_run_id or None)
    return run_stage(spec, config, store, force=force, input_uris=inputs, tracking_uri=tracking,
                     parent_run_id=parent_run_id or None, parts=parts)


@dataclass
class LaunchPlan:
    """What a launcher of one stage on other machines (a PyTorchJob, torchx) knows before it starts anything: the
    stage's address and output, and whether that output is committed already."""

    stage: str
    config: Any
    spec: Any
    store: Any
    address: str
    output: Any
    committed: bool
    started: float


def plan_launch(stage: str, *, preset: str, overrides: Sequence[str], store_uri: str,
                s3_endpoint: str = "") -> LaunchPlan:
    """Load the config, open the store, and find ``stage``'s content address and whether it is committed."""
    from fourm_kfp.config.loader import load_config
    from fourm_kfp.contract.addressing import stage_address
    from fourm_kfp.contract.manifest import read_manifest
    from fourm_kfp.contract.runner import output_store
    from fourm_kfp.stages import get_stage
    from fourm_kfp.storage import open_store

    setup_logging()
    apply_s3_endpoint(s3_endpoint)
    started = time.monotonic()
    config = load_config(preset, overrides=list(overrides))
    spec = get_stage(stage)
    store = open_store(store_uri, s3_endpoint=s3_endpoint or None, create=True)
    output = output_store(spec, config, store)
    return LaunchPlan(stage, config, spec, store, stage_address(spec, config), output,
                      read_manifest(output) is not None, started)


def committed_outcome(plan: LaunchPlan, what: str):
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
