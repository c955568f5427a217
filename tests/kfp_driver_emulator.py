"""A compiled pipeline run as a KFP backend runs it, at each supported backend version: the pods its driver makes,
the state each DAG execution ends in, and the errors that fail the run, each rule read from kubeflow/pipelines'
source at the tags 2.15.0, 2.16.0, 2.16.1 and 2.17.0 (``VERSIONS``; a rule without a tag holds at all four).

:class:`DriverEmulator` walks the run's tasks in dependency order, as the driver meets them, and raises
:class:`DriverError` with the backend's message where the driver (or the API server) would fail the run:

- run parameters (``apiserver/template/v2_template.go``, ``validatePipelineJobInputs``; defaults filled in by
  ``v2/compiler/argocompiler/argo.go``): unknown names, a missing required one, or a value of the wrong kind
  (a STRUCT parameter given a JSON string) are rejected.
- task inputs (``v2/driver/resolve.go``, ``resolveInputs`` / ``resolveInputParameter``): a component input the parent
  DAG does not have is an error ("parent DAG does not have input parameter"), not ""; a null (an optional parameter
  without default) is dropped when the component's input is optional, else an error; each value is then checked
  against the component's declared type: any value is accepted by a STRING input (as text, ``PbValueToText``),
  other types must match ("input parameter %q type mismatch"). A ``parameterExpressionSelector`` (a loop item's
  field) is CEL over the value (``expression.go``, ``Select``, with ``parseJson``), applied before that check.
- trigger conditions (``resolve.go`` then ``v2/expression/expression.go``, ``Condition``): CEL over the task's resolved
  inputs, evaluated here by cel-python (the backend: cel-go, v0.25.0 to 2.16.1, v0.27.0 in 2.17.0); an error (a
  missing key) or a result that is not a bool fails the task. The run placeholders of a constant input
  (``{{$.pipeline_job_uuid}}`` ...) are filled in; ``{{$.pipeline_job_create_time_utc}}`` and
  ``..._schedule_time_utc`` from 2.16.0.
- pod-spec placeholders (``resolve.go``, ``resolvePodSpecInputRuntimeParameter``; ``driver.go``, ``initPodSpecPatch``
  and ``getPodResource``): ``{{$.inputs.parameters['x']}}`` in an accelerator's type or count, or a CPU or memory
  limit or request, resolves to the input's *string* value; an input of any other kind resolves to "" without error
  (``GetStringValue``), so an accelerator whose type or count is "" is silently not requested, while a CPU or memory
  quantity "" fails ``ParseQuantity``; an input the task does not have is an error.
- Kubernetes config (``v2/driver/k8s.go``, ``extendPodSpecPatch``; parameters are the parent DAG's inputs):
  ``nodeSelectorJson`` (``resolveK8sJsonParameter``) must resolve to a struct of strings: a struct with another value
  fails, and anything that is not a struct (a JSON *string*, a list) is silently read as ``{}`` (the driver marshals
  ``GetStructValue()``, nil, to "{}"): no node selector, no error; a null skips it. ``tolerationJson`` must resolve to a
  struct (one toleration) or a list of them: anything else fails ("encountered unexpected toleration proto value, must
  be either struct or list type"); an empty one and a null are skipped. ``imagePullSecret.secretNameParameter``
  (``resolveInputParameterStr``) must resolve to a non-empty string ("Expected a non-empty string"); a null skips it.
- ``dsl.OneOf`` (``resolve.go``, ``GetProducerTask``): the first ``parameterSelectors`` branch whose DAG execution is
  COMPLETE or CACHED is taken, else "processing OneOf: No successful task found" (2.17.0 adds the output key, parent
  task and DAG id to the message).
- DAG states (``v2/metadata/client.go``, ``UpdateDAGExecutionsState``, called only by a launcher when its container
  ends, ``v2/component/launcher_v2.go``): a DAG becomes COMPLETE when, at an update, all its ``total_dag_tasks``
  children are COMPLETE, CACHED or CANCELED (a task not triggered). Before 2.17.0 the update reaches only the
  container's own DAG, so a DAG whose nested DAGs do not all end before one of its own containers does (a
  ParallelFor's iterator DAG, whose children are all iteration DAGs; an If/Elif/Else group; a branch or an
  ExitHandler holding a ParallelFor, or a condition no container of it waits for) stays RUNNING
  (kubeflow/pipelines#11979, #13321). From 2.17.0 (#13322, ``client.go``) a DAG that ends updates its parent in
  turn, and a ParallelFor's expected count is its ``iteration_count`` (with none, nothing ever updates it). A cache
  hit is published CACHED by the driver (``v2/driver/container.go``): no launcher runs, so it updates no DAG, in any
  version.
- the exit handler's ``PipelineTaskFinalStatus.state`` (``resolve.go``, the ``TaskFinalStatus`` case): the MLMD state
  of the ExitHandler's DAG execution as text: "COMPLETE" once it is complete, "FAILED" once a launcher under it
  published a failure it could see (see :func:`final_status_state`), and "RUNNING" while no update has reached it;
  kfp.local sends "SUCCEEDED" instead.
- retries (``v2/compiler/argocompiler/container.go``, ``getTaskRetryStrategyFromInput``): a task's ``retryPolicy``
  becomes the Argo ``retryStrategy`` of its executor pod: ``limit`` maxRetryCount, ``backoff.duration`` /
  ``backoff.maxDuration`` the whole seconds of backoffDuration / backoffMaxDuration (a field not set: the Argo
  parameter's default "0"). The backend does not cap them (the SDK fills in 3600s when ``set_retry`` is given no
  ``backoff_max_duration``). Argo's ``maxDuration`` (``workflow/controller/operator.go``, ``processNodeRetries``, in
  the Argo Workflows each version builds with: v3.7.3, v3.7.8, v3.7.8, v4.0.5) counts from the *first* attempt's
  start: once past it a failed attempt is not retried ("Max duration limit exceeded"), and a retry's pod is given
  that deadline. ``KFP_RETRY_INDEX={{retries}}`` is added to a retried task's container from 2.16.1
  (``argocompiler/common.go``, ``retryIndexEnv``).
- retried attempts and lost pods (:func:`step_attempts`, :func:`final_status_state`'s ``attempts``): KFP sets no
  ``retryPolicy`` (``container.go``, ``getTaskRetryStrategyFromInput``: 2.15.0 line 643, 2.16.0 655, 2.16.1 660,
  2.17.0 667, a ``RetryStrategy`` of ``Limit`` and ``Backoff`` only), so Argo's ``RetryPolicyActual`` is
  ``OnFailure`` (argo-workflows v3.7.3 ``pkg/apis/workflow/v1alpha1/workflow_types.go`` 2166-2171). An attempt whose
  code fails ends ``Failed`` (``operator.go`` 1399-1401, ``inferFailedReason``); an attempt whose pod is deleted (a
  node drain or loss, a preemption) before the controller records its end is marked ``Error`` "pod deleted"
  (``operator.go`` 1262), unless the controller runs with ``ARGO_POD_STATUS_CAPTURE_FINALIZER=true``
  (``workflow/common/common.go`` 176; ``workflowpod.go`` 215-217 puts the finalizer on every pod,
  ``pod/queue.go`` 35 removes it once the status is read): the pod then stays until its end is read, ``Failed``
  (its container killed). ``OnFailure`` retries ``Failed`` and never ``Error`` (``operator.go`` 1087-1089 and
  1095-1097), ``OnError`` the reverse, ``Always`` both (1076-1081), while attempts are left (1109: at most
  ``limit`` retries). The launcher of an attempt whose code ended publishes its execution's state, FAILED or
  COMPLETE, then updates its DAG (``v2/component/launcher_v2.go``, the deferred publish: 2.15.0 lines 179-201,
  2.16.0 187-209, 2.16.1 188-210, 2.17.0 192-227); a deleted pod's launcher publishes nothing (it does not survive
  SIGTERM). Every attempt of a step is the same execution (the driver made it; Argo retries only the executor pod),
  so a retry that succeeds turns it COMPLETE; but its DAG, set FAILED by the failed attempt's update, turns COMPLETE
  only at an update that finds every task complete (``UpdateDAGExecutionsState``: 2.15.0 lines 752-754, 2.16.0
  779-781, 2.16.1 788-790, 2.17.0 851-856): before 2.17.0 an ExitHandler holding a ParallelFor never does, and
  stays FAILED. The same rules hold in argo-workflows v4.0.5, which KFP 2.17.0's manifests install
  (``operator.go`` 1103-1116, 1122, 1136, 1289, 1429; ``workflow_types.go`` 2295-2300; ``workflowpod.go`` 223;
  ``common.go`` 187); KFP 2.15.0 and 2.16.0 install v3.7.3.

:func:`schedulable` is the scheduler's taint, node-selector and extended-resource rules
(``k8s.io/component-helpers/scheduling/corev1``: ``ToleratesTaint``).

Tasks are ordered by ``dependentTasks`` and the producers of their inputs (``argocompiler/dag.go``,
``addImplicitDependencies``). The timing of sibling tasks, which decides DAG states, is read conservatively: a
driver's decision (not triggered, a cache hit) is taken to come before the end of any sibling that waits for
everything it waits for; a nested DAG's end, before that of the siblings that wait for it, and no other.

Not emulated: artifacts (inputs, outputs, and an artifact OneOf, which before 2.17.0 takes the last branch without
looking at states, #13436), raw ParallelFor items and artifact iterators (a spec using them is refused),
``dsl.TaskConfig`` passthroughs, PVCs, volumes, env and secrets (other than image pull secrets), pod metadata,
affinity, security contexts, the container image, command and args (resolved by the 2.17.0 driver), literal-value
checks (2.17.0), the run's failure paths (the walk stops at the first error; an exit task after a failure is not
walked), the timing of retries (backoff, ``maxDuration``), Argo's ``when`` and ``depends`` beyond the dependencies
above, backoff factors Argo cannot read
as an integer, and cel-go's type checking: cel-python evaluates without one, and compares values of different types
with an error where cel-go's heterogeneous equality answers (numbers are doubles here, as in a protobuf ``Value``).
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Callable

import celpy

VERSIONS = ("2.15.0", "2.16.0", "2.16.1", "2.17.0")
PROPAGATING_STATES = "2.17.0"  # first version whose DAG states propagate upward (#13322)
RETRY_INDEX_ENV = "2.16.1"  # first version that sets KFP_RETRY_INDEX in a retried task's container
RUN_ID, RUN_NAME, RUN_DISPLAY_NAME = "0f1e2d3c-run-id", "fourm-pretrain-abcde", "fourm-pretrain run"

COMPLETE, CACHED, CANCELED, RUNNING, FAILED = "COMPLETE", "CACHED", "CANCELED", "RUNNING", "FAILED"
# util.go: inputPipelineChannelPattern, searched anywhere in the field (FindStringSubmatch), "." unescaped as in Go.
_CHANNEL = re.compile(r"\$.inputs.parameters\['(.+?)'\]")
# k8s.io/apimachinery resource.ParseQuantity's pattern.
_QUANTITY = re.compile(r"^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$")
_GO_KIND = {str: "string", bool: "bool", float: "number", list: "array", dict: "object", type(None): "null"}
# The Python type of a protobuf Value holding a parameter of each type (numbers are doubles).
_KINDS = {"STRING": str, "NUMBER_DOUBLE": float, "NUMBER_INTEGER": float, "BOOLEAN": bool, "LIST": list,
          "STRUCT": dict, "TASK_FINAL_STATUS": dict, "TASK_CONFIG": dict}


class DriverError(RuntimeError):
    """The backend fails the run here; the message carries the backend's own words."""


