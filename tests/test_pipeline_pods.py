"""The compiled pipeline run as each supported KFP backend runs it (``tests/kfp_driver_emulator.py``, one test per
version in ``VERSIONS``), on a cluster whose GPU nodes are tainted ``nvidia.com/gpu:NoSchedule``, as the NVIDIA GPU
Operator and the managed GPU node pools taint them.

- the run gets through the driver whichever launchers and accelerators it chooses: every input resolves, and so does
  every pod-spec placeholder and Kubernetes config the ``pod-placement`` steps feed;
- the exit handler is told what the lineage step expects: COMPLETE when the run succeeds from KFP 2.17, RUNNING
  before it (its DAG holds loops), FAILED when a step directly under it fails (a job stage's launcher), and
  RUNNING before 2.17 when a fan-out worker does; and whatever it is told, it closes the MLflow parent run by the
  run's real outcome;
- a CPU-only run (``pretrain_accelerator=cpu``, ``train_tokenizers_accelerator=cpu``) requests no accelerator in any
  step (the pretokenize workers, a teacher's label workers and evaluate follow the run's choice) and every pod fits a
  plain CPU node;
- on GPUs, every pod that requests one tolerates the GPU taint and the run's own (``gpu_tolerations``) and selects the
  run's GPU nodes (``gpu_node_selector``), whichever launcher a job stage uses: in-pod, or a job's (a CPU pod),
  and no pod without one does (a CPU step never lands on a GPU node);
- every step pulls with the run's ``image_pull_secret``, and a run that names none runs (never an empty name);
- the job stages' steps are retried (a drained launcher comes back and adopts its job where Argo's status-capture
  finalizer is on; in-pod training resumes from its checkpoint), the others are not, and Argo still retries one at the end of its job's deadline
  (``backoff.maxDuration`` counts from the first attempt's start); from KFP 2.16.1 they see ``KFP_RETRY_INDEX``.
"""

from __future__ import annotations

import pytest
import yaml

from fourm_kfp.launchers.kfp_placement import pod_placement
from fourm_kfp.pipeline_runs.compile import compile_pipeline
from tests.kfp_driver_emulator import (PROPAGATING_STATES, VERSIONS, DriverEmulator, Node, at_least,
                                       final_status_state, schedulable, stub_outputs)

GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
POOL_TAINT = {"key": "dedicated", "value": "training", "effect": "NoSchedule"}
CPU_NODE = Node(labels={"kubernetes.io/os": "linux"})
GPU_NODE = Node(labels={"pool": "h100"}, taints=[GPU_TAINT, POOL_TAINT], allocatable={"nvidia.com/gpu": "8"})
GPU_RUN = {"gpu_node_selector": {"pool": "h100"},
           "gpu_tolerations": [{"key": "dedicated", "operator": "Equal", "value": "training", "effect": "NoSchedule"}]}
SECRET = "ghcr-pull"
LAUNCHERS = ["in-pod", "pytorchjob", "trainjob"]

@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    spec, platform = yaml.safe_load_all(compile_pipeline(tmp_path_factory.mktemp("p") / "p.yaml").read_text())
    return spec, platform


def _run(compiled, version: str, preset: str, **parameters):
    """The run on backend ``version``, with the run's pull secret unless told otherwise (None: a parameter left
    out); the pod-placement steps answer as their component does, every other step with a placeholder of its
    output's type."""
    spec, platform = compiled
    outputs = stub_outputs(spec, components={"comp-pod-placement": pod_placement})
    parameters = {k: v for k, v in {"image_pull_secret": SECRET, **parameters}.items() if v is not None}
    return DriverEmulator(spec, platform, outputs, version).run({"preset": preset, **parameters})


def _pods(compiled, version: str, preset: str, **parameters):
    return _run(compiled, version, preset, **parameters).pods


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("launcher", LAUNCHERS)
@pytest.mark.parametrize("accelerator", ["cpu", "nvidia.com/gpu"])
def test_the_run_gets_through_the_driver(compiled, version, launcher, accelerator):
    run = _run(compiled, version, "photos", pretrain_launcher=launcher, train_tokenizers_launcher=launcher,
               pretrain_accelerator=accelerator, train_tokenizers_accelerator=accelerator)
    assert {"label-part", "pretrain", "evaluate", "close-lineage-run"} <= {pod.step for pod in run.pods}


@pytest.mark.parametrize("version", VERSIONS)
def test_the_exit_handler_is_told_what_the_lineage_step_expects(compiled, version):
    spec = compiled[0]
    propagates = at_least(version, PROPAGATING_STATES)
    success = final_status_state(spec, version, True, parameters={"image_pull_secret": SECRET},
                                 task_outputs=stub_outputs(spec, components={"comp-pod-placement": pod_placement}))
    assert success == ("COMPLETE" if propagates else "RUNNING")
    assert final_status_state(spec, version, False, "exit-handler-1/pretrain") == "FAILED"
    worker = "exit-handler-1/label-workers/for-loop-1/label-part"
    assert final_status_state(spec, version, False, worker) == ("FAILED" if propagates else "RUNNING")


