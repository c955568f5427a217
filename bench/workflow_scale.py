"""Benchmark the cluster side of a wide run: the pods and Argo nodes a KFP v2 run of the pipeline makes at each
fan-out width, and the size of its Argo ``Workflow`` object against Argo's limit.

    .venv/bin/python bench/workflow_scale.py [--widths 1 16 64 256 1024] [--preset 4m-b] [--output x.json]

The pipeline is compiled from this checkout (``fourm_kfp.pipeline_runs.compile``) and run, at each width (every
fan-out stage, ``<stage>_width``, set to it), through ``bench/argo_workflow_model.py``: the KFP 2.17.0 compiler's
Workflow, its driver pods' outputs and the nodes Argo's controller records once the run has succeeded. The run's
parameters are the ones ``fourm-kfp submit`` sends (``pipeline_runs/submit.py``: the preset's resolved config pinned
in ``config_overrides``, a tracking URI), or the same with ``config_overrides`` empty; the steps' outputs are what
the components return (fan-out items, pod placements, output URIs). ``tests/test_workflow_scale.py`` checks that
model against hand counts and against the KFP driver emulator (``tests/kfp_driver_emulator.py``), which a bench may
not import.

Two Argo configurations: ``kfp-2.15-2.16-manifests`` (KFP's kustomize install of 2.15.0 to 2.16.1: no workflow
defaults) and ``kfp-2.17-manifests`` (2.17.0's install adds a template default retry strategy, so every template
invocation is also a Retry node). Per width and configuration it reports:

- ``pods``: driver pods (KFP's system-container-driver and system-dag-driver) and executor pods (the pipeline's own
  steps), in all and per fan-out stage (its workers sub-pipeline, plus its fan-out, collect and placement steps);
- ``nodes``: ``status.nodes`` entries by type;
- ``workflow_bytes``: the Workflow's JSON as Argo measures it (``workflow/packer/packer.go`` ``getSize``), with its
  nodes as they are, compressed (``status.compressedNodes``: gzip + base64) and offloaded (nodes in the database);
  and what the controller does with it (``verdict``): keep the nodes, compress them, or offload them, which needs
  ``persistence.nodeStatusOffLoad`` (without it the run errors: "workflow is longer than maximum allowed size");
- ``largest_argument_bytes``: the longest single command-line argument of any executor pod (the executor input,
  which the launcher gets as one ``--executor_input`` argument and the component again as ``{{$}}``), against the
  kernel's 128 KiB limit on one argument (``MAX_ARG_STRLEN``).

``crossings``: the smallest width (searched between the measured ones) at which the uncompressed Workflow passes
1 MiB (Argo starts compressing) and 1.5 MiB (etcd's request limit, for a controller whose ``MAX_WORKFLOW_SIZE`` was
raised), at which the compressed one passes 1 MiB (node status offloading needed) and 1.5 MiB, at which the
offloaded nodes (one row of Argo's database) pass MySQL's default 64 MiB packet, and at which an executor's
argument passes 128 KiB (past the widest measured width: where the measured line meets it, the argument growing by
one output URI per part). Each is measured twice: with ``config_overrides`` pinned as ``fourm-kfp submit`` sends it,
and empty, as a run started from the KFP UI with the defaults sends it.
"""

from __future__ import annotations

import argparse
import hashlib
import platform
import re
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

import argo_workflow_model as model
from bench_output import emit
from fourm_kfp.config.loader import load_config, pinned_overrides
from fourm_kfp.launchers.kfp_dataset import with_dataset_layer
from fourm_kfp.launchers.kfp_placement import pod_placement
from fourm_kfp.pipeline_runs.compile import compile_pipeline

FAN_OUT_STAGES = ("prepare-data", "label", "pretokenize")
MAX_ARG_STRLEN = 32 * 4096  # linux include/uapi/linux/binfmts.h: PAGE_SIZE * 32, 4 KiB pages
#: MySQL 8.0's server default max_allowed_packet (reference manual, B.3.2.8 "Packet Too Large"): one offloaded
#: node status is one row of Argo's JSON column (persist/sqldb/migrate.go, offload_node_status_repo.go Save).
MYSQL_MAX_ALLOWED_PACKET = 64 * 1024 * 1024
TRACKING_URI = "http://mlflow.mlflow.svc.cluster.local:5000"


