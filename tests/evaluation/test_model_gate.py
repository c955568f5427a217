"""The model gate on real MLflow stores (no mocks): the first model is promoted, a better one takes over, a worse or
within-margin one is refused (but becomes the candidate), lower-is-better metrics, NaN, a missing metric, a deleted
champion; with per-scene scores (the champion's reports/scene_scores.json read back from its run): better by noise
is refused, clearly better is promoted, the margin applies to the interval, unpaired when the scenes differ, the
point rule when the champion has no scene scores; and the same flow against a real tracking server."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import socket
import subprocess
import sys
import time
import urllib.request
import uuid

import numpy as np
import pytest

from fourm_kfp.contract.lineage import _client
from fourm_kfp.evaluation.caption_metrics import caption_stats
from fourm_kfp.evaluation.model_gate import SCENE_SCORES, champion_info, register_and_gate, scene_scores
from fourm_kfp.evaluation.targets import beats
from fourm_kfp.testing import stop_process

LINEAGE = {"data.uri": "s3://bucket/prepare-data/123", "pipeline_run_id": "p1"}


@pytest.fixture(scope="module")
def tracking(tmp_path_factory) -> str:
    """One SQLite store for the module (creating one costs a second or two); each test uses its own model name."""
    return f"sqlite:///{tmp_path_factory.mktemp('mlflow')}/mlflow.db"


@pytest.fixture
def name() -> str:
    return f"m-{uuid.uuid4().hex[:8]}"


def _gate(tracking: str, name: str, value: float, *, higher: bool = True, margin: float = 0.1,
          uri: str = "s3://bucket/pretrain/abc", run_id: str | None = None):
    return register_and_gate(tracking, model_name=name, model_uri=uri, run_id=run_id,
                             metrics={"score": value, "other": 1.0}, primary_metric="score",
                             higher_is_better=higher, margin=margin, lineage=LINEAGE)


def _alias(tracking: str, name: str, alias: str) -> str:
    return str(_client(tracking).get_model_version_by_alias(name, alias).version)


def _run(tracking: str) -> str:
    client = _client(tracking)
    experiment = client.get_experiment_by_name("gate-tests") or client.get_experiment(
        client.create_experiment("gate-tests"))
    return client.create_run(experiment.experiment_id).info.run_id


def test_first_promoted_better_takes_over_worse_refused(tracking, name):
    run_id = _run(tracking)
    first = _gate(tracking, name, 0.50, run_id=run_id)
    assert first.promoted and first.version == "1" and "no champion" in first.reason
    assert first.champion_version is None and first.champion_value is None
    assert _alias(tracking, name, "champion") == "1" == _alias(tracking, name, "candidate")

    better = _gate(tracking, name, 0.60)  # +20% > 10% margin
    assert better.promoted and better.champion_version == "1" and better.champion_value == pytest.approx(0.5)
    # Without per-scene scores the point rule decides, and the reason says so.
    assert better.reason == ("score 0.6 beats champion v1 (0.5) by 20% (margin 10%, higher is better); point rule, "
                             "no bootstrap: the candidate has no per-scene scores of score")
    assert better.comparison == "point" and better.interval_low is None
    assert better.difference == pytest.approx(0.1) and better.required == pytest.approx(0.05)
    assert _alias(tracking, name, "champion") == "2" == _alias(tracking, name, "candidate")

    within = _gate(tracking, name, 0.63)  # +5%: better, but not by the margin
    assert not within.promoted and "does not beat champion v2 (0.6) by the 10% margin" in within.reason
    assert _alias(tracking, name, "champion") == "2" and _alias(tracking, name, "candidate") == "3"
    worse = _gate(tracking, name, 0.10)
    assert not worse.promoted and worse.champion_version == "2" and worse.champion_value == pytest.approx(0.6)
    assert _alias(tracking, name, "champion") == "2" and _alias(tracking, name, "candidate") == "4"

    client = _client(tracking)
    refused = client.get_model_version(name, "4")
    assert refused.source == "s3://bucket/pretrain/abc"
    assert refused.tags["fourm.gate"] == "refused" and refused.tags["fourm.gate_reason"] == worse.reason
    assert refused.tags["fourm.data.uri"] == "s3://bucket/prepare-data/123" and refused.tags["metric.score"] == "0.1"
    assert client.get_model_version(name, "1").run_id == run_id
    assert client.get_model_version(name, "2").tags["fourm.gate"] == "promoted"

    info = champion_info(tracking, name)
    assert info["version"] == "2" and info["metrics"] == {"score": 0.6, "other": 1.0}
    assert info["source"] == "s3://bucket/pretrain/abc" and info["tags"]["fourm.pipeline_run_id"] == "p1"
    assert better.to_dict()["champion_version"] == "1"


def test_lower_is_better_and_local_model_folders(tracking, name, tmp_path, monkeypatch):
    model_dir = tmp_path / "pretrain" / "abc"
    first = _gate(tracking, name, 2.0, higher=False, uri=str(model_dir))
    assert first.promoted
    within = _gate(tracking, name, 1.9, higher=False, uri=str(model_dir))  # 5% lower, margin 10%
    assert not within.promoted and "lower is better" in within.reason
    assert not _gate(tracking, name, 2.5, higher=False, uri=str(model_dir)).promoted
    assert _gate(tracking, name, 1.7, higher=False, uri=str(model_dir)).promoted
    assert _alias(tracking, name, "champion") == "4"
    assert champion_info(tracking, name)["source"] == champion_info(tracking, name)["registry_source"] == str(model_dir)
    monkeypatch.chdir(tmp_path)  # a relative folder is registered as an absolute path
    assert _client(tracking).get_model_version(name, _gate(tracking, name, 1.0, uri="pretrain/abc").version
                                                    ).source == str(model_dir)


def test_margin_rule_edge_cases():
    assert beats(0.011, 0.01, True, 0.1) and not beats(0.0105, 0.01, True, 0.1)
    assert beats(1e-9, 0.0, True, 0.5) and not beats(0.0, 0.0, True, 0.0)  # champion at 0: any strict gain
    assert beats(-0.9, -1.0, True, 0.1) and not beats(-0.95, -1.0, True, 0.1)  # negative scores use |old|
    assert beats(-1.1, -1.0, False, 0.1) and not beats(1.0, 1.0, False, 0.0)  # a tie never moves the champion


def test_nan_refused_and_missing_metric_or_bad_margin_is_an_error(tracking, name):
    nan = _gate(tracking, name, math.nan)
    assert not nan.promoted and "never promoted" in nan.reason
    assert champion_info(tracking, name) is None and _alias(tracking, name, "candidate") == "1"
    assert _gate(tracking, name, 0.1).promoted  # the first finite score becomes champion
    assert not _gate(tracking, name, math.inf).promoted and _alias(tracking, name, "champion") == "2"
    with pytest.raises(ValueError, match=r"'missing' is not among the evaluation's metrics \(other, score\)"):
        register_and_gate(tracking, model_name=name, model_uri="s3://b/x", run_id=None,
                          metrics={"score": 1.0, "other": 2.0}, primary_metric="missing", higher_is_better=True,
                          margin=0.0, lineage={})
    with pytest.raises(ValueError, match="margin"):
        _gate(tracking, name, 0.5, margin=-0.1)
    assert len(_client(tracking).search_model_versions(f"name = '{name}'")) == 3  # errors register nothing


def test_champion_without_the_metric_is_replaced_and_a_deleted_champion_is_gone(tracking, name):
    register_and_gate(tracking, model_name=name, model_uri="s3://b/x", run_id=None, metrics={"old": 1.0},
                      primary_metric="old", higher_is_better=True, margin=0.0, lineage={})
    decision = _gate(tracking, name, 0.2)
    assert decision.promoted and decision.reason.startswith("champion v1 has no score")
    assert decision.champion_version == "1" and decision.champion_value is None

    _client(tracking).delete_model_version(name, "2")  # MLflow drops the aliases of a deleted version
    assert champion_info(tracking, name) is None and champion_info(tracking, "never-registered") is None
    again = _gate(tracking, name, 0.1)
    assert again.promoted and again.version == "3" and "no champion" in again.reason


def test_twice_the_same_model(tracking, name):
    first, second = _gate(tracking, name, 0.5), _gate(tracking, name, 0.5)
    assert (first.version, second.version) == ("1", "2") and first.promoted and not second.promoted
    assert champion_info(tracking, name)["version"] == "1" and _alias(tracking, name, "candidate") == "2"


# -- with per-scene scores ----------------------------------------------------------------------------------------

METRIC = "rgb-to-caption.object_f1"


def _scores(hits, keys=None) -> tuple[float, dict]:
    """One object per scene, predicted (``hit``) or not: the micro F1 over the scenes is the fraction of hits. The
    metric's value and the scene-scores document of an evaluation that scored it."""
    hits = np.asarray(hits, dtype=bool)
    objects = ["a small red cube"] * len(hits)
    stats = caption_stats(["a small red cube" if h else "a small blue cube" for h in hits], objects)
    keys = keys or [f"scene-{i:04d}" for i in range(len(hits))]
    return stats.whole()["object_f1"], scene_scores({"rgb-to-caption.": (keys, stats)})