@dataclass
class Pod:
    task: str  # the task's path, e.g. exit-handler-1/label-workers/for-loop-1/label-part
    executor: str
    limits: dict[str, str]
    requests: dict[str, str]
    tolerations: list[dict[str, Any]]
    node_selector: dict[str, str]
    image_pull_secrets: list[str]
    retries: int  # the Argo retryStrategy's limit (0: no retryStrategy)
    retry_max_duration_s: int | None  # its backoff.maxDuration, counted from the first attempt's start
    retry_index_env: bool  # whether the container gets KFP_RETRY_INDEX

    @property
    def step(self) -> str:
        """The component's name: the task key without the compiler's ``-N`` suffix (``pretrain-3`` -> pretrain)."""
        return re.sub(r"-[0-9]+$", "", self.task.rsplit("/", 1)[-1])

    @property
    def accelerators(self) -> dict[str, str]:
        return {k: v for k, v in self.limits.items() if "/" in k}


@dataclass
class Execution:
    """One MLMD execution of the run: a container task, a DAG, a ParallelFor iterator or one of its iterations."""
    name: str
    kind: str  # container, dag, loop, iteration
    state: str = RUNNING
    spec: dict = field(default_factory=dict)  # the component (dag and loop: its ``dag`` holds the tasks)
    children: dict[str, Execution] = field(default_factory=dict)  # by task key (a loop: by iteration index)
    outputs: dict[str, Any] = field(default_factory=dict)  # a container's output parameters


