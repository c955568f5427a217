"""The launcher's create → follow → succeed / fail / time out / adopt / conflict / delete paths, against an
in-memory Kubernetes API reached over HTTP by the real ``kubernetes`` client (``kube_emulator``: what it does not
emulate is listed there). The test plays the operator, the schedulers and the kubelet from a second thread (their
events as their recorders write them: uids, times, repeats); the launcher watches and follows the log. Also: a
queued job (Volcano's PodGroup, Kueue) waits, a previous job of the same name's events do not count, refusals and
images that cannot be pulled fail fast, SIGTERM leaves the job to the step's retry, a failed job is replaced only by
a first attempt of the step (KFP_RETRY_INDEX=0) and reported otherwise, and the job's owner is the run's Argo
Workflow. API failures, the queue's clock, watches and the Role: test_job_follow.py.

The last test runs the whole pretrain step in job mode: plan (nothing is created when the output is committed),
render, create; the "operator" runs the rendered container command for real (one node, smoke), feeds its output
to the master pod's log and sets the job's conditions from its exit status; the launcher reports the committed
output."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from fourm_kfp.cluster.job_kinds import JOB_KINDS, PYTORCHJOB, TRAINJOB, JobFailed
from fourm_kfp.cluster.job_launcher import FollowSettings, run_job
from fourm_kfp.cluster.job_spec import ADDRESS_LABEL, KEEP_LABEL, RUN_ID_LABEL
from fourm_kfp.cluster.kube import JobConflict
from fourm_kfp.cluster.log_follower import parse_timestamp
from fourm_kfp.distributed import free_port
from fourm_kfp.launchers.stage import RunContext
from tests.cluster.job_scripts import FAST, MASTER_LABELS, RUN_ID, Operator, job as _job, pod_labels as _pod_labels
from tests.cluster.job_scripts import launcher_lost, run_pods as _run_pods, wait as _wait
from tests.cluster.kube_emulator import EmulatedCluster, TrainingOperatorV1, running_status

@pytest.fixture
def cluster():
    emulated = EmulatedCluster()
    yield emulated
    emulated.close()


def test_timestamps_of_any_precision_order_correctly():
    assert parse_timestamp("2026-11-23T10:00:00.5Z") > parse_timestamp("2026-11-23T10:00:00.123456789Z")
    assert parse_timestamp("2026-11-23T10:00:01Z") - parse_timestamp("2026-11-23T10:00:00.999999999Z") == 1


def test_create_follow_succeed_delete(cluster):
    job = _job()
    name = job["metadata"]["name"]
    lines = []
    kubelet = cluster.kubelet

    def operator():
        created = cluster.wait_for_job(PYTORCHJOB.resource, name)
        assert created["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
        cluster.set_job_conditions(PYTORCHJOB.resource, name, ("Created", "PyTorchJobCreated", "created"))
        cluster.add_pod(f"{name}-master-0", MASTER_LABELS, "pytorch", conditions=[
            {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
             "message": "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."}])
        _wait(lambda: any("Insufficient nvidia.com/gpu" in line for line in lines))
        cluster.set_pod_status(f"{name}-master-0", running_status("pytorch"))
        kubelet.write(f"{name}-master-0", "pytorch", *[f"step {i}/20 loss {9 - i * 0.1:.2f}" for i in range(10)])
        _wait(lambda: "step 9/20 loss 8.10" in lines)
        kubelet.fail_next = 2  # the log stream dropped, the next two reads failing: nothing may be lost or repeated
        kubelet.write(f"{name}-master-0", "pytorch", *[f"step {i}/20 loss {9 - i * 0.1:.2f}" for i in range(10, 15)])
        cluster.drop_streams()
        kubelet.write(f"{name}-master-0", "pytorch", *[f"step {i}/20 loss {9 - i * 0.1:.2f}" for i in range(15, 20)])
        _wait(lambda: kubelet.fail_next == 0)
        _wait(lambda: "step 19/20 loss 7.10" in lines)
        kubelet.write(f"{name}-master-0", "pytorch", "pretrain: committed")
        cluster.set_job_conditions(PYTORCHJOB.resource, name, ("Created", "", ""), ("Running", "", ""),
                                   ("Succeeded", "PyTorchJobSucceeded", "PyTorchJob succeeded"))

    script = Operator(operator)
    result = run_job(cluster.api(), PYTORCHJOB, job, deadline_s=60, settings=FAST, out=lines.append)
    script.finish()
    assert result.succeeded and not result.adopted
    steps = [line for line in lines if line.startswith("step ")]
    assert steps == [f"step {i}/20 loss {9 - i * 0.1:.2f}" for i in range(20)]  # each line once, in order
    assert "pretrain: committed" in lines
    pending = [line for line in lines if "pending" in line]
    assert pending and "Unschedulable" in pending[0] and "Insufficient nvidia.com/gpu" in pending[0]
    assert cluster.api().get(PYTORCHJOB.resource, name) is None  # deleted when done
    assert lines[-1] == f"[launcher] deleted PyTorchJob {name}"


def test_a_crash_loop_then_failure_raises_with_conditions_and_last_lines(cluster):
    job = _job()
    name = job["metadata"]["name"]
    pod = f"{name}-master-0"
    lines = []

    def operator():
        cluster.wait_for_job(PYTORCHJOB.resource, name)
        cluster.add_pod(pod, MASTER_LABELS, "pytorch", phase="Running")
        cluster.set_pod_status(pod, running_status("pytorch"))
        cluster.kubelet.write(pod, "pytorch", "step 1/20", "step 2/20")
        _wait(lambda: "step 2/20" in lines)
        cluster.kubelet.write(pod, "pytorch", "RuntimeError: CUDA out of memory")  # unread when it dies
        cluster.kubelet.restart(pod, "pytorch")
        cluster.set_pod_status(pod, running_status("pytorch", restarts=1, last_exit={"exitCode": 137,
                                                                                     "reason": "OOMKilled"}))
        cluster.kubelet.write(pod, "pytorch", "resuming from step-00000000", "RuntimeError: CUDA out of memory")
        _wait(lambda: "resuming from step-00000000" in lines)
        cluster.set_job_conditions(PYTORCHJOB.resource, name, ("Failed", "PyTorchJobFailed",
                                                               "job has reached the specified backoff limit"))

    script = Operator(operator)
    with pytest.raises(JobFailed) as failure:
        run_job(cluster.api(), PYTORCHJOB, job, deadline_s=60, settings=FAST, out=lines.append)
    script.finish()
    message = str(failure.value)
    assert "backoff limit" in message and "PyTorchJobFailed" in message
    assert "RuntimeError: CUDA out of memory" in message  # the last log lines travel with the error
    assert lines.count("RuntimeError: CUDA out of memory") == 2  # the crashed container's last line too
    restarted = [line for line in lines if "ended (restart" in line]
    assert restarted and "137" in restarted[0] and "OOMKilled" in restarted[0]
    assert lines.index("RuntimeError: CUDA out of memory") < lines.index(restarted[0])
    assert cluster.api().get(PYTORCHJOB.resource, name) is not None  # kept: a retry of the step reports it
    assert any(f"kept the failed PyTorchJob {name}" in line for line in lines)


def test_a_multi_node_job_survives_its_restart_budget_of_whole_job_crashes(cluster):
    """The operator sums restarts over all pods, and one crash restarts every node: a 4-node job must survive
    RESTARTS crashes (each resuming from its checkpoint), as a 1-node job does; the next crash fails it."""
    from fourm_kfp.cluster.job_spec import RESTARTS

    nodes = 4
    job = _job(nodes=nodes)
    name = job["metadata"]["name"]
    pods = [f"{name}-master-0", *(f"{name}-worker-{i}" for i in range(nodes - 1))]
    controller = TrainingOperatorV1(cluster, PYTORCHJOB.resource, name)
    lines, survived = [], []

    def operator():
        cluster.wait_for_job(PYTORCHJOB.resource, name)
        for i, pod in enumerate(pods):
            cluster.add_pod(pod, _pod_labels(name, "master" if i == 0 else "worker", max(0, i - 1)), "pytorch")
            cluster.set_pod_status(pod, running_status("pytorch"))
        for crash in range(1, RESTARTS + 2):  # a node is lost: every node's container restarts once
            for pod in pods:
                cluster.kubelet.restart(pod, "pytorch")
                cluster.set_pod_status(pod, running_status("pytorch", restarts=crash, last_exit={
                    "exitCode": 1, "reason": "Error", "finishedAt": f"2026-11-25T10:00:0{crash}Z"}))
            cluster.kubelet.write(pods[0], "pytorch", f"resumed after crash {crash}")
            if controller.reconcile():
                return
            survived.append(crash)

    script = Operator(operator)
    with pytest.raises(JobFailed, match="backoff limit"):
        run_job(cluster.api(), PYTORCHJOB, job, deadline_s=60, settings=FAST, out=lines.append)
    script.finish()
    assert survived == list(range(1, RESTARTS + 1))  # the configured crashes were survived, the next one was not


def _crashed_status(container: str, restarts: int, finished: str) -> dict:
    """A container in CrashLoopBackOff after a crash: waiting, with the crashed instance as its last state."""
    status = running_status(container, restarts, last_exit={"exitCode": 1, "reason": "Error", "finishedAt": finished,
                                                            "containerID": f"containerd://{restarts}"})
    status["containerStatuses"][0]["state"] = {"waiting": {"reason": "CrashLoopBackOff"}}
    return status


def test_a_crash_seen_first_after_it_happened_is_read_before_the_operator_deletes_the_pod(cluster):
    """A pod that crashed before the launcher first saw it (a start-up error, an adopted job): its restart count never
    rises under the launcher's eyes, and the operator deletes the pod before it writes Failed. The traceback must be
    read from the crashed instance while the pod is still listed (its termination grace period)."""
    job = _job(nodes=1)
    name = job["metadata"]["name"]
    pod = f"{name}-master-0"
    controller = TrainingOperatorV1(cluster, PYTORCHJOB.resource, name)
    lines = []

    def operator():
        cluster.wait_for_job(PYTORCHJOB.resource, name)
        cluster.add_pod(pod, MASTER_LABELS, "pytorch", phase="Running")
        cluster.kubelet.write(pod, "pytorch", "Traceback (most recent call last):",
                              "KeyError: 'caption' in shard 00017")
        cluster.kubelet.restart(pod, "pytorch")
        cluster.set_pod_status(pod, _crashed_status("pytorch", 1, "2026-11-25T10:00:01Z"))
        time.sleep(0.5)  # the pods' termination grace period: still listed, ten of the launcher's polls
        controller.fail(f"PyTorchJob {name} has failed because it was active longer than specified deadline")

    script = Operator(operator)
    with pytest.raises(JobFailed) as failure:
        run_job(cluster.api(), PYTORCHJOB, job, deadline_s=60, settings=FAST, out=lines.append)
    script.finish()
    assert "KeyError: 'caption' in shard 00017" in lines  # in the step's log
    assert "KeyError: 'caption' in shard 00017" in str(failure.value)  # and in the error
    assert lines.count("KeyError: 'caption' in shard 00017") == 1


def test_a_worker_s_crash_reaches_the_step_s_log_and_error(cluster):
    """A worker hits the error, the master only sees its peer vanish; both restart until the operator fails the job
    (summed restarts, pods deleted before Failed). The worker's traceback is what the user needs."""
    job = _job(nodes=2)
    name = job["metadata"]["name"]
    master, worker = f"{name}-master-0", f"{name}-worker-0"
    controller = TrainingOperatorV1(cluster, PYTORCHJOB.resource, name)
    lines = []

    def operator():
        cluster.wait_for_job(PYTORCHJOB.resource, name)
        cluster.add_pod(master, MASTER_LABELS, "pytorch", phase="Running")
        cluster.add_pod(worker, _pod_labels(name, "worker", 0), "pytorch", phase="Running")
        for crash in range(1, 10):
            for pod, error in ((worker, f"ValueError: shard 00042 is truncated (crash {crash})"),
                               (master, "torch.distributed.DistNetworkError: connection reset by peer")):
                cluster.kubelet.write(pod, "pytorch", "step 3/20", error)
                cluster.kubelet.restart(pod, "pytorch")
                cluster.set_pod_status(pod, running_status("pytorch", restarts=crash, last_exit={
                    "exitCode": 1, "reason": "Error", "finishedAt": f"2026-11-25T10:00:0{crash}Z"}))
            time.sleep(0.3)  # the kubelet's restart back-off; the last time the pods' grace period
            if controller.reconcile():
                return

    script = Operator(operator)
    with pytest.raises(JobFailed, match="backoff limit") as failure:
        run_job(cluster.api(), PYTORCHJOB, job, deadline_s=60, settings=FAST, out=lines.append)
    script.finish()
    last = "ValueError: shard 00042 is truncated (crash 4)"  # 4 crashes x 2 pods reach the limit of 7
    assert f"  {worker} | {last}" in lines
    assert last in str(failure.value) and f"{worker}'s crashed container" in str(failure.value)
    assert "torch.distributed.DistNetworkError: connection reset by peer" in lines  # the master's own lines too


