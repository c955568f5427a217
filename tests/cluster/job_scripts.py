"""What the launcher tests share: a rendered job, the test's operator script on its own thread, and its moves."""

from __future__ import annotations

import threading
import time

from fourm_kfp.cluster.job_launcher import FollowSettings
from fourm_kfp.cluster.job_spec import JobRequest, Owner, render_job
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
