"""The registered champion is an MLflow model: `mlflow.pyfunc.load_model("models:/<name>@champion")` in a fresh
process, with the README's lines, gives the bytes `fourm-kfp generate` writes for the same image, target and seed.

On the shared smoke run (its evaluate stage logged the pyfunc and registered it in the run's SQLite MLflow store)."""

from __future__ import annotations

import json
import os
import pickle
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from fourm_kfp.config.loader import load_config
from fourm_kfp.contract import lineage
from tests.evaluation.test_model_gate import _server_missing, tracking_server  # noqa: F401 (a fixture)
from tests.smoke_runs import CLI

pytestmark = pytest.mark.slow

README = Path(__file__).resolve().parents[1] / "README.md"
TARGETS = "depth,caption"


def _readme_lines() -> list[str]:
    """The README's three Python lines loading the champion (the ```python block after "Then:")."""
    text = README.read_text()
    block = re.search(r"```python\n(.*?)```", text[text.index("Then:"):], re.S)
    assert block, "README: no ```python block after 'Then:'"
    lines = block.group(1).strip().splitlines()
    assert len(lines) == 3 and lines[0] == "import mlflow", lines
    return lines


def _photo(path: Path) -> Path:
    """A picture that is not the model's size (the reading resizes it, as generate's)."""
    rng = np.random.default_rng(7)
    Image.fromarray(rng.integers(0, 256, (80, 96, 3), dtype=np.uint8)).save(path)
    return path


def _predict_in_fresh_process(tracking_uri: str, model_name: str, photo: Path, out: Path, cwd: Path):
    """Run the README's lines (model name, picture and target filled in) in a new Python; its result back."""
    first, load, predict = _readme_lines()
    load = load.replace("fourm-demo", model_name)
    predict = predict.replace("photo.png", str(photo)).replace('["depth,caption"]', json.dumps([TARGETS]))
    script = "\n".join([first, load, f"result = {predict}", "import pickle",
                        f"pickle.dump(result.to_dict('records'), open({str(out)!r}, 'wb'))"])
    env = {**os.environ, "MLFLOW_TRACKING_URI": tracking_uri}
    proc = subprocess.run([sys.executable, "-c", script], env=env, cwd=cwd, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-5000:]
    return pickle.loads(out.read_bytes())


def test_champion_loads_as_pyfunc_and_matches_generate(fresh_smoke_run, tmp_path):
    summary = fresh_smoke_run
    tracking = summary["mlflow"]["tracking_uri"]
    gate = summary["model_gate"]
    name = gate["model_name"]
    [pretrain] = [s for s in summary["stages"] if s["name"] == "pretrain"]
    client = lineage._client(tracking)

    # The registry's champion is an MLflow model logged by the evaluate run, with the evaluation's metrics linked.
    version = client.get_model_version_by_alias(name, "champion")
    assert str(version.version) == gate["version"] and version.source.startswith("models:/m-")
    model_id = version.source.removeprefix("models:/")
    logged = client.get_logged_model(model_id)
    assert logged.source_run_id == version.run_id
    linked = {m.key: m.value for m in logged.metrics}
    run_metrics = client.get_run(version.run_id).data.metrics
    assert linked[gate["primary_metric"]] == pytest.approx(gate["value"])
    assert set(linked) <= set(run_metrics) and len(linked) > 10
    assert version.tags["fourm.source"] == pretrain["output_uri"]
    # Its signature and input example are recorded.
    from mlflow.artifacts import download_artifacts
    from mlflow.models import Model

    mlmodel = Model.load(download_artifacts(artifact_uri=logged.artifact_location.rstrip("/") + "/MLmodel",
                                            dst_path=str(tmp_path / "mlmodel")))
    assert mlmodel.signature.inputs.input_names() == ["image", "target"]
    assert {p.name for p in mlmodel.signature.params} >= {"seed", "steps", "temperature"}
    assert mlmodel.saved_input_example_info is not None

    photo = _photo(tmp_path / "photo.png")
    rows = _predict_in_fresh_process(tracking, name, photo, tmp_path / "predicted.pkl", tmp_path)
    _assert_rows_are_generate_s(rows, pretrain["output_uri"], photo, tmp_path / "gen")


def _assert_rows_are_generate_s(rows: list[dict], model_uri: str, photo: Path, out: Path) -> None:
    """``rows`` (the pyfunc's prediction for ``photo``) hold the bytes ``fourm-kfp generate`` writes."""
    proc = subprocess.run([CLI, "generate", "--model", model_uri, "--from", f"rgb={photo}",
                           "--to", TARGETS, "--out", str(out), "--device", "cpu"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-5000:]
    assert [r["modality"] for r in rows] == TARGETS.split(",") and {r["row"] for r in rows} == {0}
    for row in rows:
        assert row["data"] == (out / f"{row['modality']}.{row['format']}").read_bytes(), row["modality"]
    generated = json.loads((out / "generate.json").read_text())
    assert rows[1]["text"] == generated["text"]["caption"]


def test_a_model_logged_through_a_tracking_server_loads_by_alias(fresh_smoke_run, tracking_server, tmp_path):
    """The cluster's case: the evaluate step logs and registers through an HTTP tracking server (here MLflow's own
    server app over SQLite), and a user loads ``models:/<name>@champion`` from that server."""
    from fourm_kfp.evaluation.mlflow_model import log_pyfunc
    from fourm_kfp.evaluation.model_gate import register_and_gate

    stages = {s["name"]: s for s in fresh_smoke_run["stages"]}
    client = lineage._client(tracking_server)
    run_id = client.create_run(client.create_experiment(f"http-{time.monotonic_ns()}")).info.run_id
    name = f"fourm-http-{time.monotonic_ns()}"
    model_id = log_pyfunc(tracking_server, run_id, model_uri=stages["pretrain"]["output_uri"],
                          tokenizers_uri=stages["train-tokenizers"]["output_uri"],
                          image_size=load_config("smoke").data.image_size, target="depth")
    decision = register_and_gate(tracking_server, model_name=name, model_uri=stages["pretrain"]["output_uri"],
                                 run_id=run_id, metrics={"score": 1.0}, primary_metric="score",
                                 higher_is_better=True, margin=0.0, lineage={}, logged_model_id=model_id)
    assert decision.promoted and client.get_model_version_by_alias(name, "champion").source == f"models:/{model_id}"
    photo = _photo(tmp_path / "photo.png")
    rows = _predict_in_fresh_process(tracking_server, name, photo, tmp_path / "predicted.pkl", tmp_path)
    _assert_rows_are_generate_s(rows, stages["pretrain"]["output_uri"], photo, tmp_path / "gen")
