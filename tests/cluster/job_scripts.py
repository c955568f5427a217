"""What the launcher tests share: a rendered job, the test's operator script on its own thread, and its moves."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from fourm_kfp.cluster.job_kinds import PYTORCHJOB, render_job
from fourm_kfp.cluster.job_launcher import FollowSettings, run_job
from fourm_kfp.cluster.job_spec import JobRequest, Owner
from tests.cluster.kube_emulator import running_status

ADDRESS = "00aa11bb22cc33dd"
RUN_ID = "run-1"
FAST = FollowSettings(poll_s=0.05, grace_s=0.0, pending_every_s=3600)
MASTER_LABELS = {"training.kubeflow.org/job-name": f"fourm-pretrain-{ADDRESS}",
                 "training.kubeflow.org/replica-type": "master", "training.kubeflow.org/replica-index": "0"}


def job(launcher: str = "pytorchjob", run_id: str = RUN_ID, nodes: int = 2) -> dict:
    return render_job(JobRequest(launcher=launcher, stage="pretrain", address=ADDRESS, stage_args=["stage", "pretrain"],
                                 image="fourm", nodes=nodes, kfp_run_id=run_id,
                                 owner=Owner("argoproj.io/v1alpha1", "Workflow", "run", "uid-1")))


class Operator(threading.Thread):
    """Runs a script (the operator's and kubelet's moves) beside the launcher; errors fail the test."""

    def __init__(self, script):
        super().__init__(daemon=True)
        self.script, self.error = script, None
        self.start()

    def run(self):
        try:
            self.script()
        except BaseException as exc:  # reported by finish()
            self.error = exc

    def finish(self):
        self.join(30)
        assert self.error is None, f"operator script failed: {self.error!r}"


def wait(predicate, timeout=30):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def pod_labels(name: str, role: str, index: int) -> dict[str, str]:
    return {"training.kubeflow.org/job-name": name, "training.kubeflow.org/replica-type": role,
            "training.kubeflow.org/replica-index": str(index)}


def run_pods(cluster, name: str, nodes: int = 2) -> list[str]:
    """The operator's and the scheduler's part: every pod of the job created and running; their names."""
    pods = []
    for i in range(nodes):
        pod = f"{name}-master-0" if i == 0 else f"{name}-worker-{i - 1}"
        cluster.add_pod(pod, pod_labels(name, "master" if i == 0 else "worker", max(0, i - 1)), "pytorch")
        cluster.set_pod_status(pod, running_status("pytorch"))
        pods.append(pod)
    return pods


def launcher_lost(cluster, job: dict, retry_index: int | None = 0, said: str = "left running",
                  lines: list[str] | None = None) -> str:
    """A launcher (attempt ``retry_index`` of its step) creates the PyTorchJob ``job``, follows it until its master
    logs ``step 1/4``, and is stopped by SIGTERM (its pod deleted: a node drain, a preemption), exiting with a message
    that says ``said``; the job's uid (the job trains on). Its log lines go to ``lines``."""
    name = job["metadata"]["name"]
    pod, lines = f"{name}-master-0", [] if lines is None else lines

    def operator():
        cluster.wait_for_job(PYTORCHJOB.resource, name)
        cluster.add_pod(pod, MASTER_LABELS, "pytorch")
        cluster.set_pod_status(pod, running_status("pytorch"))
        cluster.kubelet.write(pod, "pytorch", "step 1/4")
        wait(lambda: "step 1/4" in lines)
        os.kill(os.getpid(), signal.SIGTERM)

    script = Operator(operator)
    with pytest.raises(SystemExit, match=said):
        run_job(cluster.api(), PYTORCHJOB, job, deadline_s=60, settings=FAST, out=lines.append,
                retry_index=retry_index)
    script.finish()
    return cluster.api().get(PYTORCHJOB.resource, name)["metadata"]["uid"]
