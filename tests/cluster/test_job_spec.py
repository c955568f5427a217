"""Rendered stage jobs (pretrain and train-tokenizers), checked against the real schemas: the PyTorchJob and
TrainJob CRDs as the operators ship them (strict: an unknown field fails) and, for PyTorchJob pod templates,
Kubernetes' own PodTemplate schema; plus the contract the launcher and the operators rely on (replicas, integer
processes per node, run policy, owner, labels, the one training entry point, no credentials in the spec), the run-wide
cluster settings as the operators read them (gang scheduling: Training Operator v1.9 ``pkg/controller.v1/common/
job.go``, Trainer v2.2's Volcano plugin, Kueue's queue label; GPU placement; image pull secret) and the rendezvous
timeout as torchrun itself parses it."""

from __future__ import annotations

import dataclasses
import json
from datetime import timedelta
from pathlib import Path

import pytest
import yaml

from fourm_kfp.cluster.job_kinds import JOB_KINDS, render_job
from fourm_kfp.cluster.job_render import to_yaml
from fourm_kfp.cluster.job_spec import (ADDRESS_LABEL, JOB_LAUNCHERS, JOB_STAGES, KEEP_LABEL, POD_ROOT, RESTARTS,
                                        RUN_ID_LABEL, STAGE_LABEL, TRAINJOB_RUNTIMES, ClusterParams, JobRequest, Owner,
                                        job_name)
from fourm_kfp.images import GPU_IMAGE
from fourm_kfp.config.schema import ConfigError
from fourm_kfp.launchers.remote import stage_command
from fourm_kfp.launchers.stage import RunContext
from tests.k8s_schemas import PYTORCHJOB_CRD, TRAINJOB_CRD, crd_errors, crd_validator, pod_template_errors

REPO = Path(__file__).resolve().parents[2]
RUNTIMES_FILE = REPO / "manifests" / "cluster" / "trainer-runtimes.yaml"
ADDRESS = "0123456789abcdef"
INPUTS = {"pretrain": {"pretokenize": "s3://fourm-kfp/pretokenize/aaaa",
                      "train-tokenizers": "s3://fourm-kfp/train-tokenizers/bbbb"},
          "train-tokenizers": {"prepare-data": "s3://fourm-kfp/prepare-data/cccc"}}


def _request(launcher: str, nodes: int = 2, stage: str = "pretrain", **overrides) -> JobRequest:
    run = RunContext("4m-b", ["train.steps=10", "data.caption=a b c"], "s3://fourm-kfp",
                     tracking_uri="http://mlflow:5000", parent_run_id="parent123")
    args = stage_command(stage, run, INPUTS[stage], POD_ROOT)
    fields = dict(launcher=launcher, stage=stage, address=ADDRESS, stage_args=args, image=GPU_IMAGE, nodes=nodes,
                  procs_per_node=8,
                  node_selector={"nvidia.com/gpu.product": "H100"},
                  tolerations=[{"key": "dedicated", "operator": "Equal", "value": "training", "effect": "NoSchedule"}],
                  deadline_s=7200, kfp_run_id="3f1c0a52-8d1e-4f7e-9b1a-0c2d3e4f5a6b",
                  owner=Owner("argoproj.io/v1alpha1", "Workflow", "fourm-pretrain-abc", "0b6e-uid"))
    return JobRequest(**{**fields, **overrides})


@pytest.fixture(scope="module")
def validators():
    return {"pytorchjob": crd_validator(PYTORCHJOB_CRD), "trainjob": crd_validator(TRAINJOB_CRD)}


@pytest.mark.parametrize("stage", list(JOB_STAGES))
@pytest.mark.parametrize("launcher", ["pytorchjob", "trainjob"])
@pytest.mark.parametrize("nodes", [1, 2, 4])
def test_rendered_job_matches_the_operator_crd(validators, launcher, nodes, stage):
    job = render_job(_request(launcher, nodes, stage))
    errors = crd_errors(validators[launcher], job)
    assert not errors, "\n".join(errors)
    if launcher == "pytorchjob":
        for role, replica in job["spec"]["pytorchReplicaSpecs"].items():
            errors = pod_template_errors(f"{job['metadata']['name']}-{role.lower()}", replica["template"])
            assert not errors, "\n".join(errors)