@dataclass
class Run:
    pods: list[Pod]
    root: Execution
    final_status: dict[str, str]  # exit task path -> the PipelineTaskFinalStatus.state it was given


@dataclass
class Node:
    labels: dict[str, str] = field(default_factory=dict)
    taints: list[dict[str, str]] = field(default_factory=list)
    allocatable: dict[str, str] = field(default_factory=dict)  # extended resources, e.g. {"nvidia.com/gpu": "8"}


def _tolerates(toleration: dict[str, Any], taint: dict[str, str]) -> bool:
    """``ToleratesTaint``: the effect matches (or the toleration names none), the key matches (an empty key with
    Exists matches every key), and Exists ignores the value while Equal (the default) compares it."""
    if toleration.get("effect") and toleration["effect"] != taint.get("effect"):
        return False
    operator = toleration.get("operator") or "Equal"
    if not toleration.get("key"):
        return operator == "Exists"
    if toleration["key"] != taint.get("key"):
        return False
    return operator == "Exists" or (toleration.get("value") or "") == (taint.get("value") or "")


def schedulable(pod: Pod, node: Node) -> str | None:
    """None when ``node`` would take ``pod``, else why not."""
    for taint in node.taints:
        if taint.get("effect") in ("NoSchedule", "NoExecute") and not any(_tolerates(t, taint)
                                                                          for t in pod.tolerations):
            return f"untolerated taint {taint}"
    for key, value in pod.node_selector.items():
        if node.labels.get(key) != value:
            return f"node selector {key}={value} does not match"
    for resource, count in pod.accelerators.items():
        if int(node.allocatable.get(resource, "0")) < int(count):
            return f"insufficient {resource}"
    return None


def at_least(version: str, first: str) -> bool:
    if version not in VERSIONS:
        raise ValueError(f"unsupported KFP backend version {version!r}; supported: {', '.join(VERSIONS)}")
    return tuple(map(int, version.split("."))) >= tuple(map(int, first.split(".")))


def stub_outputs(spec: dict, components: dict[str, Callable[..., dict]] | None = None,
                 **overrides: dict[str, Any]) -> dict[str, Any]:
    """Every container task's output parameters, keyed by task then output, as a placeholder of the declared type
    (a LIST is one item, so each ParallelFor runs once: a struct with every field a ``parseJson(string_value)["f"]``
    selector of the spec reads, of the type its reader declares). ``components``: a function per component (its name
    without the compiler's ``-N`` suffix, e.g. ``comp-pod-placement``) that computes the outputs of each of its tasks
    from the task's inputs, as the component does; ``overrides`` (task key -> {output: value}) replace some."""
    def placeholder(kind: str, text: str) -> Any:
        return {"STRING": text, "NUMBER_INTEGER": 1.0, "NUMBER_DOUBLE": 1.0, "BOOLEAN": True, "LIST": [item],
                "STRUCT": {}}[kind]

    tasks = [task for component in [spec["root"], *spec["components"].values()]
             for task in component.get("dag", {}).get("tasks", {}).items()]
    item: dict[str, Any] = {}
    for _, task in tasks:
        definitions = spec["components"][task["componentRef"]["name"]].get("inputDefinitions", {}).get("parameters", {})
        for name, source in task.get("inputs", {}).get("parameters", {}).items():
            selector = source.get("parameterExpressionSelector", "")
            selected = re.fullmatch(r'parseJson\(string_value\)\["([^"]+)"\]', selector)
            if selected:
                item[selected.group(1)] = placeholder(definitions[name]["parameterType"], selected.group(1))
    found: dict[str, dict[str, Any]] = {}
    for key, task in tasks:
        name = task["componentRef"]["name"]
        component = spec["components"][name]
        if "dag" not in component:
            found[key] = (components or {}).get(re.sub(r"-[0-9]+$", "", name)) or {
                output: placeholder(d["parameterType"], f"{key}.{output}")
                for output, d in component.get("outputDefinitions", {}).get("parameters", {}).items()}
    for key, values in overrides.items():
        found[key] = {**found[key], **values} if isinstance(found.get(key), dict) else values
    return found


def final_status_state(spec: dict, version: str, succeeded: bool, failed_task: str | None = None,
                       parameters: dict[str, Any] | None = None, task_outputs: dict | None = None) -> str:
    """The ``PipelineTaskFinalStatus.state`` the backend gives the pipeline's exit task.

    ``succeeded``: every task of the run ends well (``parameters``: the run's, default the pipeline's defaults;
    ``task_outputs``: default :func:`stub_outputs`); a run that cannot succeed raises its :class:`DriverError`.
    Otherwise ``failed_task``, the path of a container task whose code fails: its launcher publishes FAILED and
    updates its parent DAG, which from 2.17.0 updates its own parent in turn up to the root, so the ExitHandler's DAG
    is FAILED; before 2.17.0 only when the task is one of that DAG's own (a failure deeper down reaches it only if
    one of its own containers happens to end after the failed task's DAG, not counted on here). ``failed_task`` None:
    a failure no launcher publishes (a driver error, e.g. an unresolved input or a OneOf with no branch; a pod killed
    first): no DAG is updated, and the state stays RUNNING in every version."""
    if succeeded:
        emulator = DriverEmulator(spec, None, stub_outputs(spec) if task_outputs is None else task_outputs, version)
        states = set(emulator.run(parameters or {}).final_status.values())
        if len(states) != 1:
            raise ValueError(f"expected one exit task, found states {states}")
        return states.pop()
    if failed_task is None:
        return RUNNING
    return FAILED if _reaches_exit_handler(spec, version, failed_task) else RUNNING


