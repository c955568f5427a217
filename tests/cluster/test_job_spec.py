"""Rendered stage jobs (pretrain and train-tokenizers), checked against the real schemas: the PyTorchJob and
TrainJob CRDs as the operators ship them (strict: an unknown field fails) and, for PyTorchJob pod templates,
Kubernetes' own PodTemplate schema; plus the contract the launcher and the operators rely on (replicas, integer
processes per node, run policy, owner, labels, the one training entry point, no credentials in the spec)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from fourm_kfp.cluster.job_spec import (ADDRESS_LABEL, JOB_STAGES, POD_ROOT, RESTARTS, RUN_ID_LABEL, STAGE_LABEL,
                                        JobRequest, OwnerPod, job_name, load_template, render_job, to_yaml)
from fourm_kfp.images import GPU_IMAGE
from fourm_kfp.config.schema import ConfigError
from fourm_kfp.launchers.remote import stage_command
from fourm_kfp.launchers.stage import RunContext
from tests.k8s_schemas import PYTORCHJOB_CRD, TRAINJOB_CRD, crd_errors, crd_validator, pod_template_errors

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
                  owner=OwnerPod("fourm-pretrain-abc-system-container-impl", "0b6e-uid"))
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
    assert run_policy["cleanPodPolicy"] == "All" and run_policy["activeDeadlineSeconds"] == 7200
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
        assert (owner["kind"], owner["name"], owner["uid"]) == ("Pod", "fourm-pretrain-abc-system-container-impl",
                                                                "0b6e-uid")
        assert owner["blockOwnerDeletion"] is False  # True would need update on pods/finalizers (not granted)


@pytest.mark.parametrize("stage", list(JOB_STAGES))
def test_container_runs_the_one_training_entry_point_through_torchrun(stage):
    for launcher in ("pytorchjob", "trainjob"):
        job = render_job(_request(launcher, 2, stage))
        if launcher == "pytorchjob":
            [container] = job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"]
            argv = container["command"] + container["args"]
        else:
            argv = job["spec"]["trainer"]["command"] + job["spec"]["trainer"]["args"]
        assert argv[:6] == ["torchrun", "--no-python", "fourm-kfp", "stage", stage, "--preset"]
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
    assert spec["runtimeRef"]["name"] == "torch-distributed"
    assert spec["trainer"]["numNodes"] == 4 and spec["trainer"]["numProcPerNode"] == 8
    assert spec["trainer"]["resourcesPerNode"]["limits"]["nvidia.com/gpu"] == 8
    assert spec["activeDeadlineSeconds"] == 7200
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


def test_the_template_is_the_file_users_submit():
    """What the launcher renders from is manifests/base/pytorchjob-template.yaml itself (shipped as package data)."""
    from pathlib import Path

    import yaml

    repo = Path(__file__).resolve().parents[2]
    for launcher, name in (("pytorchjob", "pytorchjob-template.yaml"), ("trainjob", "trainjob-template.yaml")):
        assert load_template(launcher) == yaml.safe_load((repo / "manifests" / "base" / name).read_text())
    # as written (Master + 1 Worker) the template has the restart budget the launcher renders for 2 nodes
    template = load_template("pytorchjob")
    nodes = sum(r["replicas"] for r in template["spec"]["pytorchReplicaSpecs"].values())
    assert template["spec"]["runPolicy"]["backoffLimit"] == render_job(_request("pytorchjob", nodes))["spec"][
        "runPolicy"]["backoffLimit"]
