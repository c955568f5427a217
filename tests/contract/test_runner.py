"""The stage contract: manifest written last, committed outputs reused, --force, and lineage in MLflow."""

from __future__ import annotations

import json

import pytest

from fourm_kfp.config.loader import load_config
from fourm_kfp.contract import StageResult, StageSpec, lineage, run_stage, run_stage_part
from fourm_kfp.contract.guarded_config import UndeclaredConfigKeyError
from fourm_kfp.contract.manifest import MANIFEST_NAME, IncompleteOutputError
from fourm_kfp.storage import open_store

CALLS: list[str] = []


def _writes_two_files(ctx):
    CALLS.append(ctx.output.uri)
    ctx.output.put_bytes("data/a.bin", b"a" * 100)
    ctx.output.child("data").put_bytes("b.bin", b"b" * 50)
    ctx.write_report("report.md", b"# report")
    return StageResult(counts={"files": 2}, metrics={"quality": 0.5})


def _fails_midway(ctx):
    ctx.output.put_bytes("data/partial.bin", b"x")
    raise RuntimeError("disk on fire")


SPEC = StageSpec("toy", _writes_two_files, config_keys=("prepare_data",))


@pytest.fixture
def config():
    return load_config("smoke")


def test_commit_then_reuse(any_store_uri, config):
    CALLS.clear()
    root = open_store(any_store_uri, create=True)
    first = run_stage(SPEC, config, root)
    assert first.status == "ran" and len(CALLS) == 1
    out = open_store(first.output_uri)
    assert first.output_uri == root.uri_of(f"toy/{first.output_uri.rsplit('/', 1)[1]}")
    manifest = json.loads(out.get_bytes(MANIFEST_NAME))
    assert manifest["stage"] == "toy" and manifest["counts"] == {"files": 2}
    assert {f["key"]: f["bytes"] for f in manifest["files"]} == {
        "data/a.bin": 100, "data/b.bin": 50, "reports/report.md": 8}
    assert manifest["bytes_total"] == 158
    assert manifest["config"]["prepare_data"]["num_train"] == config.prepare_data.num_train
    assert manifest["code"]["package_version"]

    second = run_stage(SPEC, config, root)
    assert second.status == "skipped" and len(CALLS) == 1
    assert second.output_uri == first.output_uri and second.manifest_digest == first.manifest_digest

    forced = run_stage(SPEC, config, root, force=True)
    assert forced.status == "ran" and len(CALLS) == 2


def test_failed_stage_leaves_no_manifest_and_is_redone_cleanly(tmp_path, config):
    root = open_store(str(tmp_path), create=True)
    failing = StageSpec("toy", _fails_midway, config_keys=("prepare_data",))
    with pytest.raises(RuntimeError, match="disk on fire"):
        run_stage(failing, config, root)
    [prefix] = {key.rsplit("/", 1)[0] for key in root.list("toy")} - {""}
    assert not root.exists(f"{prefix.rsplit('/data', 1)[0]}/{MANIFEST_NAME}")
    outcome = run_stage(SPEC, config, root)
    assert outcome.status == "ran"
    assert open_store(outcome.output_uri).list() == ["_MANIFEST.json", "data/a.bin", "data/b.bin",
                                                     "reports/report.md"]  # the partial file is gone


def test_uncommitted_input_is_refused(tmp_path, config):
    root = open_store(str(tmp_path), create=True)
    root.put_bytes("half/done.bin", b"x")
    consumer = StageSpec("consumer", _writes_two_files, config_keys=("data",), upstream=(SPEC,))
    with pytest.raises(IncompleteOutputError, match="has no _MANIFEST.json"):
        run_stage(consumer, config, root, input_uris={"toy": root.uri_of("half")})