@pytest.mark.parametrize("launcher", ["pytorchjob", "trainjob"])
def test_a_field_the_installed_crd_does_not_know_fails_the_create_and_names_it(cluster, launcher):
    """Trainer v2.1's TrainJob has no runtimePatches: by default the API server would drop them (and the
    tolerations, volumes and deadline in them) without a word. Created with fieldValidation=Strict, it fails."""
    from fourm_kfp.errors import UserError

    job = _job(launcher)
    job["spec"]["fromANewerTemplate"] = True  # a field the served CRD lacks
    kind = JOB_KINDS[launcher]
    with pytest.raises(UserError, match='strict decoding error: unknown field "spec.fromANewerTemplate".*Trainer'):
        run_job(cluster.api(), kind, job, deadline_s=0.3, settings=FAST, out=lambda line: None)
    assert cluster.api().get(kind.resource, job["metadata"]["name"]) is None


def test_the_emulated_server_prunes_unknown_fields_unless_told_strict(cluster):
    """What the API server does by default (Warn): the unknown field is dropped and the create succeeds."""
    job = _job("trainjob")
    job["spec"]["fromANewerTemplate"] = True
    created = cluster.api().custom.create_namespaced_custom_object("trainer.kubeflow.org", "v1alpha1", "fourm",
                                                                   "trainjobs", job)
    assert "fromANewerTemplate" not in created["spec"] and created["spec"]["runtimePatches"]


