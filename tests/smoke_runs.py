"""`fourm-kfp run --preset smoke` as a user runs it: a new process, the summary it writes read back."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

CLI = str(Path(sys.executable).parent / "fourm-kfp")
#: the session's second smoke run's fan-out (tests/conftest.py): two workers for each fan-out stage, over the smoke
#: preset's 2 train shards and 1 val shard
SECOND_RUN_WIDTHS = ("--prepare-data-width", "2", "--pretokenize-width", "2")


def run_smoke(root: Path, *extra: str, env: dict[str, str] | None = None) -> dict:
    """The run's ``--summary`` (with ``root`` added) after ``fourm-kfp run --preset smoke --root root *extra``, in
    ``env`` (default: this process's); fails the test with the run's output when it exits non-zero."""
    summary_path = Path(root) / f"summary-{time.monotonic_ns()}.json"
    proc = subprocess.run([CLI, "run", "--preset", "smoke", "--root", str(root), "--summary", str(summary_path),
                           *extra], capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stdout[-5000:] + proc.stderr[-5000:]
    return {**json.loads(summary_path.read_text()), "root": str(root)}
