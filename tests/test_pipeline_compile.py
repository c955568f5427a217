"""The committed compiled pipeline must match the pipeline definition (regenerate: make compile)."""

from __future__ import annotations

import inspect

import pytest
import yaml

from fourm_kfp.pipeline_runs.compile import compile_pipeline, default_output


def test_committed_pipeline_yaml_is_current(tmp_path):
    fresh = compile_pipeline(tmp_path / "fresh.yaml").read_text()
    committed = default_output()
    assert committed.exists(), "pipelines/fourm_pretrain.yaml is missing: run `make compile` and commit it"
    assert fresh == committed.read_text(), "pipelines/fourm_pretrain.yaml is stale: run `make compile` and commit it"


def test_every_stage_of_the_table_has_its_force_and_a_fan_out_stage_its_width_parameter(tmp_path):
    """A stage added to the stage table gets its `<stage>_force` parameter (and `<stage>_width` when it fans out)
    in the compiled pipeline, as the KFP UI shows them; no other stage has a width."""
    from fourm_kfp.stages import STAGES

    spec, _ = yaml.safe_load_all(compile_pipeline(tmp_path / "p.yaml").read_text())
    params = spec["root"]["inputDefinitions"]["parameters"]
    widths = {name for name in params if name.endswith("_width")}
    expected_widths = set()
    for name, stage in STAGES.items():
        param = name.replace("-", "_")
        assert params.get(f"{param}_force", {}).get("parameterType") == "BOOLEAN", f"{param}_force"
        if stage.run_part is not None:
            expected_widths.add(f"{param}_width")
            assert params[f"{param}_width"]["parameterType"] == "NUMBER_INTEGER", f"{param}_width"
    assert widths == expected_widths


def _tasks(spec: dict) -> dict[str, dict]:
    """Every step of the compiled pipeline by its display name, from the root DAG down through the sub-DAGs."""
    components, found, dags = spec["components"], {}, [spec["root"]["dag"]]
    while dags:
        for task in dags.pop()["tasks"].values():
            found[task["taskInfo"]["name"]] = task
            component = components[task["componentRef"]["name"]]
            if "dag" in component:
                dags.append(component["dag"])
    return found


def test_a_fan_out_stage_is_forced_in_its_fan_out_step_and_none_of_its_steps_is_cached(tmp_path):
    """``<stage>_force`` of a fan-out stage reaches its fan-out step, which clears the output once before the
    workers, and not its collect step, which would recompute every part in one process. No step of such a stage is
    cached: KFP's cache sees the parameters, not the store, and would hand a forced run an earlier run's outputs."""
    from fourm_kfp.stages import STAGES

    spec, _ = yaml.safe_load_all(compile_pipeline(tmp_path / "p.yaml").read_text())
    tasks = _tasks(spec)
    for name, stage in STAGES.items():
        if stage.run_part is None:
            continue
        fan_out, worker, collect = (tasks[f"{name}-fan-out"], tasks[f"{name}-part"], tasks[name])
        force = f"pipelinechannel--{name.replace('-', '_')}_force"
        assert fan_out["inputs"]["parameters"]["force"] == {"componentInputParameter": force}, name
        assert "force" not in worker["inputs"]["parameters"] and "force" not in collect["inputs"]["parameters"]
        for task in (fan_out, worker, collect):
            assert not task["cachingOptions"].get("enableCache"), task["taskInfo"]["name"]


def test_pipeline_parameters_are_flat_and_documented(tmp_path):
    import re

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
    # no store; a fan-out step has it (it clears a forced stage's output)
    light = {name for name in secrets if re.fullmatch(r"exec-pod-placement(-\d+)?", name)}
    assert all(secrets[name]["secretAsEnv"][0]["secretName"] == "fourm-s3-credentials"
               for name in set(executors) - light)


