"""How the data stages' cost grows with the data: prepare-data → label → train-tokenizers → pretokenize on
synthetic scenes, against a local S3 server, at several sizes with a fixed shard size, each stage in its own process.

    .venv/bin/python bench/scale.py [--samples 2000 8000 32000 100000] [--shard-size 250] [--quick]
                                    [--output bench/results/scale-cpu-<date>.json]

For each size N and stage: the stage process's wall time and time per sample, the peak RSS of the stage process
and of the largest process it started (``VmHWM``: the kernel's high-water mark), the S3 requests by kind and the
bytes up and down that the stage's manifest records (counted on the wire inside the storage layer,
``fourm_kfp.storage.metering``). pretrain and evaluate then run once (their smoke work is fixed), and the whole
pipeline again (``fourm-kfp run``), every stage committed: the fully reused rerun. The labels come from
the built-in labelers (canny_edge, color_palette, metadata); the presets' other settings are the smoke preset's
(64 px scenes, two crops a sample, tiny tokenizers) so that 100,000 samples fit on 2 cores.

``growth`` compares the largest N with the smallest: time per sample, peak RSS and S3 requests per sample, each a
ratio (flat is 1.0; the targets are 1.15, 1.2 and 1.1), and the fully reused rerun (target 10 s); ``last_step``
compares the largest N with the one before it, once each stage's start-up is a small share of its time.
train-tokenizers trains a fixed number of steps whatever N is, so its time per sample falls as N grows and it is
not among the per-sample targets; its S3 requests are (it reads a bounded sample of the data).
Everything runs in one process tree, one stage at a time; run it on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from fourm_kfp import storage
from fourm_kfp.hardware import cpu_matmul_rate
from fourm_kfp.testing import serve_s3

from bench_output import emit
from process_tree import descendants

STAGES = ("prepare-data", "label", "train-tokenizers", "pretokenize")
#: Stages whose work is per sample (the per-sample targets apply to them).
PER_SAMPLE_STAGES = ("prepare-data", "label", "pretokenize")
LABELERS = "[{name: canny_edge}, {name: color_palette}, {name: metadata}]"
#: The synthetic scenes' modalities and the built-in labelers' three.
MODALITIES = "[rgb, depth, normal, semseg, edge, det, caption, canny_edge, color_palette, metadata]"
VAL_SAMPLES = 64
OUTCOME = "outcome.json"
TARGETS = {"seconds_per_sample": 1.15, "peak_rss": 1.2, "requests_per_sample": 1.1, "reused_seconds": 10.0}


def _vm_hwm_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        pass
    return 0


def run_measured(command: list[str], env: dict[str, str], log_path: Path) -> dict:
    """Run ``command``; its wall time, its own peak RSS (from wait4) and the largest peak RSS among the processes
    it started (their VmHWM, read every 0.2 s while they live)."""
    children_peak: dict[int, int] = {}
    with open(log_path, "ab") as log:
        started = time.perf_counter()
        proc = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
        done = threading.Event()

        def watch() -> None:
            while not done.is_set():
                for child in descendants(proc.pid):
                    children_peak[child] = max(children_peak.get(child, 0), _vm_hwm_kib(child))
                done.wait(0.2)

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        _, status, usage = os.wait4(proc.pid, 0)
        seconds = time.perf_counter() - started
        done.set()
        watcher.join()
    code = os.waitstatus_to_exitcode(status)
    if code != 0:
        raise SystemExit(f"{' '.join(command)} exited {code}; see {log_path}")
    return {"seconds": seconds, "peak_rss_mb": usage.ru_maxrss / 1024,
            "peak_rss_children_mb": max(children_peak.values(), default=0) / 1024,
            "processes_started": len(children_peak)}


def stage_command(stage: str, n: int, shard_size: int, store: str, root: Path, endpoint: str) -> list[str]:
    command = [str(Path(sys.executable).parent / "fourm-kfp"), "stage", stage, "--preset", "smoke",
               "--root", str(root), "--store", store, "--s3-endpoint", endpoint, "--json", str(root / OUTCOME)]
    for setting in (f"prepare_data.num_train={n}", f"prepare_data.num_val={VAL_SAMPLES}",
                    f"prepare_data.samples_per_shard={shard_size}", f"label.labelers={LABELERS}",
                    f"data.modalities={MODALITIES}"):
        command += ["--set", setting]
    return command


def measure_size(n: int, shard_size: int, endpoint: str, env: dict[str, str], work: Path) -> dict:
    root, store = work / f"n{n}", f"s3://scale-bench-n{n}/fourm"  # a bucket per size: no size lists another's
    root.mkdir(parents=True, exist_ok=True)
    log = root / "stages.log"
    out: dict = {"samples": n, "shards": -(-n // shard_size), "stages": {}}
    for stage in STAGES:
        print(f"[scale] N={n}: {stage} ...", file=sys.stderr, flush=True)
        measured = run_measured(stage_command(stage, n, shard_size, store, root, endpoint), env, log)
        outcome = _outcome(root)
        manifest = json.loads(storage.open_store(outcome["output_uri"]).get_bytes("_MANIFEST.json"))
        used = manifest.get("storage", {})
        requests = used.get("requests_total", 0)
        out["stages"][stage] = {
            **{k: round(v, 3) if isinstance(v, float) else v for k, v in measured.items()},
            "seconds_per_sample": measured["seconds"] / n,
            "stage_seconds": manifest["timings"]["seconds"],
            "s3_requests": used.get("requests", {}),
            "s3_requests_total": requests,
            "s3_requests_per_sample": requests / n,
            "s3_bytes_up": used.get("bytes_up", 0),
            "s3_bytes_down": used.get("bytes_down", 0),
            "output_objects": len(manifest["files"]),
            "output_bytes": manifest["bytes_total"],
        }
        print(f"[scale] N={n}: {stage} {measured['seconds']:.1f}s, {requests} S3 requests, "
              f"peak RSS {measured['peak_rss_mb']:.0f} MB", file=sys.stderr, flush=True)
    for stage in ("pretrain", "evaluate"):  # the rest of the pipeline (fixed work), so that a run can reuse all
        measured = run_measured(stage_command(stage, n, shard_size, store, root, endpoint), env, log)
        out["stages"][stage] = {"seconds": round(measured["seconds"], 3)}
    command = stage_command("prepare-data", n, shard_size, store, root, endpoint)
    command[1:3] = ["run"]
    command[command.index("--json"):command.index("--json") + 2] = ["--summary", str(root / "summary.json")]
    measured = run_measured(command, env, log)
    summary = json.loads((root / "summary.json").read_text())
    ran = [s["name"] for s in summary["stages"] if s["status"] != "skipped"]
    if ran:
        raise SystemExit(f"the rerun at N={n} ran {ran} again instead of reusing them; see {log}")
    out["reused_run_seconds"] = round(measured["seconds"], 3)
    return out


def _outcome(root: Path) -> dict:
    """The outcome the stage command just wrote (``--json``)."""
    return json.loads((root / OUTCOME).read_text())


def ratios(first: dict, last: dict) -> dict:
    """Per stage, ``last`` over ``first``: time per sample, peak RSS (the stage's or its largest child's) and S3
    requests per sample."""
    out = {}
    for stage in STAGES:
        a, b = first["stages"][stage], last["stages"][stage]
        out[stage] = {
            "seconds_per_sample": b["seconds_per_sample"] / a["seconds_per_sample"],
            "peak_rss": max(b["peak_rss_mb"], b["peak_rss_children_mb"]) / max(a["peak_rss_mb"],
                                                                               a["peak_rss_children_mb"]),
            "requests_per_sample": (b["s3_requests_per_sample"] / a["s3_requests_per_sample"]
                                    if a["s3_requests_per_sample"] else None),
        }
    return out


def growth(sizes: list[dict]) -> dict:
    """The largest N against the smallest (the targets), and against the size before it: at the smallest sizes a
    stage's start-up (imports, the MLflow store) is a large share of its time, so the last step shows the growth
    once that is paid."""
    first, last = sizes[0], sizes[-1]
    out: dict = {"from_samples": first["samples"], "to_samples": last["samples"],
                 "per_stage": ratios(first, last), "met": {}}
    if len(sizes) > 2:
        out["last_step"] = {"from_samples": sizes[-2]["samples"], "to_samples": last["samples"],
                            "per_stage": ratios(sizes[-2], last)}
    for measure in ("seconds_per_sample", "peak_rss", "requests_per_sample"):
        stages = PER_SAMPLE_STAGES if measure != "peak_rss" else STAGES
        worst = max(out["per_stage"][s][measure] or 0.0 for s in stages)
        out["met"][measure] = {"worst": worst, "target": TARGETS[measure], "met": worst <= TARGETS[measure]}
    worst_rerun = max(s["reused_run_seconds"] for s in sizes)
    out["met"]["reused_seconds"] = {"worst": worst_rerun, "target": TARGETS["reused_seconds"],
                                    "met": worst_rerun <= TARGETS["reused_seconds"]}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, nargs="+", default=[2000, 8000, 32000, 100000])
    parser.add_argument("--shard-size", type=int, default=250)
    parser.add_argument("--quick", action="store_true", help="200 and 400 samples in shards of 50: checks the bench")
    parser.add_argument("--work", default=None, help="folder for the S3 data and run folders (default: a temp dir)")
    parser.add_argument("--output", default=None)
    parser.add_argument("--regrow", default=None, help="recompute `growth` of this result JSON (no run)")
    args = parser.parse_args()
    if args.regrow:
        result = json.loads(Path(args.regrow).read_text())
        emit({**result, "growth": growth(result["sizes"])}, args.output or args.regrow)
        return
    samples, shard = ([200, 400], 50) if args.quick else (sorted(args.samples), args.shard_size)
    work = Path(args.work or tempfile.mkdtemp(prefix="fourm-scale-"))
    rate = cpu_matmul_rate()
    with serve_s3(work / "s3", "scalebenchkey", "scalebenchsecret") as server:
        env = {**os.environ, **server.env(), "PYTHONUNBUFFERED": "1"}
        os.environ.update(server.env())
        storage._CLIENTS.clear()
        sizes = [measure_size(n, shard, server.endpoint, env, work) for n in samples]
    emit({"benchmark": "scale", "date": dt.date.today().isoformat(),
          "command": "python bench/scale.py " + " ".join(sys.argv[1:]),
          "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), **rate},
          "preset": "smoke", "shard_size": shard, "val_samples": VAL_SAMPLES, "labelers": LABELERS,
          "sizes": sizes, "growth": growth(sizes)}, args.output)


if __name__ == "__main__":
    main()
