"""The evaluate stage on a smoke model: every task scored beside its ceiling and baseline with a bootstrap interval,
reports written, the scores of each weight snapshot against its step, the model registered and gated in MLflow; a
second evaluation is gated against the first's per-scene scores; the payload is byte-identical in another run
folder; a real-data model (rgb + caption) gets only the tasks that make sense; `fourm-kfp generate` writes images
and text."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image

from fourm_kfp.config.loader import load_config
from fourm_kfp.contract import lineage, run_stage
from fourm_kfp.data.shard_stream import iter_split
from fourm_kfp.evaluation.any_to_any import AnyToAny
from fourm_kfp.evaluation.model_gate import SCENE_SCORES
from fourm_kfp.evaluation.tasks import Baselines, run_task
from fourm_kfp.model.generation import SamplingArgs
from fourm_kfp.stages import get_stage
from fourm_kfp.evaluation.scene_loading import load_scenes, train_ground_truth
from fourm_kfp.storage import open_store, resolve_uri

BIN = Path(sys.executable).parent
TASKS = ["rgb-to-depth", "rgb-to-normal", "rgb-to-semseg", "rgb-to-det", "rgb-to-caption", "caption-to-rgb"]


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    """A smoke store with every stage up to pretrain committed, and an MLflow store."""
    root = tmp_path_factory.mktemp("evaluate")
    store = open_store(str(root / "store"), create=True)
    config = load_config("smoke", overrides=["train.steps=4", "train.snapshot_every=2", "evaluate.curve_samples=2"])
    uris = {name: run_stage(get_stage(name), config, store).output_uri
            for name in ("prepare-data", "train-tokenizers", "pretokenize", "pretrain")}
    return root, store, config, uris


def _evaluate(root, store, config, **kwargs):
    tracking = lineage.default_tracking_uri(root)
    return run_stage(get_stage("evaluate"), config, store, tracking_uri=tracking, **kwargs), tracking


def test_evaluate_scores_every_task_with_references_and_gates_the_model(smoke):
    root, store, config, uris = smoke
    outcome, tracking = _evaluate(root, store, config)
    output = open_store(outcome.output_uri)
    report = json.loads(output.get_bytes("evaluation.json"))
    assert [t["task"] for t in report["tasks"]] == TASKS
    assert "seconds" not in report and "gate" not in report  # timings: the manifest; the gate: run records
    assert resolve_uri(outcome.output_uri, report["model_uri"]) == uris["pretrain"]
    assert not report["model_uri"].startswith("/")  # store-relative
    # the decode budget: every image modality some task decoded, images times one VQ-VAE pass each
    budget = report["decode_budget"]
    assert {"depth", "normal", "semseg", "rgb"} <= set(budget)
    assert all(b["decoder"] == "VQ-VAE" and b["passes_per_image"] == 1 and b["decoder_passes"] == b["images"] > 0
               for b in budget.values())
    assert "Decode budget: " in output.get_text("reports/evaluation_report.md")
    val_keys = None
    for task in report["tasks"]:
        for side in ("model", "ceiling", "baseline"):
            assert task["primary"] in task[side], (task["task"], side)
        assert task["resamples"] == 1000 and task["confidence"] == 0.95
        if math.isfinite(task["interval_low"]):
            assert task["interval_low"] <= task["difference"] <= task["interval_high"]
        assert task["beats_baseline"] == (task["interval_low"] > 0)
        sign = 1 if task["higher_is_better"] else -1
        primary = task["primary"]
        assert task["difference"] == pytest.approx(sign * (task["model"][primary] - task["baseline"][primary]))
        scenes = task["scene_scores"]
        assert set(scenes) == {"model", "baseline"} and len(scenes["model"]) == report["num_samples"]
        assert list(scenes["model"]) == list(scenes["baseline"])
        val_keys = val_keys or list(scenes["model"])
        assert list(scenes["model"]) == val_keys  # every task on the same val scenes, keyed by scene key
    assert report["tasks_beating_baseline"] == sum(t["beats_baseline"] for t in report["tasks"])
    # The tokenizer ceiling of the text tasks is the text's own round trip: near perfect.
    caption = next(t for t in report["tasks"] if t["task"] == "rgb-to-caption")
    assert caption["ceiling"]["object_f1"] > 0.9
    assert set(report["masked"]) >= {"rgb", "depth", "caption", "all"}
    for name in ("evaluation_report.md", "evaluation_report.html", "grid_rgb-to-depth.png", "grid_caption-to-rgb.png",
                 "scene_scores.json", "model_gate.md", "scores_vs_steps.png"):
        assert output.exists(f"reports/{name}"), name
    assert "data:image/png;base64," in output.get_text("reports/evaluation_report.html")
    markdown = output.get_text("reports/evaluation_report.md")
    assert "difference [95% interval]" in markdown and "| rgb-to-depth | abs_rel ↓ |" in markdown
    assert "Model gate" not in markdown and "Model gate" not in output.get_text("reports/evaluation_report.html")
    gate = json.loads(output.get_bytes("gate.json"))
    assert gate["promoted"] and gate["version"] == "1" and "no champion" in gate["reason"]
    assert gate["comparison"] == "none"
    assert "**promoted to champion**" in output.get_text("reports/model_gate.md")
    assert outcome.metrics["val.loss"] == pytest.approx(report["masked"]["all"]["loss"])
    assert outcome.metrics["promoted"] == 1.0
    assert get_stage("evaluate").run_records == ("gate.json", "reports/model_gate.md")

    # The per-scene statistics: in the output and as an artifact of the evaluate run (where the next gate reads them).
    scores = json.loads(output.get_bytes("reports/scene_scores.json"))
    groups = {g["prefix"]: g for g in scores["groups"]}
    assert set(groups) == {""} | {f"{t}." for t in TASKS} and groups["rgb-to-depth."]["keys"] == val_keys
    assert len(groups[""]["keys"]) == len(groups[""]["stats"]["sums"]) > 0  # masked modeling: the val batches

    from mlflow import MlflowClient

    client = MlflowClient(tracking)
    version = client.get_model_version_by_alias("fourm-smoke", "champion")
    assert str(version.version) == "1" and version.tags["fourm.pretrain.uri"] == uris["pretrain"]
    assert str(client.get_model_version_by_alias("fourm-smoke", "candidate").version) == "1"
    logged = Path(client.download_artifacts(version.run_id, SCENE_SCORES, str(root / "downloaded")))
    assert logged.read_bytes() == output.get_bytes("reports/scene_scores.json")

    # Another evaluation (forced) of the same model ties the champion on every scene: refused, with confidence.
    again, _ = _evaluate(root, store, config, force=True)
    again_output = open_store(again.output_uri)
    gate = json.loads(again_output.get_bytes("gate.json"))
    assert not gate["promoted"] and gate["version"] == "2" and gate["champion_version"] == "1"
    assert gate["comparison"] == "paired bootstrap" and gate["difference"] == 0.0
    assert gate["interval_low"] == gate["interval_high"] == 0.0 and gate["resamples"] == 1000
    assert "not promoted" in again_output.get_text("reports/model_gate.md")
    assert str(client.get_model_version_by_alias("fourm-smoke", "champion").version) == "1"
    assert str(client.get_model_version_by_alias("fourm-smoke", "candidate").version) == "2"


def test_the_curve_scores_each_snapshot_and_ends_with_the_final_model(smoke):
    """The scores against training steps: the snapshot at step 2 and the final model (step 4) on the first
    ``curve_samples`` scenes; its last point is what an evaluation of the final model on those scenes alone gives
    (the engine went back to the final weights), with the same trivial baseline."""
    root, store, config, _ = smoke
    outcome, _ = _evaluate(root, store, config)
    output = open_store(outcome.output_uri)
    report = json.loads(output.get_bytes("evaluation.json"))
    curve = report["curve"]
    assert curve["steps"] == [2, 4] and curve["scenes"] == 2 and sorted(curve["tasks"]) == sorted(TASKS)
    assert output.get_bytes("reports/scores_vs_steps.png")[:4] == b"\x89PNG"
    markdown = output.get_text("reports/evaluation_report.md")
    assert "## Scores against training steps" in markdown and "| trivial baseline |" in markdown

    small = load_config("smoke", overrides=["train.steps=4", "train.snapshot_every=2", "evaluate.num_samples=2"])
    alone, _ = _evaluate(root, store, small)
    tasks = {t["task"]: t for t in json.loads(open_store(alone.output_uri).get_bytes("evaluation.json"))["tasks"]}
    for task, values in curve["tasks"].items():
        primary = tasks[task]["primary"]
        assert values["primary"] == primary and len(values["model"]) == 2
        assert values["model"][-1] == pytest.approx(tasks[task]["model"][primary], abs=1e-9), task
        assert values["baseline"] == pytest.approx(tasks[task]["baseline"][primary], abs=1e-9), task


def test_maps_text_and_images_from_text_take_their_own_sampling(smoke):
    """rgb-to-depth/normal/semseg and caption-to-rgb's reading of its own image (and of the true image, its ceiling)
    are generated with ``evaluate.map_steps``; caption-to-rgb's image with ``evaluate.sampling``; text with
    ``evaluate.text_sampling``."""
    root, store, _, uris = smoke
    engine = AnyToAny(uris["pretrain"], "cpu", tokenizers_uri=uris["train-tokenizers"])
    prepared = open_store(uris["prepare-data"])
    scenes = load_scenes(engine, prepared, open_store(uris["pretokenize"]), 2)
    baselines = Baselines.fit(train_ground_truth(prepared, ["depth", "normal", "semseg", "det", "caption"], 8))
    calls, generate = [], engine.generator.generate

    def recording(samples, target, args, seed=0):
        calls.append((target, args.steps, args.temperature))
        return generate(samples, target, args, seed)

    engine.generator.generate = recording
    for task in TASKS:
        run_task(engine, scenes, task, baselines, SamplingArgs(steps=8, order="roar", temperature=1.0), 0, 2, 0,
                 SamplingArgs(steps=1, temperature=0.0), SamplingArgs(steps=3, temperature=0.0))
    assert calls == [("depth", 1, 0.0), ("normal", 1, 0.0), ("semseg", 1, 0.0), ("det", 3, 0.0),
                     ("caption", 3, 0.0), ("rgb", 8, 1.0), ("semseg", 1, 0.0), ("semseg", 1, 0.0)]

    config = load_config("smoke", overrides=["train.steps=4", "train.snapshot_every=2", "evaluate.map_steps=2"])
    output = open_store(_evaluate(root, store, config)[0].output_uri)
    report = json.loads(output.get_bytes("evaluation.json"))
    assert report["map_steps"] == 2 and report["sampling"]["steps"] == config.evaluate.sampling.steps
    assert report["text_sampling"]["temperature"] == config.evaluate.text_sampling.temperature
    assert "maps read off an image (rgb-to-depth/normal/semseg) in 2 step(s)" in output.get_text(
        "reports/evaluation_report.md")


def test_the_payload_is_byte_identical_in_another_run_folder(smoke, tmp_path):
    """The same inputs in a fresh run folder (another store root, another MLflow store): evaluation.json, the
    reports and the scene scores are the same bytes; only the run records differ."""
    root, store, config, _ = smoke
    first, _ = _evaluate(root, store, config)
    shutil.copytree(root / "store", tmp_path / "store", ignore=shutil.ignore_patterns("evaluate"))
    copy = open_store(str(tmp_path / "store"))
    second, _ = _evaluate(tmp_path, copy, config)
    assert second.status == "ran" and second.output_uri != first.output_uri
    a, b = open_store(first.output_uri), open_store(second.output_uri)
    payload = ["evaluation.json"] + [k for k in a.list("reports") if k != "reports/model_gate.md"]
    assert "reports/evaluation_report.md" in payload and "reports/scene_scores.json" in payload
    for key in payload:
        assert a.get_bytes(key) == b.get_bytes(key), key
    assert json.loads(b.get_bytes("gate.json"))["promoted"]  # a new registry: no champion there


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
    output = open_store(outcome.output_uri)
    assert "not registered" in json.loads(output.get_bytes("gate.json"))["skipped"]
    assert "not registered" in output.get_text("reports/model_gate.md")


def test_generation_follows_the_text_conventions_the_model_was_trained_with(smoke, tmp_path):
    """A model card saying ``text_conventions: ml4m`` (ml-4m's [EOS] and sentinels from [S_1]): text inputs get the
    [EOS] the loader appended in training, and text is generated from [S_1] to [S_2]; ours: bare ids, [S_0]/[S_1]."""
    import shutil

    _, _, _, uris = smoke
    ours = AnyToAny(uris["pretrain"], "cpu", tokenizers_uri=uris["train-tokenizers"])
    specials = ours.card["text_special_ids"]
    assert ours.card["text_conventions"] == "fourm-kfp"
    assert ours.generator.sentinels == (specials["[S_0]"], specials["[S_1]"])
    plain = ours.tokenize("caption", ["a red cube"])[0].tolist()
    copy = tmp_path / "pretrain"
    shutil.copytree(uris["pretrain"], copy)
    card = json.loads((copy / "model" / "model.json").read_text())
    (copy / "model" / "model.json").write_text(json.dumps({**card, "text_conventions": "ml4m"}))
    ml4m = AnyToAny(str(copy), "cpu", tokenizers_uri=uris["train-tokenizers"])
    assert ml4m.generator.sentinels == (specials["[S_1]"], specials["[S_2]"])
    assert ml4m.tokenize("caption", ["a red cube"])[0].tolist() == plain + [specials["[EOS]"]]