@pytest.mark.parametrize("version", VERSIONS)
def test_the_parent_run_closes_with_the_run_s_outcome_at_every_version(compiled, version, tmp_path):
    """What the exit handler is sent, at each version, closes the MLflow parent run by the run's real outcome: a
    succeeded run FINISHED (COMPLETE from 2.17, RUNNING before it), a run whose worker or job stage failed FAILED
    (FAILED, or RUNNING where the failure does not reach the ExitHandler's DAG)."""
    from fourm_kfp.contract import lineage
    from fourm_kfp.launchers.kfp_lineage import close_lineage_step, open_lineage_step
    from fourm_kfp.stages import STAGES

    spec = compiled[0]
    outputs = stub_outputs(spec, components={"comp-pod-placement": pod_placement})
    cases = {"succeeded": (final_status_state(spec, version, True, parameters={"image_pull_secret": SECRET},
                                              task_outputs=outputs), list(STAGES), "FINISHED"),
             "a worker failed": (final_status_state(spec, version, False,
                                                    "exit-handler-1/label-workers/for-loop-1/label-part"),
                                 ["prepare-data", "label"], "FAILED"),
             "pretrain failed": (final_status_state(spec, version, False, "exit-handler-1/pretrain"),
                                 ["prepare-data", "label", "train-tokenizers", "pretokenize", "pretrain"], "FAILED")}
    for case, (state, stages, expected) in cases.items():
        tracking = lineage.default_tracking_uri(tmp_path / case.replace(" ", "-"))
        parent = open_lineage_step("", "kfp-run-1", "smoke", [], "/x", tracking, "")
        for stage in stages:
            try:
                with lineage.stage_run(tracking, parent, stage):
                    if expected == "FAILED" and stage == stages[-1]:
                        raise RuntimeError(stage)
            except RuntimeError:
                pass
        close_lineage_step("", "kfp-run-1", tracking, "", state)
        assert lineage._client(tracking).get_run(parent).info.status == expected, (case, state)


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("launcher", ["in-pod", "pytorchjob"])
def test_a_cpu_only_run_requests_no_accelerator_and_fits_a_cpu_node(compiled, version, launcher):
    pods = _pods(compiled, version, "photos", pretrain_accelerator="cpu", train_tokenizers_accelerator="cpu",
                 pretrain_launcher=launcher)
    names = {pod.step for pod in pods}
    assert {"pretokenize-part", "label-part", "pretrain", "evaluate"} <= names  # a teacher labeler: label runs
    asking = [pod.task for pod in pods if pod.accelerators]
    assert asking == [], f"steps requesting an accelerator on a CPU-only run: {asking}"
    assert all(schedulable(pod, CPU_NODE) is None for pod in pods)


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("launcher", ["in-pod", "pytorchjob"])
def test_every_gpu_pod_lands_on_the_run_s_tainted_gpu_nodes(compiled, version, launcher):
    pods = _pods(compiled, version, "photos", pretrain_launcher=launcher, train_tokenizers_launcher="in-pod",
                 **GPU_RUN)
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


@pytest.mark.parametrize("version", VERSIONS)
def test_every_step_pulls_its_image_with_the_run_s_secret(compiled, version):
    pods = _pods(compiled, version, "photos", image_pull_secret="ghcr-pull")
    assert pods and all(pod.image_pull_secrets == ["ghcr-pull"] for pod in pods), \
        sorted(pod.task for pod in pods if pod.image_pull_secrets != ["ghcr-pull"])


@pytest.mark.parametrize("version", VERSIONS)
def test_a_run_that_names_no_pull_secret_gets_through_the_driver(compiled, version):
    """The driver resolves secretNameParameter with resolveInputParameterStr: "" fails every task ("Expected a
    non-empty string"), and a null (an optional parameter left out) is dropped by the DAG drivers above, so the
    tasks fail on the missing input. A run that names none uses the default Secret name, which the kubelet skips
    when no such Secret exists."""
    from fourm_kfp.cluster.job_spec import DEFAULT_PULL_SECRET

    pods = _pods(compiled, version, "demo", image_pull_secret=None)
    assert pods and all(pod.image_pull_secrets == [DEFAULT_PULL_SECRET] for pod in pods)
    with pytest.raises(Exception, match="Expected a non-empty string"):
        _pods(compiled, version, "demo", image_pull_secret="")


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_only_the_job_stages_are_retried(compiled, version, launcher):
    pods = _pods(compiled, version, "demo", pretrain_launcher=launcher, train_tokenizers_launcher=launcher)
    retried = sorted(pod.step for pod in pods if pod.retries)
    assert retried == ["pretrain", "train-tokenizers"]
    assert all(pod.retries == 3 for pod in pods if pod.retries)
    assert all(pod.retry_index_env == at_least(version, "2.16.1") for pod in pods if pod.retries)


@pytest.mark.parametrize("version", VERSIONS)
def test_a_job_stage_is_still_retried_at_its_job_s_deadline(compiled, version):
    definitions = compiled[0]["root"]["inputDefinitions"]["parameters"]
    defaults = {name: d.get("defaultValue") for name, d in definitions.items()}
    pods = _pods(compiled, version, "demo", pretrain_launcher="trainjob", train_tokenizers_launcher="pytorchjob")
    for pod in pods:
        if pod.retries:  # the job may queue, then run to its deadline, while its launcher follows it
            deadline = defaults["queue_timeout_s"] + defaults[f"{pod.step.replace('-', '_')}_deadline_s"]
            assert pod.retry_max_duration_s >= deadline, (pod.task, pod.retry_max_duration_s, deadline)
