"""The job's pods take the run's Secret and ConfigMap exactly as the pipeline's steps do: the same objects, each
optional or required alike, and every variable a step reads from them reaches the job's pods too. A job that
required what the steps take as optional would be scheduled, bind its GPUs and wait in
``CreateContainerConfigError`` in a namespace whose steps all ran (the kubelet's ``makeEnvironmentVariables``,
kubernetes ``pkg/kubelet/kubelet_pods.go``, skips a missing optional object or key and fails on a required one).

The steps' references are read from the compiled pipeline's Kubernetes platform spec (``secretAsEnv``,
``configMapAsEnv``: what KFP's driver turns into ``valueFrom``/``optional`` on the step's container); the job's from
the rendered PyTorchJob and TrainJob pods."""

from __future__ import annotations

import copy

import pytest
import yaml

from fourm_kfp.pipeline_runs.compile import compile_pipeline
from tests.cluster.job_scripts import job as _job


def pod_spec(job: dict) -> dict:
    """The pod the operator makes of the job: PyTorchJob's Master template; TrainJob's runtime patch with the
    trainer's image, command, args and env on the ``node`` container (as Trainer merges them)."""
    if job["kind"] == "PyTorchJob":
        return copy.deepcopy(job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"])
    [patch] = job["spec"]["runtimePatches"]
    [node] = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
    spec = copy.deepcopy(node["template"]["spec"]["template"]["spec"])
    trainer = job["spec"]["trainer"]
    [container] = spec["containers"]
    container.update(image=trainer["image"], command=trainer["command"], args=trainer["args"], env=trainer["env"])
    return spec


@pytest.fixture(scope="module")
def step_references(tmp_path_factory):
    """{(kind, name): (optional, {variable: key})} over every step of the compiled pipeline; each step's must agree."""
    _, platform = yaml.safe_load_all(compile_pipeline(tmp_path_factory.mktemp("p") / "p.yaml").read_text())
    found: dict[tuple[str, str], tuple[bool, dict[str, str]]] = {}
    for executor, config in platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"].items():
        for field, kind, name_key, key_key in (("secretAsEnv", "Secret", "secretName", "secretKey"),
                                               ("configMapAsEnv", "ConfigMap", "configMapName", "configMapKey")):
            for ref in config.get(field) or []:
                entry = (bool(ref.get("optional")), {e["envVar"]: e[key_key] for e in ref["keyToEnv"]})
                assert found.setdefault((kind, ref[name_key]), entry) == entry, (executor, kind, ref[name_key])
    assert found
    return found


def job_references(spec: dict) -> dict[tuple[str, str], tuple[bool, dict[str, str] | None]]:
    """{(kind, name): (optional, {variable: key}, or None for all keys: envFrom)} of a pod spec's containers."""
    found: dict[tuple[str, str], tuple[bool, dict[str, str] | None]] = {}
    for container in spec["containers"]:
        for source in container.get("envFrom") or []:
            for ref_key, kind in (("secretRef", "Secret"), ("configMapRef", "ConfigMap")):
                if ref_key in source:
                    ref = source[ref_key]
                    found[kind, ref["name"]] = (bool(ref.get("optional")), None)
        for env in container.get("env") or []:
            for ref_key, kind in (("secretKeyRef", "Secret"), ("configMapKeyRef", "ConfigMap")):
                ref = (env.get("valueFrom") or {}).get(ref_key)
                if ref is not None:
                    optional, keys = found.setdefault((kind, ref["name"]), (bool(ref.get("optional")), {}))
                    assert optional == bool(ref.get("optional")), f"{kind} {ref['name']}: mixed optional"
                    keys[env["name"]] = ref["key"]
    return found


@pytest.mark.parametrize("launcher", ["pytorchjob", "trainjob"])
def test_the_job_takes_the_run_s_secret_and_configmap_as_the_steps_do(step_references, launcher):
    job = job_references(pod_spec(_job(launcher, nodes=1)))
    assert set(job) == set(step_references)
    for ref, (optional, variables) in step_references.items():
        job_optional, job_variables = job[ref]
        assert job_optional == optional, f"{ref}: optional on the steps is {optional}, on the job {job_optional}"
        if job_variables is not None:  # envFrom carries every key
            assert job_variables.items() >= variables.items(), ref
