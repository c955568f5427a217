"""A job whose pods cannot start fails within the image-pull grace (``image_pull_s``), naming the pod, the reason,
the missing object and the fix, and is deleted (its GPUs freed) instead of waiting out ``queue_timeout_s`` (a day).

The pods are the rendered job's own pod template, created in the emulated cluster and moved on by the emulated
scheduler and kubelet (:meth:`tests.cluster.kube_emulator.EmulatedCluster.start_pod`: the volume binding plugin's
rules, the kubelet's env and image rules, :mod:`tests.cluster.kubelet_emulator`). Each reason of
:data:`fourm_kfp.cluster.pod_start.CANNOT_START` and each volume case is tried; a cause removed within the grace is
only reported. The job templates take the S3 Secret and the settings ConfigMap as optional, as the pipeline's steps
do: a namespace without them runs the job (the kubelet leaves the variables unset)."""

from __future__ import annotations

import time

import pytest

from fourm_kfp.cluster.job_kinds import PYTORCHJOB, TRAINJOB, JobFailed
from fourm_kfp.cluster.job_launcher import FollowSettings, run_job
from fourm_kfp.cluster.pod_start import CANNOT_START, missing_object
from tests.cluster.job_scripts import Operator, job as _job, pod_labels, wait
from tests.cluster.test_job_env_matches_steps import pod_spec
from tests.cluster.kube_emulator import EmulatedCluster

GRACE = FollowSettings(poll_s=0.05, grace_s=0.0, pending_every_s=3600, image_pull_s=0.6, queue_s=3600)
S3_SECRET, SETTINGS = "fourm-s3-credentials", "fourm-settings"


@pytest.fixture
def cluster():
    emulated = EmulatedCluster()
    yield emulated
    emulated.close()


def _pod_name(job: dict) -> str:
    name = job["metadata"]["name"]
    return f"{name}-master-0" if job["kind"] == "PyTorchJob" else f"{name}-node-0-0"


def _labels(job: dict) -> dict:
    name = job["metadata"]["name"]
    if job["kind"] == "PyTorchJob":
        return pod_labels(name, "master", 0)
    return {"jobset.sigs.k8s.io/jobset-name": name}


def _fails_within_the_grace(cluster, job: dict, change, kind=PYTORCHJOB, between=None) -> str:
    """Run the job whose single pod is the template changed by ``change``; the launcher's failure text."""
    name, pod = job["metadata"]["name"], _pod_name(job)
    spec = pod_spec(job)
    change(spec)

    def operator():
        cluster.wait_for_job(kind.resource, name)
        cluster.start_pod(pod, _labels(job), spec)
        if between:
            between(pod)

    script = Operator(operator)
    started = time.monotonic()
    with pytest.raises(JobFailed) as failure:
        run_job(cluster.api(), kind, job, deadline_s=3600, settings=GRACE, out=lambda line: None)
    script.finish()
    assert GRACE.image_pull_s <= time.monotonic() - started < 15  # the grace, not the queue limit
    assert cluster.api().get(kind.resource, name) is None  # given up on: deleted, its GPUs freed
    message = str(failure.value)
    assert pod in message and "Fix:" in message
    return message


def _container(spec: dict) -> dict:
    return spec["containers"][0]


def _require_secret(spec: dict) -> None:
    _container(spec)["envFrom"] = [{"secretRef": {"name": "fourm-s3"}}]


def test_a_missing_secret_fails_naming_the_secret(cluster):
    message = _fails_within_the_grace(cluster, _job(nodes=1), _require_secret)
    assert 'CreateContainerConfigError: secret "fourm-s3" not found' in message
    assert 'Secret "fourm-s3" is missing in namespace' in message


def test_a_missing_configmap_key_fails_naming_the_key_and_the_configmap(cluster):
    cluster.admin().core.create_namespaced_config_map(cluster.namespace, {
        "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "team"}, "data": {"OTHER": "1"}})

    def change(spec):
        _container(spec).setdefault("env", []).append(
            {"name": "NCCL_IB_HCA", "valueFrom": {"configMapKeyRef": {"name": "team", "key": "NCCL_IB_HCA"}}})

    message = _fails_within_the_grace(cluster, _job(nodes=1), change)
    assert "couldn't find key NCCL_IB_HCA in ConfigMap fourm/team" in message
    assert 'key "NCCL_IB_HCA" of ConfigMap "team"' in message


def test_an_image_name_that_does_not_parse_fails(cluster):
    def change(spec):
        _container(spec)["image"] = "ghcr.io/Example/Fourm-KFP:0.9"

    message = _fails_within_the_grace(cluster, _job(nodes=1), change)
    assert "InvalidImageName" in message and "ghcr.io/Example/Fourm-KFP:0.9" in message
    assert "valid image reference" in message


def test_an_image_never_pulled_and_absent_from_the_node_fails(cluster):
    def change(spec):
        _container(spec)["imagePullPolicy"] = "Never"

    message = _fails_within_the_grace(cluster, _job(nodes=1), change)
    assert 'ErrImageNeverPull: Container image "fourm" is not present with pull policy of Never' in message
    assert "imagePullPolicy is Never and its node has no fourm" in message


def test_a_container_the_runtime_refuses_to_create_fails_with_its_error(cluster):
    job = _job(nodes=1)
    refusal = ('failed to generate container "3f2a" spec: failed to generate spec: failed to mkdir "/mnt/nvme/scratch": '
               "mkdir /mnt/nvme: read-only file system")
    cluster.kubelet.runtime_errors[_pod_name(job)] = refusal
    message = _fails_within_the_grace(cluster, job, lambda spec: None)
    assert f"CreateContainerError: {refusal}" in message and "container runtime" in message


@pytest.mark.parametrize("claim_state", ["missing", "unbound"])
def test_a_persistent_volume_claim_that_is_missing_or_unbound_fails(cluster, claim_state):
    if claim_state == "unbound":
        cluster.admin().core.create_namespaced_persistent_volume_claim(cluster.namespace, {
            "apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "fourm-data"},
            "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Ti"}}}})

    def change(spec):
        spec["volumes"].append({"name": "data", "persistentVolumeClaim": {"claimName": "fourm-data"}})
        _container(spec)["volumeMounts"].append({"name": "data", "mountPath": "/data"})

    message = _fails_within_the_grace(cluster, _job(nodes=1), change)
    assert "PersistentVolumeClaim: 0/1 nodes are available" in message
    if claim_state == "missing":
        assert 'PersistentVolumeClaim "fourm-data" is missing in namespace' in message
    else:
        assert "pod has unbound immediate PersistentVolumeClaims" in message and "describe pvc" in message


