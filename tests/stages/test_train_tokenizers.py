"""The train-tokenizers stage on smoke data: the bundle loads back from its URI alone, DDP under torchrun,
modalities the data lacks are skipped, the stage reruns on its own, and a run killed midway resumes each tokenizer
from its checkpoint (a finished one is not trained again) and commits the uninterrupted run's bytes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from fourm_kfp.config.loader import load_config
from fourm_kfp.data.shard_stream import iter_split, iter_texts
from fourm_kfp.contract.manifest import MANIFEST_NAME, payload_files
from fourm_kfp.contract import run_stage
from fourm_kfp.stages import get_stage
from fourm_kfp.storage import open_store
from fourm_kfp.tokenizers.bundle import load_tokenizers
from tests.torch_threads import torch_threads

BIN = Path(sys.executable).parent
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}
IMAGE_MODALITIES = ["rgb", "depth", "normal", "semseg", "edge"]


@pytest.fixture(scope="module")
def smoke_data(tmp_path_factory):
    root = tmp_path_factory.mktemp("tok")
    store = open_store(str(root), create=True)
    data = run_stage(get_stage("prepare-data"), load_config("smoke"), store)
    return root, store, data.output_uri


def test_bundle_loads_from_its_uri_and_tokenizes_every_modality(smoke_data):
    _, store, data_uri = smoke_data
    outcome = run_stage(get_stage("train-tokenizers"), load_config("smoke"), store)
    bundle = load_tokenizers(outcome.output_uri)
    assert sorted(bundle.image) == sorted(IMAGE_MODALITIES)
    data = open_store(data_uri)
    for modality in IMAGE_MODALITIES:
        images = np.stack([s[modality] for _, s in iter_split(data, "val", [modality], limit=3)])
        tokens = bundle.image[modality].encode(images)
        assert tokens.dtype == torch.long and tuple(tokens.shape) == (3, 8, 8)
        assert int(tokens.max()) < bundle.index["image"][modality]["codebook_size"]
        decoded = bundle.image[modality].decode(tokens)
        assert decoded.shape == images.shape and decoded.dtype == images.dtype
        assert torch.equal(load_tokenizers(outcome.output_uri).image[modality].encode(images), tokens)

    ids = bundle.text.encode(next(iter_texts(data, "val", ["det"]))).ids
    specials = bundle.index["text"]["special_tokens"]
    assert specials["[PAD]"] == 0 and bundle.text.token_to_id("[S_0]") is not None
    assert bundle.text.token_to_id("v0=123") is not None and bundle.text.id_to_token(ids[0]).startswith("v0=")

    manifest = json.loads(open_store(outcome.output_uri).get_bytes(MANIFEST_NAME))
    for modality in IMAGE_MODALITIES:
        assert 0 < manifest["metrics"][f"{modality}.codebook_usage"] <= 1
        assert manifest["metrics"][f"{modality}.error_ratio"] > 0
    report = open_store(outcome.output_uri).get_text("reports/tokenizer_report.md")
    assert "| semseg | pixel_err |" in report and "## Targets" in report
    assert open_store(outcome.output_uri).exists("reports/reconstructions.png")


def test_modalities_the_data_lacks_are_skipped(smoke_data):
    _, store, _ = smoke_data
    config = load_config("smoke", overrides=["train_tokenizers.image_modalities=[rgb,semseg]",
                                              "train_tokenizers.text_modalities=[caption]"])
    outcome = run_stage(get_stage("train-tokenizers"), config, store)
    bundle = load_tokenizers(outcome.output_uri)
    assert sorted(bundle.image) == ["rgb", "semseg"]
    assert bundle.index["text"]["modalities"] == ["caption"]


def test_tokenizers_trained_side_by_side_are_those_trained_one_at_a_time(smoke_data, tmp_path, monkeypatch):
    """Two forked workers of one thread each (a 2-core machine) commit the very bytes of training each tokenizer
    in turn on one thread: no modality gets another's weights, data or seed."""
    from fourm_kfp.tokenizers import parallel_training

    _, _, data_uri = smoke_data
    config = load_config("smoke")
    monkeypatch.setattr(parallel_training, "available_cpus", lambda: 2)
    assert parallel_training.tokenizer_workers(len(IMAGE_MODALITIES), 2, "cpu") == 2
    side_by_side = run_stage(get_stage("train-tokenizers"), config, open_store(str(tmp_path / "a"), create=True),
                             input_uris={"prepare-data": data_uri})
    monkeypatch.setattr(parallel_training, "tokenizer_workers", lambda *_: 1)
    with torch_threads(1):
        in_turn = run_stage(get_stage("train-tokenizers"), config, open_store(str(tmp_path / "b"), create=True),
                            input_uris={"prepare-data": data_uri})
    a, b = open_store(side_by_side.output_uri), open_store(in_turn.output_uri)
    for modality in IMAGE_MODALITIES:
        files = sorted(a.child("image", modality).list())
        assert files and files == sorted(b.child("image", modality).list())
        for name in files:
            assert a.child("image", modality).get_bytes(name) == b.child("image", modality).get_bytes(name), \
                f"{modality}/{name}"