def test_a_job_that_outlives_its_deadline_fails_and_is_deleted(cluster):
    job = _job()
    name = job["metadata"]["name"]
    script = Operator(lambda: (cluster.wait_for_job(PYTORCHJOB.resource, name), _run_pods(cluster, name)))
    with pytest.raises(JobFailed, match="did not finish within its deadline of 1s"):
        run_job(cluster.api(), PYTORCHJOB, job, deadline_s=1, settings=FAST, out=lambda line: None)
    script.finish()
    assert cluster.api().get(PYTORCHJOB.resource, name) is None


def test_no_pods_says_the_operator_has_not_made_them(cluster):
    job = _job()
    lines = []
    with pytest.raises(JobFailed, match="waited in the queue"):
        run_job(cluster.api(), PYTORCHJOB, job, deadline_s=60, settings=replace(FAST, queue_s=0.3),
                out=lines.append)
    assert any("waiting for the operator to create pods" in line for line in lines)


#: How each controller reports a pod it could not create: the Training Operator v1 on the PyTorchJob
#: (``pod_control.go``: reason FailedCreatePod), the Job controller on the Job a TrainJob's JobSet made
#: (``controller_utils.go``: reason FailedCreate); both write "Error creating: <the API server's error>".
REFUSED_ON = {"pytorchjob": lambda name: ("PyTorchJob", name, "FailedCreatePod"),
              "trainjob": lambda name: ("Job", f"{name}-node-0", "FailedCreate")}
REFUSALS = {
    "quota": lambda pod: (f'pods "{pod}" is forbidden: exceeded quota: gpu-quota, requested: '
                          "requests.nvidia.com/gpu=8, used: requests.nvidia.com/gpu=16, limited: "
                          "requests.nvidia.com/gpu=16"),
    "webhook": lambda pod: ('admission webhook "validate.kyverno.svc-fail" denied the request: policy Pod/fourm/'
                            f"{pod} for resource violation: require-team-label: the label team is required"),
}
REFUSING = FollowSettings(poll_s=0.05, grace_s=0.0, pending_every_s=3600, no_pods_s=0.5)


