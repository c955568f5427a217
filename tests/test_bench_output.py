"""The benchmarks' JSON output (``bench/bench_output.py``) is strict JSON: undefined metrics become null. And no
benchmark or experiment script reaches into the test suite: what one needs is a function of the package (e.g. the
fixtures of ``fourm_kfp.testing``) or lives beside the script (``experiments/tools/run_outputs.py``)."""

from __future__ import annotations

import ast
import json
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
from bench_output import emit  # noqa: E402


def _strict_loads(text: str):
    def reject(constant: str):
        raise ValueError(f"non-standard JSON constant {constant}")
    return json.loads(text, parse_constant=reject)


def test_an_undefined_metric_is_written_as_null_and_the_rest_unchanged(tmp_path, capsys):
    result = {"generated": {"f1": 0.5, "precision": float("nan"), "recall": np.float32(0.25)},
              "ratios": [1.5, float("inf"), np.float64("-inf")], "scenes": np.int64(4), "name": "probe"}
    emit(result, str(tmp_path / "out.json"))
    expected = {"generated": {"f1": 0.5, "precision": None, "recall": 0.25}, "ratios": [1.5, None, None],
                "scenes": 4, "name": "probe"}
    assert _strict_loads((tmp_path / "out.json").read_text()) == expected
    assert _strict_loads(capsys.readouterr().out) == expected


def test_no_bench_or_experiment_script_imports_the_test_suite():
    test_modules = {"tests", "conftest"} | {p.stem for p in (REPO / "tests").rglob("*.py")}
    offenders = []
    for script in sorted([*(REPO / "bench").rglob("*.py"), *(REPO / "experiments").rglob("*.py")]):
        for node in ast.walk(ast.parse(script.read_text(), str(script))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            offenders += [f"{script.relative_to(REPO)}: {name}" for name in names
                          if name.split(".")[0] in test_modules]
    assert not offenders, offenders
