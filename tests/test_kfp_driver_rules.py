"""The KFP backend's rules as ``tests/kfp_driver_emulator.py`` applies them, each shown on a tiny pipeline compiled by
the KFP SDK (or its IR edited by hand where the SDK would not write it), at every supported backend version: what
the server rejects, the emulator rejects; what it silently drops, the emulator drops.

(No ``from __future__ import annotations``: the KFP SDK reads the components' annotations as types.)
"""

import copy
from typing import Optional

import pytest
import yaml
from kfp import compiler, dsl, kubernetes

from tests.kfp_driver_emulator import (ALWAYS, FAILS, ON_ERROR, POD_DELETED, PROPAGATING_STATES, SUCCEEDS, VERSIONS,
                                       DriverEmulator, DriverError, at_least, final_status_after_attempts,
                                       final_status_state, step_attempts, stub_outputs)

BEFORE_2_17 = [v for v in VERSIONS if not at_least(v, PROPAGATING_STATES)]


@dsl.component(base_image="python:3.11")
def echo(text: str) -> str:
    return text


@dsl.component(base_image="python:3.11")
def parts(n: int) -> list:
    return list(range(n))


@dsl.component(base_image="python:3.11")
def join(texts: list) -> str:
    return ",".join(texts)


@dsl.component(base_image="python:3.11")
def report(status: dsl.PipelineTaskFinalStatus):
    print(status.state)


def _compile(pipeline, tmp_path) -> tuple[dict, dict | None]:
    path = tmp_path / "pipeline.yaml"
    compiler.Compiler().compile(pipeline, str(path))
    spec, *platform = yaml.safe_load_all(path.read_text())
    return spec, (platform or [None])[0]


def _run(compiled, parameters=None, version=VERSIONS[-1], cached=frozenset(), **outputs):
    spec, platform = compiled
    return DriverEmulator(spec, platform, stub_outputs(spec, **outputs), version, cached).run(parameters or {})


def _pod(run, task: str):
    [pod] = [pod for pod in run.pods if pod.task.rsplit("/", 1)[-1] == task]
    return pod


# ------------------------------------------------------------------------------------------------ run parameters


@dsl.pipeline(name="placed")
def placed(selector: dict = {}, tolerations: list = [], secret: str = "pull", text: str = "x"):
    task = echo(text=text)
    kubernetes.add_node_selector_json(task, selector)
    kubernetes.add_toleration_json(task, tolerations)
    kubernetes.set_image_pull_secrets(task, [secret])


@pytest.mark.parametrize("version", VERSIONS)
def test_a_run_parameter_of_the_wrong_kind_or_name_is_rejected(tmp_path, version):
    compiled = _compile(placed, tmp_path)
    with pytest.raises(DriverError, match="selector requires type STRUCT"):
        _run(compiled, {"selector": '{"pool": "h100"}'}, version)
    with pytest.raises(DriverError, match="not required by pipeline: colour"):
        _run(compiled, {"colour": "blue"}, version)


# ------------------------------------------------------------------------------------------------ 1. inputs


@pytest.mark.parametrize("version", VERSIONS)
def test_an_input_the_parent_dag_does_not_have_fails_the_task(tmp_path, version):
    spec, platform = _compile(placed, tmp_path)
    spec = copy.deepcopy(spec)
    spec["root"]["dag"]["tasks"]["echo"]["inputs"]["parameters"]["text"] = {"componentInputParameter": "missing"}
    with pytest.raises(DriverError, match="parent DAG does not have input parameter missing"):
        _run((spec, platform), version=version)


@dsl.pipeline(name="optional")
def optional_text(text: Optional[str] = None):
    echo(text=text)


@pytest.mark.parametrize("version", VERSIONS)
def test_a_null_for_a_required_input_fails_the_task(tmp_path, version):
    with pytest.raises(DriverError, match="the resolved input parameter is null: text"):
        _run(_compile(optional_text, tmp_path), version=version)