@pytest.mark.parametrize("refusal", sorted(REFUSALS))
@pytest.mark.parametrize("launcher", ["pytorchjob", "trainjob"])
def test_pods_the_cluster_refuses_fail_fast_with_the_events_message(cluster, launcher, refusal):
    """A quota or an admission webhook refuses the pods: the only trace is a Warning event on the job (PyTorchJob)
    or on the Job its JobSet made (TrainJob). The launcher reports it and fails, instead of waiting to its deadline."""
    job = _job(launcher)
    name = job["metadata"]["name"]
    kind = JOB_KINDS[launcher]
    refused = REFUSALS[refusal](f"{name}-master-0")
    about, about_name, reason = REFUSED_ON[launcher](name)

    def operator():
        cluster.wait_for_job(kind.resource, name)
        cluster.add_event("Pod", "someone-elses-pod", "FailedScheduling", "not about this job")
        cluster.add_event(about, about_name, "Created", "normal news", type_="Normal")
        cluster.add_event(about, about_name, reason, f"Error creating: {refused}")

    script = Operator(operator)
    lines = []
    started = time.monotonic()
    with pytest.raises(JobFailed) as failure:
        run_job(cluster.api(), kind, job, deadline_s=30, settings=REFUSING, out=lines.append)
    script.finish()
    assert time.monotonic() - started < 10  # not the deadline
    message = str(failure.value)
    assert "has no pods after" in message and refused in message and reason in message
    assert "someone-elses-pod" not in message and "normal news" not in message
    assert any(refused in line for line in lines)  # said while waiting, too
    assert cluster.api().get(kind.resource, name) is None  # given up on, not failed: nothing for a retry to adopt


def test_a_refused_worker_fails_fast_though_the_master_runs(cluster):
    """The quota lets the master in and refuses the worker: the job can never start, though it has a pod."""
    job = _job(nodes=2)
    name = job["metadata"]["name"]
    refused = REFUSALS["quota"](f"{name}-worker-0")

    def operator():
        cluster.wait_for_job(PYTORCHJOB.resource, name)
        cluster.add_pod(f"{name}-master-0", MASTER_LABELS, "pytorch", phase="Running")
        cluster.set_pod_status(f"{name}-master-0", running_status("pytorch"))
        cluster.add_event("PyTorchJob", name, "FailedCreatePod", f"Error creating: {refused}")

    script = Operator(operator)
    started = time.monotonic()
    with pytest.raises(JobFailed) as failure:
        run_job(cluster.api(), PYTORCHJOB, job, deadline_s=30, settings=REFUSING, out=lambda line: None)
    script.finish()
    assert time.monotonic() - started < 10
    assert "has 1 of 2 pods after" in str(failure.value) and refused in str(failure.value)


#: A queue, not a refusal. Volcano (``pkg/scheduler/cache/cache.go``, RecordJobStatusEvent; client-go's ``record``
#: recorder): a Warning "Unschedulable" on the PodGroup, which the Training Operator names after the job, every
#: scheduling cycle while the gang does not fit; the operator makes no pod meanwhile. Kueue (``pkg/scheduler``;
#: the ``events.k8s.io`` recorder): the job suspended and a Warning "Pending" on its Workload
#: (``<kind>-<job>-<hash>``) each time it is not admitted.
QUEUES = {
    "volcano": ("PodGroup", lambda name: name, "Unschedulable", "record", "volcano",
                "2/2 tasks in gang unschedulable: pod group is not ready, 2 Pending, 2 minAvailable; Pending: 2 "
                "Unschedulable"),
    "kueue": ("Workload", lambda name: f"pytorchjob-{name}-3c7a1", "Pending", "events", "kueue-admission",
              "couldn't assign flavors to pod set master: insufficient quota for nvidia.com/gpu in flavor "
              "default-flavor, previously considered podsets requests (0) + current podset request (8) > maximum "
              "capacity (4)"),
}


@pytest.mark.parametrize("queue", sorted(QUEUES))
def test_a_queued_job_waits_past_no_pods_s_says_why_and_runs_when_admitted(cluster, queue):
    """A multi-node job waits for GPUs longer than no_pods_s, with Warning events about its PodGroup / Workload all
    along: it keeps waiting, the step's log says why, and it is followed to success when its pods come."""
    job = _job(nodes=2)
    name = job["metadata"]["name"]
    about, object_name, reason, recorder, component, message = QUEUES[queue]
    lines = []

    def operator():
        cluster.wait_for_job(PYTORCHJOB.resource, name)
        if queue == "kueue":
            cluster.set_job_conditions(PYTORCHJOB.resource, name, ("Created", "PyTorchJobCreated", "created"),
                                       ("Suspended", "PyTorchJobSuspended", f"PyTorchJob {name} is suspended."))
        event = cluster.add_event(about, object_name(name), reason, message, recorder=recorder, component=component)
        until = time.monotonic() + 4 * REFUSING.no_pods_s
        while time.monotonic() < until:  # one event per scheduling cycle, aggregated by the recorder
            time.sleep(0.1)
            cluster.repeat_event(event)
        cluster.set_job_conditions(PYTORCHJOB.resource, name, ("Created", "", ""), ("Running", "", ""))
        for i, pod in enumerate((f"{name}-master-0", f"{name}-worker-0")):
            cluster.add_pod(pod, _pod_labels(name, "master" if i == 0 else "worker", 0), "pytorch")
            cluster.set_pod_status(pod, running_status("pytorch"))
        cluster.kubelet.write(f"{name}-master-0", "pytorch", "step 1/2 after the queue")
        _wait(lambda: "step 1/2 after the queue" in lines)
        cluster.set_job_conditions(PYTORCHJOB.resource, name, ("Succeeded", "", ""))

    script = Operator(operator)
    result = run_job(cluster.api(), PYTORCHJOB, job, deadline_s=60, settings=REFUSING, out=lines.append)
    script.finish()
    assert result.succeeded
    queued = [line for line in lines if "queued" in line]
    assert queued and f"{reason} ({about} {object_name(name)}): {message}" in queued[0], lines


