"""The stage contract: content-addressed, manifest-committed, lineage-recorded execution of one stage.

A stage is a :class:`StageSpec`: its name, the config keys and upstream stages its output depends on, a code
version, and a function ``run(ctx) -> StageResult`` that reads ``ctx.inputs`` and writes into ``ctx.output``.
:func:`run_stage` wraps every stage the same way:

1. read the inputs' manifests (an input without one is an error) and derive the output prefix
   ``<store>/<stage>/<hash>`` (see :mod:`fourm_kfp.content_address`);
2. if that prefix holds a committed manifest and ``force`` is off, skip: record a child run tagged as reused;
3. else clear whatever a killed or forced run left there, call the stage, and commit the manifest last.
"""

from __future__ import annotations

import datetime as dt
import importlib
import logging
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

from fourm_kfp import distributed, lineage
from fourm_kfp.config.fourm_config import FourMConfig
from fourm_kfp.content_address import config_view, output_hash
from fourm_kfp.manifest import (MANIFEST_NAME, RecordingStore, code_version, commit_manifest, manifest_bytes,
                                read_manifest, require_manifest)
from fourm_kfp.storage import Store, open_store

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StageSpec:
    """What the runner needs to know about a stage."""

    name: str
    entry: str | Callable[["StageContext"], "StageResult"]  # run(ctx), or "module:function" imported lazily
    config_keys: tuple[str, ...]  # dotted config keys whose versioned fields address the output
    inputs: tuple[str, ...] = ()  # upstream stages whose committed outputs this stage reads
    code_version: int = 1  # bump when the stage's code changes what it writes
    #: "module:function" mapping the config to a digest of data read from outside the pipeline (None = none);
    #: part of the content address, so a changed source folder is not mistaken for the old one.
    source_fingerprint: str | None = None

    def function(self) -> Callable[["StageContext"], "StageResult"]:
        return self.entry if callable(self.entry) else _import(self.entry)

    def address_inputs(self, config: FourMConfig, inputs: dict[str, "StageInput"]) -> dict[str, str]:
        """What besides the config the output's address covers: input manifests and external sources."""
        digests = {name: item.digest for name, item in inputs.items()}
        source = _import(self.source_fingerprint)(config) if self.source_fingerprint else None
        if source:
            digests["<source>"] = source
        return digests


def _import(entry: str) -> Callable:
    module, _, attr = entry.partition(":")
    return getattr(importlib.import_module(module), attr)


@dataclass(frozen=True)
class StageInput:
    name: str
    uri: str
    store: Store
    manifest: dict[str, Any]
    digest: str


@dataclass
class StageContext:
    """What a stage function gets: config, inputs, where to write, and where lineage goes."""

    stage: str
    config: FourMConfig
    output: RecordingStore
    inputs: dict[str, StageInput]
    tracker: lineage.Tracker

    @property
    def is_primary(self) -> bool:
        """Whether this process writes the shared output (rank 0, or the only process)."""
        return distributed.is_primary()

    def write_report(self, name: str, data: bytes) -> None:
        """Store a report file with the output (``reports/<name>``) and attach it to the stage's MLflow run."""
        self.output.put_bytes(f"reports/{name}", data)
        self.tracker.log_artifact(f"reports/{name}", data)


@dataclass(frozen=True)
class ExternalSource:
    """Data a stage read from outside the pipeline (a user's image folder), recorded in its lineage."""

    name: str
    uri: str
    digest: str


@dataclass
class StageResult:
    """What a stage function returns: counts for the manifest, metrics for MLflow (and the manifest), and the
    external sources it read."""

    counts: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    sources: list[ExternalSource] = field(default_factory=list)


@dataclass
class StageOutcome:
    """How one stage went in this run: ``status`` is ``ran`` or ``skipped`` (output reused)."""

    name: str
    status: str
    output_uri: str
    seconds: float
    manifest_digest: str
    mlflow_run_id: str | None = None
    metrics: dict[str, float] = field(default_factory=dict)  # the committed output's, from its manifest

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def _open_inputs(spec: StageSpec, config: FourMConfig, store_root: Store,
                 input_uris: dict[str, str] | None) -> dict[str, StageInput]:
    inputs = {}
    for name in spec.inputs:
        if input_uris and input_uris.get(name):
            store = open_store(input_uris[name])
        else:
            store = store_root.child(name, resolve_hash(name, config, store_root))
        manifest, digest = require_manifest(store, f"input {name!r} of stage {spec.name!r}")
        inputs[name] = StageInput(name, store.uri, store, manifest, digest)
    return inputs