def pipeline_spec() -> tuple[dict, dict]:
    with tempfile.TemporaryDirectory() as folder:
        text = compile_pipeline(Path(folder) / "fourm_pretrain.yaml").read_text()
    spec, platform_spec = yaml.safe_load_all(text)
    return spec, platform_spec


def submitted_parameters(preset: str, width: int, pinned: bool) -> dict[str, Any]:
    """The parameters ``fourm-kfp submit --preset PRESET --param <stage>_width=W`` sends."""
    overrides = pinned_overrides(load_config(preset)) if pinned else []
    return {"preset": preset, "config_overrides": overrides, "mlflow_tracking_uri": TRACKING_URI,
            **{f"{stage.replace('-', '_')}_width": width for stage in FAN_OUT_STAGES}}


def _address(stage: str) -> str:
    return hashlib.sha256(stage.encode()).hexdigest()[:16]  # contract/addressing.py: HASH_LENGTH = 16


def product_outputs(spec: dict) -> model.TaskOutputs:
    """Each step's outputs as its component returns them: the lineage step an MLflow run id, a fan-out step one
    item per part (``kfp_placement.fan_out_items``: the part and what the worker needs from upstream), a placement
    step ``kfp_placement.pod_placement``'s answer, a worker or a stage its output URI, a dataset stage the dataset
    with its layer (``with_dataset_layer``). Outputs no other step reads (reports, the gate) never reach Argo."""

    def outputs(key: str, component: str, inputs: dict[str, Any]) -> dict[str, Any]:
        base = re.sub(r"-[0-9]+$", "", component).removeprefix("comp-")
        if base == "open-lineage-run":
            return {"Output": hashlib.md5(b"parent run").hexdigest()}  # an MLflow run id: 32 hex digits
        if base == "fan-out":
            carried = {k: inputs.get(k, "") for k in ("parent_run_id", "dataset", "tokenizers_uri")}
            return {"Output": [{"part": i, **carried} for i in range(int(inputs["width"]))]}
        if base == "pod-placement":
            names = ("stage", "preset", "config_overrides", "accelerator", "gpu_node_selector", "gpu_tolerations",
                     "launcher")
            return pod_placement(**{k: v for k, v in inputs.items() if k in names})
        stage = base.removesuffix("-part")
        uri = f"{inputs.get('store_uri', 's3://fourm-kfp')}/{stage}/{_address(stage)}"
        found: dict[str, Any] = {}
        for name, d in spec["components"][component].get("outputDefinitions", {}).get("parameters", {}).items():
            found[name] = {"STRING": uri, "BOOLEAN": True, "NUMBER_INTEGER": 0, "NUMBER_DOUBLE": 0.0,
                           "LIST": [], "STRUCT": {}}[d["parameterType"]]
        if "dataset" in found:
            found["dataset"] = with_dataset_layer(inputs.get("dataset", ""), stage, uri)
        return found

    return outputs


def _stage_tasks(spec: dict) -> dict[str, list[str]]:
    """The exit handler's tasks of each fan-out stage: its fan-out, placement and collect steps (by the ``stage``
    constant they take, or their name) and its workers sub-pipeline."""
    [handler] = [t for t in spec["root"]["dag"]["tasks"].values() if "dag" in spec["components"][
        t["componentRef"]["name"]]]
    tasks = spec["components"][handler["componentRef"]["name"]]["dag"]["tasks"]
    found: dict[str, list[str]] = {stage: [] for stage in FAN_OUT_STAGES}
    for key, task in tasks.items():
        stage = task.get("inputs", {}).get("parameters", {}).get("stage", {}).get("runtimeValue", {}).get("constant")
        stage = stage or key.removesuffix("-workers")
        if stage in found:
            found[stage].append(key)
    return found


def _pods_of(run: model.RunModel, task: str) -> list[model.Node]:
    """The pods of the exit handler's task ``task`` (its driver, and everything under it)."""
    pattern = re.compile(rf"\.exit-handler-1(\(0\))?\.{re.escape(task)}(-driver)?([.(]|$)")
    return [n for n in run.run.nodes.values() if n.status["type"] == "Pod" and pattern.search(n.status["name"])]