def test_lineage_records_ran_and_reused_runs(tmp_path, config):
    tracking = lineage.default_tracking_uri(tmp_path)
    parent = lineage.start_pipeline_run(tracking, "test", {"preset": "smoke"})
    root = open_store(str(tmp_path / "store"), create=True)
    ran = run_stage(SPEC, config, root, tracking_uri=tracking, parent_run_id=parent)
    reused = run_stage(SPEC, config, root, tracking_uri=tracking, parent_run_id=parent)

    runs = lineage.child_runs(tracking, parent)
    assert [r.info.run_id for r in runs] == [ran.mlflow_run_id, reused.mlflow_run_id]
    first, second = runs
    assert first.data.tags["fourm.status"] == "ran" and first.data.tags["fourm.reused"] == "false"
    assert second.data.tags["fourm.reused"] == "true"
    assert second.data.tags["fourm.produced_by"] == ran.mlflow_run_id
    assert first.data.params["prepare_data.num_train"] == str(config.prepare_data.num_train)
    assert first.data.metrics["quality"] == 0.5
    outputs = [d for d in first.inputs.dataset_inputs if d.tags[0].value == "output"]
    assert outputs[0].dataset.source and ran.output_uri in outputs[0].dataset.source
    client = lineage._client(tracking)
    assert [a.path for a in client.list_artifacts(ran.mlflow_run_id, "reports")] == ["reports/report.md"]


def test_the_mlflow_ui_opens_the_experiment_on_its_runs_and_finds_the_newest_pipeline_run(tmp_path):
    """MLflow 3's UI shows an experiment without a kind as a GenAI app (an empty traces page): ours says it is model
    training, also when the store was made before (a kind someone chose in the UI is kept)."""
    tracking = lineage.default_tracking_uri(tmp_path)
    assert lineage.latest_pipeline_run(tracking) is None
    first = lineage.start_pipeline_run(tracking, "first", {})
    newest = lineage.start_pipeline_run(tracking, "newest", {})
    client = lineage._client(tracking)
    experiment = client.get_experiment_by_name(lineage.EXPERIMENT)
    assert experiment.tags["mlflow.experimentKind"] == "custom_model_development"
    assert lineage.latest_pipeline_run(tracking) == newest != first
    # the UI opens a page in model training (runs, models) only when its address asks (MLflow 3.17)
    assert lineage.run_page(tracking, newest) == \
        f"#/experiments/{experiment.experiment_id}/runs/{newest}?workflowType=machine_learning"
    assert lineage.experiment_page(tracking) == f"#/experiments/{experiment.experiment_id}/runs?workflowType=machine_learning"
    client.delete_experiment_tag(experiment.experiment_id, "mlflow.experimentKind")  # a store from before
    lineage.start_pipeline_run(tracking, "later", {})
    assert client.get_experiment(experiment.experiment_id).tags["mlflow.experimentKind"] == "custom_model_development"
    client.set_experiment_tag(experiment.experiment_id, "mlflow.experimentKind", "finetuning")  # chosen in the UI
    lineage.start_pipeline_run(tracking, "again", {})
    assert client.get_experiment(experiment.experiment_id).tags["mlflow.experimentKind"] == "finetuning"


def _reads(path: str):
    def run(ctx):
        node = ctx.config
        for part in path.split("."):
            node = getattr(node, part)
        return StageResult(counts={"value": str(node)})

    return run


@pytest.mark.parametrize("declared, read", [
    (("prepare_data",), "prepare_data.num_train"),
    (("data.image_size",), "data.image_size"),
    (("train_tokenizers",), "train_tokenizers.image.codebook_size"),
])
def test_a_stage_reads_the_config_it_declares(tmp_path, config, declared, read):
    outcome = run_stage(StageSpec("reader", _reads(read), config_keys=declared), config, open_store(str(tmp_path)))
    assert outcome.status == "ran"


@pytest.mark.parametrize("declared, read", [
    (("prepare_data",), "train.steps"),
    (("data.image_size",), "data.modalities"),
    (("data.image_size",), "alphas.mixture"),
])
def test_reading_an_undeclared_key_names_the_key_and_the_stage(tmp_path, config, declared, read):
    spec = StageSpec("sneaky", _reads(read), config_keys=declared)
    with pytest.raises(UndeclaredConfigKeyError) as info:
        run_stage(spec, config, open_store(str(tmp_path)))
    assert f"{read!r}" in str(info.value) and "'sneaky'" in str(info.value)