def _raise_on_sigterm(signum, frame):
    raise RuntimeError("SIGTERM")  # as torchx's local scheduler's handler does (SignalException)


def test_forked_tokenizer_workers_end_on_sigterm_whatever_the_calling_process_handles():
    """A worker forked under a handler that raises on SIGTERM (torchx's local scheduler sets one, for the process)
    does not keep it, so Pool.terminate's SIGTERM ends the worker: one that had just sent its result used to catch
    the exception as a failed send and wait on the task queue, whose lock the terminating parent holds, forever (a
    test session hung so in the train-tokenizers stage after the torchx tests)."""
    from fourm_kfp.tokenizers.parallel_training import tokenizer_pool

    previous = signal.signal(signal.SIGTERM, _raise_on_sigterm)
    try:
        with tokenizer_pool(2, 1) as pool:
            handlers = pool.map(signal.getsignal, [signal.SIGTERM] * 4, chunksize=1)
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert handlers == [signal.SIG_DFL] * 4


@pytest.mark.slow
def test_two_process_torchrun_training(smoke_data):
    root, _, _ = smoke_data
    out = root / "ddp.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [str(BIN / "torchrun"), "--standalone", "--nproc-per-node", "2", "-m", "fourm_kfp.cli", "stage",
         "train-tokenizers", "--preset", "smoke", "--root", str(root), "--set", "train_tokenizers.seed=7",
         "--mlflow-tracking-uri", "none", "--json", str(out)],
        capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    outcome = json.loads(out.read_text())
    assert outcome["status"] == "ran"
    bundle = load_tokenizers(outcome["output_uri"])
    assert sorted(bundle.image) == sorted(IMAGE_MODALITIES)
    # Both ranks trained: rank 1's batches came from its own stream, so the DDP run differs from one process.
    single = run_stage(get_stage("train-tokenizers"), load_config("smoke", overrides=["train_tokenizers.seed=7"]),
                       open_store(str(root / "single"), create=True),
                       input_uris={"prepare-data": smoke_data[2]})
    ddp_rgb = bundle.image["rgb"].state_dict()
    single_rgb = load_tokenizers(single.output_uri).image["rgb"].state_dict()
    assert any(not torch.equal(ddp_rgb[k], single_rgb[k]) for k in ddp_rgb if ddp_rgb[k].is_floating_point())
    assert "committed" in proc.stderr and proc.stderr.count("train-tokenizers: committed") == 1


def test_stage_cli_reruns_only_that_stage(smoke_data):
    root, _, _ = smoke_data
    args = [str(BIN / "fourm-kfp"), "stage", "train-tokenizers", "--preset", "smoke", "--root", str(root),
            "--mlflow-tracking-uri", "none"]
    first = subprocess.run(args + ["--json", str(root / "a.json")], capture_output=True, text=True)
    assert first.returncode == 0, first.stderr[-3000:]
    assert json.loads((root / "a.json").read_text())["status"] in ("ran", "skipped")
    subprocess.run(args + ["--json", str(root / "b.json")], capture_output=True, text=True)
    assert json.loads((root / "b.json").read_text())["status"] == "skipped"
    forced = subprocess.run(args + ["--force", "--json", str(root / "c.json")], capture_output=True, text=True)
    assert forced.returncode == 0 and json.loads((root / "c.json").read_text())["status"] == "ran"
    assert "prepare-data: committed" not in forced.stderr  # the upstream stage was found, not redone


def test_missing_upstream_output_is_a_clear_error(tmp_path):
    proc = subprocess.run([str(BIN / "fourm-kfp"), "stage", "train-tokenizers", "--preset", "smoke", "--root",
                           str(tmp_path), "--mlflow-tracking-uri", "none"], capture_output=True, text=True)
    assert proc.returncode == 2
    assert "input 'prepare-data' of stage 'train-tokenizers'" in proc.stderr and "_MANIFEST.json" in proc.stderr


