"""``queue_timeout_s``: a whole number of seconds, at least 1 (there is no "no limit"). 0 used to pass validation and
then fail every job at the launcher's first poll; it is now refused when the job is rendered, before anything is
created, and a limit of 1 s is what the launcher enforces (the job queued past it fails and is deleted)."""

from __future__ import annotations

import time

import pytest

from fourm_kfp.cluster.job_kinds import PYTORCHJOB, JobFailed, render_job
from fourm_kfp.cluster.job_spec import ClusterParams, JobParams, JobRequest
from fourm_kfp.config.schema import ConfigError
from tests.cluster.kube_emulator import EmulatedCluster


@pytest.fixture
def cluster():
    emulated = EmulatedCluster()
    yield emulated
    emulated.close()


def _request(queue_timeout_s, launcher: str = "pytorchjob") -> JobRequest:
    return JobRequest(launcher=launcher, stage="pretrain", address="00aa11bb22cc33dd", stage_args=["stage"],
                      image="fourm", deadline_s=7200, cluster=ClusterParams(queue_timeout_s=queue_timeout_s))


@pytest.mark.parametrize("launcher", ["pytorchjob", "trainjob"])
@pytest.mark.parametrize("value", [0, -1, True, 1.5, "3600"])
def test_a_queue_timeout_below_one_second_or_not_a_whole_number_is_refused(launcher, value):
    with pytest.raises(ConfigError, match=r"^queue_timeout_s=.*at least 1; 0 does not mean \"no limit\""):
        render_job(_request(value, launcher))


@pytest.mark.parametrize("launcher", ["pytorchjob", "trainjob"])
def test_one_second_is_accepted_and_bounds_the_job_s_own_deadline(launcher):
    job = render_job(_request(1, launcher))
    deadline = (job["spec"].get("runPolicy") or job["spec"])["activeDeadlineSeconds"]
    assert deadline == 7200 + 1


def _backend(cluster, tmp_path, queue_timeout_s, lines):
    from fourm_kfp.launchers import kubernetes_job
    from fourm_kfp.launchers.stage import RunContext, plan_launch

    run = RunContext("smoke", store_uri=str(tmp_path / "store"), tracking_uri="none")
    backend = kubernetes_job.KubernetesJob(run, JobParams(accelerator="cpu"), "fourm", api=cluster.api(),
                                           owner=kubernetes_job.Owner("v1", "Workflow", "w", "u"),
                                           cluster=ClusterParams(queue_timeout_s=queue_timeout_s), out=lines.append)
    return backend, plan_launch("pretrain", run)


def test_zero_is_refused_before_a_job_is_created(cluster, tmp_path):
    lines = []
    backend, plan = _backend(cluster, tmp_path, 0, lines)
    with pytest.raises(ConfigError, match="^queue_timeout_s=0"):
        backend.start(plan, ["stage", "pretrain"], lambda: None)
    assert cluster.admin().list(PYTORCHJOB.resource, "") == []


def test_the_launcher_gives_up_on_a_job_queued_past_queue_timeout_s(cluster, tmp_path):
    """No pod ever runs (nothing schedules them): the step fails after queue_timeout_s, not at its first poll and not
    after a day, and the job is deleted."""
    lines = []
    backend, plan = _backend(cluster, tmp_path, 1, lines)
    started = time.monotonic()
    with pytest.raises(JobFailed, match=r"waited in the queue longer than queue_s=1s") as failure:
        backend.start(plan, ["stage", "pretrain"], lambda: None)
    assert 1 <= time.monotonic() - started < 30
    assert "queue_timeout_s" in str(failure.value)
    assert cluster.admin().list(PYTORCHJOB.resource, "") == []
