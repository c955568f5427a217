"""The model gate on a real MLflow store: the first model is promoted, a better one takes over, a worse or
within-margin one is refused (but is the candidate), lower-is-better metrics, NaN, a missing metric."""

from __future__ import annotations

import math

import pytest
from mlflow import MlflowClient

from fourm_kfp.evaluation.model_gate import champion_info, register_and_gate


@pytest.fixture
def tracking(tmp_path) -> str:
    return f"sqlite:///{tmp_path}/mlflow.db"


def _gate(tracking: str, value: float, *, higher: bool = True, margin: float = 0.1, name: str = "m",
          uri: str = "s3://bucket/pretrain/abc"):
    return register_and_gate(tracking, model_name=name, model_uri=uri, run_id=None,
                             metrics={"score": value, "other": 1.0}, primary_metric="score",
                             higher_is_better=higher, margin=margin,
                             lineage={"data.uri": "s3://bucket/prepare-data/123", "pipeline_run_id": "p1"})


def _alias(tracking: str, alias: str, name: str = "m") -> str:
    return str(MlflowClient(tracking).get_model_version_by_alias(name, alias).version)


def test_promote_take_over_and_refuse(tracking):
    first = _gate(tracking, 0.50)
    assert first.promoted and first.version == "1" and "no champion" in first.reason
    assert first.champion_version is None and _alias(tracking, "champion") == "1"

    better = _gate(tracking, 0.60)  # +20% > 10% margin
    assert better.promoted and better.champion_version == "1" and better.champion_value == pytest.approx(0.5)
    assert "beats champion v1" in better.reason
    assert _alias(tracking, "champion") == "2" and _alias(tracking, "candidate") == "2"

    within = _gate(tracking, 0.63)  # +5%: better, but not by the margin
    assert not within.promoted and "does not beat champion v2" in within.reason
    worse = _gate(tracking, 0.10)
    assert not worse.promoted
    assert _alias(tracking, "champion") == "2" and _alias(tracking, "candidate") == "4"

    version = MlflowClient(tracking).get_model_version("m", "4")
    assert version.source == "s3://bucket/pretrain/abc"
    assert version.tags["fourm.gate"] == "refused" and version.tags["fourm.data.uri"] == "s3://bucket/prepare-data/123"
    info = champion_info(tracking, "m")
    assert info["version"] == "2" and info["metrics"] == {"score": 0.6, "other": 1.0}


def test_lower_is_better_and_local_model_paths(tracking, tmp_path):
    model_dir = str(tmp_path / "pretrain" / "abc")
    assert _gate(tracking, 2.0, higher=False, uri=model_dir).promoted
    assert not _gate(tracking, 1.9, higher=False, uri=model_dir).promoted  # 5% lower, margin 10%
    assert _gate(tracking, 1.7, higher=False, uri=model_dir).promoted
    assert _alias(tracking, "champion") == "3"
    assert champion_info(tracking, "m")["source"] == model_dir


def test_nan_is_never_promoted_and_a_missing_metric_is_an_error(tracking):
    assert not _gate(tracking, math.nan).promoted
    assert champion_info(tracking, "m") is None
    assert _gate(tracking, 0.1).promoted  # the first finite score becomes champion
    with pytest.raises(ValueError, match="'missing' is not among the evaluation's metrics"):
        register_and_gate(tracking, model_name="m", model_uri="x", run_id=None, metrics={"score": 1.0},
                          primary_metric="missing", higher_is_better=True, margin=0.0, lineage={})


def test_a_champion_without_the_metric_is_replaced(tracking):
    register_and_gate(tracking, model_name="m", model_uri="x", run_id=None, metrics={"old": 1.0},
                      primary_metric="old", higher_is_better=True, margin=0.0, lineage={})
    decision = _gate(tracking, 0.2)
    assert decision.promoted and "has no score" in decision.reason