def _reaches_exit_handler(spec: dict, version: str, task: str) -> bool:
    """Whether the DAG update by ``task``'s launcher reaches the ExitHandler's DAG: the task is one of that DAG's own,
    or the version propagates states upward (2.17.0)."""
    handler = next((t["dependentTasks"][0] for t in spec["root"]["dag"]["tasks"].values()
                    for source in t.get("inputs", {}).get("parameters", {}).values() if "taskFinalStatus" in source),
                   None)
    if handler is None or not task.startswith(f"{handler}/"):
        raise ValueError(f"{task} is not a task of the pipeline's ExitHandler ({handler})")
    return task.count("/") == 1 or at_least(version, PROPAGATING_STATES)


# ------------------------------------------------------------------------------------------------ retried attempts

#: What happens to one attempt of a step: its code ends well or fails, or its pod is deleted before it ends.
SUCCEEDS, FAILS, POD_DELETED = "succeeds", "fails", "pod deleted"
#: Argo's retry policies (``workflow_types.go``); KFP compiles none, which Argo reads as OnFailure.
ON_FAILURE, ON_ERROR, ALWAYS = "OnFailure", "OnError", "Always"


@dataclass
class Attempt:
    """One attempt (one pod) of a retried step, as Argo and the KFP launcher end it."""
    retries: int  # Argo's {{retries}}: 0 for the first attempt
    phase: str  # the Argo node's phase: Succeeded, Failed or Error
    message: str
    published: str | None  # the execution state its KFP launcher published (COMPLETE, FAILED), None: nothing
    retry_index_env: str | None  # KFP_RETRY_INDEX in its container (None: not set)


@dataclass
class StepAttempts:
    attempts: list[Attempt]
    succeeded: bool  # the step's node ended Succeeded
    message: str  # why it ended as it did


def step_attempts(pod: Pod, outcomes: list[str], finalizer: bool = False,
                  retry_policy: str | None = None) -> StepAttempts:
    """The attempts Argo runs of ``pod``'s step when its attempts end as ``outcomes`` say (:data:`SUCCEEDS`,
    :data:`FAILS`, :data:`POD_DELETED`, one per attempt; those past the last attempt run are not used); see the module
    docstring's "retried attempts". ``finalizer``: the workflow controller runs with
    ``ARGO_POD_STATUS_CAPTURE_FINALIZER=true``; ``retry_policy``: the policy a Workflow edited by hand would carry
    (KFP's: None, read as OnFailure)."""
    policy = retry_policy or ON_FAILURE  # workflow_types.go 2166-2171: RetryPolicyActual
    retry_failed, retry_error = policy in (ON_FAILURE, ALWAYS), policy in (ON_ERROR, ALWAYS)  # operator.go 1074-1089
    attempts: list[Attempt] = []
    for retries, outcome in enumerate(outcomes):
        env = str(retries) if pod.retry_index_env else None  # KFP_RETRY_INDEX={{retries}} from 2.16.1
        if outcome == SUCCEEDS:
            attempts.append(Attempt(retries, "Succeeded", "", COMPLETE, env))
            return StepAttempts(attempts, True, "")
        if outcome == FAILS:  # operator.go 1399-1401; launcher_v2.go's deferred publish
            attempts.append(Attempt(retries, "Failed", "Error (exit code 1)", FAILED, env))
        elif outcome == POD_DELETED:  # with the finalizer the pod's end is read (Failed); else operator.go 1262
            attempts.append(Attempt(retries, "Failed" if finalizer else "Error",
                                    "Error (exit code 143)" if finalizer else "pod deleted", None, env))
        else:
            raise ValueError(f"attempt {retries}: unknown outcome {outcome!r}; one of {SUCCEEDS}, {FAILS}, "
                             f"{POD_DELETED}")
        last = attempts[-1]
        if (last.phase == "Failed" and not retry_failed) or (last.phase == "Error" and not retry_error):  # 1095
            return StepAttempts(attempts, False, last.message)
        if len(attempts) > pod.retries:  # operator.go 1109
            return StepAttempts(attempts, False, "No more retries left")
    raise ValueError(f"{pod.task}: the outcomes {outcomes} end with attempt {len(attempts) - 1} retried: say how its "
                     "retry ends")


def final_status_after_attempts(spec: dict, version: str, task: str, outcomes: list[str], finalizer: bool = False,
                                parameters: dict[str, Any] | None = None,
                                task_outputs: dict | None = None) -> tuple[str, StepAttempts]:
    """The ``PipelineTaskFinalStatus.state`` the exit task gets when every task of the run ends well but ``task``
    (a container task's path), whose attempts end as ``outcomes`` say (:func:`step_attempts`), and the attempts.

    The step succeeds: the state of a run that succeeded (:func:`final_status_state`) if that is COMPLETE (a later
    update found every task complete); else FAILED when a failed attempt's update reached the ExitHandler's DAG (it
    stays so: before 2.17.0, the retry that succeeded leaves the run FAILED), else RUNNING. The step fails: FAILED when
    its last attempt's launcher published FAILED, or an earlier one did, and the update reached the ExitHandler's
    DAG; else (a deleted pod publishes nothing) RUNNING."""
    outputs = stub_outputs(spec) if task_outputs is None else task_outputs
    run = DriverEmulator(spec, None, outputs, version).run(parameters or {})
    pod = next((p for p in run.pods if p.task == task), None)
    if pod is None:
        raise ValueError(f"no pod runs task {task}; the run's pods: {[p.task for p in run.pods]}")
    result = step_attempts(pod, outcomes, finalizer)
    reached = (any(a.published == FAILED for a in result.attempts)
               and _reaches_exit_handler(spec, version, task))
    if result.succeeded:
        state = final_status_state(spec, version, True, parameters=parameters, task_outputs=outputs)
        return (state if state == COMPLETE or not reached else FAILED), result
    return (FAILED if reached else RUNNING), result


