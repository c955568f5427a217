"""The committed compiled pipeline must match the pipeline definition (regenerate: make compile)."""

from __future__ import annotations

import yaml

from fourm_kfp.launchers.compile import compile_pipeline, default_output


def test_committed_pipeline_yaml_is_current(tmp_path):
    fresh = compile_pipeline(tmp_path / "fresh.yaml").read_text()
    committed = default_output()
    assert committed.exists(), "pipelines/fourm_pretrain.yaml is missing: run `make compile` and commit it"
    assert fresh == committed.read_text(), "pipelines/fourm_pretrain.yaml is stale: run `make compile` and commit it"


def test_pipeline_parameters_are_flat_and_documented(tmp_path):
    spec, platform = yaml.safe_load_all(compile_pipeline(tmp_path / "p.yaml").read_text())
    params = spec["root"]["inputDefinitions"]["parameters"]
    assert {"preset", "config_overrides", "store_uri", "mlflow_tracking_uri", "prepare_data_force"} <= set(params)
    for name, param in params.items():
        assert param.get("description"), f"pipeline parameter {name} has no description"
    executors = spec["deploymentSpec"]["executors"]
    images = {e["container"]["image"] for e in executors.values()}
    assert all(image.startswith("ghcr.io/fourm-kfp/fourm-kfp-python") for image in images)
    for executor in executors.values():  # thin components: no pip install at run time, the image has the package
        assert "pip install" not in " ".join(executor["container"]["command"])
    secrets = platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    assert all(e["secretAsEnv"][0]["secretName"] == "fourm-s3-credentials" for e in secrets.values())


def test_pretrain_launcher_parameters_and_the_light_launcher_pod(tmp_path):
    """The job modes' pretrain step is a 1-CPU pod without accelerators that knows its own name, uid and namespace
    (downward API: the job's owner and namespace); the in-pod steps keep their training resources."""
    spec, platform = yaml.safe_load_all(compile_pipeline(tmp_path / "p.yaml").read_text())
    params = spec["root"]["inputDefinitions"]["parameters"]
    defaults = {name: params[name].get("defaultValue") for name in params if name.startswith("pretrain_")}
    assert defaults["pretrain_launcher"] == "pytorchjob"
    assert {"pretrain_nodes", "pretrain_procs_per_node", "pretrain_cpu_per_node", "pretrain_memory_per_node",
            "pretrain_node_selector", "pretrain_tolerations", "pretrain_deadline_s", "pretrain_min_nodes",
            "pretrain_delete_job"} <= set(defaults)
    executors = spec["deploymentSpec"]["executors"]
    pretrain = {name: e["container"]["resources"] for name, e in executors.items()
                if name.startswith("exec-pretrain") and "pretokenize" not in name}
    field_envs = {name: {f["name"]: f["fieldPath"] for f in e.get("fieldPathAsEnv", [])}
                  for name, e in platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"].items()}
    launchers = [name for name in pretrain if field_envs.get(name)]
    assert len(pretrain) == 3 and len(launchers) == 1
    [launcher] = launchers
    assert pretrain[launcher]["resourceCpuLimit"] == "1" and "accelerator" not in pretrain[launcher]
    assert field_envs[launcher] == {"FOURM_POD_NAME": "metadata.name", "FOURM_POD_UID": "metadata.uid",
                                    "FOURM_POD_NAMESPACE": "metadata.namespace"}
    assert sum("accelerator" in r for r in pretrain.values()) == 1  # the in-pod GPU branch


def test_steps_with_worker_processes_get_an_in_memory_dev_shm(tmp_path):
    """pretokenize's decode workers and the in-pod pretrain's loader workers return tensors through /dev/shm,
    which is 64 MiB in a container unless the pod mounts more; the light steps do not need it."""
    _, platform = yaml.safe_load_all(compile_pipeline(tmp_path / "p.yaml").read_text())
    executors = platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    shm = {"volumeName": "dshm", "mountPath": "/dev/shm", "medium": "Memory"}
    with_shm = sorted(name for name, e in executors.items() if shm in e.get("emptyDirMounts", []))
    assert with_shm == ["exec-pretokenize-part", "exec-pretrain", "exec-pretrain-2"], with_shm


def test_the_pretrain_job_is_declared_once():
    """The job's fields live in JobParams: the pipeline's ``pretrain_<field>`` parameters and the pretrain
    component's ``<field>`` parameters are exactly its fields, with its defaults and types."""
    import inspect
    from dataclasses import MISSING, fields

    from fourm_kfp.cluster.job_spec import JobParams
    from fourm_kfp.components.pretrain import pretrain
    from fourm_kfp.pipelines.fourm_pretrain import fourm_pretrain

    pipeline = inspect.signature(fourm_pretrain.pipeline_func).parameters
    component = inspect.signature(pretrain.python_func).parameters
    for f in fields(JobParams):
        default = f.default if f.default is not MISSING else f.default_factory()
        kind = {"dict[str, str]": dict, "list[dict[str, Any]]": list}.get(f.type, {"str": str, "int": int,
                                                                                  "bool": bool}.get(f.type))
        for name, params in ((f"pretrain_{f.name}", pipeline), (f.name, component)):
            assert name in params, f"{name}: a JobParams field missing from the signature"
            assert params[name].default == default, f"{name}: default {params[name].default!r}, JobParams {default!r}"
            assert params[name].annotation in (kind, kind.__name__), f"{name}: type {params[name].annotation!r}"
    job_like = {n.removeprefix("pretrain_") for n in pipeline if n.startswith("pretrain_")}
    others = {"force", "config_overrides"}  # pretrain_force, pretrain_config_overrides: the stage's, not the job's
    assert job_like - others == {f.name for f in fields(JobParams)}