@pytest.mark.parametrize("nodes", [1, 2, 4])
def test_pytorchjob_shape(nodes):
    job = render_job(_request("pytorchjob", nodes))
    spec = job["spec"]
    replicas = spec["pytorchReplicaSpecs"]
    assert replicas["Master"]["replicas"] == 1
    if nodes == 1:
        assert "Worker" not in replicas  # replicas: 0 would still make a pod
    else:
        assert replicas["Worker"]["replicas"] == nodes - 1
        assert replicas["Worker"]["template"] == replicas["Master"]["template"]  # one pod template, torchrun's env
    assert spec["nprocPerNode"] == "8" and spec["nprocPerNode"].isdigit()  # never "auto" (= CPU count on CPUs)
    run_policy = spec["runPolicy"]
    # the operator counts its deadline from the job's start, which a queue may precede: the launcher keeps the two
    # limits apart, and the job's own is their sum, a backstop
    assert run_policy["cleanPodPolicy"] == "All" and run_policy["activeDeadlineSeconds"] == 7200 + 86400
    assert run_policy["ttlSecondsAfterFinished"] > 0
    # restarts are summed over all pods and a crash restarts every node: RESTARTS crashes must stay under the limit
    assert run_policy["backoffLimit"] == RESTARTS * nodes + 1
    assert "elasticPolicy" not in spec
    pod = replicas["Master"]["template"]
    assert pod["metadata"]["annotations"]["sidecar.istio.io/inject"] == "false"
    assert pod["metadata"]["labels"][ADDRESS_LABEL] == ADDRESS
    [container] = pod["spec"]["containers"]
    assert container["name"] == "pytorch" and container["image"] == GPU_IMAGE
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 8
    assert pod["spec"]["nodeSelector"] == {"nvidia.com/gpu.product": "H100"}
    assert {t["key"] for t in pod["spec"]["tolerations"]} == {"nvidia.com/gpu", "dedicated"}


@pytest.mark.parametrize("stage", list(JOB_STAGES))
def test_metadata_names_owner_and_labels_for_adoption(stage):
    for launcher in ("pytorchjob", "trainjob"):
        job = render_job(_request(launcher, 2, stage))
        meta = job["metadata"]
        assert meta["name"] == job_name(stage, ADDRESS) == f"fourm-{stage}-{ADDRESS}"
        assert meta["labels"][STAGE_LABEL] == stage and meta["labels"][ADDRESS_LABEL] == ADDRESS
        assert meta["labels"][RUN_ID_LABEL] == "3f1c0a52-8d1e-4f7e-9b1a-0c2d3e4f5a6b"
        assert meta["labels"]["app.kubernetes.io/part-of"] == "fourm-kfp"
        [owner] = meta["ownerReferences"]
        assert (owner["apiVersion"], owner["kind"], owner["name"], owner["uid"]) == (
            "argoproj.io/v1alpha1", "Workflow", "fourm-pretrain-abc", "0b6e-uid")
        assert owner["blockOwnerDeletion"] is False  # True would need update on the owner's finalizers (not granted)


@pytest.mark.parametrize("stage", list(JOB_STAGES))
def test_container_runs_the_one_training_entry_point_through_torchrun(stage):
    for launcher in ("pytorchjob", "trainjob"):
        job = render_job(_request(launcher, 2, stage))
        if launcher == "pytorchjob":
            [container] = job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"]
            argv = container["command"] + container["args"]
        else:
            argv = job["spec"]["trainer"]["command"] + job["spec"]["trainer"]["args"]
        assert argv[0] == "torchrun" and argv[1].startswith("--rdzv-conf=")  # rendezvous_timeout_s, see below
        assert argv[2:7] == ["--no-python", "fourm-kfp", "stage", stage, "--preset"]
        text = " ".join(argv)
        for expected in ("--set train.steps=10", f"--root {POD_ROOT}", "--store s3://fourm-kfp",
                         "--mlflow-tracking-uri http://mlflow:5000", "--parent-run-id parent123",
                         *(f"--input {name}={uri}" for name, uri in INPUTS[stage].items())):
            assert expected in text, expected
        assert argv[argv.index("--set", argv.index("train.steps=10")) + 1] == "data.caption=a b c"  # one argument
        assert "--force" not in argv  # a restarted pod resumes, never clears
        assert not any(a.startswith("--nnodes") or a.startswith("--nproc") for a in argv)  # from PET_* variables


