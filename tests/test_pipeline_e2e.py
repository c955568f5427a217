"""End to end: `fourm-kfp run --preset smoke` through kfp.local, on local disk and on the S3 server.

The local run is the session's fresh smoke run, the S3 run its second (two workers per fan-out stage). The second run
with the same arguments must report every stage `skipped` (content-addressed reuse); a forced fan-out stage is
recomputed by its workers, not by its collect step, and a forced step stage by its step, into the same bytes; a rerun
that changes only pretrain_* parameters recomputes pretrain and evaluate alone.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch

from fourm_kfp.config.loader import load_config
from fourm_kfp.contract import lineage
from fourm_kfp.hardware import resolve_precision
from fourm_kfp.stages import PIPELINE
from fourm_kfp.storage import open_store
from fourm_kfp.tokenizers.bundle import load_tokenizers
from tests.smoke_runs import CLI, SECOND_RUN_WIDTHS, run_smoke

pytestmark = pytest.mark.slow


SMOKE = load_config("smoke")
STAGES = [spec.name for spec in PIPELINE if spec.is_enabled(SMOKE)]  # the label stage is off: no labelers
REPORTS = {"prepare-data": {"reports/preview.png", "reports/dataset_report.json"},
           "train-tokenizers": {"reports/reconstructions.png", "reports/tokenizer_report.md"},
           "pretokenize": {"reports/pretokenize_report.md", "reports/codebook_usage.png"},
           "pretrain": {"reports/pretrain_report.md", "reports/training_curves.png"},
           "evaluate": {"reports/evaluation_report.md", "reports/evaluation_report.html"}}


def _check_mlflow(summary: dict, stage_status: str) -> None:
    tracking = summary["mlflow"]["tracking_uri"]
    client = lineage._client(tracking)
    parent = client.get_run(summary["mlflow"]["parent_run_id"])
    assert parent.info.status == "FINISHED"
    assert parent.data.params["preset"] == "smoke"
    children = lineage.child_runs(tracking, parent.info.run_id)
    assert [c.data.tags["fourm.stage"] for c in children] == STAGES
    data_run, tokenizer_run = children[:2]
    for child in children:
        assert child.data.tags["fourm.status"] == stage_status
        assert child.data.params["data.image_size"] == "64"
        outputs = [d for d in child.inputs.dataset_inputs if d.tags[0].value == "output"]
        assert outputs and outputs[0].dataset.digest
        produced_by = child.info.run_id if stage_status == "ran" else child.data.tags["fourm.produced_by"]
        assert REPORTS[child.data.tags["fourm.stage"]] <= {a.path for a in client.list_artifacts(produced_by, "reports")}
    # The tokenizer run names the dataset it read, by URI and manifest digest.
    [data_input] = [d for d in tokenizer_run.inputs.dataset_inputs if d.tags[0].value == "input"]
    assert data_run.data.tags["fourm.output_uri"] in data_input.dataset.source


def _check_output(uri: str) -> None:
    store = open_store(uri)
    keys = store.list()
    assert "_MANIFEST.json" in keys
    for modality in ("rgb", "depth", "normal", "semseg", "edge", "det", "caption"):
        assert f"train/{modality}/shard-000000.tar" in keys
        assert f"val/{modality}/shard-000000.tar" in keys
    manifest = json.loads(store.get_bytes("_MANIFEST.json"))
    assert manifest["counts"]["splits"]["train"]["samples"] == 16
    assert manifest["counts"]["splits"]["val"]["samples"] == 8


def test_smoke_pipeline_local_then_skipped(fresh_smoke_run):
    first = fresh_smoke_run  # from an empty run folder, on local disk (shared: the rerun below only adds MLflow runs)
    root = Path(first["root"])
    assert [s["name"] for s in first["stages"]] == STAGES
    assert [s["status"] for s in first["stages"]] == ["ran"] * len(STAGES)
    assert first["stages"][0]["output_uri"].startswith(str(root / "prepare-data"))
    assert first["stages"][1]["output_uri"].startswith(str(root / "train-tokenizers"))
    assert (root / "mlflow.db").exists()
    _check_output(first["stages"][0]["output_uri"])
    _check_mlflow(first, "ran")
    # The stage times add up to no more than the run's wall time, pretokenize's counting its fanned-out parts.
    pretokenize = first["stages"][2]
    assert 0 < pretokenize["parts_seconds"] < pretokenize["seconds"]
    assert sum(s["seconds"] for s in first["stages"]) <= first["seconds"]
    # The evaluated model is registered and, being the first, promoted to champion.
    assert first["model_gate"]["promoted"] and first["model_gate"]["model_name"] == "fourm-smoke"
    # The pretrain manifest says which precision `auto` trained in on this machine.
    pretrain = json.loads(open_store(first["stages"][3]["output_uri"]).get_bytes("_MANIFEST.json"))
    assert pretrain["counts"]["precision"] == ("bf16" if resolve_precision("auto", torch.device("cpu")) else "fp32")

    second = run_smoke(root)
    assert [s["status"] for s in second["stages"]] == ["skipped"] * len(STAGES)
    assert "parts_seconds" not in second["stages"][2]  # reused: no parts ran
    assert first["kfp_log"] and second["kfp_log"] is None  # nothing to compute: the pipeline was not started
    assert all(run["machine"]["fp32_matmul_gflops"] > 0 for run in (first, second))  # the yardstick beside the time
    assert [s["output_uri"] for s in second["stages"]] == [s["output_uri"] for s in first["stages"]]
    assert second["mlflow"]["parent_run_id"] != first["mlflow"]["parent_run_id"]
    _check_mlflow(second, "skipped")  # every stage reused: nothing recomputed (how fast is bench/'s business)


def test_smoke_pipeline_on_s3(second_smoke_run, s3_env):
    # The session's second run: on the S3 server, two prepare-data and two pretokenize workers (ParallelFor) over
    # 2 train + 1 val shards, then the collect steps (the determinism test found its payloads the local run's).
    first, store = second_smoke_run, second_smoke_run["store"]
    root, bucket = Path(first["root"]), store.split("/")[2]
    rerun_args = ("--store", store, "--s3-endpoint", s3_env.endpoint, *SECOND_RUN_WIDTHS)
    assert [s["status"] for s in first["stages"]] == ["ran"] * len(STAGES)
    stage, tokenizers, tokens = first["stages"][:3]
    assert stage["output_uri"].startswith(f"{store}/prepare-data/")
    first_digest, tokenizers_digest = (json.loads(open_store(s["output_uri"]).get_bytes("_MANIFEST.json"))[
        "payload_digest"] for s in (stage, tokenizers))
    assert tokenizers["output_uri"].startswith(f"{store}/train-tokenizers/")
    assert sorted(load_tokenizers(tokenizers["output_uri"]).image) == ["depth", "edge", "normal", "rgb", "semseg"]
    _check_output(stage["output_uri"])
    # The objects really are in the bucket on the server's disk.
    on_disk = s3_env.data_dir / bucket / stage["output_uri"].removeprefix(f"s3://{bucket}/")
    assert (on_disk / "_MANIFEST.json").is_file() and (on_disk / "train/rgb/shard-000000.tar").is_file()

    parts = lineage.child_runs(first["mlflow"]["tracking_uri"], first["mlflow"]["parent_run_id"], kind="part")
    assert sorted(r.data.tags["fourm.stage"] for r in parts) == ["prepare-data part 1/2", "prepare-data part 2/2",
                                                                 "pretokenize part 1/2", "pretokenize part 2/2"]
    assert tokens["output_uri"].startswith(f"{store}/pretokenize/")
    assert len(open_store(tokens["output_uri"]).list("train/_keys")) == 2

    second = run_smoke(root, *rerun_args)
    assert [s["status"] for s in second["stages"]] == ["skipped"] * len(STAGES)
    assert "parts_seconds" not in second["stages"][2]  # reused: no parts ran

    # One rerun, as from the UI, tries three things at once. Forced, prepare-data is cleared by its fan-out step and
    # recomputed by its two workers, each its own part, and its collect step commits their part records as they
    # wrote them (it recomputed none) and the same bytes as before. Forced, train-tokenizers is recomputed by its step
    # into the same bytes, so pretokenize after it is reused. Only pretrain_* parameters change beyond that, so
    # pretrain and evaluate recompute while every upstream output is reused by its content address.
    rerun = run_smoke(root, *rerun_args, "--force", "prepare-data", "--force", "train-tokenizers",
                      "--param", 'pretrain_config_overrides=["train.steps=3"]')
    assert [s["status"] for s in rerun["stages"]] == ["ran", "ran", "skipped", "ran", "ran"]
    assert [s["output_uri"] for s in rerun["stages"][:3]] == [s["output_uri"] for s in first["stages"][:3]]
    workers = lineage.child_runs(rerun["mlflow"]["tracking_uri"], rerun["mlflow"]["parent_run_id"], kind="part")
    out = open_store(stage["output_uri"])
    committed = {f"prepare-data part {i + 1}/2": json.loads(out.get_bytes(f"_parts/part-{i:04d}-of-0002.json"))
                 for i in range(2)}
    assert {r.data.tags["fourm.stage"]: r.data.metrics["seconds"] for r in workers} == {
        name: record["seconds"] for name, record in committed.items()}  # only prepare-data's parts ran
    assert json.loads(out.get_bytes("_MANIFEST.json"))["payload_digest"] == first_digest
    assert (json.loads(open_store(tokenizers["output_uri"]).get_bytes("_MANIFEST.json"))["payload_digest"]
            == tokenizers_digest)
    assert rerun["stages"][3]["output_uri"] != first["stages"][3]["output_uri"]
    # The pretrain step's HTML output (the KFP UI shows it) has the loss curves inline.
    pages = [p.read_text() for p in (root / "kfp").rglob("report_html") if p.parent.name.startswith("pretrain")]
    assert pages and all("training_curves.png" in page and "data:image/png;base64," in page for page in pages)


def test_bad_config_fails_before_kfp_with_a_clear_message(tmp_path):
    proc = subprocess.run([CLI, "run", "--preset", "smoke", "--root", str(tmp_path), "--set",
                           "prepare_data.num_train=zero"], capture_output=True, text=True)
    assert proc.returncode == 2
    assert "prepare_data.num_train: expected an integer" in proc.stderr
    assert "Traceback" not in proc.stderr
