"""The prepare-data stage on tiny data: aligned shards, reports, real-data skips and thresholds, kill and redo."""

from __future__ import annotations

import io
import json
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest
from PIL import Image

from fourm_kfp.config.loader import load_config
from fourm_kfp.data.ingest import TooManyBadSamplesError
from fourm_kfp.data.photo_sources import NoSourceDataError
from fourm_kfp.contract.manifest import MANIFEST_NAME
from fourm_kfp.contract import run_stage
from fourm_kfp.stages import get_stage
from fourm_kfp.storage import open_store
from tests.photos import write_photo_folder

SPEC = get_stage("prepare-data")
CLI = str(Path(sys.executable).parent / "fourm-kfp")


def _keys(store, key):
    with tarfile.open(fileobj=io.BytesIO(store.get_bytes(key))) as tar:
        return [m.name.split(".", 1)[0] for m in tar.getmembers()]


def test_synthetic_smoke_writes_aligned_shards_and_reports(tmp_path):
    config = load_config("smoke", overrides=["prepare_data.samples_per_shard=5"])
    outcome = run_stage(SPEC, config, open_store(str(tmp_path), create=True))
    out = open_store(outcome.output_uri)
    modalities = config.data.modalities
    for split, shards in (("train", 4), ("val", 2)):
        for index in range(shards):
            key_lists = [_keys(out, f"{split}/{m}/shard-{index:06d}.tar") for m in modalities]
            assert all(keys == key_lists[0] for keys in key_lists), (split, index)
            assert key_lists[0], (split, index)
    assert _keys(out, "val/rgb/shard-000000.tar")[0] == f"{config.prepare_data.num_train:08d}"

    report = json.loads(out.get_bytes("reports/dataset_report.json"))
    assert report["splits"]["train"]["samples"] == 16 and report["splits"]["val"]["samples"] == 8
    preview = Image.open(io.BytesIO(out.get_bytes("reports/preview.png")))
    assert preview.width > preview.height  # one column per modality, a few samples as rows
    manifest = json.loads(out.get_bytes(MANIFEST_NAME))
    assert manifest["counts"]["splits"]["train"]["modalities"]["caption"] == 16
    assert manifest["metrics"]["samples_per_second"] > 0


def test_synthetic_output_is_deterministic(tmp_path):
    config = load_config("smoke")
    digests = []
    for run in range(2):
        outcome = run_stage(SPEC, config, open_store(str(tmp_path / str(run)), create=True))
        manifest = json.loads(open_store(outcome.output_uri).get_bytes(MANIFEST_NAME))
        digests.append({f["key"]: f["sha256"] for f in manifest["files"] if f["key"].endswith(".tar")})
    assert digests[0] == digests[1]


def _folder_config(folder: Path, max_bad: float):
    return load_config("smoke", overrides=[
        "prepare_data.source=image_folder", f"prepare_data.source_uri={folder}", "prepare_data.val_fraction=0.3",
        f"prepare_data.max_bad_fraction={max_bad}", "data.modalities=[rgb,caption]",
        "data.input_modalities=[rgb,caption]", "data.target_modalities=[rgb,caption]",
        "alphas.mixture=[{name: a, input_alphas: {rgb: 1.0}, target_alphas: {caption: 1.0}}]"])


def test_image_folder_skips_and_counts_bad_files(tmp_path):
    folder = tmp_path / "photos"
    write_photo_folder(folder, good=10, bad=1)
    outcome = run_stage(SPEC, _folder_config(folder, 0.2), open_store(str(tmp_path / "store"), create=True))
    out = open_store(outcome.output_uri)
    manifest = json.loads(out.get_bytes(MANIFEST_NAME))
    splits = manifest["counts"]["splits"]
    assert splits["train"]["samples"] + splits["val"]["samples"] == 10
    assert splits["train"]["modalities"]["caption"] == splits["train"]["samples"]
    assert manifest["counts"]["skipped"]["total"] == 1
    [source] = manifest["sources"]
    assert source["uri"] == str(folder) and source["name"] == "image_folder" and len(source["digest"]) == 64
    assert not any(k.startswith("train/depth") for k in out.list())  # photos have no depth: absent, not faked


def test_image_folder_above_threshold_fails_naming_files_and_commits_nothing(tmp_path):
    folder = tmp_path / "photos"
    write_photo_folder(folder, good=3, bad=2)
    store = open_store(str(tmp_path / "store"), create=True)
    with pytest.raises(TooManyBadSamplesError) as err:
        run_stage(SPEC, _folder_config(folder, 0.1), store)
    assert "broken0.jpg" in str(err.value) and "max_bad_fraction" in str(err.value)
    assert not [k for k in store.list() if k.endswith(MANIFEST_NAME)]


@pytest.mark.parametrize("source", ["missing", "empty", "no images"])
def test_a_source_folder_with_no_image_fails_at_prepare_data_naming_it_and_commits_nothing(tmp_path, source):
    """It committed an empty dataset before, and the run failed two stages later at pretokenize."""
    folder = tmp_path / "photos"
    if source != "missing":
        folder.mkdir()
    if source == "no images":
        (folder / "notes.txt").write_text("not a photo")
    store = open_store(str(tmp_path / "store"), create=True)
    with pytest.raises(NoSourceDataError,
                       match=rf"prepare_data.source_uri='{folder}' \(image_folder\): no image \(.*\.jpg"):
        run_stage(SPEC, _folder_config(folder, 0.2), store)
    assert not [k for k in store.list() if k.endswith(MANIFEST_NAME)]


def test_killed_stage_leaves_no_manifest_and_is_redone(tmp_path):
    args = [CLI, "stage", "prepare-data", "--preset", "smoke", "--root", str(tmp_path),
            "--set", "prepare_data.num_train=1500", "--set", "prepare_data.samples_per_shard=50",
            "--set", "prepare_data.workers=1", "--mlflow-tracking-uri", "none"]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    store = open_store(str(tmp_path))
    deadline = time.monotonic() + 120
    while not [k for k in store.list("prepare-data") if k.endswith("shard-000002.tar")]:
        assert proc.poll() is None and time.monotonic() < deadline, "stage ended before it could be killed"
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    keys = store.list("prepare-data")
    assert keys and not [k for k in keys if k.endswith(MANIFEST_NAME)]

    done = subprocess.run(args + ["--json", str(tmp_path / "outcome.json")], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    outcome = json.loads((tmp_path / "outcome.json").read_text())
    assert outcome["status"] == "ran"
    manifest = json.loads(open_store(outcome["output_uri"]).get_bytes(MANIFEST_NAME))
    out = open_store(outcome["output_uri"])
    # _parts/ holds the workers' records and per-shard statistics, outside the manifest's payload
    listed = {k for k in out.list() if not k.startswith("_parts/")} - {MANIFEST_NAME}
    assert listed == {f["key"] for f in manifest["files"]}  # nothing stale from the killed run
    assert json.loads(out.get_bytes("_parts/part-0000-of-0001.json"))["counts"]["jobs_skipped"] >= 2  # resumed


def test_changed_source_folder_gets_a_new_address(tmp_path):
    folder = tmp_path / "photos"
    write_photo_folder(folder, good=4, bad=0)
    store = open_store(str(tmp_path / "store"), create=True)
    config = _folder_config(folder, 0.0)
    first = run_stage(SPEC, config, store)
    assert run_stage(SPEC, config, store).status == "skipped"
    Image.new("RGB", (32, 32), "red").save(folder / "new.png")
    changed = run_stage(SPEC, config, store)
    assert changed.status == "ran" and changed.output_uri != first.output_uri