class DriverEmulator:
    """Runs a compiled pipeline (``spec``: the pipeline spec, ``platform``: its Kubernetes platform spec or None) on
    backend ``version``. ``task_outputs``: each container task's output parameters (task key -> {output: value}, or a
    function of the task's inputs that returns them), as its component would return them (see :func:`stub_outputs`);
    ``cached``: the keys of the tasks whose cache the driver hits."""

    def __init__(self, spec: dict, platform: dict | None, task_outputs: dict[str, Any] | None = None,
                 version: str = VERSIONS[-1], cached: set[str] | frozenset[str] = frozenset()):
        at_least(version, version)
        self.spec, self.version, self.cached = spec, version, set(cached)
        self.task_outputs = dict(task_outputs or {})
        self.executors = spec["deploymentSpec"]["executors"]
        self.k8s = (platform or {}).get("platforms", {}).get("kubernetes", {}).get("deploymentSpec", {}).get(
            "executors", {})
        self.propagates = at_least(version, PROPAGATING_STATES)

    def pods(self, parameters: dict[str, Any]) -> list[Pod]:
        return self.run(parameters).pods

    def run(self, parameters: dict[str, Any]) -> Run:
        """The run of ``parameters``: its pods and executions; raises :class:`DriverError` where the backend fails."""
        root = self.spec["root"]
        run = Run([], Execution("", "dag", spec=root), {})
        self._walk(run.root, self._run_parameters(root.get("inputDefinitions", {}).get("parameters", {}),
                                                  parameters), "", run)
        return run

    # ------------------------------------------------------------------------------------------------ the run

    @staticmethod
    def _run_parameters(definitions: dict, given: dict[str, Any]) -> dict[str, Any]:
        """``validatePipelineJobInputs`` (v2_template.go) after ``argo.go`` fills in the defaults."""
        unknown = sorted(set(given) - set(definitions))
        if unknown:
            raise DriverError(f"parameter(s) provided are not required by pipeline: {', '.join(unknown)}")
        values = {}
        for name, d in definitions.items():
            if name in given:
                values[name] = _pb(given[name])
                if type(values[name]) is not _KINDS[d["parameterType"]] or d["parameterType"].startswith("TASK_"):
                    raise DriverError(f"input parameter {name} requires type {d['parameterType']}, but the input "
                                      f"parameter is a {_GO_KIND[type(values[name])]}")
            elif "defaultValue" in d or d.get("isOptional"):
                values[name] = _pb(d.get("defaultValue"))
            else:
                raise DriverError(f"parameter {name} is not optional, yet has neither default value nor user "
                                  "provided value")
        return values

    def _walk(self, node: Execution, scope: dict[str, Any], path: str, run: Run) -> None:
        """Run the tasks of ``node``'s DAG in dependency order, with ``scope`` its resolved inputs."""
        tasks = node.spec["dag"].get("tasks", {})
        for key in _in_order(tasks):
            task, where = tasks[key], f"{path}{key}"
            component = self.spec["components"][task["componentRef"]["name"]]
            try:
                inputs = self._inputs(task, component, scope, node, loop="parameterIterator" in task)
                condition = task.get("triggerPolicy", {}).get("condition")
                triggered = not condition or _condition(condition, inputs)
            except DriverError as error:
                raise DriverError(f"{where}: {error}") from None
            kind = "container" if "dag" not in component else "loop" if "parameterIterator" in task else "dag"
            child = node.children[key] = Execution(key, kind, spec=component)
            if not triggered:
                child.state = CANCELED
            elif kind == "loop":
                self._loop(child, task["parameterIterator"], inputs, f"{where}/", run)
            elif kind == "dag":
                self._walk(child, inputs, f"{where}/", run)
            else:
                self._container(child, node, task, inputs, scope, where, run)
        node.state = self._settled(node)

    def _loop(self, node: Execution, iterator: dict, inputs: dict, path: str, run: Run) -> None:
        """``dag.go``: the iterator fans out one iteration DAG per item; each iteration's inputs are the iterator's,
        its items parameter replaced by its item (``resolveInputs``, the iteration driver)."""
        if "inputParameter" not in iterator.get("items", {}):
            raise NotImplementedError(f"{path}: raw ParallelFor items")
        items_name, item_name = iterator["items"]["inputParameter"], iterator["itemInput"]
        items = inputs.get(items_name)
        if not isinstance(items, list):
            raise DriverError(f"{path}: iterating on item input {item_name!r} failed: not a list: {items!r}")
        definitions = {k: v for k, v in node.spec.get("inputDefinitions", {}).get("parameters", {}).items()
                       if k != items_name}
        for index, item in enumerate(items):
            scope = {k: v for k, v in inputs.items() if k != items_name} | {item_name: item}
            iteration = node.children[str(index)] = Execution(str(index), "iteration", spec=node.spec)
            try:
                scope = _typed_all(scope, definitions, set())
            except DriverError as error:
                raise DriverError(f"{path}{index}: {error}") from None
            self._walk(iteration, scope, path, run)
        node.state = self._settled(node)

    def _container(self, node: Execution, dag: Execution, task: dict, inputs: dict, parent: dict, path: str,
                   run: Run) -> None:
        if node.name in self.cached:  # container.go: reuseCachedOutputs, published CACHED; no launcher, no pod
            if not task.get("cachingOptions", {}).get("enableCache"):
                raise ValueError(f"{path}: caching is off for this task, the driver cannot hit its cache")
            node.state = CACHED
        else:
            run.pods.append(self._pod(path, node.spec["executorLabel"], inputs, parent, task, dag))
            node.state = COMPLETE
        outputs = self.task_outputs.get(node.name, {})
        if callable(outputs):
            outputs = outputs(**{k: v for k, v in inputs.items() if k in node.spec.get("inputDefinitions", {}).get(
                "parameters", {})})
        node.outputs = {k: _pb(v) for k, v in outputs.items()}
        for name, source in task.get("inputs", {}).get("parameters", {}).items():
            if "taskFinalStatus" in source:
                run.final_status[path] = inputs[name]["state"]

    def _settled(self, node: Execution) -> str:
        """The state a DAG execution ends in once its tasks have (``UpdateDAGExecutionsState``, see the module
        docstring): its children all done, and one of them the last to update it after the others settled."""
        children = node.children
        tasks = node.spec["dag"].get("tasks", {}) if node.kind != "loop" else {}
        # total_dag_tasks; from 2.17.0 a ParallelFor's iteration_count (before, never reached: no container updates it)
        expected = len(children) if node.kind == "loop" and self.propagates else len(node.spec["dag"].get("tasks", {}))
        if len(children) != expected or any(c.state not in (COMPLETE, CACHED, CANCELED) for c in children.values()):
            return RUNNING
        upstream = {key: _upstream(tasks, key) for key in tasks}
        triggers = [k for k, c in children.items()
                    if c.state == COMPLETE and (c.kind == "container" or self.propagates)]
        for key, child in children.items():
            if key in triggers:
                continue
            instant = child.state in (CANCELED, CACHED)  # decided by the driver, before a sibling's pod ends
            if not any((_dependencies(tasks.get(key, {})) <= upstream[t]) if instant
                       else key in upstream.get(t, set()) for t in triggers):
                return RUNNING
        return COMPLETE if triggers else RUNNING

    # ------------------------------------------------------------------------------------------------ inputs

    def _inputs(self, task: dict, component: dict, scope: dict, node: Execution, loop: bool = False) -> dict:
        """``resolveInputs``: each input resolved, then checked against the component's declared types."""
        definitions = component.get("inputDefinitions", {}).get("parameters", {})
        values, set_nil = {}, set()
        for name, source in task.get("inputs", {}).get("parameters", {}).items():
            if definitions.get(name, {}).get("parameterType") == "TASK_CONFIG":
                continue
            value = self._resolve(source, scope, node, task)
            if value is None and "componentInputParameter" in source:  # ErrResolvedParameterNull
                if definitions.get(name, {}).get("isOptional"):
                    continue
                raise DriverError(f"failed to resolve inputs: the resolved input parameter is null: {name}")
            values[name] = value
        for name, source in task.get("inputs", {}).get("parameters", {}).items():
            if "parameterExpressionSelector" in source:
                if name not in values:
                    raise DriverError(f"failed to resolve inputs: resolving parameter {json.dumps(name)}: evaluation "
                                      "of parameter expression selector failed: value not found in inputs")
                values[name] = _select(values[name], source["parameterExpressionSelector"], name)
        if "dag" in component:  # a DAG driver passes an omitted optional input's default, or null
            for name, d in definitions.items():
                if name not in task.get("inputs", {}).get("parameters", {}) and d.get("isOptional"):
                    values[name] = _pb(d.get("defaultValue"))
                    set_nil |= {name} if values[name] is None else set()
        if loop:  # the iterator has no item yet (only its iterations do)
            definitions = {k: v for k, v in definitions.items() if k != task["parameterIterator"]["itemInput"]}
        return _typed_all(values, definitions, set_nil)

    def _resolve(self, source: dict, scope: dict, node: Execution, task: dict) -> Any:
        """``resolveInputParameter``, for one input: None is a null."""
        if "componentInputParameter" in source:
            name = source["componentInputParameter"]
            if name not in scope:
                raise DriverError(f"failed to resolve inputs: resolving input parameter with spec "
                                  f"{json.dumps(source)}: parent DAG does not have input parameter {name}")
            return scope[name]
        if "runtimeValue" in source:
            return self._constant(_pb(source["runtimeValue"]["constant"]), task)
        if "taskOutputParameter" in source:
            producer = source["taskOutputParameter"]["producerTask"]
            if producer not in node.children:
                raise DriverError(f"failed to resolve inputs: producer task, {producer}, not in tasks")
            return self._output(node.children[producer], source["taskOutputParameter"]["outputParameterKey"])
        if "taskFinalStatus" in source:
            producer = node.children[task["dependentTasks"][0]]
            return {"state": producer.state, "pipelineTaskName": producer.name,
                    "pipelineJobResourceName": RUN_NAME, "error": {}}
        raise NotImplementedError(f"input parameter spec {source}")

    def _constant(self, value: Any, task: dict) -> Any:
        if not isinstance(value, str):
            return value
        if "{{$.workspace_path}}" in value:
            return value.replace("{{$.workspace_path}}", "/kfp-workspace")
        placeholders = {"{{$.pipeline_job_name}}": RUN_DISPLAY_NAME, "{{$.pipeline_job_resource_name}}": RUN_NAME,
                        "{{$.pipeline_job_uuid}}": RUN_ID, "{{$.pipeline_task_name}}": task["taskInfo"]["name"],
                        "{{$.pipeline_task_uuid}}": "1"}
        if at_least(self.version, "2.16.0"):
            placeholders |= {"{{$.pipeline_job_create_time_utc}}": "2026-01-01T00:00:00Z",
                             "{{$.pipeline_job_schedule_time_utc}}": ""}
        return placeholders.get(value, value)

    def _output(self, producer: Execution, key: str) -> Any:
        """``resolveUpstreamParameters``: a container's output as its component returned it; a DAG's through its
        outputs spec (``GetProducerTask``: a OneOf takes its first COMPLETE or CACHED branch); a ParallelFor's,
        collected from every iteration (``CollectInputs``)."""
        if producer.kind == "container":
            if key not in producer.outputs:
                raise KeyError(f"no value given for output {key!r} of task {producer.name!r} (task_outputs)")
            return producer.outputs[key]
        spec = producer.spec["dag"].get("outputs", {}).get("parameters", {}).get(key)
        if spec is None:
            raise DriverError(f"failed to resolve inputs: DAG {producer.name} has no output parameter {key}")
        if producer.kind == "loop":
            if not producer.children:
                raise DriverError(f"failed to resolve inputs: subTaskName, "
                                  f"{spec['valueFromParameter']['producerSubtask']}, not in tasks")
            return [self._output(iteration, key) for iteration in producer.children.values()]
        if "valueFromParameter" in spec:
            selectors = [spec["valueFromParameter"]]
        else:
            selectors = spec["valueFromOneof"]["parameterSelectors"]
            selectors = [s for s in selectors if producer.children.get(s["producerSubtask"], Execution(
                "", "")).state in (COMPLETE, CACHED)][:1]
            if not selectors:
                detail = (f" for output key {json.dumps(key)} in parent task {json.dumps(producer.name)} (dag ID 1)"
                          if at_least(self.version, "2.17.0") else "")
                raise DriverError(f"failed to resolve inputs: processing OneOf: No successful task found{detail}")
        child = producer.children.get(selectors[0]["producerSubtask"])
        if child is None:
            raise DriverError(f"failed to resolve inputs: subTaskName, {selectors[0]['producerSubtask']}, "
                              "not in tasks")
        if child.state == CANCELED:
            return None  # a task not triggered has no outputs: the lookup yields nil
        return self._output(child, selectors[0]["outputParameterKey"])

    # ------------------------------------------------------------------------------------------------ the pod

    def _pod(self, path: str, executor: str, inputs: dict, parent: dict, task: dict, dag: Execution) -> Pod:
        resources = self.executors[executor]["container"].get("resources", {})
        limits, requests = {}, {}
        for new, old, unit, target, resource in (("resourceCpuLimit", "cpuLimit", "", limits, "cpu"),
                                                 ("resourceMemoryLimit", "memoryLimit", "G", limits, "memory"),
                                                 ("resourceCpuRequest", "cpuRequest", "", requests, "cpu"),
                                                 ("resourceMemoryRequest", "memoryRequest", "G", requests, "memory")):
            if resources.get(new):  # getPodResource: the new field wins, resolved, then ParseQuantity
                target[resource] = _quantity(self._pod_spec_value(resources[new], inputs, path), path)
            elif resources.get(old):
                target[resource] = f"{_text(float(resources[old]))}{unit}"
        accelerator = resources.get("accelerator")
        if accelerator:
            kind = (self._pod_spec_value(accelerator["resourceType"], inputs, path) if accelerator.get("resourceType")
                    else accelerator.get("type", ""))
            count = (self._pod_spec_value(accelerator["resourceCount"], inputs, path)
                     if accelerator.get("resourceCount")
                     else str(int(accelerator["count"])) if int(accelerator.get("count") or 0) > 0 else "")
            if kind and count:
                limits[kind] = _quantity(count, path)
        config = self.k8s.get(executor, {})
        retry = task.get("retryPolicy")
        return Pod(path, executor, limits, requests, self._tolerations(config, parent, dag, task, path),
                   self._node_selector(config, parent, dag, task, path),
                   self._pull_secrets(config, parent, dag, task, path),
                   int(retry.get("maxRetryCount") or 0) if retry else 0,
                   _seconds(retry.get("backoffMaxDuration", "0")) if retry else None,
                   bool(retry) and at_least(self.version, RETRY_INDEX_ENV))

    @staticmethod
    def _pod_spec_value(text: str, inputs: dict, path: str) -> str:
        """``resolvePodSpecInputRuntimeParameter``: a channel placeholder anywhere in the text stands for the whole
        value, the input's ``GetStringValue()`` ("" for a value that is not a string)."""
        match = _CHANNEL.search(text)
        if not match:
            return text
        if match.group(1) not in inputs:
            raise DriverError(f"{path}: failed to init podSpecPatch: executorInput did not contain container Image "
                              "input parameter")
        value = inputs[match.group(1)]
        return value if isinstance(value, str) else ""

    def _platform_value(self, source: dict, parent: dict, dag: Execution, task: dict, path: str, what: str) -> Any:
        """A Kubernetes config parameter, resolved against the *parent DAG's* inputs (``extendPodSpecPatch``)."""
        try:
            return self._resolve(source, parent, dag, task)
        except DriverError as error:
            raise DriverError(f"{path}: failed to resolve {what}: {error}") from None

    def _node_selector(self, config: dict, parent: dict, dag: Execution, task: dict, path: str) -> dict[str, str]:
        spec = config.get("nodeSelector", {})
        if "nodeSelectorJson" not in spec:
            return dict(spec.get("labels", {}))
        value = self._platform_value(spec["nodeSelectorJson"], parent, dag, task, path, "node selector")
        if value is None:
            return {}
        selector = value if isinstance(value, dict) else {}  # GetStructValue() of a non-struct: nil, marshalled "{}"
        for key, label in selector.items():
            if not isinstance(label, str):
                raise DriverError(f"{path}: failed to resolve node selector: failed to unmarshal k8s Resource json "
                                  "ensure that k8s Resource json correctly adheres to its respective k8s spec: json: "
                                  f"cannot unmarshal {_GO_KIND[type(label)]} into Go value of type string")
        return dict(selector)

    def _tolerations(self, config: dict, parent: dict, dag: Execution, task: dict, path: str) -> list[dict]:
        found: list[dict[str, Any]] = []
        for toleration in config.get("tolerations", []):
            if "tolerationJson" not in toleration:
                found.append({k: v for k, v in toleration.items() if v not in ("", None)})
                continue
            value = self._platform_value(toleration["tolerationJson"], parent, dag, task, path, "toleration")
            if value is None:
                continue
            if not isinstance(value, (dict, list)):
                raise DriverError(f"{path}: encountered unexpected toleration proto value, must be either struct or "
                                  "list type")
            for item in [value] if isinstance(value, dict) else value:
                found.append(_toleration(item, path, "single" if isinstance(value, dict) else "list"))
        return [t for t in found if t]

    def _pull_secrets(self, config: dict, parent: dict, dag: Execution, task: dict, path: str) -> list[str]:
        names = []
        for secret in config.get("imagePullSecret", []):
            if "secretNameParameter" not in secret:
                if not secret.get("secretName"):
                    raise DriverError(f"{path}: missing either SecretName or SecretNameParameter for image pull "
                                      "secret in executor config")
                names.append(secret["secretName"])
                continue
            value = self._platform_value(secret["secretNameParameter"], parent, dag, task, path,
                                         "image pull secret name")
            if value is None:
                continue
            if not isinstance(value, str) or not value:  # resolveInputParameterStr
                expected = "a non-empty string" if isinstance(value, str) else f"a string but got: {type(value)}"
                raise DriverError(f"{path}: failed to resolve image pull secret name: resolving input parameter with "
                                  f"spec {json.dumps(secret['secretNameParameter'])}. Expected {expected}")
            names.append(value)
        return names


