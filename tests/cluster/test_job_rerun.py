"""A launcher pod lost and not retried, against the emulated API: what the run's exit handler does with the job left
running, and how a rerun of the same configuration finds it.

KFP compiles a step's ``retryStrategy`` without a ``retryPolicy`` (kubeflow/pipelines 2.15.0-2.17.0,
``backend/src/v2/compiler/argocompiler/container.go``, ``getTaskRetryStrategyFromInput``), so Argo retries
``OnFailure`` only; a launcher pod deleted before the workflow controller saw it fail is marked ``Error`` ("pod
deleted", argo-workflows v3.7.3 ``workflow/controller/operator.go``) and not retried (the rules are emulated in
``tests/argo_retry_emulator.py``). The run then fails with its job still training:

- its exit handler (:func:`fourm_kfp.cluster.stop_jobs.delete_run_jobs`) reports the job still running and deletes
  it, unless ``<stage>_delete_job=false`` labelled it to be kept;
- a rerun (a new KFP run id, the same stage address, hence the same job name) adopts a job still running, never
  starting a second one, and replaces one that failed.

With ``ARGO_POD_STATUS_CAPTURE_FINALIZER=true`` Argo retries the lost launcher instead; at every KFP version the
retry, with the ``KFP_RETRY_INDEX`` that version gives it (none before 2.16.1), adopts the job.
"""

from __future__ import annotations

import pytest
import yaml

from fourm_kfp.cluster.job_kinds import PYTORCHJOB, render_job
from fourm_kfp.cluster.job_launcher import run_job
from fourm_kfp.cluster.job_spec import RUN_ID_LABEL, JobRequest, Owner
from fourm_kfp.cluster.stop_jobs import delete_run_jobs
from tests.cluster.job_scripts import ADDRESS, FAST, Operator, launcher_lost, wait as _wait
from tests.cluster.kube_emulator import EmulatedCluster
from tests.kfp_driver_emulator import (POD_DELETED, RETRY_INDEX_ENV, SUCCEEDS, VERSIONS, DriverEmulator, at_least,
                                       step_attempts, stub_outputs)


@pytest.fixture
def cluster():
    emulated = EmulatedCluster()
    yield emulated
    emulated.close()


def _job(run_id: str, delete_job: bool = True) -> dict:
    """The pretrain job a KFP run ``run_id`` renders for the one stage address ``ADDRESS``."""
    return render_job(JobRequest(launcher="pytorchjob", stage="pretrain", address=ADDRESS,
                                 stage_args=["stage", "pretrain"], image="fourm", nodes=1, kfp_run_id=run_id,
                                 delete_job=delete_job, owner=Owner("argoproj.io/v1alpha1", "Workflow", run_id,
                                                                    f"uid-{run_id}")))


def test_a_kept_job_left_running_is_reported_then_adopted_by_a_rerun(cluster):
    """``pretrain_delete_job=false``: the failed run's exit handler reports the job still running and keeps it; the
    rerun (another KFP run id) adopts that very job and follows it to the end, creating none."""
    first = _job("run-1", delete_job=False)
    name = first["metadata"]["name"]
    uid = launcher_lost(cluster, first)

    said: list[str] = []
    assert delete_run_jobs(cluster.api(), "run-1", out=said.append) == []
    assert any(name in line and "still running" in line and "rerun" in line and "kubectl delete" in line
               for line in said), said
    assert cluster.api().get(PYTORCHJOB.resource, name)["metadata"]["uid"] == uid

    rerun: list[str] = []

    def operator():
        _wait(lambda: "step 1/4" in rerun)  # the rerun shows the log so far: it follows the first run's job
        cluster.kubelet.write(f"{name}-master-0", "pytorch", "step 4/4")
        _wait(lambda: "step 4/4" in rerun)
        cluster.set_job_conditions(PYTORCHJOB.resource, name, ("Succeeded", "", ""))

    script = Operator(operator)
    result = run_job(cluster.api(), PYTORCHJOB, _job("run-2"), deadline_s=60, settings=FAST, out=rerun.append,
                     retry_index=0)
    script.finish()
    assert result.adopted and result.succeeded
    assert _creates(cluster) == 1  # the first run's only: the rerun started no second job
    assert cluster.api().get(PYTORCHJOB.resource, name) is None  # succeeded: the rerun deleted it


