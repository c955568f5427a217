"""The model of a KFP run on Argo that ``bench/workflow_scale.py`` measures (``bench/argo_workflow_model.py``):

- at width 2 its node and pod counts are the ones worked out by hand from the compiled pipeline, on both Argo
  configurations (KFP 2.15–2.16.1's manifests, and 2.17.0's, whose template default retry strategy wraps every
  template invocation in a Retry node);
- the executor pods it runs, and each one's input parameter values, are the ones the repository's KFP driver
  emulator (``tests/kfp_driver_emulator.py``) runs and resolves for the same compiled pipeline and task outputs;
- a Workflow over Argo's size limit is compressed, and one still over it needs node status offloading.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

import pytest
import yaml

from fourm_kfp.launchers.kfp_placement import pod_placement
from fourm_kfp.pipeline_runs.compile import compile_pipeline
from tests import kfp_driver_emulator as emulator_module
from tests.kfp_driver_emulator import DriverEmulator, stub_outputs

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import argo_workflow_model as model  # noqa: E402

FAN_OUT_STAGES = ("prepare-data", "label", "pretokenize")


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    spec, platform = yaml.safe_load_all(compile_pipeline(tmp_path_factory.mktemp("p") / "p.yaml").read_text())
    return spec, platform


def _fan_out(**inputs):
    """The fan-out step's items, as ``kfp_placement.fan_out_items`` makes them: one per part, carrying the upstream
    values its worker needs."""
    carried = {k: inputs.get(k, "") for k in ("parent_run_id", "dataset", "tokenizers_uri")}
    return {"Output": [{"part": i, **carried} for i in range(int(inputs["width"]))]}


def _outputs(spec):
    """Every task's outputs as the emulator's tests give them, the pod placements and fan-outs computed."""
    return stub_outputs(spec, components={"comp-pod-placement": pod_placement, "comp-fan-out": _fan_out})


def _task_outputs(stubbed):
    def outputs(key, component, inputs):
        value = stubbed[key]
        return value(**inputs) if callable(value) else value
    return outputs


def _widths(width: int) -> dict:
    return {f"{stage.replace('-', '_')}_width": width for stage in FAN_OUT_STAGES}


def test_the_structure_the_hand_counts_assume(compiled):
    """The hand counts below read the compiled pipeline as: a root DAG of the exit handler's DAG and its one exit
    task; under the exit handler, 15 container tasks (2 of them retried: pretrain, train-tokenizers) and 3 workers
    sub-pipelines, each one ParallelFor of one container task. A change here means counting again."""
    spec, _ = compiled
    components = spec["components"]
    root = spec["root"]["dag"]["tasks"]
    assert sorted(root) == ["close-lineage-run", "exit-handler-1"]
    assert root["close-lineage-run"]["triggerPolicy"]["strategy"] == "ALL_UPSTREAM_TASKS_COMPLETED"
    handler = components[root["exit-handler-1"]["componentRef"]["name"]]["dag"]["tasks"]
    containers = [k for k, t in handler.items() if "dag" not in components[t["componentRef"]["name"]]]
    workers = [k for k, t in handler.items() if "dag" in components[t["componentRef"]["name"]]]
    assert len(containers) == 15
    assert sorted(k for k in containers if "retryPolicy" in handler[k]) == ["pretrain", "train-tokenizers"]
    assert sorted(workers) == sorted(f"{stage}-workers" for stage in FAN_OUT_STAGES)
    for key in workers:
        [(loop_key, loop)] = components[handler[key]["componentRef"]["name"]]["dag"]["tasks"].items()
        assert "parameterIterator" in loop
        body = components[loop["componentRef"]["name"]]["dag"]["tasks"]
        assert len(body) == 1 and "dag" not in components[next(iter(body.values()))["componentRef"]["name"]]


def test_nodes_and_pods_at_width_2_are_the_hand_counts(compiled):
    """Width 2 for each of the 3 fan-out stages, W = 6 iterations in all (argocompiler ``task``, ``iteratorTask``):

    - a container task: driver pod, executor DAG, executor pod = 3 nodes, 2 pods (retried: + the Retry node);
    - a workers sub-pipeline: DAG driver pod, its DAG, the loop's iterator DAG, the iteration driver pod and the
      iterations' task group = 5 nodes, 2 pods; then per iteration: its DAG, its DAG driver pod, the body's DAG,
      and the body's container task (3 nodes, 2 pods) = 6 nodes, 3 pods;
    - the workflow's node, root-driver, root, exit-handler-1-driver, exit-handler-1, its onExit DAG and the exit
      task's 3 nodes = 9 nodes, 4 pods.

    Nodes: 9 + 15 x 3 + 2 + 3 x 5 + 6 x 6 = 107; pods: 4 + 15 x 2 + 3 x 2 + 6 x 3 = 58, of which executor pods
    (our code) 1 + 15 + 6 = 22 and driver pods 3 + 15 + 3 x 2 + 6 x 2 = 36. DAG nodes: 4 (workflow, root,
    exit-handler-1, onExit) + 16 executor DAGs + 3 x 2 (workers, iterator) + 6 x 3 (iteration, body, the worker's
    executor DAG) = 44.

    With KFP 2.17.0's template default retry every template invocation becomes a Retry node around it: all nodes
    but the 3 task groups and the 2 attempts of the tasks already retried, less those 2 Retry nodes that have
    their own strategy: 107 - 3 - 2 - 2 = 100 more, 207."""
    spec, platform = compiled
    outputs = _task_outputs(_outputs(spec))
    plain = model.model_run(spec, platform, {"preset": "demo", **_widths(2)}, outputs, model.ARGO_PLAIN)
    assert plain.counts() == {"nodes": 107, "nodes_Pod": 58, "nodes_DAG": 44, "nodes_TaskGroup": 3, "nodes_Retry": 2,
                              "nodes_Skipped": 0, "pods": 58, "driver_pods": 36, "executor_pods": 22}
    retried = model.model_run(spec, platform, {"preset": "demo", **_widths(2)}, outputs, model.ARGO_KFP_2_17)
    assert retried.counts() == {**plain.counts(), "nodes": 207, "nodes_Retry": 102}
    for stage in FAN_OUT_STAGES:  # one workers sub-pipeline: 2 + 3 x 2 pods, of which 2 run our code
        pods = [n for n in plain.run.nodes.values()
                if n.status["type"] == "Pod" and f".{stage}-workers" in n.status["name"]]
        assert len(pods) == 8
        assert sum(n.kind == "executor" for n in pods) == 2


def test_one_more_iteration_is_six_nodes_and_three_pods(compiled):
    spec, platform = compiled
    outputs = _task_outputs(_outputs(spec))
    two = model.model_run(spec, platform, {"preset": "demo", **_widths(2)}, outputs).counts()
    three = model.model_run(spec, platform, {"preset": "demo", **_widths(3)}, outputs).counts()
    assert (three["nodes"] - two["nodes"], three["pods"] - two["pods"]) == (3 * 6, 3 * 3)


class _Recording(DriverEmulator):
    """The emulator, keeping each executed container task's resolved inputs."""

    def run(self, parameters):
        self.recorded = []
        return super().run(parameters)

    def _container(self, node, dag, task, inputs, parent, path, run):
        self.recorded.append((path, inputs))
        return super()._container(node, dag, task, inputs, parent, path, run)