# ------------------------------------------------------------------------------------------------ values


def _pb(value: Any) -> Any:
    """A value as a protobuf ``Value`` holds it: numbers are doubles."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, dict):
        return {k: _pb(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_pb(v) for v in value]
    raise TypeError(f"not a protobuf Value: {value!r}")


def _text(value: Any) -> str:
    """``PbValueToText``: numbers without exponent or trailing zeros, JSON for lists and structs."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return format(Decimal(repr(value)).normalize(), "f")
    return json.dumps(_whole(value), separators=(",", ":"))


def _whole(value: Any) -> Any:
    """Whole doubles as integers, as Go's JSON writes them (1, not 1.0)."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {k: _whole(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_whole(v) for v in value]
    return value


def _typed_all(values: dict, definitions: dict, set_nil: set[str]) -> dict:
    """``handleParamTypeValidationAndConversion``: every declared input has a value (or is optional), a STRING one
    is converted to text, any other must be of its declared kind."""
    typed = dict(values)
    for name, d in definitions.items():
        if name not in values:
            if not d.get("isOptional") and "defaultValue" not in d:
                raise DriverError(f"failed to resolve inputs: neither value nor default value provided for "
                                  f"non-optional parameter {json.dumps(name)}")
            if d.get("isOptional"):
                continue
        value = values.get(name)
        if name in set_nil and value is None:
            continue
        if d["parameterType"] == "STRING":
            typed[name] = _text(value)  # a task output not produced (a branch not taken) is nil, read as ""
        elif value is None:
            raise DriverError(f"failed to resolve inputs: got null for input parameter {json.dumps(name)}")
        elif type(value) is not _KINDS[d["parameterType"]]:
            got = {str: "string", float: "number", bool: "bool", list: "list", dict: "struct"}[type(value)]
            raise DriverError(f"failed to resolve inputs: input parameter {json.dumps(name)} type mismatch: expect "
                              f"{d['parameterType']}, got {got}")
    return typed


@functools.lru_cache(maxsize=None)
def _cel(expression: str) -> Any:
    """A CEL program with the driver's one extra function, ``parseJson`` (``expression.go``, ``celParseJson``)."""
    environment = celpy.Environment()
    return environment.program(environment.compile(expression),
                               functions={"parseJson": lambda text: celpy.json_to_cel(json.loads(str(text)))})


