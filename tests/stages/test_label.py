"""The label stage on a folder of photos: labels as a layer of the dataset, aligned by key with the photos, the same
bytes at any width and after a killed worker (a stage killed by SIGKILL resumes with the shards it had not
labelled), the gate's value checks against broken teachers and the missing-modality policy, and the address moving
with a labeler's parameters."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from fourm_kfp.config.loader import load_config
from fourm_kfp.config.schema import ConfigError
from fourm_kfp.contract import run_stage, run_stage_part
from fourm_kfp.contract.addressing import stage_address
from fourm_kfp.contract.manifest import MANIFEST_NAME, payload_files, read_manifest
from fourm_kfp.data.label_formats import parse_metadata_text
from fourm_kfp.data.shard_stream import available_modalities, iter_split, shard_indices
from fourm_kfp.data.shard_writer import keys_key
from fourm_kfp.labelers.base import LabelBatch
from fourm_kfp.labelers.registry import build_labeler
from fourm_kfp.stages import get_stage
from fourm_kfp.stages.label import LabelGateError
from fourm_kfp.storage import LayeredStore, open_store
from tests.labeler_plugins import GATE_LABELERS, expose_entry_points
from tests.photos import write_photo_folder

PREPARE, LABEL = get_stage("prepare-data"), get_stage("label")
BUILT_IN = "[{name: canny_edge}, {name: color_palette}, {name: metadata}]"
MODALITIES = "[rgb, caption, canny_edge, color_palette, metadata, depth]"


def _config(photos: Path, labelers: str = BUILT_IN, *overrides: str):
    return load_config("smoke", overrides=[
        "prepare_data.source=image_folder", f"prepare_data.source_uri={photos}", "prepare_data.val_fraction=0.3",
        "prepare_data.samples_per_shard=3", f"data.modalities={MODALITIES}", f"data.input_modalities={MODALITIES}",
        f"data.target_modalities={MODALITIES}", f"label.labelers={labelers}", "label.batch_size=2", *overrides])


@pytest.fixture
def photos(tmp_path):
    return write_photo_folder(tmp_path / "photos", good=10)


@pytest.fixture
def gate_labelers(tmp_path, monkeypatch):
    expose_entry_points(tmp_path / "site", monkeypatch, "gate-labelers", "1", GATE_LABELERS)


def _label(config, root: Path, parts: int = 1, order: tuple[int, ...] = ()) -> str:
    store = open_store(str(root), create=True)
    run_stage(PREPARE, config, store)
    for part in order:
        run_stage_part(LABEL, config, store, part, parts)
    return run_stage(LABEL, config, store, parts=parts).output_uri


def _payload(uri: str) -> tuple[dict, str]:
    manifest = json.loads(open_store(uri).get_bytes(MANIFEST_NAME))
    return payload_files(manifest), manifest["payload_digest"]


def _dataset(config, root: Path) -> LayeredStore:
    store = open_store(str(root))
    return LayeredStore([store.child("prepare-data", stage_address(PREPARE, config)),
                         store.child("label", stage_address(LABEL, config))])


def test_labels_are_a_layer_of_the_dataset_aligned_with_the_photos(photos, tmp_path):
    config = _config(photos)
    uri = _label(config, tmp_path / "run")
    manifest, _ = read_manifest(open_store(uri))
    assert set(manifest["counts"]["labelers"]) == {"canny_edge", "color_palette", "metadata"}
    assert manifest["counts"]["labelers"]["canny_edge"]["params"] == {"blur": 0.0, "high": 200, "low": 100}
    dataset = _dataset(config, tmp_path / "run")
    canny = build_labeler("canny_edge")
    seen = 0
    for split in ("train", "val"):
        for key, sample in iter_split(dataset, split, ["rgb", "caption", "canny_edge", "color_palette", "metadata"]):
            assert set(sample) == {"rgb", "caption", "canny_edge", "color_palette", "metadata"}, key
            expected = canny.label(LabelBatch((key,), (sample["rgb"],)))[0]
            np.testing.assert_array_equal(sample["canny_edge"], expected)  # the labels of this very photo
            fields = parse_metadata_text(sample["metadata"])
            assert (fields["original_width"], fields["original_height"]) == (60 // 32, 40 // 32)  # before the crop
            assert fields["caption_n_words"] == len(sample["caption"].split())
            seen += 1
    assert seen == 10 == sum(s["samples"] for s in manifest["counts"]["splits"].values())
    reports = open_store(uri).list("reports")
    assert {"reports/label_report.json", "reports/label_report.md", "reports/label_preview.png"} <= set(reports)
    report = json.loads(open_store(uri).get_bytes("reports/label_report.json"))
    assert report["coverage"] == {"canny_edge": 1.0, "color_palette": 1.0, "metadata": 1.0}


def test_any_width_and_a_killed_worker_give_the_same_bytes(photos, tmp_path):
    config = _config(photos)
    one = _payload(_label(config, tmp_path / "one"))
    assert one == _payload(_label(config, tmp_path / "three", 3, order=(2, 0, 1)))
    # A worker killed mid-way: its first shard is committed, its second is not (no key index yet).
    root = tmp_path / "killed"
    store = open_store(str(root), create=True)
    run_stage(PREPARE, config, store)
    run_stage_part(LABEL, config, store, 0, 2)
    output = store.child("label", stage_address(LABEL, config))
    data = store.child("prepare-data", stage_address(PREPARE, config))
    mine = [(split, i) for split in ("train", "val") for i in shard_indices(data, split)][0::2]
    assert len(mine) >= 2
    output.delete_prefix(keys_key(*mine[-1]))
    output.delete_prefix("_parts")
    assert one == _payload(run_stage(LABEL, config, store, parts=2).output_uri)


def test_a_killed_label_stage_resumes_labelling_only_the_missing_shards(photos, tmp_path, monkeypatch):
    """The label stage killed (SIGKILL) between shards, as a preempted pod is: nothing is committed, the shards
    labelled before the kill stay as they were, the rerun labels only the others, and the result is the bytes of a
    run that was never killed."""
    import os
    import signal
    import subprocess
    import sys
    import time

    site = tmp_path / "site"
    expose_entry_points(site, monkeypatch, "gate-labelers", "1", GATE_LABELERS)
    overrides = ["prepare_data.source=image_folder", f"prepare_data.source_uri={photos}",
                 "prepare_data.val_fraction=0.3", "prepare_data.samples_per_shard=1", "label.batch_size=1",
                 "data.modalities=[rgb, caption, depth]", "data.input_modalities=[rgb, caption, depth]",
                 "data.target_modalities=[rgb, caption, depth]", "label.labelers=[{name: slow_depth}]"]
    config = load_config("smoke", overrides=overrides)
    root = tmp_path / "killed"
    store = open_store(str(root), create=True)
    run_stage(PREPARE, config, store)
    output = store.child("label", stage_address(LABEL, config))
    data = store.child("prepare-data", stage_address(PREPARE, config))
    shards = [(split, i) for split in ("train", "val") for i in shard_indices(data, split)]
    assert len(shards) >= 6

    cli = [str(Path(sys.executable).parent / "fourm-kfp"), "stage", "label", "--root", str(root),
           "--mlflow-tracking-uri", "none", *[arg for item in overrides for arg in ("--set", item)]]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(Path(__file__).resolve().parents[2])])}
    proc = subprocess.Popen(cli, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    committed = []
    while len(committed) < 2:
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read().decode()[-2000:]
        time.sleep(0.05)
        committed = [s for s in shards if output.exists(keys_key(*s))]
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert read_manifest(output) is None
    committed = [s for s in shards if output.exists(keys_key(*s))]
    assert len(committed) < len(shards), "the stage finished before it could be killed"
    before = {key: output.get_bytes(key) for key in output.list()
              if any(key.startswith(f"{split}/") and f"shard-{index:06d}" in key for split, index in committed)}
    assert len(before) >= 2 * len(committed)  # each committed shard's tar and key index at least

    rerun = subprocess.run(cli + ["--json", str(tmp_path / "outcome.json")], env=env, capture_output=True, text=True)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    labelled = json.loads(output.get_bytes("_parts/part-0000-of-0001.json"))["counts"]["shards"]
    assert sorted(map(tuple, labelled)) == sorted(set(shards) - set(committed))  # only the missing ones
    assert {key: output.get_bytes(key) for key in before} == before  # the committed shards were not labelled again
    never_killed = _label(config, tmp_path / "whole")
    assert _payload(never_killed) == _payload(json.loads((tmp_path / "outcome.json").read_text())["output_uri"])


def test_a_labeler_parameter_moves_the_address_and_the_rest_downstream(photos):
    plain, other = _config(photos), _config(photos, "[{name: canny_edge, params: {low: 20}}, {name: color_palette},"
                                                    " {name: metadata}]")
    assert stage_address(PREPARE, plain) == stage_address(PREPARE, other)
    for name in ("label", "train-tokenizers", "pretokenize", "evaluate"):
        assert stage_address(get_stage(name), plain) != stage_address(get_stage(name), other), name


@pytest.mark.parametrize("labeler, modality, problem", [
    ("far_depth", "depth", r"depth outside \[0, 1000.0\] m"),
    ("nan_depth", "depth", "non-finite depth values"),
    ("out_of_vocabulary_semseg", "semseg", r"class ids \d\.\.5 outside the vocabulary of 3 classes"),
    ("off_image_det", "det", r"box 0 \(photo\): bins \[10, 20, 1200, 600\] outside the image"),
])
def test_a_bad_value_fails_naming_labeler_shard_key_and_modality_and_commits_nothing(photos, tmp_path, gate_labelers,
                                                                                     labeler, modality, problem):
    """A teacher that outputs NaN, a class id outside its vocabulary, or a box outside the image fails the data gate
    on the photo it got wrong, and the label stage commits nothing."""
    config = _config(photos, f"[{{name: {labeler}}}]", f"data.modalities=[rgb, caption, {modality}]",
                     f"data.input_modalities=[rgb, caption, {modality}]",
                     f"data.target_modalities=[rgb, caption, {modality}]")
    with pytest.raises(LabelGateError, match=rf"labeler '{labeler}': the {modality} label of key '[^']+' in shard "
                                             rf"\d+ of (train|val) .*fails its check: {problem}"):
        _label(config, tmp_path / "run")
    assert read_manifest(open_store(str(tmp_path / "run")).child("label", stage_address(LABEL, config))) is None


def test_missing_labels_are_dropped_everywhere_or_kept_and_counted(photos, tmp_path, gate_labelers):
    lenient = ("label.max_missing_fraction=0.9",)
    dropped = _config(photos, "[{name: patchy_depth}]", *lenient)
    uri = _label(dropped, tmp_path / "drop")
    gate = read_manifest(open_store(uri))[0]["counts"]["gate"]
    lost = sum(g["dropped"] for g in gate.values())
    assert 0 < lost < 10 and sum(g["missing"].get("depth", 0) for g in gate.values()) == lost
    dataset = _dataset(dropped, tmp_path / "drop")
    kept = [(key, s) for split in ("train", "val") for key, s in iter_split(dataset, split, ["rgb", "depth"])]
    assert len(kept) == 10 - lost and all("depth" in s for _, s in kept)  # the rgb of a dropped photo is gone too
    assert all(s["rgb"][..., 0].mean() <= s["rgb"][..., 2].mean() for _, s in kept)

    keep = _config(photos, "[{name: patchy_depth}]", "label.missing=keep", *lenient)
    dataset = _dataset(keep, tmp_path / "keep")
    _label(keep, tmp_path / "keep")
    samples = [s for split in ("train", "val") for _, s in iter_split(dataset, split, ["rgb", "depth"])]
    assert len(samples) == 10 and sum("depth" not in s for s in samples) == lost

    strict = _config(photos, "[{name: patchy_depth}]", f"label.max_missing_fraction={(lost - 1) / 10}")
    with pytest.raises(LabelGateError, match=rf"{lost} of 10 samples .* lack a required modality .*depth"):
        _label(strict, tmp_path / "strict")


def test_a_labeler_of_a_modality_the_photos_came_with_is_not_run(photos, tmp_path, gate_labelers):
    config = _config(photos, "[{name: caption_teacher}, {name: canny_edge}]")
    uri = _label(config, tmp_path / "run")
    manifest, _ = read_manifest(open_store(uri))
    assert set(manifest["counts"]["labelers"]) == {"canny_edge"}
    report = json.loads(open_store(uri).get_bytes("reports/label_report.json"))
    assert report["not_run"] == ["label.labelers[0] (caption_teacher): the data's own caption"]
    dataset = _dataset(config, tmp_path / "run")
    captions = [s["caption"] for split in ("train", "val") for _, s in iter_split(dataset, split, ["caption"])]
    assert len(captions) == 10 and all(c.startswith("a photo number ") for c in captions)  # the files' own


def test_a_preset_teacher_that_is_not_committed_is_an_error_naming_the_run_to_make_it(photos, tmp_path):
    config = _config(photos, "[{name: fourm_model, weights: 'preset:smoke', params: {modality: depth}}]")
    with pytest.raises(ConfigError, match=r"label.labelers\[0\]: the teacher 'preset:smoke' is the smoke preset's "
                                          r"model, which is not committed at .*/pretrain/[0-9a-f]{16}: run "
                                          r"`fourm-kfp run --preset smoke` first"):
        _label(config, tmp_path / "run")


def test_a_captioner_labels_only_the_photos_that_came_without_text(photos, tmp_path):
    """A teacher that fills gaps (hf_caption) runs although the photos came with captions, and generates a caption
    only for those without one: every photo ends with a caption, its own where it had one."""
    from tests.teacher_models import save_teacher

    for i in (1, 4, 7):
        (photos / f"img{i}.txt").unlink()
    blip = save_teacher("hf_caption", tmp_path / "blip", 64)
    labelers = f"[{{name: hf_caption, weights: '{blip}', params: {{max_new_tokens: 5}}}}]"
    config = _config(photos, labelers, "data.image_size=64")
    uri = _label(config, tmp_path / "run")
    report = json.loads(open_store(uri).get_bytes("reports/label_report.json"))
    assert report["not_run"] == [] and report["labelers"]["caption"]["name"] == "hf_caption"
    layer = open_store(uri)
    written = {key: s["caption"] for split in ("train", "val") if "caption" in available_modalities(layer, split)
               for key, s in iter_split(layer, split, ["caption"]) if "caption" in s}
    assert sorted(written) == [f"img{i}" for i in range(10)] and all(written.values())
    assert all(written[f"img{i}"] == f"a photo number {i}" for i in range(10) if i not in (1, 4, 7))
    assert all(not written[f"img{i}"].startswith("a photo number") for i in (1, 4, 7))  # generated
    captions = {key: s["caption"] for split in ("train", "val")
                for key, s in iter_split(_dataset(config, tmp_path / "run"), split, ["caption"])}
    assert captions == written  # the dataset read as one: every photo has its caption


def test_a_labeler_that_reads_another_s_labels_needs_it_listed_before_it(photos, tmp_path):
    from fourm_kfp.stages.label import build_labelers

    only = "[rgb, caption, normal]"
    alone = _config(photos, "[{name: normal_from_depth}]", f"data.modalities={only}",
                    f"data.input_modalities={only}", f"data.target_modalities={only}")
    with pytest.raises(ConfigError, match=r"label.labelers\[0\] \(normal_from_depth\) reads the depth labels of a "
                                          r"labeler listed before it"):
        build_labelers(alone, ["rgb", "caption"], str(tmp_path))