@dsl.pipeline(name="accelerated")
def accelerated(kind: str = "nvidia.com/gpu", count: int = 2, count_text: str = "2", cpu: int = 4):
    echo(text="counted").set_accelerator_type(kind).set_accelerator_limit(count)
    echo(text="texted").set_accelerator_type(kind).set_accelerator_limit(count_text)
    echo(text="cpu").set_cpu_limit(cpu)


@pytest.mark.parametrize("version", VERSIONS)
def test_a_pod_spec_placeholder_takes_only_a_string_value(tmp_path, version):
    spec, platform = _compile(accelerated, tmp_path)
    spec = copy.deepcopy(spec)
    del spec["root"]["dag"]["tasks"]["echo-3"]  # cpu: below, alone
    run = _run((spec, platform), version=version)
    assert _pod(run, "echo-2").accelerators == {"nvidia.com/gpu": "2"}
    assert _pod(run, "echo").accelerators == {}  # an int count resolves to "": no accelerator, and no error


@pytest.mark.parametrize("version", VERSIONS)
def test_a_quantity_placeholder_of_another_kind_fails_the_task(tmp_path, version):
    spec, platform = _compile(accelerated, tmp_path)
    spec = copy.deepcopy(spec)
    spec["root"]["dag"]["tasks"] = {"echo-3": spec["root"]["dag"]["tasks"]["echo-3"]}
    with pytest.raises(DriverError, match="failed to init podSpecPatch: quantities must match"):
        _run((spec, platform), version=version)
    del spec["root"]["dag"]["tasks"]["echo-3"]["inputs"]["parameters"]["pipelinechannel--cpu"]
    with pytest.raises(DriverError, match="executorInput did not contain container Image input parameter"):
        _run((spec, platform), version=version)


# ------------------------------------------------------------------------------------------------ 2. Kubernetes config


@pytest.mark.parametrize("version", VERSIONS)
def test_node_selector_and_tolerations_from_structs_and_lists(tmp_path, version):
    compiled = _compile(placed, tmp_path)
    toleration = {"key": "dedicated", "operator": "Equal", "value": "training", "effect": "NoSchedule"}
    pod = _pod(_run(compiled, {"selector": {"pool": "h100"}, "tolerations": [toleration]}, version), "echo")
    assert (pod.node_selector, pod.tolerations, pod.image_pull_secrets) == ({"pool": "h100"}, [toleration], ["pull"])
    assert _pod(_run(compiled, {}, version), "echo").tolerations == []  # an empty list is skipped


@dsl.pipeline(name="placed-by-text")
def placed_by_text(selector: str = '{"pool": "h100"}', tolerations: str = '[{"key": "a", "operator": "Exists"}]'):
    kubernetes.add_node_selector_json(echo(text="selected"), selector)
    kubernetes.add_toleration_json(echo(text="tolerated"), tolerations)


@pytest.mark.parametrize("version", VERSIONS)
def test_a_json_string_node_selector_is_dropped_without_error(tmp_path, version):
    spec, platform = _compile(placed_by_text, tmp_path)
    spec = copy.deepcopy(spec)
    del spec["root"]["dag"]["tasks"]["echo-2"]
    # resolveK8sJsonParameter marshals GetStructValue() of a string, nil, to "{}": the pod selects no node.
    assert _pod(_run((spec, platform), version=version), "echo").node_selector == {}


@pytest.mark.parametrize("version", VERSIONS)
def test_a_json_string_toleration_fails_the_task(tmp_path, version):
    spec, platform = _compile(placed_by_text, tmp_path)
    spec = copy.deepcopy(spec)
    del spec["root"]["dag"]["tasks"]["echo"]
    with pytest.raises(DriverError, match="unexpected toleration proto value, must be either struct or list type"):
        _run((spec, platform), version=version)


