"""Every MLflow run this package opens carries MLflow's standard context tags (user, source, git commit), and a
stage run under a KFP run names that run and links its page in the KFP UI; checked in a real SQLite store."""

from __future__ import annotations

import pytest
from mlflow.tracking import MlflowClient
from mlflow.tracking.context.default_context import _get_user
from mlflow.utils.mlflow_tags import MLFLOW_GIT_COMMIT, MLFLOW_SOURCE_NAME, MLFLOW_SOURCE_TYPE, MLFLOW_USER

from fourm_kfp.contract import lineage


@pytest.fixture
def image_commit(monkeypatch):
    """An image's build arg naming the commit it was built from."""
    commit = "0123456789abcdef0123456789abcdef01234567"
    monkeypatch.setenv("FOURM_GIT_COMMIT", commit)
    return commit


def test_pipeline_and_stage_runs_carry_the_context_and_the_kfp_run(tmp_path, image_commit):
    uri = lineage.default_tracking_uri(tmp_path)
    host, kfp_run = "https://kfp.example.org/pipeline", "7f0c9a51-run"
    parent = lineage.start_pipeline_run(uri, "demo", {}, {lineage.TAG_KFP_RUN_ID: kfp_run,
                                                          lineage.TAG_KFP_HOST: host})
    with lineage.stage_run(uri, parent, "pretrain") as tracker:
        pass
    client = MlflowClient(tracking_uri=uri)
    parent_tags, stage_tags = client.get_run(parent).data.tags, client.get_run(tracker.run_id).data.tags
    for tags, source in ((parent_tags, "fourm-kfp pipeline"), (stage_tags, "fourm-kfp stage pretrain")):
        assert tags[MLFLOW_USER] == _get_user()
        assert tags[MLFLOW_SOURCE_NAME] == source and tags[MLFLOW_SOURCE_TYPE] == "JOB"
        assert tags[MLFLOW_GIT_COMMIT] == image_commit
    assert stage_tags[lineage.TAG_KFP_RUN_ID] == kfp_run
    assert stage_tags[lineage.TAG_KFP_RUN_URL] == f"{host}/#/runs/details/{kfp_run}"  # the KFP UI's run page


def test_a_local_run_is_a_local_source_without_a_kfp_link(tmp_path, image_commit):
    uri = lineage.default_tracking_uri(tmp_path)
    parent = lineage.start_pipeline_run(uri, "local", {})
    with lineage.stage_run(uri, parent, "label") as tracker:
        pass
    tags = MlflowClient(tracking_uri=uri).get_run(tracker.run_id).data.tags
    assert tags[MLFLOW_SOURCE_TYPE] == "LOCAL" and tags[MLFLOW_GIT_COMMIT] == image_commit
    assert lineage.TAG_KFP_RUN_ID not in tags and lineage.TAG_KFP_RUN_URL not in tags