@pytest.fixture(scope="module")
def experiment(tracking, tmp_path_factory) -> str:
    """An experiment whose artifacts live in the test's folder (not ./mlruns)."""
    client = _client(tracking)
    return client.create_experiment("scene-scores", artifact_location=tmp_path_factory.mktemp("artifacts").as_uri())


def _evaluated(tracking: str, experiment: str, name: str, hits, *, keys=None, margin: float = 0.0,
               log_scores: bool = True):
    """Gate one evaluation the way the evaluate stage does: its run holds reports/scene_scores.json."""
    value, doc = _scores(hits, keys)
    client = _client(tracking)
    run_id = client.create_run(experiment).info.run_id
    if log_scores:
        client.log_text(run_id, json.dumps(doc), SCENE_SCORES)
    return register_and_gate(tracking, model_name=name, model_uri="s3://bucket/pretrain/x", run_id=run_id,
                             metrics={METRIC: value}, primary_metric=METRIC, higher_is_better=True, margin=margin,
                             lineage={}, scene_scores=doc)


CHAMPION_HITS = np.random.default_rng(0).random(200) < 0.5  # the champion gets about half the scenes right


def test_better_by_noise_is_refused_clearly_better_is_promoted(tracking, experiment, name):
    assert _evaluated(tracking, experiment, name, CHAMPION_HITS).promoted  # no champion yet
    noisy = CHAMPION_HITS.copy()
    noisy[np.flatnonzero(~CHAMPION_HITS)[:6]] = True  # six scenes fixed, two broken: +2% (4 of 200 scenes)
    noisy[np.flatnonzero(CHAMPION_HITS)[:2]] = False
    gain = noisy.mean() - CHAMPION_HITS.mean()
    assert gain == pytest.approx(0.02) and beats(noisy.mean(), CHAMPION_HITS.mean(), True, 0.0)  # point rule: yes
    refused = _evaluated(tracking, experiment, name, noisy)
    assert not refused.promoted and refused.comparison == "paired bootstrap" and refused.resamples == 1000
    assert refused.difference == pytest.approx(gain) and refused.interval_low <= 0 < refused.interval_high
    assert "does not beat champion v1" in refused.reason and "paired bootstrap over the same 200" in refused.reason
    assert _alias(tracking, name, "champion") == "1"

    clearly = CHAMPION_HITS.copy()
    clearly[np.flatnonzero(~CHAMPION_HITS)[:50]] = True  # every hit kept, 50 misses fixed: +25%
    promoted = _evaluated(tracking, experiment, name, clearly)
    assert promoted.promoted and promoted.champion_version == "1" and promoted.interval_low > 0
    assert promoted.interval_low <= promoted.difference <= promoted.interval_high
    assert _alias(tracking, name, "champion") == "3"
    assert _client(tracking).get_model_version(name, "3").tags["fourm.gate_reason"] == promoted.reason