def test_trainjob_shape():
    job = render_job(_request("trainjob", 4))
    spec = job["spec"]
    assert spec["runtimeRef"]["name"] == "fourm-torch-distributed"  # ours, with the restart budget
    assert spec["trainer"]["numNodes"] == 4 and spec["trainer"]["numProcPerNode"] == 8
    assert spec["trainer"]["resourcesPerNode"]["limits"]["nvidia.com/gpu"] == 8
    assert spec["activeDeadlineSeconds"] == 7200 + 86400  # deadline_s + queue_timeout_s
    assert not [e for e in spec["trainer"]["env"] if e["name"].startswith("PET_")]  # reserved by the runtime
    [patch] = spec["runtimePatches"]
    [node] = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
    pod = node["template"]["spec"]["template"]
    assert pod["metadata"]["annotations"]["sidecar.istio.io/inject"] == "false"
    assert pod["spec"]["nodeSelector"] == {"nvidia.com/gpu.product": "H100"}


def test_cpu_nodes_request_no_accelerator():
    for launcher in ("pytorchjob", "trainjob"):
        job = render_job(_request(launcher, 2, accelerator="cpu", procs_per_node=4, cpu_per_node="16",
                                  memory_per_node="64Gi", tolerations=[], node_selector={}))
        text = to_yaml(job)
        assert "nvidia.com/gpu" not in text
        resources = (job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]["resources"]
                     if launcher == "pytorchjob" else job["spec"]["trainer"]["resourcesPerNode"])
        assert resources["requests"]["cpu"] == "16" and resources["limits"]["memory"] == "64Gi"


@pytest.mark.parametrize("nodes,min_nodes", [(2, 1), (2, 2), (4, 2)])
def test_an_elastic_pytorchjob_has_what_the_operator_s_webhook_requires(validators, nodes, min_nodes):
    """The webhook (``pkg/webhooks/pytorch/pytorchjob_webhook.go``): an elastic job needs a Worker spec; Master
    replicas 1, Worker replicas at least 1."""
    spec = render_job(_request("pytorchjob", nodes, min_nodes=min_nodes))["spec"]
    replicas = spec["pytorchReplicaSpecs"]
    assert "elasticPolicy" in spec and replicas["Master"]["replicas"] == 1 and replicas["Worker"]["replicas"] >= 1
    assert spec["elasticPolicy"]["maxReplicas"] == sum(r["replicas"] for r in replicas.values())


def test_elastic_pytorchjob(validators):
    job = render_job(_request("pytorchjob", 4, min_nodes=2))
    assert job["spec"]["elasticPolicy"] == {"minReplicas": 2, "maxReplicas": 4, "rdzvBackend": "c10d",
                                            "rdzvHost": f"{job['metadata']['name']}-master-0",  # not worker-0
                                            "maxRestarts": RESTARTS}  # torchrun counts per node
    assert job["spec"]["runPolicy"]["backoffLimit"] == RESTARTS * 4 + 1
    assert not crd_errors(validators["pytorchjob"], job)


def test_no_credentials_in_the_spec():
    for launcher in ("pytorchjob", "trainjob"):
        text = json.dumps(render_job(_request(launcher, 2)))
        assert "fourm-s3-credentials" in text  # referenced by name only
        for env in (e for e in json.loads(text).get("spec", {}).get("trainer", {}).get("env", [])
                    if "KEY" in e["name"]):
            assert "value" not in env and "secretKeyRef" in env["valueFrom"]


@pytest.mark.parametrize("stage", list(JOB_STAGES))
def test_bad_parameters_name_the_stage_s_pipeline_parameter(stage):
    prefix = stage.replace("-", "_")
    cases = {"nodes": dict(nodes=0, min_nodes=0), "procs_per_node": dict(procs_per_node=0),
             "min_nodes": dict(min_nodes=5), "memory_per_node": dict(memory_per_node="lots"),
             "node_selector": dict(node_selector=["gpu"]), "launcher": dict(launcher="slurm")}
    for param, change in cases.items():
        with pytest.raises(ConfigError, match=rf"^{prefix}_{param}\b"):
            render_job(_request(**{"launcher": "pytorchjob", "stage": stage, **change}))
    # one node renders no Worker, and the webhook rejects an elastic job without one
    with pytest.raises(ConfigError, match=rf"^{prefix}_min_nodes=1 with {prefix}_nodes=1: .*{prefix}_min_nodes=0"):
        render_job(_request("pytorchjob", 1, stage, min_nodes=1))
    with pytest.raises(ConfigError, match=f"{prefix}_launcher=pytorchjob"):
        render_job(_request("trainjob", 2, stage, min_nodes=1))
    with pytest.raises(ConfigError, match="'prepare-data' does not run as a job"):
        render_job(dataclasses.replace(_request("pytorchjob", 2), stage="prepare-data"))