@pytest.mark.parametrize("version", VERSIONS)
def test_a_node_selector_label_that_is_not_a_string_fails_the_task(tmp_path, version):
    with pytest.raises(DriverError, match="cannot unmarshal number into Go value of type string"):
        _run(_compile(placed, tmp_path), {"selector": {"gpus": 8}}, version)


@pytest.mark.parametrize("version", VERSIONS)
def test_an_empty_pull_secret_name_fails_the_task(tmp_path, version):
    with pytest.raises(DriverError, match="image pull secret name: .*Expected a non-empty string"):
        _run(_compile(placed, tmp_path), {"secret": ""}, version)


@dsl.pipeline(name="optional-secret")
def optional_secret(secret: Optional[str] = None):
    kubernetes.set_image_pull_secrets(echo(text="x"), [secret])


@pytest.mark.parametrize("version", VERSIONS)
def test_a_null_pull_secret_is_skipped(tmp_path, version):
    assert _pod(_run(_compile(optional_secret, tmp_path), version=version), "echo").image_pull_secrets == []


# ------------------------------------------------------------------------------------------------ 3. conditions


@dsl.pipeline(name="branches")
def branches(colour: str = "red", n: int = 2):
    with dsl.If(colour == "red"):
        echo(text="red")
    with dsl.Elif(colour == "blue"):
        echo(text="blue")
    with dsl.Else():
        echo(text="other")
    with dsl.If(n > 1):
        echo(text="many")


@pytest.mark.parametrize("version", VERSIONS)
def test_conditions_are_cel_over_the_resolved_inputs(tmp_path, version):
    compiled = _compile(branches, tmp_path)
    ran = lambda **parameters: sorted(pod.task.rsplit("/", 1)[-1] for pod in _run(compiled, parameters, version).pods)
    assert ran() == ["echo", "echo-4"]
    assert ran(colour="blue", n=1) == ["echo-2"]
    assert ran(colour="green", n=3) == ["echo-3", "echo-4"]


@pytest.mark.parametrize("version", VERSIONS)
def test_a_condition_that_fails_to_evaluate_fails_the_task(tmp_path, version):
    spec, platform = _compile(branches, tmp_path)
    for condition, error in (("inputs.parameter_values['nothing'] == 'red'", "evaluation error"),
                             ("inputs.parameter_values['pipelinechannel--n']", "return type is not bool")):
        edited = copy.deepcopy(spec)
        edited["root"]["dag"]["tasks"]["condition-5"]["triggerPolicy"]["condition"] = condition
        with pytest.raises(DriverError, match=error):
            _run((edited, platform), version=version)


# ------------------------------------------------------------------------------------------------ 4. dsl.OneOf


@dsl.pipeline(name="oneof-loops")
def oneof_loops(colour: str = "red"):
    with dsl.If(colour == "red"):
        with dsl.ParallelFor(parts(n=2).output) as part:
            red = echo(text="red")
        red_joined = join(texts=dsl.Collected(red.output))
    with dsl.Else():
        with dsl.ParallelFor(parts(n=2).output) as part:
            other = echo(text="other")
        other_joined = join(texts=dsl.Collected(other.output))
    echo(text=dsl.OneOf(red_joined.output, other_joined.output))


@dsl.pipeline(name="oneof-tasks")
def oneof_tasks(colour: str = "red"):
    with dsl.If(colour == "red"):
        red = echo(text="red")
    with dsl.Else():
        other = echo(text="other")
    echo(text=dsl.OneOf(red.output, other.output))


@pytest.mark.parametrize("version", VERSIONS)
def test_a_oneof_whose_branch_holds_a_parallelfor_fails_before_2_17(tmp_path, version):
    compiled = _compile(oneof_loops, tmp_path)
    if version in BEFORE_2_17:  # the branch's DAG never leaves RUNNING (#11979)
        with pytest.raises(DriverError, match=r"processing OneOf: No successful task found$"):
            _run(compiled, version=version)
    else:
        run = _run(compiled, version=version, **{"join": {"Output": "a,b"}})
        assert run.pods[-1].task == "echo-3"