def _canonical(pods) -> Counter:
    return Counter((path, json.dumps(inputs, sort_keys=True)) for path, inputs in pods)


@pytest.mark.parametrize("width", [2, 5, 256])
def test_the_model_runs_the_pods_the_driver_emulator_runs(compiled, width, monkeypatch):
    """The same compiled pipeline, run parameters and task outputs: the emulator's executed container tasks (by
    task path, one per iteration in a loop) and their resolved inputs are the model's executor pods'. At width 256
    (the issue's check: the compiled pipeline at width 256 gets through the driver emulator) it takes seconds."""
    spec, platform = compiled
    for name, value in (("RUN_ID", emulator_module.RUN_ID), ("WORKFLOW_NAME", emulator_module.RUN_NAME),
                        ("RUN_DISPLAY_NAME", emulator_module.RUN_DISPLAY_NAME)):
        monkeypatch.setattr(model, name, value)
    stubbed = _outputs(spec)
    parameters = {"preset": "demo", "config_overrides": ["train.steps=10"], **_widths(width)}
    emulator = _Recording(spec, platform, stubbed, "2.17.0")
    emulated = emulator.run(parameters)
    modelled = model.model_run(spec, platform, parameters, _task_outputs(stubbed))
    assert len(emulated.pods) == modelled.counts()["executor_pods"] == 16 + 3 * width
    assert _canonical(modelled.executor_pods()) == _canonical(emulator.recorded)


def test_the_controller_compresses_then_needs_offloading():
    sizes = model.WorkflowSizes(spec=200_000, nodes=800_000, uncompressed=1_000_000, compressed=260_000,
                                offloaded=200_050)
    assert sizes.verdict() == "nodes"
    assert model.WorkflowSizes(200_000, 900_000, 1_100_000, 260_000, 200_050).verdict() == "compressed"
    assert model.WorkflowSizes(200_000, 30_000_000, 30_200_000, 1_300_000, 200_050).verdict() == "offload-needed"


def test_go_json_escapes_as_go_does():
    assert model.go_json({"a": "x -> y & <z>", "n": 8.0, "f": 34.359738368}) == \
        '{"a":"x -\\u003e y \\u0026 \\u003cz\\u003e","n":8,"f":34.359738368}'
    assert model.node_id(model.WORKFLOW_NAME) == model.WORKFLOW_NAME
    assert model.fnv32a("") == 0x811C9DC5 and model.fnv32a("a") == 0xE40C292C  # FNV-1a 32 test vectors