def _evaluate(expression: str, activation: dict) -> Any:
    try:
        return _cel(expression).evaluate(activation)
    except (celpy.CELEvalError, celpy.CELParseError, json.JSONDecodeError) as error:
        raise DriverError(f"evaluation error: {error}") from None


def _from_cel(value: Any) -> Any:
    if isinstance(value, celpy.celtypes.BoolType):
        return bool(value)
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        return str(value)
    if isinstance(value, dict):
        return {str(k): _from_cel(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_from_cel(v) for v in value]
    return None


def _condition(expression: str, inputs: dict) -> bool:
    """``Expr.Condition``: CEL over the executor input (``inputs.parameter_values``); the result must be a bool."""
    result = _evaluate(expression, {"inputs": celpy.json_to_cel({"parameter_values": inputs})})
    if not isinstance(result, celpy.celtypes.BoolType):
        raise DriverError(f"evaluation error: return type is not bool, got {result}")
    return bool(result)


def _select(value: Any, selector: str, name: str) -> Any:
    """``Expr.Select``: CEL over the fields of the value's protobuf ``Value`` that are set, and ``string_value``, its
    text (``PbValueToText``), e.g. ``parseJson(string_value)["dataset"]`` for a field of a loop item."""
    field = {str: "string_value", bool: "bool_value", float: "number_value", list: "list_value",
             dict: "struct_value", type(None): "null_value"}[type(value)]
    activation = {field: celpy.json_to_cel(value), "string_value": celpy.json_to_cel(_text(value))}
    try:
        return _from_cel(_evaluate(selector, activation))
    except DriverError as error:
        raise DriverError(f"failed to resolve inputs: resolving parameter {json.dumps(name)}: evaluation of parameter "
                          f"expression selector {json.dumps(selector)} failed: {error}") from None


def _quantity(text: str, path: str) -> str:
    if not _QUANTITY.match(text):
        raise DriverError(f"{path}: failed to init podSpecPatch: quantities must match the regular expression "
                          f"'{_QUANTITY.pattern}'")
    return text


def _toleration(item: Any, path: str, kind: str) -> dict[str, Any]:
    """JSON into a ``k8s.io/api/core/v1.Toleration``: unknown fields dropped, known ones of the right type."""
    if not isinstance(item, dict):
        raise DriverError(f"{path}: failed to marshal {kind} toleration to json: json: cannot unmarshal "
                          f"{_GO_KIND[type(item)]} into Go value of type v1.Toleration")
    toleration = {}
    for key in ("key", "operator", "value", "effect", "tolerationSeconds"):
        value = item.get(key)
        wanted = float if key == "tolerationSeconds" else str
        if value is None:
            continue
        if not isinstance(value, wanted) or isinstance(value, bool) or (wanted is float and value != int(value)):
            raise DriverError(f"{path}: failed to marshal {kind} toleration to json: json: cannot unmarshal "
                              f"{_GO_KIND[type(value)]} into Go struct field Toleration.{key}")
        toleration[key] = int(value) if wanted is float else value
    return {k: v for k, v in toleration.items() if v != ""}


def _seconds(duration: str) -> int:
    """A protobuf Duration's whole seconds (``GetBackoffMaxDuration().Seconds``): "3600s" -> 3600."""
    return int(float(str(duration).rstrip("s")))


def _dependencies(task: dict) -> set[str]:
    """The tasks a task waits for: its ``dependentTasks`` and the producers of its inputs
    (``argocompiler/dag.go``, ``addImplicitDependencies``)."""
    inputs = task.get("inputs", {})
    return set(task.get("dependentTasks", [])) | {
        source[kind]["producerTask"] for group, kind in (("parameters", "taskOutputParameter"),
                                                         ("artifacts", "taskOutputArtifact"))
        for source in inputs.get(group, {}).values() if kind in source}


def _upstream(tasks: dict, key: str) -> set[str]:
    """The tasks ``key`` waits for, directly or not."""
    found, todo = set(), list(_dependencies(tasks[key]))
    while todo:
        name = todo.pop()
        if name not in found:
            found.add(name)
            todo += _dependencies(tasks.get(name, {}))
    return found


def _in_order(tasks: dict) -> list[str]:
    """The task keys in an order the driver can meet them: each after the tasks it waits for (ties by name)."""
    done: list[str] = []
    while len(done) < len(tasks):
        ready = sorted(k for k, t in tasks.items() if k not in done and _dependencies(t) <= set(done))
        if not ready:
            raise ValueError(f"dependency cycle among {sorted(set(tasks) - set(done))}")
        done.append(ready[0])
    return done