def test_a_volume_the_kubelet_cannot_mount_fails_with_its_event(cluster):
    """Scheduled, its containers never created: the kubelet's volume manager says why in a FailedMount event."""
    def change(spec):
        spec["volumes"].append({"name": "team-config", "configMap": {"name": "team-config"}})

    message = _fails_within_the_grace(cluster, _job(nodes=1), change)
    assert 'FailedMount: MountVolume.SetUp failed for volume "team-config" : configmap "team-config" not found' \
        in message
    assert 'ConfigMap "team-config" is missing' in message


def test_every_reason_is_one_the_tests_raise():
    """Each kubelet reason the launcher acts on is tried here or in test_job_launcher.py (ErrImagePull and
    ImagePullBackOff, with the registry's answer): a reason added to the table needs its test."""
    tried = {"CreateContainerConfigError", "InvalidImageName", "CreateContainerError", "ErrImageNeverPull"}
    pulls = {"ErrImagePull", "ImagePullBackOff"}
    assert set(CANNOT_START) == tried | pulls
    assert all(CANNOT_START[reason].startswith("pkg/kubelet/") for reason in CANNOT_START)


def test_a_cause_removed_within_the_grace_is_only_reported(cluster):
    job = _job(nodes=1)
    name, pod = job["metadata"]["name"], _pod_name(job)
    spec = pod_spec(job)
    _require_secret(spec)
    settings = FollowSettings(poll_s=0.05, grace_s=0.0, pending_every_s=3600, image_pull_s=1.5)
    lines = []

    def operator():
        cluster.wait_for_job(PYTORCHJOB.resource, name)
        cluster.start_pod(pod, _labels(job), spec)
        wait(lambda: any("CreateContainerConfigError" in line for line in lines))
        cluster.admin().core.create_namespaced_secret(cluster.namespace, {
            "apiVersion": "v1", "kind": "Secret", "metadata": {"name": "fourm-s3"}, "data": {}})
        assert cluster.sync_pod(pod)["status"]["phase"] == "Running"  # the kubelet's next sync starts it
        time.sleep(settings.image_pull_s + 0.3)
        cluster.set_job_conditions(PYTORCHJOB.resource, name, ("Succeeded", "", ""))

    script = Operator(operator)
    assert run_job(cluster.api(), PYTORCHJOB, job, deadline_s=60, settings=settings, out=lines.append).succeeded
    script.finish()


@pytest.mark.parametrize("launcher", ["pytorchjob", "trainjob"])
def test_the_job_runs_without_the_s3_secret_and_the_settings_configmap(cluster, launcher):
    """As the steps (``_Cluster.env``: optional): a namespace that has neither (an IAM role for S3, the endpoint
    and MLflow given as parameters) starts the job's pods."""
    job = _job(launcher, nodes=1)
    assert cluster.read("Secret", S3_SECRET) is None and cluster.read("ConfigMap", SETTINGS) is None
    pod = cluster.start_pod(_pod_name(job), _labels(job), pod_spec(job))
    assert pod["status"]["phase"] == "Running", pod["status"]


@pytest.mark.parametrize("message, missing", [
    ('secret "fourm-s3" not found', 'Secret "fourm-s3"'),
    ('configmap "fourm-settings" not found', 'ConfigMap "fourm-settings"'),
    ("couldn't find key AWS_ACCESS_KEY_ID in Secret fourm/fourm-s3-credentials",
     'key "AWS_ACCESS_KEY_ID" of Secret "fourm-s3-credentials"'),
    ('0/4 nodes are available: persistentvolumeclaim "data" not found.', 'PersistentVolumeClaim "data"'),
    ("Back-off pulling image", None)])
def test_the_missing_object_is_read_from_the_kubelet_s_and_the_scheduler_s_text(message, missing):
    assert missing_object(message) == missing