@pytest.mark.parametrize("stage, default", [("pretrain", "pytorchjob"), ("train-tokenizers", "in-pod")])
def test_job_stage_launcher_parameters_and_the_light_launcher_pod(tmp_path, stage, default):
    """A job stage is one step, placed at run time by its pod-placement step: in the job modes a 1-CPU pod without
    accelerators that knows its own name and namespace (downward API: the job's owner and namespace); in-pod, its
    training resources, on the run's accelerator or none."""
    import re

    from fourm_kfp.launchers.kfp_placement import pod_placement

    spec, platform = yaml.safe_load_all(compile_pipeline(tmp_path / "p.yaml").read_text())
    prefix = stage.replace("-", "_")
    params = spec["root"]["inputDefinitions"]["parameters"]
    defaults = {name: params[name].get("defaultValue") for name in params if name.startswith(f"{prefix}_")}
    assert defaults[f"{prefix}_launcher"] == default
    assert {f"{prefix}_{name}" for name in ("nodes", "procs_per_node", "cpu_per_node", "memory_per_node",
                                            "node_selector", "tolerations", "deadline_s", "min_nodes",
                                            "delete_job")} <= set(defaults)
    executors = spec["deploymentSpec"]["executors"]
    steps = {name: e["container"]["resources"] for name, e in executors.items()
             if re.fullmatch(rf"exec-{stage}(-\d+)?", name)}
    assert len(steps) == 1, sorted(steps)
    [(name, resources)] = steps.items()
    placeholder = re.compile(r"\{\{\$\.inputs\.parameters\['pipelinechannel--pod-placement(-\d+)?-(\w+)'\]\}\}")
    assert {key: placeholder.fullmatch(value).group(2) for key, value in (
        ("type", resources["accelerator"]["resourceType"]), ("cpu", resources["resourceCpuLimit"]),
        ("memory", resources["resourceMemoryLimit"]))} == {"type": "accelerator", "cpu": "cpu_limit",
                                                          "memory": "memory_limit"}
    field_envs = {f["name"]: f["fieldPath"]
                  for f in platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"][name]["fieldPathAsEnv"]}
    assert field_envs == {"FOURM_POD_NAME": "metadata.name", "FOURM_POD_NAMESPACE": "metadata.namespace"}
    gpu = dict(gpu_node_selector={"pool": "h100"}, gpu_tolerations=[])
    launcher = pod_placement(stage, "smoke", [], "nvidia.com/gpu", launcher="pytorchjob", **gpu)
    assert launcher == {"accelerator": "", "node_selector": {}, "tolerations": [], "cpu_limit": "1",
                        "memory_limit": "2Gi"}
    in_pod = pod_placement(stage, "smoke", [], "nvidia.com/gpu", launcher="in-pod", **gpu)
    assert in_pod["accelerator"] == "nvidia.com/gpu" and in_pod["node_selector"] == {"pool": "h100"}
    assert int(in_pod["cpu_limit"]) >= 8
    assert pod_placement(stage, "smoke", [], "cpu", launcher="in-pod", **gpu)["accelerator"] == ""


def test_job_stages_are_retried_for_longer_than_their_queue_time_and_deadline(tmp_path):
    """KFP hands Argo a step's backoffMaxDuration as the retry strategy's maxDuration, counted from the first
    attempt's start; the SDK's default (3600 s) would end a launcher's retries an hour into a multi-day training.
    The window holds the default queue time and deadline, and a step refuses a job that would outlast it."""
    from fourm_kfp.cluster.job_spec import ClusterParams, JobParams
    from fourm_kfp.config.schema import ConfigError
    from fourm_kfp.launchers.kfp_retry import RETRY_WINDOW_S, check_retry_window

    spec, _ = yaml.safe_load_all(compile_pipeline(tmp_path / "p.yaml").read_text())
    params = spec["root"]["inputDefinitions"]["parameters"]
    retried = {}
    for component in spec["components"].values():
        for task in component.get("dag", {}).get("tasks", {}).values():
            if "retryPolicy" in task:
                retried[task["componentRef"]["name"]] = task["retryPolicy"]
    assert set(retried) == {"comp-pretrain", "comp-train-tokenizers"}
    for stage in ("pretrain", "train_tokenizers"):
        policy = retried[f"comp-{stage.replace('_', '-')}"]
        window = int(policy["backoffMaxDuration"].removesuffix("s"))
        assert window == RETRY_WINDOW_S
        assert window >= (params[f"{stage}_deadline_s"]["defaultValue"] + params["queue_timeout_s"]["defaultValue"]
                          + 600)
    check_retry_window("pretrain", JobParams(deadline_s=20 * 86400), ClusterParams(queue_timeout_s=5 * 86400))
    with pytest.raises(ConfigError, match=r"pretrain_deadline_s=2592000 \+ queue_timeout_s=86400"):
        check_retry_window("pretrain", JobParams(deadline_s=30 * 86400), ClusterParams())


def test_steps_with_worker_processes_get_an_in_memory_dev_shm(tmp_path):
    """pretokenize's decode workers, a teacher's loader and the in-pod training's loader workers return tensors
    through /dev/shm, which is 64 MiB in a container unless the pod mounts more; the light steps do not need it."""
    _, platform = yaml.safe_load_all(compile_pipeline(tmp_path / "p.yaml").read_text())
    executors = platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    shm = {"volumeName": "dshm", "mountPath": "/dev/shm", "medium": "Memory"}
    with_shm = sorted(name for name, e in executors.items() if shm in e.get("emptyDirMounts", []))
    assert with_shm == ["exec-label-part", "exec-pretokenize-part", "exec-pretrain", "exec-train-tokenizers"], with_shm


@pytest.mark.parametrize("stage", ["pretrain", "train-tokenizers"])
def test_a_stage_s_job_is_declared_once(stage):
    """The job's fields live in JobParams: the pipeline's ``<stage>_<field>`` parameters and the stage component's
    ``<field>`` parameters are exactly its fields, with the stage's defaults (JOB_STAGES) and JobParams' types."""
    import inspect
    from dataclasses import fields

    from fourm_kfp.cluster.job_spec import JOB_STAGES, ClusterParams, JobParams
    from fourm_kfp.components.pretrain import pretrain
    from fourm_kfp.components.train_tokenizers import train_tokenizers
    from fourm_kfp.pipelines.fourm_pretrain import fourm_pretrain

    prefix = stage.replace("-", "_")
    pipeline = inspect.signature(fourm_pretrain.pipeline_func).parameters
    component = inspect.signature({"pretrain": pretrain, "train-tokenizers": train_tokenizers}[stage]
                                  .python_func).parameters
    for f in fields(JobParams):
        default = getattr(JOB_STAGES[stage], f.name)
        kind = {"dict[str, str]": dict, "list[dict[str, Any]]": list}.get(f.type, {"str": str, "int": int,
                                                                                  "bool": bool}.get(f.type))
        for name, params in ((f"{prefix}_{f.name}", pipeline), (f.name, component)):
            assert name in params, f"{name}: a JobParams field missing from the signature"
            assert params[name].default == default, f"{name}: default {params[name].default!r}, JobParams {default!r}"
            assert params[name].annotation in (kind, kind.__name__), f"{name}: type {params[name].annotation!r}"
    job_like = {n.removeprefix(f"{prefix}_") for n in pipeline if n.startswith(f"{prefix}_")}
    others = {"force", "config_overrides"}  # <stage>_force, pretrain_config_overrides: the stage's, not the job's
    assert job_like - others == {f.name for f in fields(JobParams)}
    # The run-wide cluster settings: one pipeline parameter each, unprefixed, passed to both job components.
    for f in fields(ClusterParams):
        default = ClusterParams().__getattribute__(f.name)
        for params in (pipeline, component):
            assert f.name in params and params[f.name].default == default, f"{f.name}: {params.get(f.name)}"


def test_an_image_tag_pins_every_step_and_the_jobs_they_launch(tmp_path):
    """`compile --image-tag` (what submit uses for a commit's images): every executor runs that tag, and the job
    launchers carry it to the pod, whose job spec then names the same GPU image."""
    import os
    import subprocess
    import sys

    from fourm_kfp import __version__
    from fourm_kfp.errors import UserError

    spec, platform = yaml.safe_load_all(compile_pipeline(tmp_path / "p.yaml", image_tag="0a1b2c3d").read_text())
    executors = spec["deploymentSpec"]["executors"]
    images = {e["container"]["image"] for e in executors.values()}
    assert images == {"ghcr.io/fourm-kfp/fourm-kfp-python:0a1b2c3d", "ghcr.io/fourm-kfp/fourm-kfp-python-gpu:0a1b2c3d"}
    launchers = [e for e in executors.values() if {"name": "FOURM_IMAGE_TAG", "value": "0a1b2c3d"}
                 in e["container"].get("env", [])]
    assert len(launchers) == 2  # the pretrain and train-tokenizers job launchers
    default, _ = yaml.safe_load_all(compile_pipeline(tmp_path / "d.yaml").read_text())
    assert {e["container"]["image"].rsplit(":", 1)[1] for e in default["deploymentSpec"]["executors"].values()} \
        == {__version__}
    in_pod = subprocess.run([sys.executable, "-c", "from fourm_kfp.images import GPU_IMAGE; "
                             "print(GPU_IMAGE)"], env={**os.environ, "FOURM_IMAGE_TAG": "0a1b2c3d"},
                            capture_output=True, text=True, check=True)
    assert in_pod.stdout.strip() == "ghcr.io/fourm-kfp/fourm-kfp-python-gpu:0a1b2c3d"
    with pytest.raises(UserError, match="--image-tag 'main/x': not a Docker image tag"):
        compile_pipeline(tmp_path / "bad.yaml", image_tag="main/x")


@pytest.fixture(scope="module")
def _noop_component():
    from kfp import dsl

    @dsl.component(base_image="python:3.11")
    def noop():
        pass

    return noop


def test_a_resource_setter_on_a_sub_pipeline_still_names_itself_in_kfp_s_error(_noop_component):
    """The pipeline module hands kfp's ``pipeline_task`` a ``stack()`` without source lines (building the pipeline
    read every frame's source file); kfp's error for a setter on a pipeline used as a component must still say which
    setter it was."""
    from kfp import dsl
    from kfp.dsl import pipeline_task

    from pipelines import fourm_pretrain

    assert pipeline_task.inspect is not inspect, f"{fourm_pretrain.__name__} left kfp's inspect as it was"

    @dsl.pipeline
    def inner():
        _noop_component()

    @dsl.pipeline
    def outer():
        task = inner()
        for setter, value in (("set_memory_limit", "1G"), ("set_cpu_limit", "1")):
            with pytest.raises(ValueError, match=f"^{setter} can only be used on single-step components"):
                getattr(task, setter)(value)
