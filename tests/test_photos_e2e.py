"""The ``photos`` preset end to end through kfp.local, on a few of the real photographs scikit-image ships:
prepare-data → label (canny, palette, metadata, a team's own depth network as a plug-in, normals derived from its
depth, transformers teachers of semseg, boxes and CLIP feature maps read from model folders, and a model of this pipeline as the teacher
of captions, with two label workers) → tokenizers → pretokenize → pretrain →
evaluate, whose report says the ground truth of the labelled modalities is a labeler's.

The model teacher is the smoke run's model (the session's ``fresh_smoke_run``), named by its URI; the preset's own
default teacher is the demo model (``preset:demo``), which a suite cannot afford to train."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

from fourm_kfp.contract import lineage
from fourm_kfp.contract.manifest import read_manifest
from fourm_kfp.data.shard_stream import iter_split
from fourm_kfp.labelers.weights import file_digest, folder_digest
from fourm_kfp.storage import LayeredStore, open_store
from tests.labeler_plugins import expose_entry_points
from tests.smoke_runs import CLI
from tests.teacher_models import SEG_CLASSES, save_teacher

pytestmark = pytest.mark.slow

PHOTOS = "[astronaut.png, chelsea.png, coffee.png, rocket.jpg, retina.jpg, motorcycle_left.png, camera.png]"
MODALITIES = "[rgb, caption, canny_edge, color_palette, metadata, depth, normal, semseg, det, clip]"
_HALF = "{" + ", ".join(f"{m}: 0.5" for m in MODALITIES.strip("[]").split(", ")) + "}"
ALPHAS = (f"[{{name: all-to-all, weight: 1.0, input_alphas: {_HALF}, target_alphas: {_HALF}}}, "
          f"{{name: rgb-to-all, weight: 1.0, input_alphas: {{rgb: 1.0}}, target_alphas: {_HALF}}}]")
EXAMPLE_SRC = Path(__file__).resolve().parents[1] / "examples" / "fourm-kfp-tiny-depth" / "src"
TINY_DEPTH = "fourm_kfp_tiny_depth:TinyDepthLabeler"


def test_photos_preset_labels_real_photos_and_trains_on_them(fresh_smoke_run, tmp_path, monkeypatch):
    # The depth teacher is the example plug-in (a team's own network): visible to every step's subprocess through
    # PYTHONPATH, as if installed, with its weights in a file. Normals come from its depth; semseg and boxes from
    # tiny random-weight transformers networks in model folders; captions from the smoke model (two steps), whose
    # depth maps would be all invalid, which the gate and the depth tokenizer would refuse.
    site = tmp_path / "site"
    expose_entry_points(site, monkeypatch, "fourm-kfp-tiny-depth", "0.1.0", {"tiny_depth": TINY_DEPTH})
    monkeypatch.syspath_prepend(str(EXAMPLE_SRC))
    from fourm_kfp_tiny_depth import save_random_network

    save_random_network(tmp_path / "tiny-depth.pt", seed=0)
    path = os.pathsep.join(p for p in (str(site), str(EXAMPLE_SRC), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "PYTHONPATH": path}
    teacher = next(s["output_uri"] for s in fresh_smoke_run["stages"] if s["name"] == "pretrain")
    semseg = save_teacher("hf_semseg", tmp_path / "mask2former", 64)
    boxes = save_teacher("hf_det", tmp_path / "rt-detr", 64)
    clip = save_teacher("hf_clip", tmp_path / "clip", 64)
    labelers = (f"[{{name: canny_edge}}, {{name: color_palette}}, {{name: metadata}}, "
                f"{{name: tiny_depth, weights: '{tmp_path / 'tiny-depth.pt'}'}}, {{name: normal_from_depth}}, "
                f"{{name: hf_semseg, weights: '{semseg}'}}, "
                f"{{name: hf_det, weights: '{boxes}', params: {{threshold: 0.3, max_boxes: 3}}}}, "
                f"{{name: hf_clip, weights: '{clip}'}}, "
                f"{{name: fourm_model, weights: '{teacher}', params: {{modality: caption}}}}]")
    summary_path = tmp_path / "summary.json"
    args = [CLI, "run", "--preset", "photos", "--root", str(tmp_path / "run"), "--summary", str(summary_path),
            "--label-width", "2",
            "--set", f"prepare_data.include={PHOTOS}", "--set", "prepare_data.val_fraction=0.3",
            "--set", f"label.labelers={labelers}",
            "--set", f"data.modalities={MODALITIES}", "--set", f"data.input_modalities={MODALITIES}",
            "--set", f"data.target_modalities={MODALITIES}", "--set", f"alphas.mixture={ALPHAS}",
            "--set", "train_tokenizers.image_modalities=[rgb, depth, normal, semseg, canny_edge, clip]",
            "--set", "train_tokenizers.image.steps=3", "--set", "pretokenize.n_crops=2", "--set", "train.steps=3",
            "--set", "evaluate.num_samples=2", "--set", "evaluate.baseline_samples=4"]
    started = time.monotonic()
    proc = subprocess.run(args, capture_output=True, text=True, timeout=900, env=env)
    assert proc.returncode == 0, proc.stdout[-5000:] + proc.stderr[-5000:]
    summary = json.loads(summary_path.read_text())
    stages = {s["name"]: s for s in summary["stages"]}
    assert list(stages) == ["prepare-data", "label", "train-tokenizers", "pretokenize", "pretrain", "evaluate"]
    assert all(s["status"] == "ran" for s in stages.values()), summary["stages"]

    label = open_store(stages["label"]["output_uri"])
    manifest, _ = read_manifest(label)
    made = {m: who["name"] for m, who in manifest["counts"]["labelers"].items()}
    assert made == {"canny_edge": "canny_edge", "color_palette": "color_palette", "metadata": "metadata",
                    "depth": "tiny_depth", "normal": "normal_from_depth", "semseg": "hf_semseg", "det": "hf_det",
                    "clip": "hf_clip", "caption": "fourm_model"}
    who = manifest["counts"]["labelers"]
    assert who["caption"]["weights"] == read_manifest(open_store(teacher))[0][
        "payload_digest"]  # a model teacher's identity is its committed payload, a file's its sha256, a folder's
    assert who["depth"]["weights"] == file_digest(tmp_path / "tiny-depth.pt")  # the digest of all its files
    assert who["semseg"]["weights"] == folder_digest(semseg) and who["det"]["weights"] == folder_digest(boxes)
    assert who["normal"]["weights"] is None  # derived from the depth labels, no weights of its own
    meta = json.loads(label.get_bytes("dataset_meta.json"))  # the teachers' vocabularies travel with the data
    assert meta["vocabularies"]["semseg"] == list(SEG_CLASSES) and "traffic_light" in meta["vocabularies"]["det"]
    assert meta["modality_settings"]["clip"] == {"channels": 24, "grid": 4}  # the CLIP tower's projection, patches
    assert "reports/label_preview.png" in label.list("reports")

    # Every photo has every modality, its rgb the photo's centre crop, its labels from this very photo.
    dataset = LayeredStore([open_store(stages["prepare-data"]["output_uri"]), label])
    read = ["rgb", "depth", "normal", "semseg", "metadata", "clip"]
    samples = [s for split in ("train", "val") for _, s in iter_split(dataset, split, read)]
    assert len(samples) == 7 and all(set(s) == set(read) for s in samples)
    assert all(s["depth"].shape == (64, 64) and np.isfinite(s["depth"]).all() for s in samples)
    assert all(s["normal"].shape == (64, 64, 3) and s["semseg"].max() < len(SEG_CLASSES) for s in samples)
    assert all(s["clip"].shape == (4, 4, 24) for s in samples)
    assert len({s["metadata"] for s in samples}) == 7  # statistics of seven different photos

    evaluation = open_store(stages["evaluate"]["output_uri"])
    report = evaluation.get_text("reports/evaluation_report.md")
    assert "ground truth of these modalities is a labeler's output" in report and "depth: tiny_depth v1" in report
    result = json.loads(evaluation.get_bytes("evaluation.json"))
    assert {t["task"] for t in result["tasks"]} >= {"rgb-to-depth", "rgb-to-canny_edge", "rgb-to-metadata",
                                                   "rgb-to-clip"}

    # MLflow records, per modality, which labeler made it.
    tracking = summary["mlflow"]["tracking_uri"]
    [label_run] = [r for r in lineage.child_runs(tracking, summary["mlflow"]["parent_run_id"])
                   if r.data.tags["fourm.stage"] == "label"]
    assert label_run.data.tags["fourm.label.caption"] == "fourm_model v2"
    assert label_run.data.tags["fourm.label.semseg"] == "hf_semseg v1"
    assert label_run.data.tags["fourm.label.depth"] == "tiny_depth v1"
    assert label_run.data.tags["fourm.label.canny_edge"] == "canny_edge v1"
    print(f"photos preset end to end: {time.monotonic() - started:.0f} s")


def test_a_preset_teacher_is_that_presets_model_in_the_same_store(fresh_smoke_run):
    from fourm_kfp.stages.label import _weights_uri

    stages = {s["name"]: s["output_uri"] for s in fresh_smoke_run["stages"]}
    assert _weights_uri("preset:smoke", stages["prepare-data"], "label.labelers[0]") == stages["pretrain"]
