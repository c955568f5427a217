"""How long a fully reused ``fourm-kfp run`` takes: every stage already committed, so the run only plans, finds each
output by its address, and reports it skipped.

    .venv/bin/python bench/rerun.py [--preset demo] [--root runs/demo] [--repeats 3] [--output f.json]

When the run folder does not hold a committed run of the preset yet, one is made first (``make demo``'s run; its
time is reported apart, as ``fill_seconds``, and not counted). Then the same command runs ``--repeats`` times, each
timed from the process's start to its exit (what a user waits), with the run summary's per-stage seconds and the
time the pipeline itself took, and the machine's matmul rate measured after the timings.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_output import emit

from fourm_kfp.hardware import cpu_matmul_rate

CLI = str(Path(sys.executable).with_name("fourm-kfp"))


def committed(preset: str, root: str) -> bool:
    """Whether every enabled stage of ``preset`` is committed under ``root`` (``fourm-kfp status --json``)."""
    proc = subprocess.run([CLI, "status", "--preset", preset, "--root", root, "--json"], capture_output=True,
                          text=True)
    if proc.returncode != 0:
        return False
    return all(stage["committed"] or stage["off"] for stage in json.loads(proc.stdout))


def timed_run(preset: str, root: str) -> dict:
    with tempfile.TemporaryDirectory(prefix="bench-rerun-") as scratch:
        summary_path = Path(scratch) / "summary.json"
        started = time.perf_counter()
        proc = subprocess.run([CLI, "run", "--preset", preset, "--root", root, "--summary", str(summary_path)],
                              capture_output=True, text=True)
        seconds = time.perf_counter() - started
        if proc.returncode != 0:
            raise SystemExit(f"fourm-kfp run failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
        summary = json.loads(summary_path.read_text())
    return {"seconds": round(seconds, 2), "pipeline_seconds": summary.get("seconds"),
            "stages": {s["name"]: {"status": s["status"], "seconds": s.get("seconds")} for s in summary["stages"]}}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="demo")
    parser.add_argument("--root", default="runs/demo")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--output", help="write the JSON here too")
    args = parser.parse_args(argv)
    fill = None
    if not committed(args.preset, args.root):
        started = time.perf_counter()
        subprocess.run([CLI, "run", "--preset", args.preset, "--root", args.root], check=True,
                       stdout=subprocess.DEVNULL)
        fill = round(time.perf_counter() - started, 1)
    runs = [timed_run(args.preset, args.root) for _ in range(args.repeats)]
    if not all(s["status"] == "skipped" for r in runs for s in r["stages"].values()):
        raise SystemExit("a stage ran again: the run folder was not fully committed")
    seconds = [r["seconds"] for r in runs]
    result = {"bench": "rerun", "preset": args.preset, "fill_seconds": fill, "repeats": runs,
              "seconds_median": statistics.median(seconds), "seconds_min": min(seconds),
              "target_seconds": 10.0,
              "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), **cpu_matmul_rate()}}
    return emit(result, args.output)


if __name__ == "__main__":
    main()