@pytest.mark.parametrize("version", VERSIONS)
def test_a_oneof_whose_branch_holds_containers_resolves_in_every_version(tmp_path, version):
    compiled = _compile(oneof_tasks, tmp_path)
    assert [pod.task for pod in _run(compiled, {"colour": "blue"}, version).pods][-1] == "echo-3"


@pytest.mark.parametrize("version", VERSIONS)
def test_a_cache_hit_in_a_oneof_branch_fails_the_join_in_every_version(tmp_path, version):
    # container.go publishes the hit CACHED from the driver; no launcher runs, so no one updates the branch's DAG.
    detail = ' for output key "pipelinechannel--condition-branches-1-oneof-1"' if version not in BEFORE_2_17 else "$"
    with pytest.raises(DriverError, match=f"processing OneOf: No successful task found{detail}"):
        _run(_compile(oneof_tasks, tmp_path), version=version, cached={"echo"})


# ------------------------------------------------------------------------------------------------ 5. exit handler


@dsl.pipeline(name="exit-flat")
def exit_flat():
    with dsl.ExitHandler(report()):
        echo(text=echo(text="a").output)


@dsl.pipeline(name="exit-loop")
def exit_loop():
    with dsl.ExitHandler(report()):
        with dsl.ParallelFor(parts(n=2).output):
            echo(text="a")


@dsl.pipeline(name="exit-if")
def exit_if(colour: str = "red"):
    with dsl.ExitHandler(report()):
        first = echo(text="a")
        with dsl.If(first.output == "a"):
            echo(text="b")


@pytest.mark.parametrize("version", VERSIONS)
def test_the_exit_handler_s_final_state(tmp_path, version):
    flat, loop, branch = (_compile(p, tmp_path)[0] for p in (exit_flat, exit_loop, exit_if))
    propagates = version not in BEFORE_2_17
    assert final_status_state(flat, version, True) == "COMPLETE"
    assert final_status_state(loop, version, True) == ("COMPLETE" if propagates else "RUNNING")  # #13321
    assert final_status_state(branch, version, True, task_outputs={"echo": {"Output": "a"}}) == (
        "COMPLETE" if propagates else "RUNNING")
    assert final_status_state(flat, version, False, "exit-handler-1/echo") == "FAILED"
    nested = "exit-handler-1/for-loop-2/echo"
    assert final_status_state(loop, version, False, nested) == ("FAILED" if propagates else "RUNNING")
    assert final_status_state(flat, version, False) == "RUNNING"  # a driver error: nothing is published


# ------------------------------------------------------------------------------------------------ 6. retries


@dsl.pipeline(name="retried")
def retried():
    echo(text="a").set_retry(3, backoff_duration="60s", backoff_max_duration="2h")
    echo(text="b").set_retry(2)
    echo(text="c")


@pytest.mark.parametrize("version", VERSIONS)
def test_retry_policies_as_argo_retry_strategies(tmp_path, version):
    spec, platform = _compile(retried, tmp_path)
    run = _run((spec, platform), version=version)
    first, second, plain = (_pod(run, key) for key in ("echo", "echo-2", "echo-3"))
    assert (first.retries, first.retry_max_duration_s) == (3, 7200)
    assert (second.retries, second.retry_max_duration_s) == (2, 3600)  # the SDK's default; the backend caps nothing
    assert (plain.retries, plain.retry_max_duration_s, plain.retry_index_env) == (0, None, False)
    assert first.retry_index_env == second.retry_index_env == at_least(version, "2.16.1")
    edited = copy.deepcopy(spec)
    del edited["root"]["dag"]["tasks"]["echo"]["retryPolicy"]["backoffMaxDuration"]
    assert _pod(_run((edited, platform), version=version), "echo").retry_max_duration_s == 0  # the Argo default "0"


# ------------------------------------------------------------------------------------------------ 7. lost pods, retries


@dsl.pipeline(name="exit-retried")
def exit_retried():
    with dsl.ExitHandler(report()):
        echo(text=echo(text="a").set_retry(2, backoff_duration="0s").output)