def measure(spec: dict, platform_spec: dict, parameters: dict, config: model.ArgoConfig) -> dict[str, Any]:
    start = time.perf_counter()
    run = model.model_run(spec, platform_spec, parameters, product_outputs(spec), config)
    counts = run.counts()
    stages = {}
    for stage, tasks in _stage_tasks(spec).items():
        workers = _pods_of(run, f"{stage}-workers")
        steps = [pod for task in tasks if not task.endswith("-workers") for pod in _pods_of(run, task)]
        stages[stage] = {"width": parameters[f"{stage.replace('-', '_')}_width"],
                         "worker_pods": len(workers),
                         "worker_executor_pods": sum(n.kind == "executor" for n in workers),
                         "worker_driver_pods": sum(n.kind != "executor" for n in workers),
                         "step_pods": len(steps), "steps": sorted(t for t in tasks if not t.endswith("-workers"))}
    node_json = run.node_json()
    sizes = run.sizes(node_json)
    by_kind: dict[str, dict[str, int]] = {}
    for node in run.run.nodes.values():
        entry = by_kind.setdefault(node.kind, {"nodes": 0, "bytes": 0})
        entry["nodes"] += 1
        entry["bytes"] += len(node_json[node.id].encode())
    del node_json
    arguments: dict[str, int] = {}  # the longest executor input of each step
    for execution in run.driver.containers():
        size = len(model.go_json(execution.executor_input).encode())
        arguments[execution.task] = max(size, arguments.get(execution.task, 0))
    collect = {stage: arguments[stage] for stage in FAN_OUT_STAGES}
    return {
        "pods": {"all": counts["pods"], "driver": counts["driver_pods"], "executor": counts["executor_pods"]},
        "nodes": {k.removeprefix("nodes_") if k != "nodes" else "all": v for k, v in counts.items()
                  if k.startswith("nodes")},
        "stages": stages,
        "workflow_bytes": {"spec": sizes.spec, "nodes": sizes.nodes, "uncompressed": sizes.uncompressed,
                           "compressed": sizes.compressed, "offloaded": sizes.offloaded,
                           "verdict": sizes.verdict()},
        "node_bytes_by_kind": by_kind,
        "largest_argument_bytes": max(arguments.values()),
        "largest_argument_step": max(arguments, key=arguments.get),
        "collect_step_argument_bytes": collect,
        "seconds": round(time.perf_counter() - start, 2),
    }


def _first_over(low: int, high: int, over) -> int | None:
    """The smallest width in (low, high] for which ``over(width)`` holds, given it fails at ``low`` and holds at
    ``high`` (it grows with the width)."""
    while high - low > 1:
        middle = (low + high) // 2
        if over(middle):
            high = middle
        else:
            low = middle
    return high