def test_a_previous_job_of_the_same_name_s_events_do_not_fail_this_one(cluster):
    """Job names are fixed per address and events live an hour: the last attempt's refusals (an event on a
    PyTorchJob of this name but another uid, one on its pods, all older than this job) are not this job's."""
    job = _job()
    name = job["metadata"]["name"]
    an_hour_ago = time.time() - 3000
    old = REFUSALS["quota"](f"{name}-master-0")
    cluster.add_event("PyTorchJob", name, "FailedCreatePod", f"Error creating: {old}", uid="3b0c1f7e-old-job",
                      at=an_hour_ago)
    cluster.add_event("PodGroup", name, "Unschedulable", "1/1 tasks in gang unschedulable (old)",
                      uid="9a41-old-podgroup", at=an_hour_ago)
    cluster.add_event("Job", f"{name}-node-0", "FailedCreate", f"Error creating: {old}", uid="77d2-old-job",
                      at=an_hour_ago)
    lines = []

    def operator():
        cluster.wait_for_job(PYTORCHJOB.resource, name)
        time.sleep(4 * REFUSING.no_pods_s)  # no pods for longer than no_pods_s
        cluster.add_pod(f"{name}-master-0", MASTER_LABELS, "pytorch")
        cluster.set_pod_status(f"{name}-master-0", running_status("pytorch"))
        cluster.set_job_conditions(PYTORCHJOB.resource, name, ("Succeeded", "", ""))

    script = Operator(operator)
    result = run_job(cluster.api(), PYTORCHJOB, job, deadline_s=60, settings=REFUSING, out=lines.append)
    script.finish()
    assert result.succeeded
    assert not any("exceeded quota" in line or "(old)" in line for line in lines)


PULL_IMAGE = "ghcr.io/example/fourm-kfp:0.9.1"
PULL_ERROR = (f'failed to pull and unpack image "{PULL_IMAGE}": failed to resolve reference "{PULL_IMAGE}": failed to '
              "authorize: failed to fetch anonymous token: unexpected status from GET request to "
              "https://ghcr.io/token?scope=repository%3Aexample%2Ffourm-kfp%3Apull&service=ghcr.io: 401 Unauthorized")


def _pulling(container: str, reason: str, message: str) -> dict:
    """A pod scheduled on a node whose kubelet cannot pull the container's image (ErrImagePull, then back-off)."""
    return {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "True"}],
            "containerStatuses": [{"name": container, "image": PULL_IMAGE, "imageID": "", "ready": False,
                                   "restartCount": 0, "state": {"waiting": {"reason": reason, "message": message}}}]}


def test_an_image_that_cannot_be_pulled_fails_with_the_image_the_pod_and_the_fix(cluster):
    """ErrImagePull / ImagePullBackOff would wait out the job's 3-day deadline: past image_pull_s the launcher fails
    and names the pod, the image, the kubelet's error, and (unauthorized) the pipeline parameter that fixes it."""
    job = _job()
    name = job["metadata"]["name"]
    pod = f"{name}-master-0"
    settings = FollowSettings(poll_s=0.05, grace_s=0.0, pending_every_s=3600, image_pull_s=0.5)
    lines = []

    def operator():
        cluster.wait_for_job(PYTORCHJOB.resource, name)
        cluster.add_pod(pod, MASTER_LABELS, "pytorch", image=PULL_IMAGE)
        cluster.set_pod_status(pod, _pulling("pytorch", "ErrImagePull", PULL_ERROR))
        cluster.add_event("Pod", pod, "Failed", f'Failed to pull image "{PULL_IMAGE}": {PULL_ERROR}',
                          component="kubelet")
        time.sleep(0.2)
        cluster.set_pod_status(pod, _pulling("pytorch", "ImagePullBackOff", f'Back-off pulling image "{PULL_IMAGE}"'))

    script = Operator(operator)
    started = time.monotonic()
    with pytest.raises(JobFailed) as failure:
        run_job(cluster.api(), PYTORCHJOB, job, deadline_s=30, settings=settings, out=lines.append)
    script.finish()
    assert time.monotonic() - started < 10  # not the deadline
    message = str(failure.value)
    assert pod in message and PULL_IMAGE in message and "401 Unauthorized" in message
    assert "image_pull_secret" in message
    assert cluster.api().get(PYTORCHJOB.resource, name) is None  # given up on: deleted


def test_an_image_pull_that_recovers_in_time_is_only_reported(cluster):
    job = _job()
    name = job["metadata"]["name"]
    pod = f"{name}-master-0"
    settings = FollowSettings(poll_s=0.05, grace_s=0.0, pending_every_s=3600, image_pull_s=0.6)
    lines = []

    def operator():
        cluster.wait_for_job(PYTORCHJOB.resource, name)
        cluster.add_pod(pod, MASTER_LABELS, "pytorch", image=PULL_IMAGE)
        cluster.set_pod_status(pod, _pulling("pytorch", "ErrImagePull", "i/o timeout"))
        time.sleep(0.3)
        cluster.set_pod_status(pod, running_status("pytorch"))
        time.sleep(0.5)  # past image_pull_s since the first error: the pull succeeded in between
        cluster.set_job_conditions(PYTORCHJOB.resource, name, ("Succeeded", "", ""))

    script = Operator(operator)
    assert run_job(cluster.api(), PYTORCHJOB, job, deadline_s=30, settings=settings, out=lines.append).succeeded
    script.finish()
    assert any("ErrImagePull" in line for line in lines)


def test_a_restarted_launcher_adopts_its_own_running_job(cluster):
    job = _job()
    name = job["metadata"]["name"]
    first = {**job, "metadata": {**job["metadata"], "annotations": {"created-by": "first launcher attempt"}}}
    cluster.api().create(PYTORCHJOB.resource, first)

    def operator():
        cluster.add_pod(f"{name}-master-0", MASTER_LABELS, "pytorch")
        cluster.set_pod_status(f"{name}-master-0", running_status("pytorch"))
        cluster.kubelet.write(f"{name}-master-0", "pytorch", "step 7/20 (before the launcher restarted)")
        time.sleep(0.3)
        cluster.set_job_conditions(PYTORCHJOB.resource, name, ("Succeeded", "", ""))

    script = Operator(operator)
    lines = []
    result = run_job(cluster.api(), PYTORCHJOB, job, deadline_s=60, settings=FAST, out=lines.append)
    script.finish()
    assert result.adopted and result.succeeded
    assert "step 7/20 (before the launcher restarted)" in lines  # the log so far is shown on adoption
    assert cluster.api().get(PYTORCHJOB.resource, name) is None