def test_one_record_per_job_kind_named_as_the_launcher_parameter_names_it():
    """The launcher's names for the job kinds are the records' (one record each: resource, template, renderer ...)."""
    assert tuple(JOB_KINDS) == JOB_LAUNCHERS and all(kind.name == name for name, kind in JOB_KINDS.items())
    assert {kind.resource.kind for kind in JOB_KINDS.values()} == {"PyTorchJob", "TrainJob"}
    for kind in JOB_KINDS.values():  # each renders its own kind from its own template
        assert render_job(_request(kind.name, 2))["kind"] == kind.resource.kind == kind.load_template()["kind"]


def test_the_template_is_the_file_users_submit():
    """What the launcher renders from is manifests/base/pytorchjob-template.yaml itself (shipped as package data)."""
    from pathlib import Path

    import yaml

    repo = Path(__file__).resolve().parents[2]
    for launcher, name in (("pytorchjob", "pytorchjob-template.yaml"), ("trainjob", "trainjob-template.yaml")):
        assert JOB_KINDS[launcher].load_template() == yaml.safe_load(
            (repo / "manifests" / "base" / name).read_text())
    # as written (Master + 1 Worker) the template has the restart budget the launcher renders for 2 nodes
    template = JOB_KINDS["pytorchjob"].load_template()
    nodes = sum(r["replicas"] for r in template["spec"]["pytorchReplicaSpecs"].values())
    assert template["spec"]["runPolicy"]["backoffLimit"] == render_job(_request("pytorchjob", nodes))["spec"][
        "runPolicy"]["backoffLimit"]


# ------------------------------------------------------------------------------------------- run-wide settings


def _runtimes() -> dict[str, dict]:
    """The ClusterTrainingRuntimes we ship, by name."""
    return {d["metadata"]["name"]: d for d in yaml.safe_load_all(RUNTIMES_FILE.read_text()) if d}


def _pod_specs(job: dict) -> list[dict]:
    """The pod spec of every replica (PyTorchJob) or of the runtime patch (TrainJob)."""
    if job["kind"] == "PyTorchJob":
        return [r["template"]["spec"] for r in job["spec"]["pytorchReplicaSpecs"].values()]
    [patch] = job["spec"]["runtimePatches"]
    return [n["template"]["spec"]["template"]["spec"]
            for n in patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]]


def _assert_valid(validators, job: dict) -> None:
    errors = crd_errors(validators[job["kind"].lower()], job)
    if job["kind"] == "PyTorchJob":
        errors += [e for role, replica in job["spec"]["pytorchReplicaSpecs"].items()
                   for e in pod_template_errors(f"{job['metadata']['name']}-{role.lower()}", replica["template"])]
    assert not errors, "\n".join(errors)


def _cluster(**fields) -> ClusterParams:
    return ClusterParams(**fields)


@pytest.mark.parametrize("nodes,min_nodes", [(1, 0), (2, 0), (4, 0), (4, 2)])
@pytest.mark.parametrize("scheduler,queue", [("volcano", None), ("volcano:research", "research")])
def test_volcano_gang_schedules_a_pytorchjob_through_its_scheduling_policy(validators, nodes, min_nodes, scheduler,
                                                                             queue):
    """Training Operator v1.9 (``--gang-scheduler-name=volcano``) makes a PodGroup with ``minMember`` =
    ``schedulingPolicy.minAvailable`` (all replicas when unset) and ``queue`` = ``schedulingPolicy.queue`` ("default"
    when unset), and creates the pods only once the group is admitted; an elastic job starts with ``min_nodes``."""
    job = render_job(_request("pytorchjob", nodes, min_nodes=min_nodes, cluster=_cluster(scheduler=scheduler)))
    _assert_valid(validators, job)
    policy = job["spec"]["runPolicy"]["schedulingPolicy"]
    replicas = sum(r["replicas"] for r in job["spec"]["pytorchReplicaSpecs"].values())
    assert policy["minAvailable"] == (min_nodes or nodes) and replicas == nodes
    assert policy.get("queue") == queue
    assert "kueue.x-k8s.io/queue-name" not in job["metadata"]["labels"]