def crossings(spec: dict, platform_spec: dict, preset: str, pinned: bool, config: model.ArgoConfig,
              measured: dict[int, dict]) -> dict[str, Any]:
    cache: dict[int, dict] = dict(measured)

    def at(width: int) -> dict:
        if width not in cache:
            cache[width] = measure(spec, platform_spec, submitted_parameters(preset, width, pinned), config)
        return cache[width]

    limits = {"uncompressed_over_max_workflow_size": (lambda r: r["workflow_bytes"]["uncompressed"] >
                                                      model.MAX_WORKFLOW_SIZE),
              "uncompressed_over_etcd_request_limit": (lambda r: r["workflow_bytes"]["uncompressed"] >
                                                       model.ETCD_REQUEST_LIMIT),
              "compressed_over_max_workflow_size": (lambda r: r["workflow_bytes"]["compressed"] >
                                                    model.MAX_WORKFLOW_SIZE),
              "compressed_over_etcd_request_limit": (lambda r: r["workflow_bytes"]["compressed"] >
                                                     model.ETCD_REQUEST_LIMIT),
              "offloaded_nodes_over_mysql_max_allowed_packet": (lambda r: r["workflow_bytes"]["nodes"] >
                                                                MYSQL_MAX_ALLOWED_PACKET),
              "executor_argument_over_max_arg_strlen": (lambda r: r["largest_argument_bytes"] > MAX_ARG_STRLEN)}
    found: dict[str, Any] = {}
    widths = sorted(measured)
    argument = "executor_argument_over_max_arg_strlen"
    if not limits[argument](at(widths[-1])) and len(widths) >= 3:
        # A collect step's executor input grows by one output URI per part, linearly in the width (checked on the
        # three widest measured); where the widest measured width is below the limit, the crossing is where that
        # line meets it.
        (w0, a0), (w1, a1), (w2, a2) = [(w, max(at(w)["collect_step_argument_bytes"].values()))
                                        for w in widths[-3:]]
        slope, before = (a2 - a1) / (w2 - w1), (a1 - a0) / (w1 - w0)
        found[argument] = {"extrapolated_width": int((MAX_ARG_STRLEN - a2) // slope) + w2 + 1 if slope else None,
                           "bytes_per_width": [round(before, 3), round(slope, 3)], "over_widths": [w0, w1, w2],
                           "linear_within_1_percent": abs(before - slope) <= 0.01 * slope}
        del limits[argument]
    for name, over in limits.items():
        if over(at(1)):
            found[name] = 1
            continue
        below = [w for w in widths if not over(at(w))]
        above = [w for w in widths if over(at(w))]
        found[name] = _first_over(max(below), min(above), lambda w: over(at(w))) if above else (
            f"> {max(widths)}")
    (w1, r1), (w2, r2) = [(w, at(w)) for w in widths[-2:]]
    workers = 3 * (w2 - w1)  # every fan-out stage one more worker per unit of width
    found["per_worker"] = {"between_widths": [w1, w2], **{
        name: round((get(r2) - get(r1)) / workers, 1) for name, get in (
            ("pods", lambda r: r["pods"]["all"]), ("nodes", lambda r: r["nodes"]["all"]),
            ("node_bytes", lambda r: r["workflow_bytes"]["nodes"]),
            ("compressed_bytes", lambda r: r["workflow_bytes"]["compressed"]))}}
    return found


def _commit() -> str:
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "pipelines", "components"],
                               capture_output=True, text=True, check=True)
        return head.stdout.strip() + ("+uncommitted pipeline or component changes" if dirty.stdout.strip() else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main() -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--widths", type=int, nargs="+", default=[1, 16, 64, 256, 1024])
    parser.add_argument("--preset", default="4m-b")
    parser.add_argument("--config-overrides", choices=["pinned", "empty", "both"], default="both",
                        help="the run's config_overrides: the resolved config pinned (fourm-kfp submit), empty (a run "
                             "from the KFP UI with the defaults), or each in turn")
    parser.add_argument("--no-crossings", action="store_true", help="measure the widths only")
    parser.add_argument("--output", help="write the JSON here too")
    args = parser.parse_args()
    spec, platform_spec = pipeline_spec()
    result: dict[str, Any] = {
        "bench": "workflow_scale", "machine": platform.machine(), "python": platform.python_version(),
        "commit": _commit(), "kfp_compiler": model.KFP_VERSION, "preset": args.preset,
        "limits": {"max_workflow_size": model.MAX_WORKFLOW_SIZE, "etcd_request_limit": model.ETCD_REQUEST_LIMIT,
                   "max_arg_strlen": MAX_ARG_STRLEN, "mysql_max_allowed_packet": MYSQL_MAX_ALLOWED_PACKET},
        "config_overrides": {},
    }
    variants = {"pinned": True, "empty": False}
    for variant in ([args.config_overrides] if args.config_overrides != "both" else variants):
        pinned = variants[variant]
        overrides = submitted_parameters(args.preset, 1, pinned)["config_overrides"]
        configs: dict[str, Any] = {}
        for config in (model.ARGO_PLAIN, model.ARGO_KFP_2_17):
            widths = {}
            for width in args.widths:
                widths[width] = measure(spec, platform_spec, submitted_parameters(args.preset, width, pinned),
                                        config)
                print(f"{variant} {config.name} width {width}: {widths[width]['pods']['all']} pods, "
                      f"{widths[width]['nodes']['all']} nodes, {widths[width]['workflow_bytes']}", flush=True)
            entry: dict[str, Any] = {"widths": {str(w): r for w, r in widths.items()}}
            if not args.no_crossings:
                entry["crossings"] = crossings(spec, platform_spec, args.preset, pinned, config, widths)
            configs[config.name] = entry
        result["config_overrides"][variant] = {"entries": len(overrides), "bytes": len(model.go_json(overrides)),
                                               "configs": configs}
    return emit(result, args.output)


if __name__ == "__main__":
    main()