PART_CALLS: list[int] = []


def _part(ctx, part, parts):
    PART_CALLS.append(part)
    ctx.output.put_bytes(f"shards/{part}.bin", bytes([part]) * (part + 1))
    return StageResult(counts={"items": part + 1})


def _collect(ctx):
    records = ctx.part_records()
    return StageResult(counts={"items": sum(r["counts"]["items"] for r in records), "parts": len(records)})


FANNED = StageSpec("fanned", _collect, config_keys=("prepare_data",), run_part=_part, resumable=True)


def test_fan_out_parts_then_collect_lists_every_file(any_store_uri, config):
    PART_CALLS.clear()
    root = open_store(any_store_uri, create=True)
    uris = {run_stage_part(FANNED, config, root, part, 3) for part in (2, 0)}
    assert len(uris) == 1 and PART_CALLS == [2, 0]
    assert run_stage_part(FANNED, config, root, 0, 3) in uris and PART_CALLS == [2, 0]  # a done part is skipped
    outcome = run_stage(FANNED, config, root, parts=3)  # runs the missing part 1 itself, then collects
    assert PART_CALLS == [2, 0, 1]
    manifest = json.loads(open_store(outcome.output_uri).get_bytes(MANIFEST_NAME))
    assert manifest["counts"] == {"items": 6, "parts": 3}
    assert {f["key"]: f["bytes"] for f in manifest["files"] if f["key"].startswith("shards/")} == {
        "shards/0.bin": 1, "shards/1.bin": 2, "shards/2.bin": 3}
    assert run_stage_part(FANNED, config, root, 1, 3) == outcome.output_uri and PART_CALLS == [2, 0, 1]


def test_a_resumable_stage_keeps_committed_pieces_unless_forced(tmp_path, config):
    PART_CALLS.clear()
    root = open_store(str(tmp_path), create=True)
    run_stage_part(FANNED, config, root, 0, 2)
    assert run_stage(FANNED, config, root, parts=2).status == "ran" and PART_CALLS == [0, 1]
    run_stage(FANNED, config, root, parts=2, force=True)
    assert PART_CALLS == [0, 1, 0, 1]


def test_the_manifest_records_the_stage_s3_requests_and_bytes(s3_uri, config, tmp_path):
    """``storage`` in the manifest: what making the output asked of S3 (here the three objects, the clearing of
    the prefix, and the reads of the runner's own checks), counted on the wire."""
    root = open_store(s3_uri, create=True)
    outcome = run_stage(SPEC, config, root)
    storage = json.loads(open_store(outcome.output_uri).get_bytes(MANIFEST_NAME))["storage"]
    assert storage["requests"]["put"] == 3 and storage["bytes_up"] == 158
    assert storage["requests"]["list"] >= 1 and storage["requests_total"] == sum(storage["requests"].values())
    local = run_stage(SPEC, config, open_store(str(tmp_path)))
    local_storage = json.loads(open_store(local.output_uri).get_bytes(MANIFEST_NAME))["storage"]
    assert local_storage == {"requests": {}, "requests_total": 0, "bytes_up": 0, "bytes_down": 0}


def test_a_clear_cut_off_midway_leaves_no_manifest_over_missing_files(tmp_path, config, monkeypatch):
    from fourm_kfp.contract.manifest import read_manifest
    from fourm_kfp.contract.runner import clear_output

    outcome = run_stage(SPEC, config, open_store(str(tmp_path)))
    output = open_store(outcome.output_uri)

    class CutOff(Exception):
        pass

    def cut_off(self, prefix=""):
        self.delete("data/a.bin")  # the first object goes, then the clear is killed
        raise CutOff

    monkeypatch.setattr(type(output), "delete_prefix", cut_off)
    with pytest.raises(CutOff):
        clear_output("toy", output)
    assert read_manifest(output) is None and output.exists("data/b.bin")  # uncommitted, so never read
