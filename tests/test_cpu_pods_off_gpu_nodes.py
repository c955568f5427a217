"""A pod that requests no accelerator never tolerates the run's GPU taints (``gpu_tolerations``), so it never takes a
GPU node's room: the pipeline's steps as each supported KFP backend runs them (``tests/kfp_driver_emulator.py``, the
``pod-placement`` steps answering as their component does, :func:`fourm_kfp.launchers.kfp_placement.pod_placement`),
and a CPU job's replicas (:func:`fourm_kfp.cluster.job_kinds.render_job`).

The GPU nodes here carry only the cluster's own taint (``dedicated=training:NoSchedule``), which the run's
``gpu_tolerations`` tolerate: a CPU pod handed those tolerations would be placed there (the accelerator's own
``nvidia.com/gpu`` taint would hide the mistake on a node that has it)."""

from __future__ import annotations

import pytest
import yaml

from fourm_kfp.cluster.job_kinds import render_job
from fourm_kfp.cluster.job_spec import ClusterParams, JobRequest
from fourm_kfp.launchers.kfp_placement import pod_placement
from fourm_kfp.pipeline_runs.compile import compile_pipeline
from tests.kfp_driver_emulator import VERSIONS, DriverEmulator, Node, Pod, schedulable, stub_outputs

POOL_TAINT = {"key": "dedicated", "value": "training", "effect": "NoSchedule"}
RUN_TOLERATIONS = [{"key": "dedicated", "operator": "Equal", "value": "training", "effect": "NoSchedule"}]
GPU_POOL_NODE = Node(labels={"pool": "h100"}, taints=[POOL_TAINT], allocatable={"nvidia.com/gpu": "8"})
CPU_NODE = Node(labels={"kubernetes.io/os": "linux"})
GPU_RUN = {"gpu_node_selector": {"pool": "h100"}, "gpu_tolerations": RUN_TOLERATIONS, "image_pull_secret": "pull"}


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    spec, platform = yaml.safe_load_all(compile_pipeline(tmp_path_factory.mktemp("p") / "p.yaml").read_text())
    return spec, platform


def _pods(compiled, version: str, **parameters) -> list[Pod]:
    spec, platform = compiled
    outputs = stub_outputs(spec, components={"comp-pod-placement": pod_placement})
    return DriverEmulator(spec, platform, outputs, version).run({"preset": "photos", **GPU_RUN, **parameters}).pods


def _assert_off_gpu_nodes(pods: list[Pod]) -> None:
    cpu_pods = [pod for pod in pods if not pod.accelerators]
    assert cpu_pods
    for pod in cpu_pods:
        assert not [t for t in pod.tolerations if t in RUN_TOLERATIONS], (pod.task, pod.tolerations)
        assert schedulable(pod, GPU_POOL_NODE) is not None, f"{pod.task} would take a GPU node: {pod.tolerations}"
        assert schedulable(pod, CPU_NODE) is None, pod.task


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("launcher", ["in-pod", "pytorchjob"])
def test_no_cpu_step_tolerates_the_run_s_gpu_taints(compiled, version, launcher):
    """A GPU run: the light steps, the job stages' launchers and every step without work for an accelerator."""
    pods = _pods(compiled, version, pretrain_launcher=launcher)
    assert [pod for pod in pods if pod.accelerators]  # the GPU steps exist, and get the run's placement
    assert all(t in pod.tolerations for pod in pods if pod.accelerators for t in RUN_TOLERATIONS)
    _assert_off_gpu_nodes(pods)


@pytest.mark.parametrize("version", VERSIONS)
def test_a_cpu_only_run_s_steps_tolerate_none_of_the_run_s_gpu_taints(compiled, version):
    pods = _pods(compiled, version, pretrain_accelerator="cpu", train_tokenizers_accelerator="cpu",
                 pretrain_launcher="in-pod", train_tokenizers_launcher="in-pod")
    assert not [pod.task for pod in pods if pod.accelerators]
    _assert_off_gpu_nodes(pods)


@pytest.mark.parametrize("launcher", ["pytorchjob", "trainjob"])
def test_a_cpu_job_s_replicas_tolerate_none_of_the_run_s_gpu_taints(launcher):
    request = JobRequest(launcher=launcher, stage="pretrain", address="00aa11bb22cc33dd", stage_args=["stage"],
                         image="fourm", nodes=3, procs_per_node=4, accelerator="cpu",
                         cluster=ClusterParams(gpu_node_selector={"pool": "h100"}, gpu_tolerations=RUN_TOLERATIONS))
    job = render_job(request)
    if launcher == "pytorchjob":
        specs = [replica["template"]["spec"] for replica in job["spec"]["pytorchReplicaSpecs"].values()]
        limits = [spec["containers"][0]["resources"].get("limits", {}) for spec in specs]
    else:
        [patch] = job["spec"]["runtimePatches"]
        specs = [rj["template"]["spec"]["template"]["spec"]
                 for rj in patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]]
        limits = [job["spec"]["trainer"]["resourcesPerNode"].get("limits", {})] * len(specs)
    pods = [Pod(task=f"{launcher}-replica-{i}", executor="", limits={k: str(v) for k, v in limit.items()},
                requests={}, tolerations=spec.get("tolerations", []), node_selector=spec.get("nodeSelector", {}),
                image_pull_secrets=[], retries=0, retry_max_duration_s=None, retry_index_env=False)
            for i, (spec, limit) in enumerate(zip(specs, limits))]
    _assert_off_gpu_nodes(pods)
