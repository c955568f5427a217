"""The pretrain stage as users run it: a full smoke run whose model (and weight snapshots) load back from its URI;
a run killed midway that resumes on its own with the very losses an uninterrupted run has (bitwise, CPU); two
torchrun processes that end with identical replicas; and a cool-down start from another run's checkpoint on another
world size."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from torch.distributed.checkpoint.state_dict import get_model_state_dict

from fourm_kfp.contract.manifest import MANIFEST_NAME
from fourm_kfp.distributed import free_port
from fourm_kfp.model.saved_model import load_model, snapshot_steps
from fourm_kfp.storage import open_store
from fourm_kfp.train.checkpoint import complete_checkpoints, load_checkpoint
from tests.train.pretrain_helpers import input_args, losses, smoke_upstream

BIN = Path(sys.executable).parent
ENV = {**os.environ, "MLFLOW_TRACKING_URI": "none", "OMP_NUM_THREADS": "1"}


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> list[str]:
    """``--input`` arguments pointing at committed smoke pretokenize and train-tokenizers outputs."""
    return input_args(smoke_upstream(open_store(str(tmp_path_factory.mktemp("upstream")), create=True)))


def _pretrain(root: Path, inputs: list[str], *sets: str, launcher: list[str] | None = None,
              wait: bool = True) -> subprocess.Popen | dict:
    args = ["stage", "pretrain", "--root", str(root), *inputs]
    for item in sets:
        args += ["--set", item]
    cmd = (launcher or [str(BIN / "fourm-kfp")]) + args
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
    if not wait:
        return proc
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-4000:]
    return json.loads(out[out.index("{"):])


def test_a_smoke_run_exports_a_model_that_loads_from_its_uri(tmp_path, inputs):
    outcome = _pretrain(tmp_path, inputs, "train.steps=6", "train.log_every=2", "train.checkpoint_every=2",
                        "train.snapshot_every=2")
    out = open_store(outcome["output_uri"])
    model, card = load_model(outcome["output_uri"])
    assert card["step"] == 6 and card["args"]["dim"] == 64 and card["tokenizers_uri"]
    assert sum(p.numel() for p in model.parameters()) == card["parameters"]
    manifest = json.loads(out.get_bytes(MANIFEST_NAME))
    keys = {f["key"] for f in manifest["files"]}
    assert {"model/model.safetensors", "model/model.json", "metrics.jsonl",
            "checkpoints/step-00000006/_COMPLETE"} <= keys
    report = json.loads(out.get_bytes("reports/pretrain_report.json"))
    assert report["steps"] == 6 and set(report["modalities"]) == set(card["modalities"])
    assert report["first_val_step"] == 0 and report["last_val_step"] == 6
    assert "| modality | val loss at step 0 | val loss at step 6 |" in out.get_text("reports/pretrain_report.md")
    assert all(m["marginal_loss"] > 0 for m in report["modalities"].values())
    assert out.get_bytes("reports/training_curves.png")[:4] == b"\x89PNG"
    assert sorted(losses(outcome["output_uri"])) == [2, 4, 6]
    # Weight snapshots every 2 steps before the last (whose weights are the model): the checkpoint's weights.
    assert snapshot_steps(out) == [2, 4]
    assert {"snapshots/step-00000002.safetensors", "snapshots/step-00000004.safetensors"} <= keys
    snapshot, snapshot_card = load_model(outcome["output_uri"], snapshot=4)
    assert snapshot_card["step"] == 4
    checkpointed, _ = load_model(outcome["output_uri"])
    app = {"model": get_model_state_dict(checkpointed)}
    load_checkpoint({c.step: c for c in complete_checkpoints(out.child("checkpoints"))}[4], app)
    for name, tensor in snapshot.state_dict().items():
        assert torch.equal(tensor, app["model"][name]), name
    assert not all(torch.equal(t, model.state_dict()[n]) for n, t in snapshot.state_dict().items())
    with pytest.raises(ValueError, match="no weight snapshot at step 3; it has \\[2, 4\\]"):
        load_model(outcome["output_uri"], snapshot=3)


def test_a_killed_run_resumes_with_the_uninterrupted_losses(tmp_path, inputs):
    sets = ("train.steps=30", "train.checkpoint_every=5", "train.log_every=1", "train.global_batch_size=16")
    reference = _pretrain(tmp_path / "reference", inputs, *sets)
    proc = _pretrain(tmp_path / "killed", inputs, *sets, wait=False)
    deadline = time.monotonic() + 300
    markers = []
    while not markers and time.monotonic() < deadline and proc.poll() is None:
        markers = list((tmp_path / "killed").glob("pretrain/*/checkpoints/step-00000010/_COMPLETE"))
        time.sleep(0.02)
    assert markers, "the run ended before its step-10 checkpoint could be seen"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not list((tmp_path / "killed").glob("pretrain/*/_MANIFEST.json"))  # killed before committing
    resumed = _pretrain(tmp_path / "killed", inputs, *sets)
    assert resumed["status"] == "ran" and resumed["output_uri"].rsplit("/", 1)[1] == \
        reference["output_uri"].rsplit("/", 1)[1]
    after = losses(resumed["output_uri"])
    assert after == losses(reference["output_uri"]) and sorted(after) == list(range(1, 31))  # bitwise, from step 1
    # and the same bytes: weights, optimizer, every checkpoint's rank files with their RNG states, and the history
    # before the resume point (metrics, report, curves), which the checkpoint carries
    manifests = [json.loads(open_store(r["output_uri"]).get_bytes(MANIFEST_NAME)) for r in (resumed, reference)]
    assert manifests[0]["payload_digest"] == manifests[1]["payload_digest"]
    report = json.loads(open_store(resumed["output_uri"]).get_bytes("reports/pretrain_report.json"))
    assert report["first_val_step"] == 0


def test_two_processes_end_with_identical_replicas_and_a_cool_down_reshards(tmp_path, inputs):
    torchrun = [str(BIN / "torchrun"), "--nproc-per-node", "2", "--master-port", str(free_port()), "-m",
                "fourm_kfp.cli"]
    ddp = _pretrain(tmp_path / "ddp", inputs, "train.steps=4", "train.checkpoint_every=2", launcher=torchrun)
    assert ddp["metrics"]["replica_divergence"] == 0.0 and ddp["metrics"]["steps"] == 4.0
    # A cool-down on one process from the 2-process run's checkpoint (DCP reshards to the new world size).
    source = f"{ddp['output_uri']}/checkpoints"
    cool = _pretrain(tmp_path / "cool", inputs, "train.steps=2", f"train.resume_from={source}")
    report = json.loads(open_store(cool["output_uri"]).get_bytes("reports/pretrain_report.json"))
    first_val = report["val_history"][0]
    ddp_last = json.loads(open_store(ddp["output_uri"]).get_bytes("reports/pretrain_report.json"))["val_history"][-1]
    assert first_val["step"] == 0.0 and first_val["val/loss"] == pytest.approx(ddp_last["val/loss"], rel=1e-6)


def test_fsdp2_on_two_processes_trains_checkpoints_and_exports(tmp_path, inputs):
    torchrun = [str(BIN / "torchrun"), "--nproc-per-node", "2", "--master-port", str(free_port()), "-m",
                "fourm_kfp.cli"]
    fsdp = _pretrain(tmp_path, inputs, "train.steps=2", "train.checkpoint_every=1", "train.parallelism=fsdp",
                     "train.snapshot_every=1", launcher=torchrun)
    assert fsdp["metrics"]["steps"] == 2.0
    model, card = load_model(fsdp["output_uri"])  # the gathered full state dict
    assert sum(p.numel() for p in model.parameters()) == card["parameters"]
    snapshot, _ = load_model(fsdp["output_uri"], snapshot=1)  # gathered from both ranks' shards mid-run
    assert snapshot.state_dict().keys() == model.state_dict().keys()
    assert open_store(fsdp["output_uri"]).exists("checkpoints/step-00000002/_COMPLETE")
