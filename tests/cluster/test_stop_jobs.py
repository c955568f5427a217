"""The exit handler's clean-up (:mod:`fourm_kfp.cluster.stop_jobs`) against the emulated API: a run's unfinished jobs of
both kinds and its failed ones (the launcher keeps those for the step's retry) are deleted by their run-id label, a
job still running reported; another run's jobs and a job labelled to be kept (``<stage>_delete_job=false``) stay,
one still running reported with the command that stops it; outside a pod (kfp.local) nothing is touched and nothing
fails."""

from __future__ import annotations

import pytest

from fourm_kfp.cluster.job_kinds import PYTORCHJOB, TRAINJOB, render_job
from fourm_kfp.cluster.job_spec import JobRequest
from fourm_kfp.cluster.job_spec import KEEP_LABEL
from fourm_kfp.cluster.stop_jobs import delete_run_jobs, stop_run_jobs
from tests.cluster.kube_emulator import EmulatedCluster


@pytest.fixture
def cluster():
    emulated = EmulatedCluster()
    yield emulated
    emulated.close()


def _create(cluster, launcher: str, stage: str, address: str, run_id: str, keep: bool = False) -> str:
    job = render_job(JobRequest(launcher=launcher, stage=stage, address=address, stage_args=["stage", stage],
                                image="fourm", nodes=2, kfp_run_id=run_id))
    if keep:  # <stage>_delete_job=false
        job["metadata"]["labels"][KEEP_LABEL] = "true"
    cluster.api().create(PYTORCHJOB.resource if launcher == "pytorchjob" else TRAINJOB.resource, job)
    return job["metadata"]["name"]


def test_a_run_s_leftover_jobs_are_deleted_and_nothing_else(cluster):
    running_pt = _create(cluster, "pytorchjob", "pretrain", "aaaa", "run-1")
    running_tj = _create(cluster, "trainjob", "train-tokenizers", "bbbb", "run-1")
    kept = _create(cluster, "pytorchjob", "train-tokenizers", "cccc", "run-1", keep=True)
    cluster.set_job_conditions(PYTORCHJOB.resource, kept, ("Succeeded", "", ""))
    kept_failed = _create(cluster, "trainjob", "pretrain", "eeee", "run-1", keep=True)
    cluster.set_job_conditions(TRAINJOB.resource, kept_failed, ("Failed", "", ""))
    failed = _create(cluster, "pytorchjob", "pretrain", "ffff", "run-1")  # kept by its launcher for a step retry
    cluster.set_job_conditions(PYTORCHJOB.resource, failed, ("Failed", "PyTorchJobFailed", "backoff limit"))
    other = _create(cluster, "pytorchjob", "pretrain", "dddd", "run-2")
    kept_running = _create(cluster, "pytorchjob", "pretrain", "abab", "run-1", keep=True)
    lines = []
    deleted = delete_run_jobs(cluster.api(), "run-1", out=lines.append)
    assert sorted(deleted) == sorted([running_pt, running_tj, failed])
    api = cluster.api()
    assert api.get(PYTORCHJOB.resource, running_pt) is None and api.get(TRAINJOB.resource, running_tj) is None
    assert api.get(PYTORCHJOB.resource, failed) is None
    assert api.get(PYTORCHJOB.resource, kept) is not None and api.get(TRAINJOB.resource, kept_failed) is not None
    assert api.get(PYTORCHJOB.resource, other) is not None and api.get(PYTORCHJOB.resource, kept_running) is not None
    assert any(running_pt in line and "run-1" in line and "still running" in line for line in lines)
    assert [line for line in lines if kept_running in line] == [
        f"[exit handler] PyTorchJob {kept_running} (stage pretrain) is still running after KFP run run-1 ended, and is "
        "kept (delete_job=false): a rerun of the same configuration adopts it; to stop it: `kubectl delete "
        f"pytorchjobs.kubeflow.org {kept_running} -n fourm`"]
    assert any(failed in line and "failed" in line for line in lines)
    assert delete_run_jobs(cluster.api(), "", out=lines.append) == []  # no run id: never "every job"


def test_outside_a_pod_there_is_nothing_to_stop(monkeypatch):
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    lines = []
    assert stop_run_jobs("run-1", out=lines.append) == []
    assert lines == ["[exit handler] not in a Kubernetes pod: no cluster jobs to stop"]


def test_the_exit_handler_component_stops_the_run_s_jobs_then_closes_the_lineage(monkeypatch):
    """close_lineage_run (the pipeline's exit handler) deletes the jobs even when closing the lineage fails."""
    import fourm_kfp.cluster.stop_jobs as stop_jobs
    import fourm_kfp.launchers.kfp_lineage as kfp_lineage
    from components.lineage import close_lineage_run

    calls = []
    monkeypatch.setattr(stop_jobs, "stop_run_jobs", lambda run_id, out=print: calls.append(("stop", run_id)))

    def close(*args):
        calls.append(("close", args[1]))
        raise RuntimeError("tracking server down")

    monkeypatch.setattr(kfp_lineage, "close_lineage_step", close)

    class Status:
        state = "CANCELLED"

    with pytest.raises(RuntimeError, match="tracking server down"):
        close_lineage_run.python_func(run_label="", kfp_run_id="run-1", mlflow_tracking_uri="",
                                      mlflow_parent_run_id="", status=Status())
    assert calls == [("stop", "run-1"), ("close", "run-1")]