@pytest.mark.parametrize("nodes", [1, 2, 4])
@pytest.mark.parametrize("scheduler,queue", [("volcano", None), ("volcano:research", "research")])
def test_volcano_gang_schedules_a_trainjob_through_our_volcano_runtime(validators, nodes, scheduler, queue):
    """Trainer v2.2 takes ``podGroupPolicy`` from the runtime only (a TrainJob's ``runtimePatches`` reach metadata
    and the pod template, not the policy), so the job refers to our runtime with ``podGroupPolicy.volcano``, whose pods
    name Volcano as their scheduler (the plugin does not set it); the plugin's PodGroup has ``minMember`` = the node
    pods and its queue from the JobSet metadata's ``scheduling.volcano.sh/queue-name`` (an empty one is rejected)."""
    job = render_job(_request("trainjob", nodes, cluster=_cluster(scheduler=scheduler)))
    _assert_valid(validators, job)
    runtime = _runtimes()[job["spec"]["runtimeRef"]["name"]]
    assert job["spec"]["runtimeRef"]["name"] == "fourm-torch-distributed-volcano"
    assert runtime["spec"]["podGroupPolicy"] == {"volcano": {}}
    [node] = runtime["spec"]["template"]["spec"]["replicatedJobs"]
    assert node["template"]["spec"]["template"]["spec"]["schedulerName"] == "volcano"
    [patch] = job["spec"]["runtimePatches"]
    annotations = patch["trainingRuntimeSpec"]["template"].get("metadata", {}).get("annotations", {})
    assert annotations.get("scheduling.volcano.sh/queue-name") == queue
    assert job["spec"]["trainer"]["numNodes"] == nodes  # the PodGroup's minMember


@pytest.mark.parametrize("launcher", ["pytorchjob", "trainjob"])
def test_kueue_admits_the_job_of_its_queue_label(validators, launcher):
    """Kueue (``jobframework.QueueNameForObject``) reads the LocalQueue from the job's ``kueue.x-k8s.io/queue-name``
    label and its webhook suspends a labelled job until its Workload is admitted; no gang PodGroup, no suspend of ours
    (a job Kueue does not manage would stay suspended). A PyTorchJob's scheduler states that Kueue's PyTorchJob
    integration is on (test_kueue_s_pytorchjob_integration_must_be_stated)."""
    scheduler = "kueue:team-a" + (":pytorchjob-integration-on" if launcher == "pytorchjob" else "")
    job = render_job(_request(launcher, 4, cluster=_cluster(scheduler=scheduler)))
    _assert_valid(validators, job)
    assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"
    if launcher == "pytorchjob":
        assert "schedulingPolicy" not in job["spec"]["runPolicy"] and "suspend" not in job["spec"]["runPolicy"]
    else:
        assert job["spec"]["runtimeRef"]["name"] == "fourm-torch-distributed" and "suspend" not in job["spec"]


@pytest.mark.parametrize("stage", list(JOB_STAGES))
def test_kueue_s_pytorchjob_integration_must_be_stated(stage):
    """Kueue 0.19 turned its PyTorchJob integration off by default (kubernetes-sigs/kueue PR #12606): with it off,
    Kueue ignores the queue label and the job runs at once, unqueued. So a PyTorchJob is refused before anything is
    created unless the scheduler says the integration is on; a TrainJob (on by default) needs no statement."""
    prefix = stage.replace("-", "_")
    with pytest.raises(ConfigError, match=rf"scheduler='kueue:team-a' with {prefix}_launcher=pytorchjob: .*PR #12606.*"
                                          r"scheduler=kueue:team-a:pytorchjob-integration-on"):
        render_job(_request("pytorchjob", 2, stage, cluster=_cluster(scheduler="kueue:team-a")))
    render_job(_request("trainjob", 2, stage, cluster=_cluster(scheduler="kueue:team-a")))
    with pytest.raises(ConfigError, match="'team-a:on' is not a queue name"):  # no other statement is read
        render_job(_request("trainjob", 2, stage, cluster=_cluster(scheduler="kueue:team-a:on")))


