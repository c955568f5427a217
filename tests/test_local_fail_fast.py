"""A local run fails fast: ``fourm-kfp run`` (kfp.local) retries no step, so a step that fails on its own error (a
dead S3 endpoint) fails the run within the storage layer's deadline, naming the endpoint, while the compiled pipeline
the cluster runs keeps its job stages' retries (for a launcher pod lost with its node).
"""

import json
import os
import signal
import subprocess
import threading
import time
import uuid
from pathlib import Path

import pytest
from google.protobuf import json_format
from kfp import dsl, local

from fourm_kfp.distributed import free_port
from fourm_kfp.testing import serve_s3
from fourm_kfp.pipeline_runs.local import without_step_retries
from tests.smoke_runs import CLI

KEY, SECRET = "fourm-fail-fast-key", "fourm-fail-fast-secret"


@dsl.component(base_image="python:3.11")  # no annotations import: kfp reads the parameter types
def _fail_and_count(attempts_file: str):
    """Appends a line to ``attempts_file``, then fails."""
    with open(attempts_file, "a") as fh:
        fh.write("attempt\n")
    raise RuntimeError("a step's own error")


@dsl.pipeline
def _retried(attempts_file: str):
    _fail_and_count(attempts_file=attempts_file).set_retry(2, backoff_duration="0s")


@pytest.fixture
def kfp_local():
    """kfp.local's process-wide settings for one test, cleared after it (a component called outside a pipeline
    would otherwise run locally)."""
    from kfp.local.config import LocalExecutionConfig

    yield
    LocalExecutionConfig.instance = None


def _attempts(pipeline, tmp_path: Path, name: str) -> int:
    attempts = tmp_path / f"{name}.txt"
    local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=str(tmp_path / "kfp"),
               raise_on_error=False)
    pipeline(attempts_file=str(attempts))
    return len(attempts.read_text().splitlines())


def test_kfp_local_retries_a_failed_step_by_its_policy_and_the_local_run_clears_it(tmp_path, kfp_local):
    """kfp.local (2.17.0) runs a task ``max_retry_count + 1`` times whatever made it fail; the local run's copy of a
    pipeline runs it once."""
    assert _attempts(_retried, tmp_path, "as-compiled") == 3
    assert _attempts(without_step_retries(_retried), tmp_path, "local") == 1
    assert _attempts(_retried, tmp_path, "as-compiled-again") == 3  # the original keeps its policy


def _without_retry_policies(node):
    if isinstance(node, dict):
        return {k: _without_retry_policies(v) for k, v in node.items() if k != "retryPolicy"}
    if isinstance(node, list):
        return [_without_retry_policies(v) for v in node]
    return node


def test_the_local_pipeline_is_the_cluster_s_without_its_retry_policies():
    from fourm_kfp.pipelines.fourm_pretrain import fourm_pretrain

    cluster = json_format.MessageToDict(fourm_pretrain.pipeline_spec)
    local_spec = json_format.MessageToDict(without_step_retries(fourm_pretrain).pipeline_spec)
    retried = {name for c in cluster["components"].values() for name, task in c.get("dag", {}).get("tasks", {}).items()
               if "retryPolicy" in task}
    assert retried == {"train-tokenizers", "pretrain"}  # the job stages, for a lost launcher pod
    assert local_spec == _without_retry_policies(cluster)
    assert json_format.MessageToDict(fourm_pretrain.pipeline_spec) == cluster  # the cluster's is untouched


#: The storage deadline the run is given (FOURM_STORAGE_DEADLINE_S; the default, 60 s, is test_storage's), and how
#: soon after its S3 endpoint dies the run must have failed: that deadline from the first failed call, then the
#: step's and the run's wind-down, with room for a loaded 2-core machine (with the 60 s default: 72 and 96 s in runs
#: here, beside other test runs). That the step ran once, not retried, is read from kfp.local's log.
DEADLINE_S = 10
FAIL_WITHIN_S = DEADLINE_S + 80


