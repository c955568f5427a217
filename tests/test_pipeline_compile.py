"""The committed compiled pipeline must match the pipeline definition (regenerate: make compile)."""

from __future__ import annotations

import yaml

from fourm_kfp.pipeline_compiler import compile_pipeline, default_output


def test_committed_pipeline_yaml_is_current(tmp_path):
    fresh = compile_pipeline(tmp_path / "fresh.yaml").read_text()
    committed = default_output()
    assert committed.exists(), "pipelines/fourm_pretrain.yaml is missing: run `make compile` and commit it"
    assert fresh == committed.read_text(), "pipelines/fourm_pretrain.yaml is stale: run `make compile` and commit it"


def test_pipeline_parameters_are_flat_and_documented(tmp_path):
    spec, platform = yaml.safe_load_all(compile_pipeline(tmp_path / "p.yaml").read_text())
    params = spec["root"]["inputDefinitions"]["parameters"]
    assert {"preset", "config_overrides", "store_uri", "mlflow_tracking_uri", "prepare_data_force"} <= set(params)
    for name, param in params.items():
        assert param.get("description"), f"pipeline parameter {name} has no description"
    executors = spec["deploymentSpec"]["executors"]
    images = {e["container"]["image"] for e in executors.values()}
    assert all(image.startswith("ghcr.io/fourm-kfp/fourm-kfp-python") for image in images)
    for executor in executors.values():  # thin components: no pip install at run time, the image has the package
        assert "pip install" not in " ".join(executor["container"]["command"])
    secrets = platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    assert all(e["secretAsEnv"][0]["secretName"] == "fourm-s3-credentials" for e in secrets.values())
