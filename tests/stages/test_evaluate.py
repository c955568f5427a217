"""The evaluate stage on a smoke model: every task scored beside its ceiling and baseline, reports written, the
model registered and gated in MLflow; a second evaluation of another model is gated against the first; a
real-data model (rgb + caption) gets only the tasks that make sense; `fourm-kfp generate` writes images and text."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image

from fourm_kfp.config.loader import load_config
from fourm_kfp.contract import lineage, run_stage
from fourm_kfp.data.shard_stream import iter_split
from fourm_kfp.stages import get_stage
from fourm_kfp.storage import open_store

BIN = Path(sys.executable).parent
TASKS = ["rgb-to-depth", "rgb-to-normal", "rgb-to-semseg", "rgb-to-det", "rgb-to-caption", "caption-to-rgb"]


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    """A smoke store with every stage up to pretrain committed, and an MLflow store."""
    root = tmp_path_factory.mktemp("evaluate")
    store = open_store(str(root / "store"), create=True)
    config = load_config("smoke", overrides=["train.steps=4"])
    uris = {name: run_stage(get_stage(name), config, store).output_uri
            for name in ("prepare-data", "train-tokenizers", "pretokenize", "pretrain")}
    return root, store, config, uris


def _evaluate(root, store, config, **kwargs):
    tracking = lineage.default_tracking_uri(root)
    return run_stage(get_stage("evaluate"), config, store, tracking_uri=tracking, **kwargs), tracking


def test_evaluate_scores_every_task_with_references_and_gates_the_model(smoke):
    root, store, config, _ = smoke
    outcome, tracking = _evaluate(root, store, config)
    output = open_store(outcome.output_uri)
    report = json.loads(output.get_bytes("evaluation.json"))
    assert [t["task"] for t in report["tasks"]] == TASKS
    for task in report["tasks"]:
        for side in ("model", "ceiling", "baseline"):
            assert task["primary"] in task[side], (task["task"], side)
    # The tokenizer ceiling of the text tasks is the text's own round trip: near perfect.
    caption = next(t for t in report["tasks"] if t["task"] == "rgb-to-caption")
    assert caption["ceiling"]["object_f1"] > 0.9
    assert set(report["masked"]) >= {"rgb", "depth", "caption", "all"}
    for name in ("evaluation_report.md", "evaluation_report.html", "grid_rgb-to-depth.png", "grid_caption-to-rgb.png"):
        assert output.exists(f"reports/{name}"), name
    assert "data:image/png;base64," in output.get_text("reports/evaluation_report.html")
    gate = json.loads(output.get_bytes("gate.json"))
    assert gate["promoted"] and gate["version"] == "1" and "no champion" in gate["reason"]
    assert outcome.metrics["val.loss"] == pytest.approx(report["masked"]["all"]["loss"])

    from mlflow import MlflowClient

    client = MlflowClient(tracking)
    version = client.get_model_version_by_alias("fourm-smoke", "champion")
    assert str(version.version) == "1" and version.tags["fourm.pretrain.uri"] == report["model_uri"]
    assert str(client.get_model_version_by_alias("fourm-smoke", "candidate").version) == "1"

    # Another evaluation (forced) of the same model cannot beat the champion by the margin: refused.
    again, _ = _evaluate(root, store, config, force=True)
    gate = json.loads(open_store(again.output_uri).get_bytes("gate.json"))
    assert not gate["promoted"] and gate["version"] == "2" and gate["champion_version"] == "1"
    assert str(client.get_model_version_by_alias("fourm-smoke", "champion").version) == "1"
    assert str(client.get_model_version_by_alias("fourm-smoke", "candidate").version) == "2"


def test_generate_command_writes_images_and_text(smoke, tmp_path):
    *_, uris = smoke
    model_uri = uris["pretrain"]
    [(_, sample)] = list(iter_split(open_store(uris["prepare-data"]), "val", ["rgb"], limit=1))
    Image.fromarray(sample["rgb"]).save(tmp_path / "scene.png")
    out = tmp_path / "out"
    env = {**os.environ, "MLFLOW_TRACKING_URI": "none"}
    proc = subprocess.run([str(BIN / "fourm-kfp"), "generate", "--model", model_uri, "--from",
                           f"rgb={tmp_path / 'scene.png'}", "--to", "caption,depth", "--out", str(out),
                           "--steps", "2"], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (out / "caption.txt").is_file() and (out / "depth.png").is_file() and (out / "depth_view.png").is_file()
    summary = json.loads((out / "generate.json").read_text())
    assert summary["targets"] == ["caption", "depth"] and "caption" in summary["text"]

    bad = subprocess.run([str(BIN / "fourm-kfp"), "generate", "--model", model_uri, "--from", "rgb=missing.png",
                          "--to", "depth", "--out", str(out)], capture_output=True, text=True, env=env, timeout=300)
    assert bad.returncode == 2 and "missing.png: no such file" in bad.stderr


def test_real_data_gets_the_tasks_that_make_sense(tmp_path, photo_config):
    config = photo_config
    store = open_store(str(tmp_path / "store"), create=True)
    for name in ("prepare-data", "train-tokenizers", "pretokenize", "pretrain"):
        run_stage(get_stage(name), config, store)
    outcome = run_stage(get_stage("evaluate"), config, store)  # lineage off: nothing to register with
    report = json.loads(open_store(outcome.output_uri).get_bytes("evaluation.json"))
    [task] = report["tasks"]
    assert task["task"] == "rgb-to-caption" and task["primary"] == "word_f1"
    assert task["ceiling"]["word_f1"] > 0.8  # the round trip loses only words unknown to the tokenizer ("10")
    assert any(s.startswith("caption-to-rgb (no semseg") for s in report["tasks_skipped"])
    assert set(report["masked"]) == {"rgb", "caption", "all"}
    assert report["gate"] is None and "not registered" in report["gate_skipped"]