@pytest.mark.parametrize("retry_index", [None, "0", "1"])
def test_an_own_failed_job_is_replaced_only_by_a_first_attempt(cluster, monkeypatch, retry_index):
    """KFP_RETRY_INDEX=0 (the step's first attempt, e.g. a run retried by hand) replaces its run's failed job: a fresh
    restart budget, resuming from the newest checkpoint. A retry of the step (1: Argo's {{retries}}) reports the
    failure instead of multiplying the budget, and so does an attempt without KFP_RETRY_INDEX (KFP before 2.16.1
    does not set it: a retry cannot be told from a first attempt), naming the command that deletes the job."""
    if retry_index is None:
        monkeypatch.delenv("KFP_RETRY_INDEX", raising=False)
    else:
        monkeypatch.setenv("KFP_RETRY_INDEX", retry_index)
    job = _job()
    name = job["metadata"]["name"]
    stale = {**job, "metadata": {**job["metadata"], "annotations": {"created-by": "failed attempt"}}}
    cluster.api().create(PYTORCHJOB.resource, stale)
    cluster.set_job_conditions(PYTORCHJOB.resource, name, ("Failed", "PyTorchJobFailed", f"PyTorchJob {name} has "
                                                           "failed because it has reached the specified backoff limit"))
    uid = cluster.api().get(PYTORCHJOB.resource, name)["metadata"]["uid"]
    if retry_index != "0":
        with pytest.raises(JobFailed) as failure:
            run_job(cluster.api(), PYTORCHJOB, job, deadline_s=60, settings=FAST, out=lambda line: None)
        message = str(failure.value)
        assert "reached the specified backoff limit" in message and "not started again" in message
        assert ("KFP_RETRY_INDEX is not set" if retry_index is None else "retry 1 of the step") in message
        assert f"kubectl delete pytorchjobs.kubeflow.org {name} -n fourm" in message
        assert cluster.api().get(PYTORCHJOB.resource, name)["metadata"]["uid"] == uid  # neither recreated nor deleted
        return

    def operator():
        def recreated():  # the launcher's own job, not the stale one, nor the gap between delete and create
            current = cluster.api().get(PYTORCHJOB.resource, name)
            return current is not None and current["metadata"].get("annotations") is None

        _wait(recreated)
        cluster.set_job_conditions(PYTORCHJOB.resource, name, ("Succeeded", "", ""))

    script = Operator(operator)
    result = run_job(cluster.api(), PYTORCHJOB, job, deadline_s=60, settings=FAST, out=lambda line: None)
    script.finish()
    assert result.succeeded and not result.adopted


def test_sigterm_leaves_the_job_running_and_the_step_s_retry_adopts_it(cluster, monkeypatch):
    """A node drain or a spot preemption of the launcher pod (SIGTERM) must not end the training: the launcher
    exits and leaves the job; the step's retry (a new launcher pod, the same run) adopts it and follows it."""
    monkeypatch.delenv("KFP_RETRY_INDEX", raising=False)
    job = _job()
    name = job["metadata"]["name"]
    pod = f"{name}-master-0"
    # the job is still there: the training goes on
    uid = launcher_lost(cluster, job, retry_index=None, said="retry of this step adopts it")

    monkeypatch.setenv("KFP_RETRY_INDEX", "1")
    retried: list[str] = []

    def operator_after():
        _wait(lambda: "step 1/4" in retried)  # the retry shows the log so far
        assert cluster.api().get(PYTORCHJOB.resource, name)["metadata"]["uid"] == uid  # the same job
        cluster.kubelet.write(pod, "pytorch", "step 4/4")
        _wait(lambda: "step 4/4" in retried)
        cluster.set_job_conditions(PYTORCHJOB.resource, name, ("Succeeded", "", ""))

    script = Operator(operator_after)
    result = run_job(cluster.api(), PYTORCHJOB, _job(), deadline_s=60, settings=FAST, out=retried.append)
    script.finish()
    assert result.adopted and result.succeeded
    assert cluster.api().get(PYTORCHJOB.resource, name) is None  # succeeded: deleted


@pytest.mark.parametrize("other", [{ADDRESS_LABEL: "ffffffffffffffff"}, {ADDRESS_LABEL: "ffffffffffffffff",
                                                                   RUN_ID_LABEL: "another-run"}, None])
def test_any_other_name_conflict_fails_clearly_and_touches_nothing(cluster, other):
    """A job of this name with another content address (or none) is not this stage's: named, never adopted (another
    run's job of the same address is adopted: test_job_rerun.py)."""
    job = _job()
    name = job["metadata"]["name"]
    labels = {**job["metadata"]["labels"], **other} if other else {"app": "someone-else"}
    cluster.api().create(PYTORCHJOB.resource, {**job, "metadata": {"name": name, "labels": labels}})
    with pytest.raises(JobConflict) as conflict:
        run_job(cluster.api(), PYTORCHJOB, job, deadline_s=60, settings=FAST, out=lambda line: None)
    message = str(conflict.value)
    assert name in message and f"kubectl delete pytorchjobs.kubeflow.org {name} -n fourm" in message
    assert cluster.api().get(PYTORCHJOB.resource, name)["metadata"]["labels"] == labels  # not deleted