@dsl.pipeline(name="exit-retried-loop")
def exit_retried_loop():
    with dsl.ExitHandler(report()):
        with dsl.ParallelFor(parts(n=2).output):
            echo(text="a")
        echo(text="b").set_retry(2, backoff_duration="0s")


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("finalizer", [False, True])
def test_a_pod_deleted_before_its_launcher_publishes_is_retried_only_under_the_finalizer(tmp_path, version,
                                                                                          finalizer):
    """KFP compiles no retryPolicy (OnFailure): a deleted pod is an Error "pod deleted", not retried; with
    ARGO_POD_STATUS_CAPTURE_FINALIZER=true the controller reads the killed container's end, Failed, and retries it.
    Nothing was published: the exit handler is told RUNNING when the step is not retried."""
    spec = _compile(exit_retried, tmp_path)[0]
    state, result = final_status_after_attempts(spec, version, "exit-handler-1/echo", [POD_DELETED, SUCCEEDS],
                                                finalizer)
    first = result.attempts[0]
    assert (first.phase, first.message, first.published) == (
        ("Failed", "Error (exit code 143)", None) if finalizer else ("Error", "pod deleted", None))
    if finalizer:
        assert result.succeeded and len(result.attempts) == 2 and state == "COMPLETE"
        assert result.attempts[1].retry_index_env == ("1" if at_least(version, "2.16.1") else None)
    else:
        assert not result.succeeded and len(result.attempts) == 1 and state == "RUNNING"


@pytest.mark.parametrize("version", VERSIONS)
def test_a_policy_that_retries_errors_retries_a_deleted_pod_and_not_a_failure(tmp_path, version):
    spec = _compile(exit_retried, tmp_path)[0]
    pod = _pod(_run((spec, None), version=version), "echo")
    assert step_attempts(pod, [POD_DELETED, SUCCEEDS], retry_policy=ON_ERROR).succeeded
    assert not step_attempts(pod, [FAILS, SUCCEEDS], retry_policy=ON_ERROR).succeeded
    assert step_attempts(pod, [FAILS, POD_DELETED, SUCCEEDS], retry_policy=ALWAYS).succeeded
    spent = step_attempts(pod, [FAILS, FAILS, FAILS, SUCCEEDS])  # limit 2: three attempts in all
    assert (len(spent.attempts), spent.succeeded, spent.message) == (3, False, "No more retries left")


@pytest.mark.parametrize("version", VERSIONS)
def test_a_retry_that_succeeds_leaves_the_exit_handler_failed_before_2_17(tmp_path, version):
    """The failed attempt's launcher set the ExitHandler's DAG FAILED; the retry's success is an update that finds
    not every task complete (a ParallelFor's DAG never completes before 2.17), so nothing sets it COMPLETE. From
    2.17 the loop's end propagates, and the last update finds every task complete. Without a loop the DAG completes
    in every version."""
    looped, flat = (_compile(p, tmp_path)[0] for p in (exit_retried_loop, exit_retried))
    propagates = version not in BEFORE_2_17
    state, result = final_status_after_attempts(looped, version, "exit-handler-1/echo-2", [FAILS, SUCCEEDS])
    assert result.succeeded and [a.published for a in result.attempts] == ["FAILED", "COMPLETE"]
    assert state == ("COMPLETE" if propagates else "FAILED")
    assert final_status_after_attempts(flat, version, "exit-handler-1/echo", [FAILS, SUCCEEDS])[0] == "COMPLETE"
    # A retried step that fails for good: FAILED; its pod deleted after a failed attempt: that attempt's FAILED.
    assert final_status_after_attempts(looped, version, "exit-handler-1/echo-2", [FAILS] * 3)[0] == "FAILED"
    assert final_status_after_attempts(looped, version, "exit-handler-1/echo-2", [FAILS, POD_DELETED])[0] == "FAILED"