def test_the_margin_applies_to_the_lower_bound(tracking, experiment, name):
    champion = np.arange(200) < 100  # F1 0.5
    better = champion | ((np.arange(200) >= 100) & (np.arange(200) < 130))  # 30 more scenes right: 0.65
    _evaluated(tracking, experiment, name, champion)
    # +30%: the point rule with a 25% margin would promote (0.65 >= 0.625), but the interval's lower bound
    # (about 0.15 - 2 x 0.025) is below 0.125.
    assert beats(0.65, 0.5, True, 0.25)
    strict = _evaluated(tracking, experiment, name, better, margin=0.25)
    assert not strict.promoted and strict.required == pytest.approx(0.125)
    assert 0 < strict.interval_low < 0.125 and strict.difference == pytest.approx(0.15)
    lenient = _evaluated(tracking, experiment, name, better, margin=0.1)  # needs a lower bound above 0.05
    assert lenient.promoted and lenient.interval_low > 0.05 and lenient.required == pytest.approx(0.05)


def test_unpaired_when_the_scenes_differ(tracking, experiment, name):
    _evaluated(tracking, experiment, name, CHAMPION_HITS)
    other_keys = [f"other-{i}" for i in range(150)]
    same = _evaluated(tracking, experiment, name, CHAMPION_HITS[:150], keys=other_keys)
    assert same.comparison == "unpaired bootstrap" and not same.promoted
    assert "unpaired bootstrap: the candidate's 150 val scenes and the champion's 200" in same.reason
    # The same scene keys in another order are paired (matched by key, not by position): the same scores tie.
    _, doc = _scores(CHAMPION_HITS)
    shuffled = np.random.default_rng(1).permutation(200)
    reordered = _evaluated(tracking, experiment, name, CHAMPION_HITS[shuffled],
                           keys=[doc["groups"][0]["keys"][i] for i in shuffled])
    assert reordered.comparison == "paired bootstrap" and not reordered.promoted
    assert reordered.difference == reordered.interval_low == reordered.interval_high == 0
    far_better = _evaluated(tracking, experiment, name, np.ones(150, bool), keys=other_keys)
    assert far_better.promoted and far_better.comparison == "unpaired bootstrap" and far_better.interval_low > 0


