"""The stage runner: content-addressed, manifest-committed, lineage-recorded execution of one stage.

:func:`run_stage` wraps every stage the same way:

1. derive the output prefix ``<store>/<stage>/<address>`` from the config alone (:mod:`.addressing`) and open
   the upstream stages' committed outputs (an input without a manifest is an error);
2. if that prefix holds a committed manifest and ``force`` is off, skip: record a child run tagged as reused;
3. else clear whatever a killed or forced run left there (a ``resumable`` stage keeps it unless forced), run the
   stage with a :class:`StageContext`, and commit the manifest last.

A process that computes a stage keeps the memory it frees for reuse (:func:`fourm_kfp.allocator.reuse_freed_memory`:
on the CPU each training step's fresh tensors are otherwise new pages the kernel faults in).

A fan-out stage (``spec.run_part``) is run as ``parts`` workers by :func:`run_stage_part`, each recording the
files it wrote in ``_parts/part-IIII-of-NNNN.json``; :func:`run_stage` then runs any part still missing
in-process and calls the collect step, whose manifest lists every part's files. A worker never clears: forcing a
stage whose workers run elsewhere is :func:`clear_output` once, before any worker starts (the pipeline's fan-out
step), then the workers and an unforced :func:`run_stage`, as in a first run.

Under torchrun every rank calls :func:`run_stage`: all ranks run the stage function, rank 0 alone clears, commits
and records lineage, and barriers keep the ranks in step.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from fourm_kfp import distributed
from fourm_kfp.allocator import reuse_freed_memory
from fourm_kfp.config.fourm_config import FourMConfig
from fourm_kfp.config.schema import ConfigError
from fourm_kfp.contract import lineage
from fourm_kfp.contract.addressing import config_view, stage_address
from fourm_kfp.contract.context import StageContext, StageInput, part_key
from fourm_kfp.contract.guarded_config import guard
from fourm_kfp.contract.manifest import (MANIFEST_NAME, FileRecord, RecordingStore, code_version, commit_manifest,
                                         manifest_bytes, payload_digest, read_manifest, require_manifest)
from fourm_kfp.contract.spec import StageSpec
from fourm_kfp.storage import Store, metering, open_store

log = logging.getLogger(__name__)
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


def output_store(spec: StageSpec, config: FourMConfig, store_root: Store) -> Store:
    """Where ``spec``'s output lives under ``config``: ``<store_root>/<stage>/<address>``."""
    return store_root.child(spec.name, stage_address(spec, config))


def open_inputs(spec: StageSpec, config: FourMConfig, store_root: Store,
                input_uris: dict[str, str] | None = None) -> dict[str, StageInput]:
    """The committed outputs ``spec`` reads: at their content addresses, or at the URIs given (a KFP step gets
    its inputs' URIs from the upstream steps)."""
    unknown = sorted(set(input_uris or {}) - set(spec.input_names))
    if unknown:
        raise ValueError(f"stage {spec.name!r} has no inputs {unknown}; its inputs: {list(spec.input_names)}")
    inputs = {}
    for up in spec.active_upstream(config):
        uri = (input_uris or {}).get(up.name)
        store = open_store(uri) if uri else output_store(up, config, store_root)
        manifest, digest = require_manifest(store, f"input {up.name!r} of stage {spec.name!r}")
        inputs[up.name] = StageInput(up.name, store.uri, store, manifest, digest, up.dataset_layer)
    return inputs


def require_enabled(spec: StageSpec, config: FourMConfig) -> None:
    """Fail when ``spec`` is off under ``config`` (it has nothing to do and no output)."""
    if not spec.is_enabled(config):
        raise ConfigError(f"stage {spec.name!r} is off under this config ({spec.off_when}): it has nothing to do, "
                          "so it has no output to run or read")


def _context(spec: StageSpec, config: FourMConfig, output: Store, inputs: dict[str, StageInput],
             tracker: lineage.Tracker, parts: int) -> StageContext:
    return StageContext(spec.name, guard(config, spec.config_keys, spec.name), RecordingStore(output), inputs,
                        tracker, parts)


