"""The benchmarks' JSON output (``bench/bench_output.py``) is strict JSON: undefined metrics become null."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
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