def test_a_job_left_running_is_reported_and_deleted_by_the_exit_handler(cluster):
    """``pretrain_delete_job`` true (the default): the failed run's exit handler reports the job it found still
    running and deletes it; the rerun starts a job of its own."""
    first = _job("run-1")
    name = first["metadata"]["name"]
    uid = launcher_lost(cluster, first)
    said: list[str] = []
    assert delete_run_jobs(cluster.api(), "run-1", out=said.append) == [name]
    assert any(name in line and "still running" in line and "deleted" in line for line in said), said
    assert cluster.api().get(PYTORCHJOB.resource, name) is None

    def operator():
        _wait(lambda: (cluster.api().get(PYTORCHJOB.resource, name) or {}).get("metadata", {}).get("uid")
              not in (None, uid))
        cluster.set_job_conditions(PYTORCHJOB.resource, name, ("Succeeded", "", ""))

    script = Operator(operator)
    result = run_job(cluster.api(), PYTORCHJOB, _job("run-2"), deadline_s=60, settings=FAST, out=lambda line: None,
                     retry_index=0)
    script.finish()
    assert result.succeeded and not result.adopted


@pytest.mark.parametrize("retry_index", [None, 1])
def test_a_rerun_replaces_another_run_s_failed_job(cluster, retry_index):
    """Another run's failed job spent that run's restart budget, not this one's: replaced, whatever this attempt's
    KFP_RETRY_INDEX (absent before KFP 2.16.1)."""
    kept = _job("run-1", delete_job=False)
    name = kept["metadata"]["name"]
    cluster.api().create(PYTORCHJOB.resource, kept)
    cluster.set_job_conditions(PYTORCHJOB.resource, name, ("Failed", "PyTorchJobFailed", "backoff limit"))

    def operator():
        _wait(lambda: (cluster.api().get(PYTORCHJOB.resource, name) or {}).get("metadata", {}).get("labels", {})
              .get(RUN_ID_LABEL) == "run-2")
        cluster.set_job_conditions(PYTORCHJOB.resource, name, ("Succeeded", "", ""))

    script = Operator(operator)
    result = run_job(cluster.api(), PYTORCHJOB, _job("run-2"), deadline_s=60, settings=FAST, out=lambda line: None,
                     retry_index=retry_index)
    script.finish()
    assert result.succeeded and not result.adopted
    assert _creates(cluster) == 2  # the kept failed job (made by the test) and the rerun's own


def _creates(cluster) -> int:
    """How many PyTorchJob creates the API server received."""
    return sum(1 for info, _ in cluster.requests() if info.verb == "create" and info.resource == "pytorchjobs")


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    from fourm_kfp.pipeline_runs.compile import compile_pipeline

    spec, platform = yaml.safe_load_all(compile_pipeline(tmp_path_factory.mktemp("p") / "p.yaml").read_text())
    return spec, platform


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("finalizer", [True, False])
def test_the_pretrain_step_s_lost_launcher_at_every_version(cluster, compiled, monkeypatch, version, finalizer):
    """The pretrain step as each version compiles it (retries, KFP_RETRY_INDEX): its launcher pod is deleted while
    the job trains. Under the finalizer Argo retries it, and the retry adopts the job with whatever KFP_RETRY_INDEX
    the version sets; without it the step is not retried, and the exit handler deletes the job it reports."""
    from fourm_kfp.launchers.kfp_placement import pod_placement

    spec, platform = compiled
    outputs = stub_outputs(spec, components={"comp-pod-placement": pod_placement})
    run = DriverEmulator(spec, platform, outputs, version).run({"image_pull_secret": "pull"})
    [pod] = [p for p in run.pods if p.task == "exit-handler-1/pretrain"]
    attempts = step_attempts(pod, [POD_DELETED, SUCCEEDS], finalizer)
    job = _job("run-1")
    name = job["metadata"]["name"]

    def attempt_env(attempt) -> None:
        if attempt.retry_index_env is None:
            monkeypatch.delenv("KFP_RETRY_INDEX", raising=False)
        else:
            monkeypatch.setenv("KFP_RETRY_INDEX", attempt.retry_index_env)

    attempt_env(attempts.attempts[0])
    uid = launcher_lost(cluster, job, retry_index=None)
    if not finalizer:
        assert not attempts.succeeded and attempts.attempts[0].message == "pod deleted"
        said: list[str] = []
        assert delete_run_jobs(cluster.api(), "run-1", out=said.append) == [name]
        assert any("still running" in line for line in said)
        return
    retry = attempts.attempts[1]
    assert retry.retry_index_env == ("1" if at_least(version, RETRY_INDEX_ENV) else None)  # {{retries}} from 2.16.1
    attempt_env(retry)

    def operator():
        assert cluster.api().get(PYTORCHJOB.resource, name)["metadata"]["uid"] == uid
        cluster.set_job_conditions(PYTORCHJOB.resource, name, ("Succeeded", "", ""))

    script = Operator(operator)
    result = run_job(cluster.api(), PYTORCHJOB, _job("run-1"), deadline_s=60, settings=FAST, out=lambda line: None)
    script.finish()
    assert result.adopted and result.succeeded and _creates(cluster) == 1