def resolve_hash(name: str, config: FourMConfig, store_root: Store) -> str:
    """The content address stage ``name`` has under ``config``, found through its inputs' committed outputs."""
    from fourm_kfp.stages import get_stage

    spec = get_stage(name)
    inputs = _open_inputs(spec, config, store_root, None)
    return output_hash(spec.name, spec.code_version, config, spec.config_keys, spec.address_inputs(config, inputs))


def run_stage(spec: StageSpec, config: FourMConfig, store_root: Store, *, force: bool = False,
              input_uris: dict[str, str] | None = None, tracking_uri: str | None = None,
              parent_run_id: str | None = None) -> StageOutcome:
    """Run (or reuse) one stage; see the module docstring.

    Under torchrun every rank calls this: all ranks run the stage function, rank 0 alone clears, commits and
    records lineage, and barriers keep the ranks in step.
    """
    started = time.monotonic()
    if not distributed.is_primary():
        tracking_uri = None
    inputs = _open_inputs(spec, config, store_root, input_uris)
    digest = output_hash(spec.name, spec.code_version, config, spec.config_keys, spec.address_inputs(config, inputs))
    output = store_root.child(spec.name, digest)
    resolved = config_view(config, spec.config_keys, versioned_only=False)

    with lineage.stage_run(tracking_uri, parent_run_id, spec.name) as tracker:
        tracker.log_params({"preset": config.preset, **resolved})
        for item in inputs.values():
            tracker.log_dataset(item.name, item.uri, item.digest, context="input")
        committed = None if force else read_manifest(output)
        if committed is not None:
            manifest, manifest_digest = committed
            status = "skipped"
            log.info("%s: reusing committed output %s", spec.name, output.uri)
            tracker.set_tags({lineage.TAG_STATUS: status, lineage.TAG_REUSED: "true",
                              lineage.TAG_PRODUCED_BY: str(manifest.get("mlflow_run_id"))})
        else:
            status = "ran"
            manifest, manifest_digest = _execute(spec, config, output, inputs, tracker, resolved, digest)
            tracker.set_tags({lineage.TAG_STATUS: status, lineage.TAG_REUSED: "false"})
        for source in manifest.get("sources", []):
            tracker.log_dataset(source["name"], source["uri"], source["digest"], context="source")
        tracker.log_dataset(spec.name, output.uri, manifest_digest, context="output")
        tracker.log_artifact(MANIFEST_NAME, manifest_bytes(manifest))
        tracker.log_metrics({**manifest.get("metrics", {}), "seconds": time.monotonic() - started})
        tracker.set_tags({"fourm.output_uri": output.uri, "fourm.content_hash": digest})
    return StageOutcome(spec.name, status, output.uri, round(time.monotonic() - started, 3), manifest_digest,
                        tracker.run_id, manifest.get("metrics", {}))


def _execute(spec: StageSpec, config: FourMConfig, output: Store, inputs: dict[str, StageInput],
             tracker: lineage.Tracker, resolved: dict[str, Any], digest: str) -> tuple[dict[str, Any], str]:
    primary = distributed.is_primary()
    stale = output.delete_prefix() if primary else 0
    if stale:
        log.warning("%s: cleared %d objects left by an unfinished or forced run at %s", spec.name, stale, output.uri)
    distributed.barrier()
    recording = RecordingStore(output)
    ctx = StageContext(spec.name, config, recording, inputs, tracker)
    started_at, started = _now(), time.monotonic()
    result = spec.function()(ctx)
    seconds = time.monotonic() - started
    distributed.barrier()
    if not primary:
        distributed.barrier()  # rank 0 commits meanwhile
        return require_manifest(output, f"output of {spec.name}")
    files = sorted(recording.records.values(), key=lambda r: r.key)
    manifest = {
        "stage": spec.name,
        "code_version": spec.code_version,
        "content_hash": digest,
        "output_uri": output.uri,
        "preset": config.preset,
        "config": resolved,
        "inputs": [{"name": i.name, "uri": i.uri, "manifest_digest": i.digest} for i in inputs.values()],
        "sources": [asdict(source) for source in result.sources],
        "code": code_version(),
        "counts": result.counts,
        "metrics": result.metrics,
        "files": [asdict(f) for f in files],
        "bytes_total": sum(f.bytes for f in files),
        "timings": {"started_at": started_at, "finished_at": _now(), "seconds": round(seconds, 3)},
        "mlflow_run_id": tracker.run_id,
    }
    manifest_digest = commit_manifest(output, manifest)
    distributed.barrier()
    log.info("%s: committed %s (%d files, %d bytes, %.1fs)", spec.name, output.uri_of(MANIFEST_NAME),
             len(files), manifest["bytes_total"], seconds)
    return manifest, manifest_digest