def test_the_default_scheduler_gets_no_gang_policy():
    pytorchjob, trainjob = (render_job(_request(launcher, 4)) for launcher in ("pytorchjob", "trainjob"))
    assert "schedulingPolicy" not in pytorchjob["spec"]["runPolicy"]
    assert trainjob["spec"]["runtimeRef"]["name"] == TRAINJOB_RUNTIMES[""] == "fourm-torch-distributed"
    assert "podGroupPolicy" not in _runtimes()[TRAINJOB_RUNTIMES[""]]["spec"]
    for job in (pytorchjob, trainjob):
        assert "kueue.x-k8s.io/queue-name" not in job["metadata"]["labels"]


def test_a_trainjob_refers_to_a_runtime_we_ship():
    assert set(TRAINJOB_RUNTIMES.values()) == set(_runtimes())
    for scheduler in ("", "volcano", "volcano:q", "kueue:q"):
        ref = render_job(_request("trainjob", 2, cluster=_cluster(scheduler=scheduler)))["spec"]["runtimeRef"]
        assert ref == {"name": TRAINJOB_RUNTIMES[scheduler.partition(":")[0]]}  # kind ClusterTrainingRuntime (default)


@pytest.mark.parametrize("scheduler", ["slurm", "kueue", "kueue:", "volcano:", "volcano:Research", ":q", "Volcano",
                                       "kueue:" + "q" * 64])
def test_a_bad_scheduler_names_the_parameter(scheduler):
    with pytest.raises(ConfigError, match=r"^scheduler="):
        render_job(_request("pytorchjob", 2, cluster=_cluster(scheduler=scheduler)))


def _rendezvous_timeout(job: dict, monkeypatch) -> timedelta:
    """How long the container's torchrun waits for its peers: the rendered command parsed by torchrun's own parser
    with the variables the operator sets in the pod (node 1's), and the rendezvous handler it would make."""
    from torch.distributed import HashStore
    from torch.distributed import run as torchrun
    from torch.distributed.elastic.rendezvous import RendezvousParameters, registry
    from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import create_handler

    if job["kind"] == "PyTorchJob":
        [container] = job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"]
        nodes = sum(r["replicas"] for r in job["spec"]["pytorchReplicaSpecs"].values())
    else:
        container, nodes = job["spec"]["trainer"], job["spec"]["trainer"]["numNodes"]
    env = {"PET_NPROC_PER_NODE": "8", "OMP_NUM_THREADS": "1"}
    elastic = job["spec"].get("elasticPolicy")
    if elastic:  # pkg/controller.v1/pytorch/elastic.go
        env.update(PET_RDZV_BACKEND="c10d", PET_RDZV_ENDPOINT="master-0:23456", PET_MAX_RESTARTS="3",
                   PET_NNODES=f"{elastic['minReplicas']}:{elastic['maxReplicas']}")
    else:  # the operator's and Trainer's torch plugin's static rendezvous
        env.update(PET_NNODES=str(nodes), PET_NODE_RANK="1", PET_MASTER_ADDR="master-0", PET_MASTER_PORT="23456")
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert container["command"] == ["torchrun"]
    config, entry, _ = torchrun.config_from_args(torchrun.get_args_parser().parse_args(container["args"]))
    assert entry == "fourm-kfp"
    params = RendezvousParameters(config.rdzv_backend, config.rdzv_endpoint, config.run_id, config.min_nodes,
                                  config.max_nodes, **config.rdzv_configs)
    if config.rdzv_backend == "static":
        return registry.get_rendezvous_handler(params).timeout  # the TCPStore's: connect and wait for all nodes
    assert config.rdzv_backend == "c10d"
    store = HashStore()
    return create_handler(store, C10dRendezvousBackend(store, config.run_id), params).settings.timeout.join


@pytest.mark.parametrize("launcher,min_nodes", [("pytorchjob", 0), ("pytorchjob", 2), ("trainjob", 0)])
@pytest.mark.parametrize("timeout_s", [None, 2400])
def test_started_nodes_wait_the_rendezvous_timeout_for_the_others(monkeypatch, launcher, min_nodes, timeout_s):
    """torchrun's defaults (900 s static, a 600 s c10d join) are shorter than a partly placed job may wait for its
    last nodes; the rendered command waits ``rendezvous_timeout_s`` (default 1800 s) instead."""
    cluster = _cluster() if timeout_s is None else _cluster(rendezvous_timeout_s=timeout_s)
    job = render_job(_request(launcher, 4, min_nodes=min_nodes, cluster=cluster))
    assert _rendezvous_timeout(job, monkeypatch) == timedelta(seconds=cluster.rendezvous_timeout_s)
    assert cluster.rendezvous_timeout_s > 900


