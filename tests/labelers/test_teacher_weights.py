"""Where a teacher's weights come from (fourm_kfp.labelers.weights): a local folder, an s3:// folder on the real test
S3 server, or a hub folder pinned to a commit and read from the cache with HF_HUB_OFFLINE, or in place from a Hugging
Face cache that HF_HOME / HF_HUB_CACHE names (laid out as huggingface_hub lays it out; no hub call); the digest in the
label stage's address moves with any file and with nothing else. A stale teacher never passes: a retrained network of
the same shape (every file the same size) moves the label stage's address and is labelled again, a same-size rewrite
that keeps the old modification time is seen through the digest memo, and an s3:// folder's cache loses a file
deleted upstream."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from fourm_kfp.config.loader import load_config
from fourm_kfp.contract import run_stage
from fourm_kfp.data.shard_stream import iter_split
from fourm_kfp.labelers.base import LabelBatch, LabelerError
from fourm_kfp.labelers.registry import build_labeler
from fourm_kfp.labelers.weights import (HF_PREFIX, fetch_folder, folder_digest, parse_hf_uri, resolve_weights,
                                        weights_digest)
from fourm_kfp.stages import get_stage
from fourm_kfp.storage import open_store
from tests.photos import write_photo_folder
from tests.teacher_models import save_teacher

COMMIT = "0123456789abcdef0123456789abcdef01234567"
DEPTH = {"depth": "metric"}


@pytest.fixture(scope="module")
def dpt(tmp_path_factory):
    return save_teacher("hf_depth", tmp_path_factory.mktemp("dpt") / "dpt")


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FOURM_LABELER_CACHE", str(tmp_path / "cache"))


def _photo() -> LabelBatch:
    return LabelBatch(("k",), ((np.arange(64 * 64 * 3) % 251).astype(np.uint8).reshape(64, 64, 3),))


def test_a_folder_digest_moves_with_any_file_and_not_with_the_folders_place(dpt, tmp_path):
    copy = shutil.copytree(dpt, tmp_path / "elsewhere")
    assert folder_digest(copy) == folder_digest(dpt)
    (copy / "extra.txt").write_text("x")
    assert folder_digest(copy) != folder_digest(dpt)
    (copy / "extra.txt").unlink()
    config = (copy / "config.json").read_text()
    (copy / "config.json").write_text(config.replace('"hidden_size": 32', '"hidden_size": 32 '))
    assert folder_digest(copy) != folder_digest(dpt)
    with pytest.raises(LabelerError, match=r"label.labelers\[3\]: weights folder .*nowhere does not exist"):
        fetch_folder(str(tmp_path / "nowhere"), "label.labelers[3]")


def test_an_s3_folder_is_fetched_once_into_the_cache_and_again_when_an_object_changes(dpt, s3_uri, tmp_path):
    store = open_store(f"{s3_uri}/teachers/dpt")
    for path in sorted(dpt.iterdir()):
        store.put_file(path.name, path)
    uri = store.uri_of()
    local, digest = resolve_weights("folder", uri, "w")
    assert digest.startswith("s3-etags:") and weights_digest("folder", uri, "w") == digest
    assert folder_digest(local) == folder_digest(dpt)  # the same bytes
    assert sorted(p.name for p in Path(local).iterdir()) == sorted(p.name for p in dpt.iterdir())
    stamp = (tmp_path / "cache").rglob("folder.versions.json").__next__()
    before = stamp.stat().st_mtime_ns
    assert resolve_weights("folder", uri, "w") == (local, digest) and stamp.stat().st_mtime_ns == before
    store.put_file("model.safetensors", dpt / "model.safetensors")  # the same bytes again: the same digest
    assert weights_digest("folder", uri, "w") == digest
    weights = bytearray((dpt / "model.safetensors").read_bytes())
    weights[-1] ^= 1  # one bit of the weights, the size unchanged: another digest, fetched again
    store.put_bytes("model.safetensors", bytes(weights))
    again, moved = resolve_weights("folder", uri, "w")
    assert again == local and moved != digest and stamp.stat().st_mtime_ns != before
    assert (Path(local) / "model.safetensors").read_bytes() == bytes(weights)
    store.put_file("model.safetensors", dpt / "model.safetensors")
    labeler = build_labeler("hf_depth", DEPTH, uri)
    assert labeler.identity()["weights"] == digest and labeler.label(_photo())[0].shape == (64, 64)
    with pytest.raises(LabelerError, match="does not exist or is empty"):
        resolve_weights("folder", f"{s3_uri}/teachers/none", "w")


@pytest.mark.parametrize("uri", ["hf://Intel/dpt-hybrid-midas@main", "hf://Intel/dpt-hybrid-midas@v1.0",
                                 "hf://Intel/dpt-hybrid-midas@0123456", "hf://Intel/dpt-hybrid-midas",
                                 f"hf://dpt-hybrid-midas@{COMMIT}"])
def test_a_hub_address_must_pin_a_full_commit(uri):
    with pytest.raises(LabelerError, match=r"label.labelers\[0\]: .*40-hex commit.*must not move"):
        parse_hf_uri(uri, "label.labelers[0]")
    with pytest.raises(LabelerError, match="40-hex commit"):
        weights_digest("folder", uri, "label.labelers[0]")


def test_a_pinned_hub_folder_is_read_from_the_cache_offline_and_its_digest_is_the_commit(dpt, tmp_path, monkeypatch):
    uri = f"{HF_PREFIX}test-org/tiny-dpt@{COMMIT}"
    assert parse_hf_uri(uri, "w") == ("test-org/tiny-dpt", COMMIT)
    # The address needs no download: the commit names the bytes.
    assert weights_digest("folder", uri, "w") == f"hf:test-org/tiny-dpt@{COMMIT}"
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(LabelerError, match=r"not in the weights cache .*HF_HUB_OFFLINE is set"):
        build_labeler("hf_depth", DEPTH, uri)
    # huggingface_hub's cache layout, as a worker that fetched it once leaves it.
    snapshot = tmp_path / "cache" / "hf" / "models--test-org--tiny-dpt" / "snapshots" / COMMIT
    shutil.copytree(dpt, snapshot)
    labeler = build_labeler("hf_depth", DEPTH, uri)
    assert labeler.setup.weights_path == str(snapshot)
    assert labeler.identity()["weights"] == f"hf:test-org/tiny-dpt@{COMMIT}"
    reference = build_labeler("hf_depth", DEPTH, str(dpt))
    np.testing.assert_array_equal(labeler.label(_photo())[0], reference.label(_photo())[0])


def _sizes(folder: Path) -> dict[str, int]:
    return {p.name: p.stat().st_size for p in sorted(folder.iterdir())}


def test_a_retrained_teacher_of_the_same_shape_moves_the_label_address_and_is_labelled_again(dpt, tmp_path):
    """Retraining a teacher keeps its folder's shape: the same files, each of the same size. The folder's digest
    (and so the label stage's address) must follow the bytes, or the stale labels would be reused."""
    retrained = save_teacher("hf_depth", tmp_path / "retrained", seed=1)
    assert _sizes(retrained) == _sizes(dpt)
    assert (retrained / "model.safetensors").read_bytes() != (dpt / "model.safetensors").read_bytes()
    assert folder_digest(retrained) != folder_digest(dpt)

    teacher = shutil.copytree(dpt, tmp_path / "models" / "dpt")  # the folder the config names
    modalities = "[rgb, caption, depth]"
    config = load_config("smoke", overrides=[
        "prepare_data.source=image_folder", f"prepare_data.source_uri={write_photo_folder(tmp_path / 'photos', 4)}",
        "prepare_data.val_fraction=0.25", "data.image_size=64", f"data.modalities={modalities}",
        f"data.input_modalities={modalities}", f"data.target_modalities={modalities}", "label.batch_size=2",
        f"label.labelers=[{{name: hf_depth, weights: '{teacher}', params: {{depth: relative}}}}]"])
    store = open_store(str(tmp_path / "run"), create=True)
    run_stage(get_stage("prepare-data"), config, store)
    label = get_stage("label")
    first = run_stage(label, config, store)
    assert first.status == "ran"
    assert run_stage(label, config, store).status == "skipped"  # the same teacher: its labels are reused

    shutil.copyfile(retrained / "model.safetensors", teacher / "model.safetensors")  # retrained in place
    again = run_stage(label, config, store)
    assert again.status == "ran" and again.output_uri != first.output_uri  # a new address, labelled again

    def depth(uri: str) -> dict[str, np.ndarray]:
        return {key: sample["depth"] for split in ("train", "val")
                for key, sample in iter_split(open_store(uri), split, ["depth"])}

    old, new = depth(first.output_uri), depth(again.output_uri)
    assert sorted(old) == sorted(new) and len(old) == 4
    assert all(not np.array_equal(old[key], new[key]) for key in old)  # the retrained network's labels


def test_a_same_size_rewrite_that_keeps_the_modification_time_moves_the_digest(dpt, tmp_path):
    """The digest memo must not take a rewritten file for the one it remembered: ``cp -p``, ``rsync -t`` and
    ``tar x`` write new bytes of the same size and set the old modification time back."""
    teacher = shutil.copytree(dpt, tmp_path / "teacher")
    weights = teacher / "model.safetensors"
    remembered = folder_digest(teacher)
    assert list((tmp_path / "cache" / "digests").iterdir())  # the memo is in use
    assert folder_digest(teacher) == remembered
    retrained = save_teacher("hf_depth", tmp_path / "retrained", seed=1)
    old = weights.stat()
    shutil.copyfile(retrained / "model.safetensors", weights)  # in place: the same path and inode
    os.utime(weights, ns=(old.st_atime_ns, old.st_mtime_ns))  # the old modification time, as cp -p sets it
    now = weights.stat()
    assert (now.st_size, now.st_mtime_ns, now.st_ino) == (old.st_size, old.st_mtime_ns, old.st_ino)
    assert folder_digest(teacher) == folder_digest(retrained) != remembered


def test_an_s3_folder_refetched_mirrors_upstream_and_drops_a_file_deleted_there(dpt, s3_uri):
    store = open_store(f"{s3_uri}/teachers/dpt-mirrored")
    for path in sorted(dpt.iterdir()):
        store.put_file(path.name, path)
    store.put_bytes("extra/notes.txt", b"an extra file, deleted upstream later")
    uri = store.uri_of()
    local, digest = resolve_weights("folder", uri, "w")
    assert (Path(local) / "extra" / "notes.txt").read_bytes() == b"an extra file, deleted upstream later"
    store.delete("extra/notes.txt")
    again, moved = resolve_weights("folder", uri, "w")
    assert again == local and moved != digest
    cached = sorted(p.relative_to(again).as_posix() for p in Path(again).rglob("*") if p.is_file())
    assert cached == sorted(store.list()) == sorted(p.name for p in dpt.iterdir())  # upstream exactly
    assert folder_digest(again) == folder_digest(dpt)


def _hf_cache_with(dpt, hub: Path, repo: str) -> Path:
    """``hub`` laid out as huggingface_hub lays out its cache after a download of ``repo`` at :data:`COMMIT`:
    ``models--<org>--<name>/snapshots/<commit>/`` (a random-weight teacher folder) and ``refs/main``."""
    storage_folder = hub / ("models--" + repo.replace("/", "--"))
    (storage_folder / "refs").mkdir(parents=True)
    (storage_folder / "refs" / "main").write_text(COMMIT)
    return Path(shutil.copytree(dpt, storage_folder / "snapshots" / COMMIT))


@pytest.fixture
def hub_calls(monkeypatch):
    """Every call huggingface_hub's snapshot_download would make to the hub (none is expected)."""
    from huggingface_hub import hf_api

    calls = []
    for name in ("repo_info", "list_repo_tree"):
        monkeypatch.setattr(hf_api.HfApi, name, lambda self, *a, _name=name, **k: calls.append(_name) or [])
    return calls


def test_hf_home_and_hf_hub_cache_name_the_teacher_cache_and_the_labeler_cache_keeps_precedence(tmp_path, monkeypatch):
    from fourm_kfp.labelers.weights import hf_cache_dir

    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    assert hf_cache_dir() == tmp_path / "cache" / "hf"  # FOURM_LABELER_CACHE (the autouse fixture) comes first
    monkeypatch.delenv("FOURM_LABELER_CACHE")
    assert hf_cache_dir() == tmp_path / "hf-home" / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub-cache"))
    assert hf_cache_dir() == tmp_path / "hub-cache"


def test_a_pinned_hub_teacher_in_the_hf_cache_is_read_from_there_without_the_hub(dpt, tmp_path, monkeypatch,
                                                                                  hub_calls):
    """A pod with a PVC at $HF_HOME: the pinned commit, already in huggingface_hub's layout there, is read in place
    (no hub call, HF_HUB_OFFLINE unset)."""
    monkeypatch.delenv("FOURM_LABELER_CACHE")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    snapshot = _hf_cache_with(dpt, tmp_path / "hf-home" / "hub", "x/y")
    labeler = build_labeler("hf_depth", DEPTH, f"{HF_PREFIX}x/y@{COMMIT}")
    assert labeler.setup.weights_path == str(snapshot) and hub_calls == []
    reference = build_labeler("hf_depth", DEPTH, str(dpt))
    np.testing.assert_array_equal(labeler.label(_photo())[0], reference.label(_photo())[0])

    # With FOURM_LABELER_CACHE set, its own cache is the one read (offline here: it lacks the commit).
    monkeypatch.setenv("FOURM_LABELER_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(LabelerError, match=r"not in the weights cache .*cache/hf and HF_HUB_OFFLINE is set"):
        build_labeler("hf_depth", DEPTH, f"{HF_PREFIX}x/y@{COMMIT}")


def test_a_missing_teacher_folder_whose_source_is_in_the_hf_cache_is_read_from_there(dpt, tmp_path, monkeypatch,
                                                                                     capsys, hub_calls):
    """The preset's form (a local folder and its hub ``source``): ``fourm-kfp teachers`` prints an ``hf download``
    into $HF_HOME's cache; once the commit is there the folder is no longer missing, and the label stage reads the
    cached snapshot, with the digest of the same files in a folder of their own."""
    from fourm_kfp.cli import main
    from fourm_kfp.labelers.weights import fetch_command, folder_to_read
    from fourm_kfp.stages.label import labelers_fingerprint

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("FOURM_LABELER_CACHE")
    hub = tmp_path / "hf-home" / "hub"
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    source = f"{HF_PREFIX}x/y@{COMMIT}"
    teachers = ["teachers", "--preset", "smoke", "--set",
                f"label.labelers=[{{name: hf_depth, weights: models/dpt, source: '{source}', params: {DEPTH}}}]"]
    assert main(teachers) == 1
    printed = capsys.readouterr().out
    command = fetch_command(source, "models/dpt", "w")
    assert command.endswith(f"--cache-dir {hub}") and command in printed and "models/dpt  MISSING" in printed
    # The hf CLI accepts the command as written: offline, its dry run gets as far as asking the hub for that commit.
    hf = Path(sys.executable).with_name("hf")
    proc = subprocess.run([str(hf), *shlex.split(command)[1:], "--dry-run"], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "HF_HUB_OFFLINE": "1"}, cwd=tmp_path)
    assert proc.returncode == 1 and "No such option" not in proc.stderr, proc.stderr[-2000:]
    assert f"tree/{COMMIT}" in proc.stderr

    snapshot = _hf_cache_with(dpt, hub, "x/y")  # what that command leaves
    assert main(teachers) == 0 and "MISSING" not in capsys.readouterr().out
    assert folder_to_read("models/dpt", source, "w") == str(snapshot)
    config = load_config("smoke", overrides=teachers[-1:])
    own_folder = load_config("smoke", overrides=[teachers[-1].replace("models/dpt", str(dpt))])
    assert labelers_fingerprint(config) == labelers_fingerprint(own_folder)
    assert hub_calls == []