def _stage_process(root: Path, data_uri: str, sets: list[str], stderr) -> subprocess.Popen:
    args = [str(BIN / "fourm-kfp"), "stage", "train-tokenizers", "--preset", "smoke", "--root", str(root), "--input",
            f"prepare-data={data_uri}", "--mlflow-tracking-uri", "none", "--json", str(root / "outcome.json")]
    return subprocess.Popen(args + [a for item in sets for a in ("--set", item)], stdout=subprocess.DEVNULL,
                            stderr=stderr, text=True, env=ENV)


def _run_to_the_end(root: Path, data_uri: str, sets: list[str]) -> tuple[dict, dict, str]:
    """(outcome, manifest, stderr) of a stage run that must succeed."""
    proc = _stage_process(root, data_uri, sets, subprocess.PIPE)
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-4000:]
    outcome = json.loads((root / "outcome.json").read_text())
    return outcome, json.loads(open_store(outcome["output_uri"]).get_bytes(MANIFEST_NAME)), err


def _checkpoint_steps(root: Path, modality: str) -> list[int]:
    return sorted(int(p.parent.name.split("-")[1])
                  for p in root.glob(f"train-tokenizers/*/checkpoints/{modality}/step-*/_COMPLETE"))


def _children(pid: int) -> list[int]:
    """The processes ``pid`` forked (Linux: its main thread's children, the tokenizer workers among them)."""
    listing = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(c) for c in listing.read_text().split()] if listing.exists() else []


def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (FileNotFoundError, ProcessLookupError):
        return False


def test_a_killed_run_resumes_each_tokenizer_and_commits_the_uninterrupted_bytes(smoke_data, tmp_path):
    """SIGKILL once rgb has a checkpoint midway and depth (4 steps) has finished; the rerun continues rgb from its
    checkpoint, loads depth without training it, and commits the payload of a run never killed."""
    _, _, data_uri = smoke_data
    sets = ["train_tokenizers.image_modalities=[rgb,depth]", "train_tokenizers.text_modalities=[caption]",
            "train_tokenizers.image.steps=120", "train_tokenizers.per_modality={depth: {steps: 4}}",
            "train_tokenizers.checkpoint_every=10"]
    _, expected, _ = _run_to_the_end(tmp_path / "reference", data_uri, sets)
    killed = tmp_path / "killed"
    killed.mkdir()
    with open(killed / "stderr.txt", "w") as stderr:
        proc = _stage_process(killed, data_uri, sets, stderr)
        deadline, ready, workers = time.monotonic() + 300, False, []
        while not ready and time.monotonic() < deadline and proc.poll() is None:
            workers = _children(proc.pid) or workers
            ready = _checkpoint_steps(killed, "depth") == [4] and any(s >= 20 for s in _checkpoint_steps(killed, "rgb"))
            time.sleep(0.01)
        assert ready, "the run ended before rgb's checkpoint at step 20 and depth's last could be seen"
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert not list(killed.glob("train-tokenizers/*/_MANIFEST.json"))  # killed before committing
    # Its forked tokenizer workers die with it, at once (they would otherwise train on for seconds, writing
    # checkpoints beside the rerun).
    deadline = time.monotonic() + 2
    while any(_running(pid) for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(_running(pid) for pid in workers), workers
    saved = max(_checkpoint_steps(killed, "rgb"))
    assert 20 <= saved < 120

    outcome, resumed, err = _run_to_the_end(killed, data_uri, sets)
    assert outcome["status"] == "ran" and resumed["content_hash"] == expected["content_hash"]
    assert f"train-tokenizer rgb: resumed from step {saved} of 120" in err and "rgb: step 12/120" not in err
    assert "train-tokenizer depth: already trained (checkpoint at its last step, 4)" in err
    assert resumed["metrics"]["rgb.resumed_from_step"] == saved and resumed["metrics"]["depth.resumed_from_step"] == 4
    assert expected["metrics"]["rgb.resumed_from_step"] == 0
    # The same bytes, every file; the checkpoints are working state outside the payload.
    assert payload_files(resumed) == payload_files(expected) and resumed["payload_digest"] == expected["payload_digest"]
    assert not [key for key in payload_files(resumed) if key.startswith("checkpoints/")]
    assert _checkpoint_steps(killed, "rgb") == [120]  # the newest alone is kept