GPU_SELECTOR = {"nvidia.com/gpu.product": "A100", "pool": "gpu"}
GPU_TOLERATIONS = [{"key": "dedicated", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"},
                   {"key": "gpu-pool", "operator": "Exists", "effect": "NoSchedule"}]


@pytest.mark.parametrize("launcher", ["pytorchjob", "trainjob"])
def test_the_run_s_gpu_placement_goes_on_gpu_jobs_only(validators, launcher):
    """On a GPU job the stage's node selector and tolerations win on a key clash (H100 over A100, dedicated=training
    over dedicated=gpu), the run's others are added, the accelerator's own toleration stays; a CPU job gets none of
    the run's GPU placement."""
    cluster = _cluster(gpu_node_selector=GPU_SELECTOR, gpu_tolerations=GPU_TOLERATIONS)
    job = render_job(_request(launcher, 2, cluster=cluster))
    _assert_valid(validators, job)
    for pod in _pod_specs(job):
        assert pod["nodeSelector"] == {"nvidia.com/gpu.product": "H100", "pool": "gpu"}
        assert sorted((t["key"], t.get("value")) for t in pod["tolerations"]) == [
            ("dedicated", "training"), ("gpu-pool", None), ("nvidia.com/gpu", None)]
    for selector, tolerations in (({}, []), ({"pool": "cpu"}, [{"key": "spot", "operator": "Exists"}])):
        job = render_job(_request(launcher, 2, accelerator="cpu", procs_per_node=4, node_selector=selector,
                                  tolerations=tolerations, cluster=cluster))
        _assert_valid(validators, job)
        for pod in _pod_specs(job):
            assert pod.get("nodeSelector", {}) == selector and pod.get("tolerations", []) == tolerations


@pytest.mark.parametrize("launcher", ["pytorchjob", "trainjob"])
def test_the_image_pull_secret_is_on_every_pod(validators, launcher):
    """A TrainJob's runtime patch takes ``imagePullSecrets`` (Trainer v2.2 ``PodSpecPatch``: the strict CRD check
    would fail on a field it lacks). Unless told otherwise, the run's default Secret name (which the kubelet skips
    when it does not exist); "" (outside KFP, which refuses it) names none."""
    job = render_job(_request(launcher, 4, cluster=_cluster(image_pull_secret="ghcr-pull")))
    _assert_valid(validators, job)
    assert [pod["imagePullSecrets"] for pod in _pod_specs(job)] == [[{"name": "ghcr-pull"}]] * len(_pod_specs(job))
    default = _pod_specs(render_job(_request(launcher, 4)))
    assert [pod["imagePullSecrets"] for pod in default] == [[{"name": "fourm-image-pull"}]] * len(default)
    none = render_job(_request(launcher, 4, cluster=_cluster(image_pull_secret="")))
    assert all("imagePullSecrets" not in pod for pod in _pod_specs(none))


@pytest.mark.parametrize("launcher", ["pytorchjob", "trainjob"])
def test_a_kept_job_is_labelled_keep_and_outlives_the_run(validators, launcher):
    """KFP deletes a finished run's Workflow after TTL_SECONDS_AFTER_WORKFLOW_FINISH (a day; the API server's
    resource_manager.go), and the garbage collector then deletes what it owns: a kept job (delete_job=false) has no
    owner, and no TTL of its own either."""
    kept = render_job(_request(launcher, 2, delete_job=False))
    _assert_valid(validators, kept)
    assert kept["metadata"]["labels"][KEEP_LABEL] == "true"
    assert "ownerReferences" not in kept["metadata"]
    assert "ttlSecondsAfterFinished" not in (kept["spec"].get("runPolicy") or {})
    deleted = render_job(_request(launcher, 2))
    assert KEEP_LABEL not in deleted["metadata"]["labels"]
    assert deleted["metadata"]["ownerReferences"][0]["kind"] == "Workflow"


def test_bad_cluster_settings_name_their_parameter():
    cases = {"image_pull_secret": dict(image_pull_secret="GHCR pull"), "gpu_node_selector": dict(
        gpu_node_selector=["gpu"]), "gpu_tolerations": dict(gpu_tolerations={"key": "gpu"}),
             "rendezvous_timeout_s": dict(rendezvous_timeout_s=0), "queue_timeout_s": dict(queue_timeout_s=-1)}
    for param, change in cases.items():
        for launcher in ("pytorchjob", "trainjob"):
            with pytest.raises(ConfigError, match=rf"^{param}="):
                render_job(_request(launcher, 2, cluster=_cluster(**change)))
    with pytest.raises(ConfigError, match=r"^rendezvous_timeout_s="):
        render_job(_request("pytorchjob", 2, cluster=_cluster(rendezvous_timeout_s="1800")))


NCCL_ENV = {"NCCL_IB_HCA": "mlx5_0,mlx5_1", "NCCL_SOCKET_IFNAME": "eth0", "NCCL_IB_GID_INDEX": "3"}


def _training_containers(job: dict) -> list[dict]:
    """Every pod's training container; on a TrainJob with the trainer's env and resources, as Trainer merges them."""
    if job["kind"] == "PyTorchJob":
        return [pod["containers"][0] for pod in _pod_specs(job)]
    trainer = job["spec"]["trainer"]
    return [{**[c for c in pod["containers"] if c["name"] == "node"][0], "env": trainer["env"],
             "resources": trainer["resourcesPerNode"]} for pod in _pod_specs(job)]


@pytest.mark.parametrize("launcher", ["pytorchjob", "trainjob"])
@pytest.mark.parametrize("rdma_resource, resource, count", [("rdma/rdma_shared_device_a", "rdma/rdma_shared_device_a", 1),
                                                            ("rdma/hca_shared_devices_a=2", "rdma/hca_shared_devices_a", 2)])
def test_the_rdma_and_nccl_settings_reach_every_pod(validators, launcher, rdma_resource, resource, count):
    """rdma_resource: the RDMA device plugin's resource requested (and limited) per node, with IPC_LOCK added to the
    container's capabilities (all others still dropped); nccl_env: NCCL's variables on every node. Checked against
    the operators' CRDs and, for a PyTorchJob, Kubernetes' PodTemplate schema (strict: a misplaced field fails)."""
    job = render_job(_request(launcher, 3, cluster=_cluster(rdma_resource=rdma_resource, nccl_env=NCCL_ENV)))
    _assert_valid(validators, job)
    for container in _training_containers(job):
        resources = container["resources"]
        assert resources["requests"][resource] == resources["limits"][resource] == count
        assert resources["limits"]["nvidia.com/gpu"] == 8  # beside the accelerator
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert {k: env[k] for k in NCCL_ENV} == NCCL_ENV
        assert container["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["IPC_LOCK"]}


@pytest.mark.parametrize("launcher", ["pytorchjob", "trainjob"])
def test_rdma_and_nccl_are_off_by_default(validators, launcher):
    job = render_job(_request(launcher, 3))
    _assert_valid(validators, job)
    for container in _training_containers(job):
        assert not [r for section in container["resources"].values() for r in section if r.startswith("rdma/")]
        assert not [e for e in container["env"] if e["name"].startswith("NCCL_")]
        assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert ClusterParams().rdma_resource == "" and ClusterParams().nccl_env == {}


@pytest.mark.parametrize("launcher", ["pytorchjob", "trainjob"])
def test_nccl_env_alone_sets_the_variables_without_a_device(validators, launcher):
    """NCCL over the pod network on a chosen interface (NCCL_SOCKET_IFNAME), no RDMA device, no extra capability."""
    job = render_job(_request(launcher, 2, cluster=_cluster(nccl_env={"NCCL_SOCKET_IFNAME": "net1"})))
    _assert_valid(validators, job)
    for container in _training_containers(job):
        assert {"name": "NCCL_SOCKET_IFNAME", "value": "net1"} in container["env"]
        assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}


@pytest.mark.parametrize("change", [dict(rdma_resource="rdma_shared_device_a"), dict(rdma_resource="rdma/dev=0"),
                                    dict(rdma_resource="nvidia.com/gpu"), dict(nccl_env={"IB_HCA": "mlx5"}),
                                    dict(nccl_env={"NCCL_IB_HCA": 5}), dict(nccl_env=["NCCL_IB_HCA=mlx5"])])
def test_bad_rdma_and_nccl_settings_name_their_parameter(change):
    [param] = change
    with pytest.raises(ConfigError, match=rf"^{param}="):
        render_job(_request("pytorchjob", 2, cluster=_cluster(**change)))