def test_keeping_the_job_when_asked(cluster):
    job = _job()
    name = job["metadata"]["name"]

    def operator():
        cluster.wait_for_job(PYTORCHJOB.resource, name)
        cluster.set_job_conditions(PYTORCHJOB.resource, name, ("Succeeded", "", ""))

    script = Operator(operator)
    keep = FollowSettings(poll_s=0.05, grace_s=0, delete=False)
    run_job(cluster.api(), PYTORCHJOB, job, deadline_s=60, settings=keep, out=lambda line: None)
    script.finish()
    assert cluster.api().get(PYTORCHJOB.resource, name) is not None


def test_trainjob_follows_node_zero_and_its_complete_condition(cluster):
    job = _job("trainjob", nodes=2)
    name = job["metadata"]["name"]
    lines = []
    labels = {"jobset.sigs.k8s.io/jobset-name": name, "jobset.sigs.k8s.io/replicatedjob-name": "node",
              "jobset.sigs.k8s.io/job-index": "0"}

    def operator():
        cluster.wait_for_job(TRAINJOB.resource, name)
        for index in (1, 0):  # node 1 first: the launcher must still pick rank 0's pod
            pod = f"{name}-node-0-{index}"
            cluster.add_pod(pod, {**labels, "batch.kubernetes.io/job-completion-index": str(index)}, "node")
            cluster.set_pod_status(pod, running_status("node"))
            cluster.kubelet.write(pod, "node", f"hello from node {index}")
        _wait(lambda: "hello from node 0" in lines)
        cluster.set_job_conditions(TRAINJOB.resource, name, ("Created", "", ""), ("Complete", "", "done"))

    script = Operator(operator)
    result = run_job(cluster.api(), TRAINJOB, job, deadline_s=60, settings=FAST, out=lines.append)
    script.finish()
    assert result.succeeded and "hello from node 1" not in lines
    assert cluster.api().get(TRAINJOB.resource, name) is None


# --------------------------------------------------------------------------------------- the job's owner

WORKFLOW = {"apiVersion": "argoproj.io/v1alpha1", "kind": "Workflow", "name": "fourm-pretrain-x7k2p",
            "uid": "5d0b6c1e-2f4a-4d8e-9a63-0c1f2e3d4b5a", "controller": True, "blockOwnerDeletion": True}
LAUNCHER_POD = "fourm-pretrain-x7k2p-system-container-impl-2741950365"


def _start_stage_job(cluster, tmp_path, lines: list[str], delete_job: bool = True, cluster_params=None,
                     accelerator: str = "cpu") -> dict:
    """Run the pretrain step's job backend to a succeeded job; the job as it was created."""
    from fourm_kfp.cluster.job_spec import JobParams
    from fourm_kfp.launchers.kubernetes_job import KubernetesJob
    from fourm_kfp.launchers.stage import plan_launch

    run = RunContext("smoke", store_uri=str(tmp_path / "store"), tracking_uri="none")
    plan = plan_launch("pretrain", run)
    name = f"fourm-pretrain-{plan.address}"
    created = {}

    def operator():
        created.update(cluster.wait_for_job(PYTORCHJOB.resource, name))
        cluster.set_job_conditions(PYTORCHJOB.resource, name, ("Succeeded", "", ""))

    script = Operator(operator)
    settings = FollowSettings(poll_s=FAST.poll_s, grace_s=0.0, pending_every_s=3600, delete=delete_job)
    backend = KubernetesJob(run, JobParams(accelerator=accelerator, delete_job=delete_job), "fourm", kfp_run_id=RUN_ID,
                            spec_path=str(tmp_path / "job.yaml"), api=cluster.api(), settings=settings,
                            cluster=cluster_params, out=lines.append)
    backend.start(plan, ["stage", "pretrain"], lambda: None)
    script.finish()
    return created


def test_the_job_is_owned_by_the_workflow_that_owns_the_launcher_pod(cluster, tmp_path, monkeypatch):
    """Not the launcher pod (a drain or a preemption of it would garbage-collect the training): the Argo Workflow
    of the KFP run, read from the launcher pod's controller ownerReference, as Argo sets it on every step's pod."""
    cluster.add_pod(LAUNCHER_POD, {"workflows.argoproj.io/workflow": WORKFLOW["name"]}, "main", phase="Running",
                    owner_references=[WORKFLOW])
    monkeypatch.setenv("FOURM_POD_NAME", LAUNCHER_POD)
    lines: list[str] = []
    job = _start_stage_job(cluster, tmp_path, lines)
    assert job["metadata"]["ownerReferences"] == [
        {"apiVersion": "argoproj.io/v1alpha1", "kind": "Workflow", "name": WORKFLOW["name"], "uid": WORKFLOW["uid"],
         "controller": False, "blockOwnerDeletion": False}]
    assert "kind: Workflow" in (tmp_path / "job.yaml").read_text()  # the saved spec is the job as created


def test_without_a_workflow_the_job_has_no_owner_and_the_log_says_who_deletes_it(cluster, tmp_path, monkeypatch):
    cluster.add_pod(LAUNCHER_POD, {}, "main", phase="Running")  # e.g. not run by Argo
    monkeypatch.setenv("FOURM_POD_NAME", LAUNCHER_POD)
    lines: list[str] = []
    job = _start_stage_job(cluster, tmp_path, lines, delete_job=False)
    assert "ownerReferences" not in job["metadata"]
    said = [line for line in lines if "no owner" in line]
    assert said and "exit handler" in said[0], lines
    # <stage>_delete_job=false: the label that keeps the finished job from the run's exit handler too
    assert job["metadata"]["labels"][KEEP_LABEL] == "true"
    assert cluster.api().get(PYTORCHJOB.resource, job["metadata"]["name"]) is not None


# ------------------------------------------------------------------------------ the whole step in job mode

BIN = Path(sys.executable).parent


