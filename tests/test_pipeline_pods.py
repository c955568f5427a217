"""Where the compiled pipeline's pods land, as a KFP 2.17 backend makes them (``tests/kfp_driver_emulator.py``) on a
cluster whose GPU nodes are tainted ``nvidia.com/gpu:NoSchedule``, as the NVIDIA GPU Operator and the managed GPU
node pools taint them.

- a CPU-only run (``pretrain_accelerator=cpu``, ``train_tokenizers_accelerator=cpu``) requests no accelerator in any
  step (the pretokenize workers, a teacher's label workers and evaluate follow the run's choice) and every pod fits a
  plain CPU node;
- on GPUs, every pod that requests one tolerates the GPU taint and the run's own (``gpu_tolerations``) and selects the
  run's GPU nodes (``gpu_node_selector``), whichever branch runs: in-pod, or a job's launcher (a CPU pod);
- every step pulls with the run's ``image_pull_secret``;
- the job stages' launcher steps are retried (a drained launcher comes back and adopts its job), the others are not.
"""

from __future__ import annotations

import pytest
import yaml

from fourm_kfp.launchers.kfp_runtime import worker_pods
from fourm_kfp.pipeline_runs.compile import compile_pipeline
from tests.kfp_driver_emulator import DriverEmulator, Node, schedulable

GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
POOL_TAINT = {"key": "dedicated", "value": "training", "effect": "NoSchedule"}
CPU_NODE = Node(labels={"kubernetes.io/os": "linux"})
GPU_NODE = Node(labels={"pool": "h100"}, taints=[GPU_TAINT, POOL_TAINT], allocatable={"nvidia.com/gpu": "8"})
GPU_RUN = {"gpu_node_selector": {"pool": "h100"},
           "gpu_tolerations": [{"key": "dedicated", "operator": "Equal", "value": "training", "effect": "NoSchedule"}]}


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    spec, platform = yaml.safe_load_all(compile_pipeline(tmp_path_factory.mktemp("p") / "p.yaml").read_text())
    return spec, platform


def _pods(compiled, preset: str, **parameters):
    """The run's pods; the label stage's worker-pods step answers as its component does for ``preset``."""
    spec, platform = compiled
    accelerator = parameters.get("pretrain_accelerator", "nvidia.com/gpu")
    outputs = {"worker-pods": worker_pods("label", preset, [], accelerator)}
    return DriverEmulator(spec, platform, outputs).pods({"preset": preset, **parameters})


@pytest.mark.parametrize("launcher", ["in-pod", "pytorchjob"])
def test_a_cpu_only_run_requests_no_accelerator_and_fits_a_cpu_node(compiled, launcher):
    pods = _pods(compiled, "photos", pretrain_accelerator="cpu", train_tokenizers_accelerator="cpu",
                 pretrain_launcher=launcher)
    names = {pod.step for pod in pods}
    assert {"pretokenize-part", "label-part", "pretrain", "evaluate"} <= names  # a teacher labeler: label runs
    asking = [pod.task for pod in pods if pod.accelerators]
    assert asking == [], f"steps requesting an accelerator on a CPU-only run: {asking}"
    assert all(schedulable(pod, CPU_NODE) is None for pod in pods)


@pytest.mark.parametrize("launcher", ["in-pod", "pytorchjob"])
def test_every_gpu_pod_lands_on_the_run_s_tainted_gpu_nodes(compiled, launcher):
    pods = _pods(compiled, "photos", pretrain_launcher=launcher, train_tokenizers_launcher="in-pod", **GPU_RUN)
    gpu_pods = [pod for pod in pods if pod.accelerators]
    expected = {"label-part", "train-tokenizers", "pretokenize-part", "evaluate"} | (
        {"pretrain"} if launcher == "in-pod" else set())
    assert {pod.step for pod in gpu_pods} == expected
    for pod in gpu_pods:
        assert schedulable(pod, GPU_NODE) is None, (pod.task, schedulable(pod, GPU_NODE))
        assert schedulable(pod, Node(labels={"pool": "a100"}, taints=[GPU_TAINT], allocatable=GPU_NODE.allocatable))
    for pod in pods:
        if not pod.accelerators:  # light and CPU steps go anywhere, GPU nodes not required
            assert schedulable(pod, CPU_NODE) is None, pod.task


def test_every_step_pulls_its_image_with_the_run_s_secret(compiled):
    pods = _pods(compiled, "photos", image_pull_secret="ghcr-pull")
    assert pods and all(pod.image_pull_secrets == ["ghcr-pull"] for pod in pods), \
        sorted(pod.task for pod in pods if pod.image_pull_secrets != ["ghcr-pull"])
    # No secret given: the one entry has an empty name, which the kubelet skips (pkg/kubelet: "API validation
    # permitted entries with empty names").
    assert all(pod.image_pull_secrets == [""] for pod in _pods(compiled, "demo"))


def test_only_the_job_launchers_are_retried(compiled):
    pods = _pods(compiled, "demo", pretrain_launcher="trainjob", train_tokenizers_launcher="pytorchjob")
    retried = sorted(pod.step for pod in pods if pod.retries)
    assert retried == ["pretrain", "train-tokenizers"]
    assert all(pod.retries == 3 for pod in pods if pod.retries)
    in_pod = _pods(compiled, "demo", pretrain_launcher="in-pod")
    assert not any(pod.retries for pod in in_pod)