def test_champion_without_scene_scores_falls_back_to_the_point_rule(tracking, experiment, name):
    _evaluated(tracking, experiment, name, CHAMPION_HITS, log_scores=False)  # an older version: no artifact
    noisy = CHAMPION_HITS.copy()
    noisy[np.flatnonzero(~noisy)[:3]] = True  # three more hits: better by the point rule
    decision = _evaluated(tracking, experiment, name, noisy)
    assert decision.promoted and decision.comparison == "point" and decision.interval_low is None
    assert decision.reason.endswith(f"point rule, no bootstrap: champion v1 has no per-scene scores of {METRIC} "
                                    f"({SCENE_SCORES})")
    # The new champion has scene scores: the next candidate is bootstrapped against them.
    assert _evaluated(tracking, experiment, name, noisy).comparison == "paired bootstrap"


def _server_missing() -> str | None:
    missing = [m for m in ("flask", "flask_cors") if importlib.util.find_spec(m) is None]
    return f"the MLflow tracking server needs {', '.join(missing)}, which mlflow-skinny does not install" \
        if missing else None


SERVER_SCRIPT = """
import os, sys
os.environ["_MLFLOW_SERVER_FILE_STORE"], os.environ["_MLFLOW_SERVER_ARTIFACT_ROOT"] = sys.argv[1], sys.argv[2]
from mlflow.server import app
app.run(host="127.0.0.1", port=int(sys.argv[3]), threaded=True)
"""


@pytest.fixture(scope="module")
def tracking_server(tmp_path_factory):
    """MLflow's tracking server app (the Flask app ``mlflow server`` serves) on loopback, over a SQLite store.
    Served by Werkzeug: the ``mlflow server`` command's uvicorn front end needs packages (aiohttp, huey, ...) that
    mlflow-skinny does not have either."""
    root = tmp_path_factory.mktemp("mlflow-server")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    log_path = root / "server.log"
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    with open(log_path, "wb") as log:
        process = subprocess.Popen([sys.executable, "-c", SERVER_SCRIPT, f"sqlite:///{root}/mlflow.db",
                                    str(root / "artifacts"), str(port)], stdout=log, stderr=log, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"{url}/health", timeout=1).close()
                break
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"the MLflow server did not start:\n{log_path.read_text()[-3000:]}")
                time.sleep(0.2)
        yield url
    finally:
        stop_process(process)


@pytest.mark.skipif(_server_missing() is not None, reason=_server_missing() or "")
def test_against_a_tracking_server(tracking_server, name, tmp_path):
    run_id = _run(tracking_server)
    first = _gate(tracking_server, name, 0.5, run_id=run_id)
    assert first.promoted and first.version == "1"
    assert _client(tracking_server).get_model_version(name, "1").source == "s3://bucket/pretrain/abc"
    assert not _gate(tracking_server, name, 0.52).promoted  # within the margin

    # The server refuses local paths (and file:// URIs) as sources: registered as the evaluate run instead.
    model_dir = str(tmp_path / "pretrain" / "abc")
    better = _gate(tracking_server, name, 0.9, uri=model_dir, run_id=run_id)
    assert better.promoted and better.version == "3" and better.champion_version == "1"
    info = champion_info(tracking_server, name)
    assert info["version"] == "3" and info["source"] == model_dir and info["registry_source"] == f"runs:/{run_id}/"
    assert info["run_id"] == run_id and info["metrics"]["score"] == 0.9
    assert _alias(tracking_server, name, "candidate") == "3"
    with pytest.raises(ValueError, match="refuses the local model folder"):
        _gate(tracking_server, name, 0.95, uri=model_dir)  # without a run id, a local folder cannot be registered