@pytest.mark.slow
@pytest.mark.parametrize("stage", ["pretrain", "train-tokenizers"])
def test_a_job_stage_in_job_mode_plans_launches_and_reports(cluster, tmp_path, stage):
    """The same launch function and job object for both job stages: the step renders the stage's job, the pod runs
    the rendered container (the one ``fourm-kfp stage`` entry point), and the step reports what it committed."""
    from fourm_kfp.cluster.job_spec import job_name
    from fourm_kfp.cluster.job_spec import JobParams
    from fourm_kfp.launchers.kubernetes_job import launch_stage_job
    from fourm_kfp.config.loader import load_config
    from fourm_kfp.contract.addressing import stage_address
    from fourm_kfp.contract.runner import run_stage
    from fourm_kfp.stages import get_stage
    from fourm_kfp.storage import open_store
    from tests.train.pretrain_helpers import smoke_upstream

    store = str(tmp_path / "store")
    if stage == "pretrain":
        inputs = smoke_upstream(open_store(store, create=True))
        overrides = ["train.steps=2", "train.checkpoint_every=1", "train.log_every=1"]
    else:
        data = run_stage(get_stage("prepare-data"), load_config("smoke"), open_store(store, create=True))
        inputs, overrides = {"prepare-data": data.output_uri}, []
    address = stage_address(get_stage(stage), load_config("smoke", overrides=overrides))
    name, pod = job_name(stage, address), f"{job_name(stage, address)}-master-0"
    params = JobParams(launcher="pytorchjob", nodes=1, procs_per_node=1, accelerator="cpu", deadline_s=600)

    def operator():
        """Run the rendered master container as its pod would (one node, the operator's env); log into the API."""
        job = cluster.wait_for_job(PYTORCHJOB.resource, name, timeout=120)
        assert "Worker" not in job["spec"]["pytorchReplicaSpecs"]
        [container] = job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"]
        argv = container["command"] + container["args"]
        argv[argv.index("--root") + 1] = str(tmp_path / "pod-root")  # the pod's emptyDir
        cluster.add_pod(pod, {**MASTER_LABELS, "training.kubeflow.org/job-name": name}, "pytorch")
        cluster.set_pod_status(pod, running_status("pytorch"))
        port = str(free_port())  # not a fixed one: another test (an xdist worker's) may hold it
        env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}", "PYTHONUNBUFFERED": "1",
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "WORLD_SIZE": "1", "RANK": "0",
               "PET_MASTER_ADDR": "127.0.0.1", "PET_MASTER_PORT": port, "PET_NNODES": "1", "PET_NODE_RANK": "0",
               "PET_NPROC_PER_NODE": job["spec"]["nprocPerNode"], "OMP_NUM_THREADS": "1",
               "MLFLOW_TRACKING_URI": "none"}
        proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for line in proc.stdout:
            cluster.kubelet.write(pod, "pytorch", line.rstrip("\n"))
        state = ("Succeeded", "", "") if proc.wait() == 0 else ("Failed", "", f"exit {proc.returncode}")
        cluster.set_job_conditions(PYTORCHJOB.resource, name, state)

    lines: list[str] = []
    script = Operator(operator)
    run = RunContext("smoke", overrides, store, tracking_uri="none")
    outcome = launch_stage_job(stage, run, force=False, input_uris=inputs, params=params, image="fourm",
                               kfp_run_id=RUN_ID, spec_path=str(tmp_path / "job.yaml"), api=cluster.api(),
                               settings=FAST, out=lines.append)
    script.finish()
    assert outcome.status == "ran" and outcome.output_uri.endswith(f"{stage}/{address}")
    if stage == "pretrain":
        assert outcome.metrics["steps"] == 2.0
    else:
        assert {"tokenizers.json", "image/rgb/model.safetensors"} <= set(open_store(outcome.output_uri).list(""))
    assert (tmp_path / "job.yaml").read_text().startswith("apiVersion: kubeflow.org/v1")
    assert any(f"{stage}: committed" in line for line in lines), lines[-20:]  # the pod's log reached the step's
    assert cluster.api().get(PYTORCHJOB.resource, name) is None

    # Plan first: the same step again finds the output committed and creates no job.
    lines.clear()
    again = launch_stage_job(stage, run, force=False, input_uris=inputs, params=params, image="fourm",
                             kfp_run_id="run-2", api=cluster.api(), settings=FAST, out=lines.append)
    assert again.status == "skipped" and again.output_uri == outcome.output_uri
    assert any("creating no job" in line for line in lines)
    assert cluster.api().get(PYTORCHJOB.resource, name) is None


def test_the_run_s_cluster_settings_reach_the_job_the_step_creates(cluster, tmp_path, monkeypatch):
    """The pipeline's run-wide parameters (scheduler, image pull secret, GPU placement), passed by the step to its
    backend, are in the job the API server receives: gang-scheduled, pulling with the secret, on the GPU pool."""
    from fourm_kfp.cluster.job_spec import ClusterParams

    monkeypatch.setenv("FOURM_POD_NAME", LAUNCHER_POD)
    cluster.add_pod(LAUNCHER_POD, {}, "main", phase="Running")
    params = ClusterParams(scheduler="volcano:training", image_pull_secret="ghcr-pull",
                           gpu_node_selector={"pool": "h100"},
                           gpu_tolerations=[{"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}])
    job = _start_stage_job(cluster, tmp_path, [], cluster_params=params, accelerator="nvidia.com/gpu")
    assert job["spec"]["runPolicy"]["schedulingPolicy"] == {"minAvailable": 1, "queue": "training"}
    pod = job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]
    assert pod["imagePullSecrets"] == [{"name": "ghcr-pull"}] and pod["nodeSelector"] == {"pool": "h100"}
    assert {t["key"] for t in pod["tolerations"]} == {"nvidia.com/gpu", "dedicated"}