def run_stage(spec: StageSpec, config: FourMConfig, store_root: Store, *, force: bool = False,
              input_uris: dict[str, str] | None = None, tracking_uri: str | None = None,
              parent_run_id: str | None = None, parts: int = 1,
              committed: tuple[dict, str] | None = None) -> StageOutcome:
    """Run (or reuse) one stage; see the module docstring. ``committed``: the output's manifest and digest when the
    caller has just read them (a launcher's plan), so they are not read again."""
    started, usage_start = time.monotonic(), metering.snapshot()
    require_enabled(spec, config)
    if not distributed.is_primary():
        tracking_uri = None
    address = stage_address(spec, config)
    output = store_root.child(spec.name, address)
    inputs = open_inputs(spec, config, store_root, input_uris)
    resolved = config_view(config, spec.config_keys, versioned_only=False)

    with lineage.stage_run(tracking_uri, parent_run_id, spec.name) as tracker:
        tracker.log_params({"preset": config.preset, **resolved})
        for item in inputs.values():
            tracker.log_dataset(item.name, item.uri, item.digest, context="input")
        committed = None if force else (committed or read_manifest(output))
        if committed is not None:
            manifest, manifest_digest = committed
            status = "skipped"
            log.info("%s: reusing committed output %s", spec.name, output.uri)
            tracker.set_tags({lineage.TAG_STATUS: status, lineage.TAG_REUSED: "true",
                              lineage.TAG_PRODUCED_BY: str(manifest.get("mlflow_run_id"))})
        else:
            status = "ran"
            manifest, manifest_digest = _execute(spec, config, output, inputs, tracker, resolved, address, force,
                                                 parts, usage_start)
            tracker.set_tags({lineage.TAG_STATUS: status, lineage.TAG_REUSED: "false"})
        for source in manifest.get("sources", []):
            tracker.log_dataset(source["name"], source["uri"], source["digest"], context="source")
        tracker.log_dataset(spec.name, output.uri, manifest_digest, context="output")
        tracker.log_artifact(MANIFEST_NAME, manifest_bytes(manifest))
        usage = (metering.Usage.from_dict(manifest.get("storage")) if status == "ran"
                 else metering.since(usage_start))
        tracker.log_metrics({**manifest.get("metrics", {}), "seconds": time.monotonic() - started,
                             **storage_metrics(usage)})
        tracker.set_tags({lineage.TAG_OUTPUT_URI: output.uri, lineage.TAG_ADDRESS: address})
    return StageOutcome(spec.name, status, output.uri, round(time.monotonic() - started, 3), manifest_digest,
                        tracker.run_id, manifest.get("metrics", {}))


def run_stage_part(spec: StageSpec, config: FourMConfig, store_root: Store, part: int, parts: int, *,
                   input_uris: dict[str, str] | None = None, tracking_uri: str | None = None,
                   parent_run_id: str | None = None) -> str:
    """Run fan-out worker ``part`` of ``parts`` (skipped when the stage or this part is already committed);
    returns the stage's output URI. The collect step (:func:`run_stage`) commits the manifest."""
    if spec.run_part is None:
        raise ConfigError(f"stage {spec.name!r} does not fan out: --part applies to fan-out stages only")
    if not 0 <= part < parts:
        raise ConfigError(f"--part {part} is not in 0..{parts - 1} (--parts {parts})")
    require_enabled(spec, config)
    output = output_store(spec, config, store_root)
    if read_manifest(output) is not None or output.exists(part_key(part, parts)):
        log.info("%s: part %d/%d already committed at %s", spec.name, part, parts, output.uri)
        return output.uri
    inputs = open_inputs(spec, config, store_root, input_uris)
    with lineage.stage_run(tracking_uri if distributed.is_primary() else None, parent_run_id,
                           f"{spec.name} part {part + 1}/{parts}", kind="part") as tracker:
        _run_part(spec, config, output, inputs, tracker, part, parts)
    return output.uri


def clear_output(stage: str, output: Store) -> int:
    """Remove everything at ``stage``'s ``output`` (a forced run's, or what an unfinished one left); returns the
    number of objects removed. The manifest goes first: a clear cut off midway leaves an uncommitted output, never a
    manifest over missing files."""
    committed = output.exists(MANIFEST_NAME)
    if committed:
        output.delete(MANIFEST_NAME)
    stale = int(committed) + output.delete_prefix()
    if stale:
        log.warning("%s: cleared %d objects left by an unfinished or forced run at %s", stage, stale, output.uri)
    return stale


