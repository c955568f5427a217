"""Each stage's committed output reaches KFP as a typed artifact: declared so in the compiled pipeline, filled by the
step with its store URI, address, digest and preset under kfp.local, and recorded in ML Metadata as the backend's
launcher records it (tests/kfp_mlmd_emulator.py), which is what the run graph, Artifacts tab and lineage explorer
read. Caching and per-stage reruns stay keyed by the URIs the steps pass as parameters."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from kfp import dsl

from fourm_kfp.config.loader import load_config
from fourm_kfp.contract import StageOutcome
from fourm_kfp.contract.manifest import require_manifest
from fourm_kfp.contract.runner import output_store
from fourm_kfp.launchers.kfp_artifacts import fill_output_artifact, output_record
from fourm_kfp.stages import get_stage
from fourm_kfp.storage import open_store
from tests.kfp_mlmd_emulator import LauncherError, MetadataStore

PIPELINE_YAML = Path(__file__).resolve().parents[1] / "pipelines" / "fourm_pretrain.yaml"
#: The output artifact of each stage's committing step: its name and type.
STAGE_ARTIFACTS = {"prepare-data": ("data", "system.Dataset"), "label": ("labels", "system.Dataset"),
                   "train-tokenizers": ("tokenizers", "system.Model"), "pretokenize": ("tokens", "system.Dataset"),
                   "pretrain": ("model", "system.Model"), "evaluate": ("evaluation", "system.Artifact")}
PIPELINE_ROOT = "minio://mlpipeline/v2/artifacts"


@pytest.fixture(scope="module")
def pipeline_spec() -> dict:
    return next(yaml.safe_load_all(PIPELINE_YAML.read_text()))


def _tasks(spec: dict) -> dict:
    """Every task of every DAG of the compiled pipeline, by name (the stages sit inside the exit handler's DAG)."""
    return {name: task for component in spec["components"].values() if "dag" in component
            for name, task in component["dag"]["tasks"].items()}


def test_the_compiled_pipeline_declares_each_stage_s_output_as_a_typed_artifact(pipeline_spec):
    for stage, (name, kind) in STAGE_ARTIFACTS.items():
        outputs = pipeline_spec["components"][f"comp-{stage}"]["outputDefinitions"]["artifacts"]
        assert outputs[name]["artifactType"]["schemaTitle"] == kind, stage


def test_steps_take_upstream_outputs_as_uris_so_caching_is_keyed_as_before(pipeline_spec):
    """No step takes a stage's artifact as an input (its identity would join the cache key, and a never-cached
    fan-out collect step records a new one each run); the job stages and evaluate stay cached, fan-out steps not."""
    stage_outputs = {(stage, name) for stage, (name, _) in STAGE_ARTIFACTS.items()}
    tasks = _tasks(pipeline_spec)
    for task_name, task in tasks.items():
        for arg in task.get("inputs", {}).get("artifacts", {}).values():
            producer = arg.get("taskOutputArtifact", {})
            assert (producer.get("producerTask"), producer.get("outputArtifactKey")) not in stage_outputs, task_name
    for stage in ("train-tokenizers", "pretrain", "evaluate"):
        assert tasks[stage]["cachingOptions"] == {"enableCache": True}, stage
    for stage in ("prepare-data", "label", "pretokenize"):
        assert tasks[stage]["cachingOptions"] == {}, stage


def test_the_record_is_the_artifact_s_metadata_and_its_file(tmp_path):
    outcome = StageOutcome("pretokenize", "skipped", "s3://bucket/runs/pretokenize/0123abcd", 1.5, "sha256:ab")
    artifact = dsl.Dataset(name="tokens", uri=str(tmp_path / "tokens"))
    record = output_record(outcome, "demo", {"train-tokenizers": "s3://bucket/runs/train-tokenizers/99"})
    fill_output_artifact(artifact, record)
    assert artifact.metadata == record == json.loads((tmp_path / "tokens").read_text())
    assert record["address"] == "0123abcd" and record["digest"] == "sha256:ab" and record["status"] == "skipped"


def _mlmd_of_local_run(run_dir: Path, spec: dict) -> MetadataStore:
    """The MLMD records the backend would make for the stage steps of a kfp.local run: each step's executor output,
    with kfp.local's local pipeline root in its URIs read as the cluster's (the executor echoes the URI it was
    assigned; a URI it set would be kept)."""
    store = MetadataStore(PIPELINE_ROOT)
    cluster_dir = f"{PIPELINE_ROOT}/{run_dir.name}"
    for stage in STAGE_ARTIFACTS:
        written = (run_dir / stage / "executor_output.json").read_text().replace(str(run_dir), cluster_dir)
        definitions = spec["components"][f"comp-{stage}"]["outputDefinitions"]["artifacts"]
        outputs = {name: {"type": d["artifactType"]["schemaTitle"], "uri": f"{cluster_dir}/{stage}/{name}"}
                   for name, d in definitions.items()}
        store.publish_outputs(stage, outputs, json.loads(written))
    return store


def test_a_kfp_local_run_records_each_stage_s_output_in_mlmd_with_its_store_uri(fresh_smoke_run, pipeline_spec):
    root = Path(fresh_smoke_run["root"])
    run_dir = sorted((root / "kfp").glob("fourm-pretrain-*"))[0]  # the first, fresh run
    mlmd = _mlmd_of_local_run(run_dir, pipeline_spec)
    config, store_root = load_config("smoke"), open_store(str(root))
    uris = {s["name"]: s["output_uri"] for s in fresh_smoke_run["stages"]}
    for stage, (name, kind) in STAGE_ARTIFACTS.items():
        artifact = mlmd.outputs_of(stage)[name]
        props = artifact.custom_properties
        assert artifact.type == kind and artifact.uri == f"{PIPELINE_ROOT}/{run_dir.name}/{stage}/{name}"
        assert props["display_name"] == name and props["preset"] == "smoke" and props["stage"] == stage
        recorded = json.loads((run_dir / stage / name).read_text())  # what the UI's download gives
        assert recorded == {k: (v["struct"] if isinstance(v, dict) else v) for k, v in props.items()
                            if k not in ("display_name", "store_session_info")}
        spec = get_stage(stage)
        if not spec.is_enabled(config):  # the smoke preset has no labelers
            assert stage not in uris and props["status"] == "off" and props["store_uri"] == ""
            continue
        expected = output_store(spec, config, store_root)
        assert props["store_uri"] == expected.uri == uris[stage] and props["status"] == "ran"
        assert props["address"] == expected.uri.rsplit("/", 1)[-1]
        assert props["digest"] == require_manifest(expected, stage)[1]
        upstream = {up.name for up in spec.active_upstream(config)}
        assert set(props["inputs"]["struct"]) == upstream, stage
        assert all(props["inputs"]["struct"][up] == uris[up] for up in upstream)


def test_the_launcher_refuses_an_artifact_uri_outside_the_pipeline_root():
    """Why the step leaves its artifact's URI to KFP: a store URI set in its place fails the step."""
    store = MetadataStore(PIPELINE_ROOT)
    outputs = {"data": {"type": "system.Dataset", "uri": f"{PIPELINE_ROOT}/run/prepare-data/data"}}
    written = {"artifacts": {"data": {"artifacts": [{"uri": "s3://fourm-kfp/prepare-data/53d8e8684f4b515c"}]}}}
    with pytest.raises(LauncherError, match="does not have expected bucket prefix"):
        store.publish_outputs("prepare-data", outputs, written)
    with pytest.raises(LauncherError, match="unsupported value type"):
        store.publish_outputs("prepare-data", outputs, {"artifacts": {"data": {"artifacts": [
            {"metadata": {"digest": None}}]}}})