def _stop(proc: subprocess.Popen) -> None:
    """Kill the run's process group (the run and its step processes) if the run is still going."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


@pytest.mark.slow
def test_a_dead_s3_endpoint_fails_a_local_run_at_its_storage_deadline_naming_it(tmp_path, monkeypatch):
    """The S3 server is killed while train-tokenizers trains: the step's next S3 call fails past the storage
    deadline (FOURM_STORAGE_DEADLINE_S), and the run ends there, not after the cluster's 3 retries with 60 s
    doubling backoff (which kept it going some 10 minutes after the kill). Nothing is half-committed, and the stage
    rerun with the server back commits on the prepare-data output the failed run committed."""
    data, port, bucket = tmp_path / "s3", free_port(), f"fail-fast-{uuid.uuid4().hex[:8]}"
    data.mkdir()
    store, summary_path = f"s3://{bucket}/runs", tmp_path / "failed-summary.json"
    training = threading.Event()
    lines: list[str] = []

    def read(stream):
        for line in stream:
            lines.append(line)
            if "train-tokenizer rgb: step" in line:
                training.set()

    with serve_s3(data, KEY, SECRET, port=port) as s3:
        for name, value in s3.env().items():
            monkeypatch.setenv(name, value)
        monkeypatch.setenv("FOURM_STORAGE_DEADLINE_S", str(DEADLINE_S))  # every step process inherits it
        # its own process group: the run and the step processes kfp.local starts can be stopped together
        proc = subprocess.Popen([CLI, "run", "--preset", "smoke", "--root", str(tmp_path / "root"), "--store", store,
                                 "--s3-endpoint", s3.endpoint, "--summary", str(summary_path)],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
        reader = threading.Thread(target=read, args=(proc.stdout,), daemon=True)
        reader.start()
        try:
            assert training.wait(timeout=400), "train-tokenizers did not start:\n" + "".join(lines)[-5000:]
        except BaseException:
            _stop(proc)
            raise
    killed = time.monotonic()  # the server is stopped on leaving the block
    try:
        returncode = proc.wait(timeout=FAIL_WITHIN_S)
    except subprocess.TimeoutExpired:
        returncode = None
    finally:
        _stop(proc)
    seconds = time.monotonic() - killed
    reader.join(timeout=10)
    output = "".join(lines)
    print(f"the run ended {seconds:.0f}s after its S3 endpoint was stopped")  # shown by pytest -rP

    assert returncode is not None, f"still running {FAIL_WITHIN_S}s after the endpoint died:\n{output[-5000:]}"
    assert returncode == 1, output[-5000:]
    # one failure of the step (no retry), and the console's line for it names the endpoint (the storage error's)
    [failure] = [line for line in lines if line.startswith("✗ train-tokenizers failed")]
    assert f"S3 endpoint {s3.endpoint}" in failure, failure
    summary = json.loads(summary_path.read_text())
    started = [line for line in Path(summary["kfp_log"]).read_text().splitlines()
               if "Executing task" in line and "'train-tokenizers'" in line]  # kfp.local's line for each attempt
    assert len(started) == 1, started
    assert [(s["name"], s["status"]) for s in summary["stages"]] == [("prepare-data", "ran"),
                                                                     ("train-tokenizers", "failed")]
    # nothing half-committed: prepare-data's output is committed; no train-tokenizers output is
    runs = data / bucket / "runs"
    assert len(list((runs / "prepare-data").glob("*/_MANIFEST.json"))) == 1
    assert not list((runs / "train-tokenizers").glob("*/_MANIFEST.json"))

    # the failed stage again with the server back: nothing the failed attempt left blocks it, and it trains on the
    # prepare-data output the failed run committed (a whole rerun's reuse of it is test_pipeline_e2e's)
    outcome_path = tmp_path / "rerun.json"
    with serve_s3(data, KEY, SECRET, port=port) as s3:
        rerun = subprocess.run([CLI, "stage", "train-tokenizers", "--preset", "smoke", "--root", str(tmp_path / "root"),
                                "--store", store, "--s3-endpoint", s3.endpoint, "--json", str(outcome_path)],
                               capture_output=True, text=True, timeout=600)
    assert rerun.returncode == 0, rerun.stdout[-5000:] + rerun.stderr[-5000:]
    outcome = json.loads(outcome_path.read_text())
    assert outcome["status"] == "ran"
    manifest = json.loads((data / bucket / outcome["output_uri"].removeprefix(f"s3://{bucket}/") / "_MANIFEST.json")
                          .read_text())
    assert [(i["name"], i["uri"]) for i in manifest["inputs"]] == [("prepare-data", summary["stages"][0]["output_uri"])]