def storage_metrics(usage: metering.Usage) -> dict[str, float]:
    """A stage's S3 usage as MLflow metrics: requests in all and by kind, bytes up and down."""
    return {"s3_requests": float(usage.total_requests), "s3_bytes_up": float(usage.bytes_up),
            "s3_bytes_down": float(usage.bytes_down),
            **{f"s3_requests_{kind}": float(n) for kind, n in usage.requests.items()}}


def _run_part(spec: StageSpec, config: FourMConfig, output: Store, inputs: dict[str, StageInput],
              tracker: lineage.Tracker, part: int, parts: int) -> None:
    reuse_freed_memory()
    ctx = _context(spec, config, output, inputs, tracker, parts)
    started, usage_start = time.monotonic(), metering.snapshot()
    result = spec.run_part(ctx, part, parts)
    record = {"part": part, "parts": parts, "counts": result.counts, "metrics": result.metrics,
              "seconds": round(time.monotonic() - started, 3),
              "storage": metering.since(usage_start).to_dict(),
              "files": [asdict(r) for r in sorted(ctx.output.records.values(), key=lambda r: r.key)]}
    output.put_bytes(part_key(part, parts), json.dumps(record, indent=1, sort_keys=True).encode())
    tracker.log_metrics({**result.metrics, "seconds": record["seconds"]})


def _execute(spec: StageSpec, config: FourMConfig, output: Store, inputs: dict[str, StageInput],
             tracker: lineage.Tracker, resolved: dict[str, Any], address: str, force: bool,
             parts: int, usage_start: metering.Usage) -> tuple[dict[str, Any], str]:
    reuse_freed_memory()
    primary = distributed.is_primary()
    if primary and (force or not spec.resumable):
        clear_output(spec.name, output)
    distributed.barrier()
    ran_here = set()
    if spec.run_part is not None:
        for part in range(parts):
            if not output.exists(part_key(part, parts)):
                _run_part(spec, config, output, inputs, tracker, part, parts)
                ran_here.add(part)
    ctx = _context(spec, config, output, inputs, tracker, parts)
    started_at, started = _now(), time.monotonic()
    result = spec.run(ctx)
    seconds = time.monotonic() - started
    distributed.barrier()
    if not primary:
        distributed.barrier()  # rank 0 commits meanwhile
        return require_manifest(output, f"output of {spec.name}")
    files = {r.key: r for r in ctx.output.records.values()}
    usage = metering.since(usage_start)  # this process's, the parts it ran included
    if spec.run_part is not None:
        for record in ctx.part_records():
            files.update({f["key"]: FileRecord(**f) for f in record["files"]})
            if record["part"] not in ran_here:  # a worker's, in its own process
                usage = usage.plus(metering.Usage.from_dict(record.get("storage")))
    ordered = sorted(files.values(), key=lambda r: r.key)
    run_records = sorted(key for key in spec.run_records if key in files)
    nondeterminism = sorted(set(result.nondeterminism))
    manifest = {
        "stage": spec.name,
        "code_version": spec.code_version,
        "content_hash": address,
        "output_uri": output.uri,
        "preset": config.preset,
        "config": resolved,
        "inputs": [{"name": i.name, "uri": i.uri, "manifest_digest": i.digest} for i in inputs.values()],
        "sources": [asdict(source) for source in result.sources],
        "code": code_version(),
        "counts": result.counts,
        "metrics": result.metrics,
        "files": [asdict(f) for f in ordered],
        "bytes_total": sum(f.bytes for f in ordered),
        "run_records": run_records,
        "payload_digest": payload_digest({f.key: f.sha256 for f in ordered if f.key not in run_records}),
        "deterministic": not nondeterminism,
        "nondeterminism": nondeterminism,
        "timings": {"started_at": started_at, "finished_at": _now(), "seconds": round(seconds, 3)},
        "storage": usage.to_dict(),
        "mlflow_run_id": tracker.run_id,
    }
    manifest_digest = commit_manifest(output, manifest)
    distributed.barrier()
    log.info("%s: committed %s (%d files, %d bytes, %.1fs)", spec.name, output.uri_of(MANIFEST_NAME),
             len(ordered), manifest["bytes_total"], seconds)
    return manifest, manifest_digest
