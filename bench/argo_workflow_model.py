"""A KFP v2 run on Argo Workflows, as the objects it leaves in the cluster: the Argo ``Workflow`` the KFP API server
compiles from a pipeline spec, and the nodes and pods the Argo controller records in its ``status.nodes`` as the run
goes. ``bench/workflow_scale.py`` measures them at each width; ``tests/test_workflow_scale.py`` checks this model
against hand counts and against the repository's KFP driver emulator (``tests/kfp_driver_emulator.py``, which a
bench may not import: ``tests/test_bench_output.py``).

Read from kubeflow/pipelines at 2.17.0 (``backend/src/v2/compiler/argocompiler/``; the node and pod structure is the
same at 2.15.0, 2.16.0 and 2.16.1, whose compilers differ only in driver flags and security contexts):

- ``argo.go`` ``Compile``: the run's parameters with the pipeline's defaults filled in; each component's spec, each
  container's implementation (``saveComponentSpec``/``saveComponentImpl``, keyed by a SHA-256 of the container, so
  components with the same container share one) and each executor's Kubernetes config (``spec_patch.go``
  ``AddKubernetesSpec``) are saved once as a workflow argument (``saveProtoToArguments``) that templates refer to as
  ``{{workflow.parameters.<name>}}``.
- ``dag.go`` ``task``: a container task is a ``system-container-driver`` pod task and a ``system-container-executor``
  DAG task (``retry-system-container-executor`` when the task has a retry policy) whose one ``executor`` task runs
  the ``system-container-impl`` pod; a DAG task (a sub-pipeline, the exit handler) is a ``system-dag-driver`` pod
  task and a DAG task; ``iteratorTask``/``iterationItemTask``: a ``dsl.ParallelFor`` is a DAG task whose template
  holds an ``iteration-driver`` (a DAG driver that counts the items) and ``iteration-iterations``, a task with
  ``withSequence`` over that count, each iteration a DAG of its own DAG driver (``iteration-item-driver``) and the
  loop body's DAG; ``DAG``: a task run ``ALL_UPSTREAM_TASKS_COMPLETED`` (the exit handler's) becomes an exit
  lifecycle hook (``common.go`` ``addExitTask``) on the DAG task it waits for; the root is an ``entrypoint`` DAG of
  ``root-driver`` and ``root``.
- driver outputs (``backend/src/v2/cmd/driver/main.go`` ``handleExecution``; ``backend/src/v2/driver/driver.go``
  ``initPodSpecPatch``, ``provisionOutputs``; ``k8s.go`` ``extendPodSpecPatch``): a container driver writes the
  ``pod-spec-patch``, a JSON pod spec whose launcher command carries the executor input (every input parameter's
  value) and the component spec, and whose user arguments carry the executor input again (``{{$}}``).

Read from argoproj/argo-workflows at v3.7.8 (KFP 2.15.0 to 2.16.1 deploy v3.7.3, 2.17.0 deploys v4.0.5:
``manifests/kustomize/third-party/argo/base/workflow-controller-deployment-patch.yaml``):

- ``workflow/controller/operator.go`` ``executeTemplate``/``initializeExecutableNode``: every template invocation
  is a node that keeps the template's resolved inputs (``node.Inputs``); a template with a retry strategy (its own,
  or the workflow's ``templateDefaults``: ``mergedTemplateDefaultsInto``) is a ``Retry`` node with one child per
  attempt, ``<name>(0)``, whose outputs the Retry node copies; a pod's outputs are its output parameters, its exit
  code and, with ``archiveLogs``, its ``main-logs`` artifact.
- ``workflow/controller/dag.go`` ``executeDAGTask``: a task's node is ``<dag node>.<task>``; a ``withSequence``
  task is a ``TaskGroup`` node with children ``<task>(<i>:<i>)``; a task is the child of its dependencies'
  outbound nodes (``getOutboundNodes``), or of the DAG node when it has none; a DAG node's ``outboundNodes`` are
  those of its leaf tasks; ``exit_handler.go`` ``runOnExitNode``: an exit hook is a child ``<task node>.onExit``.
- ``pkg/apis/workflow/v1alpha1/workflow_types.go``: ``NodeStatus``'s fields and ``NodeID`` (the workflow's name
  and the FNV-1a hash of the node's name); ``workflow/util/pod_name.go`` ``GeneratePodName`` (v2 pod names).

What is left out, and why the sizes are a floor: ``metadata.managedFields`` (the API server's field ownership, which
lists the fields of every node a manager wrote), node messages and events, ``estimatedDuration``, retried attempts
(one attempt per pod: a retry adds a node), and cache hits (a hit skips the executor pod and leaves a Skipped node).
"""

from __future__ import annotations

import base64
import copy
import gzip
import hashlib
import json
import re
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable

KFP_VERSION = "2.17.0"
WORKFLOW_NAME = "fourm-pretrain-x7k2p"  # generateName "fourm-pretrain-" and Argo's five characters
NAMESPACE = "kubeflow"
RUN_ID = "3f2c9a4e-8b1d-4c7a-9e2f-5a6b7c8d9e0f"  # the run's uid, {{workflow.uid}}
RUN_DISPLAY_NAME = "fourm-pretrain-20261202-100000"
CREATED = "2026-12-02T10:00:00Z"
CREATED_EPOCH = 1796205600  # CREATED in seconds since 1970
HOST_NODE = "gke-fourm-gpu-pool-6c3f1a2b-x7k2"
PIPELINE_ROOT = "minio://mlpipeline/v2/artifacts"  # backend/src/v2/config/env.go defaultPipelineRoot
LAUNCHER_IMAGE = f"ghcr.io/kubeflow/kfp-launcher:{KFP_VERSION}"
DRIVER_IMAGE = f"ghcr.io/kubeflow/kfp-driver:{KFP_VERSION}"
ML_PIPELINE = ("ml-pipeline.kubeflow.svc.cluster.local", "8887")  # v2/config/env.go GetMLPipelineServerConfig
MLMD = ("metadata-grpc-service.kubeflow.svc.cluster.local", "8080")
#: workflow/packer/packer.go: MAX_WORKFLOW_SIZE's default, compared with the whole Workflow's JSON.
MAX_WORKFLOW_SIZE = 1024 * 1024
#: etcd's --max-request-bytes default, which a Workflow raised past MAX_WORKFLOW_SIZE meets next.
ETCD_REQUEST_LIMIT = 1572864
#: KFP 2.17.0's manifests/kustomize/third-party/argo/base/workflow-controller-configmap-patch.yaml workflowDefaults.
KFP_2_17_WORKFLOW_DEFAULTS = {"ttlStrategy": {"secondsAfterCompletion": 3600, "secondsAfterSuccess": 3600,
                                              "secondsAfterFailure": 3600},
                              "templateDefaults": {"retryStrategy": {"limit": "2", "retryPolicy": "OnError"}}}


# ------------------------------------------------------------------------------------------------ JSON as Go writes it


def _go_values(value: Any) -> Any:
    """Whole floats as integers (Go's encoding/json and protojson write 8, not 8.0)."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e21:
        return int(value)
    if isinstance(value, dict):
        return {k: _go_values(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_go_values(v) for v in value]
    return value


def go_json(value: Any, sort_keys: bool = False) -> str:
    """``json.Marshal``: compact, UTF-8, and ``<``, ``>``, ``&``, U+2028 and U+2029 escaped as Go escapes them."""
    text = json.dumps(_go_values(value), separators=(",", ":"), ensure_ascii=False, sort_keys=sort_keys)
    for char, escaped in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"), ("\u2028", "\\u2028"),
                          ("\u2029", "\\u2029")):
        text = text.replace(char, escaped)
    return text


def stably(message: Any) -> str:
    """``argocompiler/proto.go`` ``stablyMarshalJSON``: protojson, read back and written by encoding/json (keys
    sorted). The pipeline spec's YAML is already protojson's mapping (the SDK writes it with ``MessageToDict``)."""
    return go_json(message, sort_keys=True)


def fnv32a(text: str) -> int:
    h = 0x811C9DC5
    for byte in text.encode():
        h = ((h ^ byte) * 0x01000193) & 0xFFFFFFFF
    return h


def node_id(name: str) -> str:
    """``Workflow.NodeID``."""
    return WORKFLOW_NAME if name == WORKFLOW_NAME else f"{WORKFLOW_NAME}-{fnv32a(name)}"


def pod_name(node_name: str, template: str) -> str:
    """``GeneratePodName``, v2."""
    return f"{WORKFLOW_NAME}-{template}-{fnv32a(node_name)}"


def _param(name: str, value: Any = None, default: Any = None) -> dict:
    """A ``wfapi.Parameter``: ``AnyStringPtr`` writes numbers as text."""
    p: dict[str, Any] = {"name": name}
    if default is not None:
        p["default"] = str(default)
    if value is not None:
        p["value"] = value if isinstance(value, str) else go_json(value)
    return p


# ------------------------------------------------------------------------------------------------ the compiler

PARENT_DAG_ID, ITERATION_INDEX = "parent-dag-id", "iteration-index"
_SECURITY = {"allowPrivilegeEscalation": False, "runAsNonRoot": True, "capabilities": {"drop": ["ALL"]},
             "seccompProfile": {"type": "RuntimeDefault"}}
_POD_SECURITY = {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}
_COMMON_ENV = [{"name": "KFP_POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
               {"name": "KFP_POD_UID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}}]
_SCRATCH = [("kfp-launcher", "/kfp-launcher"), ("gcs-scratch", "/gcs"), ("s3-scratch", "/s3"),
            ("minio-scratch", "/minio"), ("dot-local-scratch", "/.local"), ("dot-cache-scratch", "/.cache"),
            ("dot-config-scratch", "/.config")]
_RETRY_PARAMS = ("retry-max-count", "retry-backoff-duration", "retry-backoff-factor", "retry-backoff-max-duration")


def _tasks_of(component: dict) -> dict:
    return component.get("dag", {}).get("tasks", {})


def _depends(deps: list[str]) -> str:
    return " && ".join(f"{d}.Succeeded" for d in deps)


class ArgoCompiler:
    """``argocompiler.Compile`` for the subset this pipeline uses: container and DAG components, parameter
    iterators, one exit handler, retry policies and Kubernetes executor configs (an artifact iterator, a trigger
    condition, an importer or a workspace raises ``NotImplementedError``)."""

    def __init__(self, spec: dict, platform: dict | None, parameters: dict[str, Any]):
        self.spec = copy.deepcopy(spec)  # addImplicitDependencies edits the tasks, as the Go compiler does
        self.executors = self.spec["deploymentSpec"]["executors"]
        self.k8s = (platform or {}).get("platforms", {}).get("kubernetes", {}).get("deploymentSpec", {}).get(
            "executors", {})
        values = {}
        for name, d in self.spec["root"].get("inputDefinitions", {}).get("parameters", {}).items():
            if name in parameters:
                values[name] = parameters[name]
            elif "defaultValue" in d:
                values[name] = d["defaultValue"]
            elif d.get("isOptional"):
                values[name] = None
        unknown = set(parameters) - set(values)
        if unknown:
            raise ValueError(f"parameters the pipeline does not declare: {sorted(unknown)}")
        self.runtime_config = {"gcsOutputDirectory": PIPELINE_ROOT, "parameterValues": values}
        self.arguments: dict[str, str] = {}
        self.templates: dict[str, dict] = {}
        self._visited: set[str] = set()
        self._dfs("root", self.spec["root"])

    # ---------------------------------------------------------------- the workflow

    def workflow(self) -> dict:
        """The Workflow as the API server creates it (``argo.go`` ``Compile``, plus the run's name, uid and labels)."""
        name = self.spec["pipelineInfo"]["name"]
        return {
            "apiVersion": "argoproj.io/v1alpha1", "kind": "Workflow",
            "metadata": {"name": WORKFLOW_NAME, "generateName": f"{name}-", "namespace": NAMESPACE, "uid": RUN_ID,
                         "resourceVersion": "123456789", "generation": 42, "creationTimestamp": CREATED,
                         "labels": {"pipeline/runid": RUN_ID, "pipelines.kubeflow.org/v2_component": "true",
                                    "workflows.argoproj.io/completed": "true",
                                    "workflows.argoproj.io/phase": "Succeeded"},
                         "annotations": {"pipelines.kubeflow.org/run_name": f"{name}-20261202-100000",
                                         "workflows.argoproj.io/pod-name-format": "v2"}},
            "spec": {"templates": list(self.templates.values()), "entrypoint": "entrypoint",
                     "arguments": {"parameters": [_param(k, v) for k, v in self.arguments.items()]},
                     "serviceAccountName": "pipeline-runner",
                     "podMetadata": {"annotations": {"pipelines.kubeflow.org/v2_component": "true"},
                                     "labels": {"pipelines.kubeflow.org/v2_component": "true",
                                                "pipeline/runid": RUN_ID}},
                     "securityContext": _POD_SECURITY},
        }

    # ---------------------------------------------------------------- visitor (compiler/visitor.go Accept)

    def _dfs(self, name: str, component: dict) -> None:
        if name in self._visited:
            return
        self._visited.add(name)
        label = component.get("executorLabel")
        if label:
            executor = self.executors[label]
            if label in self.k8s:
                self._save(f"kubernetes-{name}", self.k8s[label])
            if "container" not in executor:
                raise NotImplementedError(f"{name}: only container executors are modelled")
            self._save(f"components-{self._hash(name)}", component)
            self._save(f"implementations-{self._hash(name)}", executor["container"])
            return
        for key in sorted(_tasks_of(component)):
            ref = _tasks_of(component)[key]["componentRef"]["name"]
            self._dfs(ref, self.spec["components"][ref])
        self._dag(name, component)

    def _save(self, name: str, message: dict) -> None:
        if name not in self.arguments:  # saveProtoToArguments: the first one saved wins
            self.arguments[name] = stably(message)

    def _hash(self, name: str) -> str:
        """``hashComponentContainer``: the SHA-256 of the component's container (Go hashes its own JSON of the
        struct: another 64 hex digits, the same length), the component's name for a DAG or the root."""
        if name == "root":
            return name
        label = self.spec["components"][name].get("executorLabel")
        if label and "container" in self.executors.get(label, {}):
            return hashlib.sha256(go_json(self.executors[label]["container"], sort_keys=True).encode()).hexdigest()
        return name

    def _component_placeholder(self, name: str) -> str:
        return "{{workflow.parameters.components-%s}}" % self._hash(name)

    def _add(self, template: dict) -> str:
        if template["name"] in self.templates:
            raise ValueError(f"template {template['name']} already exists")
        self.templates[template["name"]] = template
        return template["name"]

    # ---------------------------------------------------------------- dag.go

    def _dag(self, name: str, component: dict) -> None:
        tasks = _tasks_of(component)
        for task in tasks.values():  # addImplicitDependencies
            for source in task.get("inputs", {}).get("parameters", {}).values():
                producer = source.get("taskOutputParameter", {}).get("producerTask")
                if producer and producer not in task.setdefault("dependentTasks", []):
                    task["dependentTasks"].append(producer)
            if task.get("inputs", {}).get("artifacts"):
                raise NotImplementedError(f"{name}: artifacts are not modelled")
        self._save(f"components-{self._hash(name)}", component)
        exit_templates = {}
        for key in sorted(tasks):
            task = tasks[key]
            if task.get("triggerPolicy", {}).get("strategy") != "ALL_UPSTREAM_TASKS_COMPLETED":
                continue
            hook = f"exit-hook-{name}-{key}"
            for dep in task.get("dependentTasks", []):
                exit_templates[dep] = hook
            self._add({"name": hook, "inputs": {"parameters": [_param(PARENT_DAG_ID)]},
                       "dag": {"tasks": self._task(key, task, "{{inputs.parameters.parent-dag-id}}")}})
        dag_tasks = []
        for key in sorted(tasks):
            task = tasks[key]
            if task.get("triggerPolicy", {}).get("strategy") == "ALL_UPSTREAM_TASKS_COMPLETED":
                continue
            dag_tasks += self._task(key, task, "{{inputs.parameters.parent-dag-id}}",
                                    exit_template=exit_templates.get(key, ""))
        self._add({"name": name, "inputs": {"parameters": [_param(PARENT_DAG_ID)]}, "dag": {"tasks": dag_tasks}})
        if name == "root":
            driver = self._dag_driver_task("root-driver", self._component_placeholder("root"),
                                           runtime_config=stably(self.runtime_config))
            root = self._dag_task("root", "root", "{{tasks.root-driver.outputs.parameters.execution-id}}")
            root["depends"] = "root-driver.Succeeded"
            self._add({"name": "entrypoint", "dag": {"tasks": [driver, root]}})

    def _task(self, name: str, task: dict, parent_dag_id: str, iteration_index: str = "", exit_template: str = "",
              task_name: str = "") -> list[dict]:
        ref = task["componentRef"]["name"]
        component = self.spec["components"][ref]
        placeholder = self._component_placeholder(ref)
        task_json = stably(task)
        if task.get("triggerPolicy", {}).get("condition"):
            raise NotImplementedError(f"{name}: trigger conditions are not modelled")
        if "artifactIterator" in task:
            raise NotImplementedError(f"{name}: artifact iterators are not modelled")
        if not iteration_index and "parameterIterator" in task:
            return self._iterator_task(name, task, task_json, parent_dag_id)
        is_exit = task.get("triggerPolicy", {}).get("strategy") == "ALL_UPSTREAM_TASKS_COMPLETED"
        if "dag" in component:
            driver = self._dag_driver_task(f"{name}-driver", placeholder, parent_dag_id=parent_dag_id, task=task_json,
                                           iteration_index=iteration_index, task_name=task_name or name)
            if not iteration_index and not is_exit and task.get("dependentTasks"):
                driver["depends"] = _depends(task["dependentTasks"])
            dag = self._dag_task(name, ref, "{{tasks.%s-driver.outputs.parameters.execution-id}}" % name,
                                 exit_template, parent_dag_id,
                                 condition="{{tasks.%s-driver.outputs.parameters.condition}}" % name)
            dag["depends"] = f"{name}-driver.Succeeded"
            return [driver, dag]
        args = [_param("component", placeholder), _param("task", task_json),
                _param("container", "{{workflow.parameters.implementations-%s}}" % self._hash(ref)),
                _param("task-name", task_name or name), _param(PARENT_DAG_ID, parent_dag_id)]
        if iteration_index:
            args.append(_param(ITERATION_INDEX, iteration_index))
        if f"kubernetes-{ref}" in self.arguments:
            args.append(_param("kubernetes-config", "{{workflow.parameters.kubernetes-%s}}" % ref))
        driver = {"name": f"{name}-driver", "template": self._container_driver_template(),
                  "arguments": {"parameters": args}}
        if not iteration_index and not is_exit and task.get("dependentTasks"):
            driver["depends"] = _depends(task["dependentTasks"])
        retry = task.get("retryPolicy")
        executor = {"name": name, "template": self._executor_templates(retry is not None),
                    "arguments": {"parameters": [
                        _param("pod-spec-patch", "{{tasks.%s-driver.outputs.parameters.pod-spec-patch}}" % name),
                        _param("cached-decision", "{{tasks.%s-driver.outputs.parameters.cached-decision}}" % name,
                               default="false"),
                        *self._retry_values(retry)]},
                    "depends": f"{name}-driver.Succeeded"}
        if exit_template:
            executor["hooks"] = {"exit": {"template": exit_template,
                                          "arguments": {"parameters": [_param(PARENT_DAG_ID, parent_dag_id)]}}}
        return [driver, executor]

    @staticmethod
    def _retry_values(retry: dict | None) -> list[dict]:
        """``getTaskRetryParametersWithValues``."""
        if retry is None:
            return []
        seconds = lambda d: str(int(float(str(d).rstrip("s"))))  # noqa: E731
        found = [_param("retry-max-count", str(retry.get("maxRetryCount", 0)))]
        if "backoffDuration" in retry:
            found.append(_param("retry-backoff-duration", seconds(retry["backoffDuration"])))
        found.append(_param("retry-backoff-factor", go_json(float(retry.get("backoffFactor", 0)))))
        if "backoffMaxDuration" in retry:
            found.append(_param("retry-backoff-max-duration", seconds(retry["backoffMaxDuration"])))
        return found

    def _dag_task(self, name: str, component: str, parent_dag_id: str, exit_template: str = "",
                  hook_parent_dag_id: str = "", condition: str = "") -> dict:
        task = {"name": name, "template": component, "arguments": {"parameters": [
            _param(PARENT_DAG_ID, parent_dag_id), _param("condition", condition)]}}
        if exit_template:
            task["hooks"] = {"exit": {"template": exit_template,
                                      "arguments": {"parameters": [_param(PARENT_DAG_ID, hook_parent_dag_id)]}}}
        return task

    def _iterator_task(self, name: str, task: dict, task_json: str, parent_dag_id: str) -> list[dict]:
        ref = task["componentRef"]["name"]
        driver = self._dag_driver_task("iteration-driver", self._component_placeholder(ref),
                                       parent_dag_id=parent_dag_id, task=task_json, task_name=name)
        inner = self._task("iteration-item", task, "{{inputs.parameters.parent-dag-id}}",
                           iteration_index="{{inputs.parameters.iteration-index}}", task_name=name)
        iterations = self._add({"name": f"{ref}-iteration", "inputs": {"parameters": [
            _param(PARENT_DAG_ID), _param(ITERATION_INDEX)]}, "dag": {"tasks": inner}})
        loop = {"name": f"{ref}-{name}-iterator", "inputs": {"parameters": [_param(PARENT_DAG_ID)]},
                "dag": {"tasks": [driver, {
                    "name": "iteration-iterations", "template": iterations, "depends": "iteration-driver.Succeeded",
                    "arguments": {"parameters": [
                        _param(PARENT_DAG_ID, "{{tasks.iteration-driver.outputs.parameters.execution-id}}"),
                        _param(ITERATION_INDEX, "{{item}}")]},
                    "withSequence": {"count": "{{tasks.iteration-driver.outputs.parameters.iteration-count}}"}}]}}
        limit = int(task.get("iteratorPolicy", {}).get("parallelismLimit", 0))
        if limit > 0:
            loop["parallelism"] = limit
        dag_task = {"name": name, "template": self._add(loop),
                    "arguments": {"parameters": [_param(PARENT_DAG_ID, parent_dag_id)]}}
        if task.get("dependentTasks"):
            dag_task["depends"] = _depends(task["dependentTasks"])
        return [dag_task]

    def _dag_driver_task(self, name: str, component: str, parent_dag_id: str = "", task: str = "",
                         iteration_index: str = "", task_name: str = "", runtime_config: str = "") -> dict:
        params = [_param("component", component)]
        if iteration_index:
            params.append(_param(ITERATION_INDEX, iteration_index))
        if parent_dag_id:
            params.append(_param(PARENT_DAG_ID, parent_dag_id))
        if runtime_config:
            params += [_param("runtime-config", runtime_config), _param("driver-type", "ROOT_DAG")]
        if task:
            params.append(_param("task", task))
        if task_name:
            params.append(_param("task-name", task_name))
        return {"name": name, "template": self._dag_driver_template(), "arguments": {"parameters": params}}

    # ---------------------------------------------------------------- the system templates

    def _driver_args(self, kind: str) -> list[str]:
        args = ["--type", kind, "--pipeline_name", self.spec["pipelineInfo"]["name"], "--run_id", "{{workflow.uid}}",
                "--run_name", "{{workflow.name}}", "--run_display_name", "",
                "--pipeline_job_create_time_utc", "{{workflow.creationTimestamp}}",
                "--dag_execution_id", "{{inputs.parameters.parent-dag-id}}",
                "--component", "{{inputs.parameters.component}}", "--task", "{{inputs.parameters.task}}",
                "--task_name", "{{inputs.parameters.task-name}}"]
        if kind == "CONTAINER":
            args += ["--container", "{{inputs.parameters.container}}",
                     "--iteration_index", "{{inputs.parameters.iteration-index}}",
                     "--cached_decision_path", "{{outputs.parameters.cached-decision.path}}",
                     "--pod_spec_patch_path", "{{outputs.parameters.pod-spec-patch.path}}",
                     "--condition_path", "{{outputs.parameters.condition.path}}",
                     "--kubernetes_config", "{{inputs.parameters.kubernetes-config}}"]
        else:
            args += ["--runtime_config", "{{inputs.parameters.runtime-config}}",
                     "--iteration_index", "{{inputs.parameters.iteration-index}}",
                     "--execution_id_path", "{{outputs.parameters.execution-id.path}}",
                     "--iteration_count_path", "{{outputs.parameters.iteration-count.path}}",
                     "--condition_path", "{{outputs.parameters.condition.path}}"]
        return args + ["--http_proxy", "", "--https_proxy", "", "--no_proxy", "",
                       "--ml_pipeline_server_address", ML_PIPELINE[0], "--ml_pipeline_server_port", ML_PIPELINE[1],
                       "--mlmd_server_address", MLMD[0], "--mlmd_server_port", MLMD[1]]

    def _driver_template(self, name: str, kind: str, inputs: list[dict], outputs: list[dict]) -> dict:
        return {"name": name, "inputs": {"parameters": inputs}, "outputs": {"parameters": outputs},
                "metadata": {"annotations": {"pipelines.kubeflow.org/runtime-role": "driver"}},
                "container": {"name": "", "image": DRIVER_IMAGE, "command": ["driver"], "args": self._driver_args(kind),
                              "resources": {"limits": {"cpu": "500m", "memory": "512Mi"},
                                            "requests": {"cpu": "100m", "memory": "64Mi"}},
                              **({"env": _COMMON_ENV} if kind == "CONTAINER" else {}),
                              "securityContext": _SECURITY},
                "securityContext": _POD_SECURITY}

    def _container_driver_template(self) -> str:
        name = "system-container-driver"
        if name not in self.templates:
            self._add(self._driver_template(name, "CONTAINER", [
                _param("component"), _param("task"), _param("container"), _param("task-name"),
                _param(PARENT_DAG_ID), _param(ITERATION_INDEX, default="-1"),
                _param("kubernetes-config", default="")], [
                {"name": "pod-spec-patch", "valueFrom": {"path": "/tmp/outputs/pod-spec-patch", "default": ""}},
                {"name": "cached-decision", "default": "false",
                 "valueFrom": {"path": "/tmp/outputs/cached-decision", "default": "false"}},
                {"name": "condition", "valueFrom": {"path": "/tmp/outputs/condition", "default": "true"}}]))
        return name

    def _dag_driver_template(self) -> str:
        name = "system-dag-driver"
        if name not in self.templates:
            self._add(self._driver_template(name, "{{inputs.parameters.driver-type}}", [
                _param("component"), _param("runtime-config", default=""), _param("task", default=""),
                _param("task-name", default=""), _param(PARENT_DAG_ID, default="0"),
                _param(ITERATION_INDEX, default="-1"), _param("driver-type", default="DAG")], [
                {"name": "execution-id", "valueFrom": {"path": "/tmp/outputs/execution-id"}},
                {"name": "iteration-count", "valueFrom": {"path": "/tmp/outputs/iteration-count", "default": "0"}},
                {"name": "condition", "valueFrom": {"path": "/tmp/outputs/condition", "default": "true"}}]))
        return name

    def _executor_templates(self, retried: bool) -> str:
        """``addContainerExecutorTemplate``: the executor DAG and the pod it runs (``retry-`` ones with a retry
        strategy read from the task's retry parameters)."""
        prefix = "retry-" if retried else ""
        name, impl = f"{prefix}system-container-executor", f"{prefix}system-container-impl"
        if name in self.templates:
            return name
        retry_inputs = [_param(p, default="0") for p in _RETRY_PARAMS] if retried else []
        self._add({"name": name, "inputs": {"parameters": [
            _param("pod-spec-patch"), _param("cached-decision", default="false"), *retry_inputs]},
            "dag": {"tasks": [{"name": "executor", "template": impl, "arguments": {"parameters": [
                _param("pod-spec-patch", "{{inputs.parameters.pod-spec-patch}}"),
                *[_param(p, "{{inputs.parameters.%s}}" % p) for p in (_RETRY_PARAMS if retried else ())]]},
                "when": "{{inputs.parameters.cached-decision}} != true"}]}})
        env = _COMMON_ENV + ([{"name": "KFP_RETRY_INDEX", "value": "{{retries}}"}] if retried else [])
        template = {
            "name": impl, "inputs": {"parameters": [_param("pod-spec-patch"),
                                                    *[_param(p) for p in (_RETRY_PARAMS if retried else ())]]},
            "metadata": {"annotations": {"pipelines.kubeflow.org/runtime-role": "launcher"}},
            "podSpecPatch": "{{inputs.parameters.pod-spec-patch}}",
            "volumes": [{"name": v, "emptyDir": {}} for v, _ in _SCRATCH],
            "initContainers": [{"name": "kfp-launcher", "image": LAUNCHER_IMAGE, "command": ["launcher-v2"],
                                "args": ["--copy", "/kfp-launcher/launch"],
                                "resources": {"limits": {"cpu": "500m", "memory": "256Mi"},
                                              "requests": {"cpu": "100m"}},
                                "volumeMounts": [{"name": "kfp-launcher", "mountPath": "/kfp-launcher"}],
                                "securityContext": _SECURITY}],
            "container": {"name": "", "image": "gcr.io/ml-pipeline/should-be-overridden-during-runtime",
                          "command": ["should-be-overridden-during-runtime"],
                          "envFrom": [{"configMapRef": {"name": "metadata-grpc-configmap", "optional": True}}],
                          "env": env, "resources": {},
                          "volumeMounts": [{"name": v, "mountPath": p} for v, p in _SCRATCH]},
            "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}}}
        if retried:
            template["retryStrategy"] = {"limit": "{{inputs.parameters.retry-max-count}}", "backoff": {
                "duration": "{{inputs.parameters.retry-backoff-duration}}",
                "factor": "{{inputs.parameters.retry-backoff-factor}}",
                "maxDuration": "{{inputs.parameters.retry-backoff-max-duration}}"}}
        self._add(template)
        return name


# ------------------------------------------------------------------------------------------------ the KFP driver


@dataclass
class Execution:
    """One MLMD execution the drivers create: the root DAG, a DAG task, a ParallelFor's iterator, an iteration or a
    container task."""
    id: int
    kind: str  # dag, loop, iteration, container
    task: str  # the task key ("" for the root and an iteration)
    component: dict
    inputs: dict[str, Any]
    children: dict[str, Execution] = field(default_factory=dict)
    iterations: list[Execution] = field(default_factory=list)
    outputs: dict[str, Any] = field(default_factory=dict)
    executor_input: dict = field(default_factory=dict)
    items: list = field(default_factory=list)


#: (task key, component name, the task's resolved inputs) -> its output parameters, as the component returns them.
TaskOutputs = Callable[[str, str, dict[str, Any]], dict[str, Any]]


def _text(value: Any) -> str:
    """``PbValueToText``: numbers without trailing zeros, JSON for lists and structs."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return go_json(float(value))
    return go_json(value)


def _pb(value: Any) -> Any:
    """A protobuf ``Value``: numbers are doubles."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, dict):
        return {k: _pb(v) for k, v in value.items()}
    return [_pb(v) for v in value]


_SELECTOR = re.compile(r'parseJson\(string_value\)\["([^"]+)"\]')
_CHANNEL = re.compile(r"\{\{\$\.inputs\.parameters\['(.+?)'\]\}\}")


class KfpDriver:
    """What the KFP driver pods write (``backend/src/v2/driver``), with MLMD as a table of executions: a DAG
    driver's execution id and iteration count, a container driver's pod spec patch. Input resolution covers
    the pipeline's kinds (``resolve.go``): a parent DAG's input, a constant with the run's placeholders, a sibling
    task's output (a container's, a DAG's through its outputs, a ParallelFor's collected from its iterations), a
    ``parseJson(string_value)["field"]`` selector of a loop item, and the exit handler's final status."""

    def __init__(self, compiled: ArgoCompiler, task_outputs: TaskOutputs):
        self.spec = compiled.spec
        self.task_outputs = task_outputs
        self.executions: dict[int, Execution] = {}
        self._next_id = 40001

    def _new(self, kind: str, task: str, component: dict, inputs: dict) -> Execution:
        execution = Execution(self._next_id, kind, task, component, inputs)
        self.executions[execution.id] = execution
        self._next_id += 1
        return execution

    def containers(self) -> list[Execution]:
        return [e for e in self.executions.values() if e.kind == "container"]

    # ---------------------------------------------------------------- the driver pods' outputs

    def dag_driver(self, inputs: dict[str, str]) -> dict[str, str]:
        component = json.loads(inputs["component"])
        if inputs.get("driver-type") == "ROOT_DAG":
            runtime = json.loads(inputs["runtime-config"])
            root = self._new("dag", "", component, _pb(runtime["parameterValues"]))
            return {"execution-id": str(root.id), "iteration-count": "0", "condition": "nil"}
        parent = self.executions[int(inputs[PARENT_DAG_ID])]
        task = json.loads(inputs["task"])
        index = int(inputs.get(ITERATION_INDEX, "-1"))
        if index >= 0:  # an iteration: the iterator's inputs, its items replaced by the item
            iterator = task["parameterIterator"]
            items_name, item_name = iterator["items"]["inputParameter"], iterator["itemInput"]
            scope = {k: v for k, v in parent.inputs.items() if k != items_name} | {item_name: parent.items[index]}
            iteration = self._new("iteration", "", component, scope)
            parent.iterations.append(iteration)
            return {"execution-id": str(iteration.id), "iteration-count": "0", "condition": "nil"}
        values = self._resolve_all(task, component, parent)
        if "parameterIterator" in task:
            items = values[task["parameterIterator"]["items"]["inputParameter"]]
            if not isinstance(items, list):
                raise ValueError(f"{inputs['task-name']}: iterating over {items!r}, not a list")
            loop = self._new("loop", inputs["task-name"], component, values)
            loop.items = items
            parent.children[inputs["task-name"]] = loop
            return {"execution-id": str(loop.id), "iteration-count": str(len(items)), "condition": "nil"}
        dag = self._new("dag", inputs["task-name"], component, values)
        parent.children[inputs["task-name"]] = dag
        return {"execution-id": str(dag.id), "iteration-count": "0", "condition": "nil"}

    def container_driver(self, inputs: dict[str, str]) -> dict[str, str]:
        component = json.loads(inputs["component"])
        container = json.loads(inputs["container"])
        k8s = json.loads(inputs["kubernetes-config"]) if inputs.get("kubernetes-config") else {}
        parent = self.executions[int(inputs[PARENT_DAG_ID])]
        task = json.loads(inputs["task"])
        name = inputs["task-name"]
        values = self._resolve_all(task, component, parent)
        execution = self._new("container", name, component, values)
        parent.children[name] = execution
        outputs = self.task_outputs(name, task["componentRef"]["name"], values)
        execution.outputs = {k: _pb(v) for k, v in outputs.items()}
        execution.executor_input = self._executor_input(name, component, values)
        patch = self._pod_spec_patch(execution, container, k8s, task, parent)
        return {"pod-spec-patch": go_json(patch), "cached-decision": "false", "condition": "nil"}

    # ---------------------------------------------------------------- inputs (resolve.go)

    def _resolve_all(self, task: dict, component: dict, parent: Execution) -> dict[str, Any]:
        definitions = component.get("inputDefinitions", {}).get("parameters", {})
        values: dict[str, Any] = {}
        for name, source in task.get("inputs", {}).get("parameters", {}).items():
            value = self._resolve(source, parent, task)
            if "parameterExpressionSelector" in source:
                selected = _SELECTOR.fullmatch(source["parameterExpressionSelector"])
                if not selected:
                    raise NotImplementedError(f"selector {source['parameterExpressionSelector']}")
                value = _pb(json.loads(_text(value))[selected.group(1)])
            values[name] = value
        if "parameterIterator" in task:  # the iterator has no item yet
            definitions = {k: v for k, v in definitions.items() if k != task["parameterIterator"]["itemInput"]}
        for name, d in definitions.items():
            if name not in values:
                # resolve.go: a DAG driver passes an omitted optional input's default (or null); a container's is
                # left to the component
                if "dag" in component and d.get("isOptional"):
                    values[name] = _pb(d.get("defaultValue"))
                continue
            if d["parameterType"] == "STRING" and not (values[name] is None and "dag" in component):
                values[name] = _text(values[name])
        return values

    def _resolve(self, source: dict, parent: Execution, task: dict) -> Any:
        if "componentInputParameter" in source:
            return parent.inputs[source["componentInputParameter"]]
        if "runtimeValue" in source:
            value = source["runtimeValue"]["constant"]
            placeholders = {"{{$.pipeline_job_uuid}}": RUN_ID, "{{$.pipeline_job_name}}": RUN_DISPLAY_NAME,
                            "{{$.pipeline_job_resource_name}}": WORKFLOW_NAME,
                            "{{$.pipeline_task_name}}": task["taskInfo"]["name"],
                            "{{$.pipeline_job_create_time_utc}}": CREATED}
            return _pb(placeholders.get(value, value) if isinstance(value, str) else value)
        if "taskOutputParameter" in source:
            spec = source["taskOutputParameter"]
            return self._output(parent.children[spec["producerTask"]], spec["outputParameterKey"])
        if "taskFinalStatus" in source:
            producer = task["dependentTasks"][0]
            return {"error": {}, "pipelineJobResourceName": WORKFLOW_NAME, "pipelineTaskName": producer,
                    "state": "COMPLETE"}
        raise NotImplementedError(f"input parameter spec {source}")

    def _output(self, producer: Execution, key: str) -> Any:
        if producer.kind == "container":
            return producer.outputs[key]
        selector = producer.component["dag"]["outputs"]["parameters"][key]["valueFromParameter"]
        subtask, subkey = selector["producerSubtask"], selector["outputParameterKey"]
        if producer.kind == "loop":
            return [self._output(iteration.children[subtask], subkey) for iteration in producer.iterations]
        return self._output(producer.children[subtask], subkey)

    # ---------------------------------------------------------------- the pod spec patch (driver.go, k8s.go)

    def _executor_input(self, task_name: str, component: dict, values: dict) -> dict:
        """``ExecutorInput`` as the container driver builds it (``provisionOutputs``: the executor-logs artifact
        that ``--publish_logs`` defaults to, an output file under the task's root)."""
        salt = uuid.uuid5(uuid.NAMESPACE_OID, f"{RUN_ID}/{self._next_id}")  # provisionOutputs: a new uuid a task
        root = f"{PIPELINE_ROOT}/{self.spec['pipelineInfo']['name']}/{RUN_ID}/{task_name}/{salt}"
        local_root = "/minio/" + root.split("://", 1)[1]
        outputs: dict[str, Any] = {"artifacts": {"executor-logs": {"artifacts": [{
            "name": "executor-logs", "type": {"schemaTitle": "system.Artifact"}, "uri": f"{root}/executor-logs"}]}}}
        parameters = component.get("outputDefinitions", {}).get("parameters", {})
        if parameters:
            outputs["parameters"] = {name: {"outputFile": f"/tmp/kfp/outputs/{name}"} for name in parameters}
        outputs["outputFile"] = f"{local_root}/output_metadata.json"
        return {"inputs": {"parameterValues": values}, "outputs": outputs}

    def _k8s_value(self, source: dict, parent: Execution, task: dict) -> Any:
        return self._resolve(source, parent, task)

    def _pod_spec_patch(self, execution: Execution, container: dict, k8s: dict, task: dict,
                        parent: Execution) -> dict:
        executor_input = go_json(execution.executor_input)
        values = execution.inputs

        def resolve(text: str) -> str:
            text = text.replace("{{$}}", executor_input)
            return _CHANNEL.sub(lambda m: _text(values.get(m.group(1))), text)

        command = ["/kfp-launcher/launch", "--pipeline_name", self.spec["pipelineInfo"]["name"], "--run_id", RUN_ID,
                   "--execution_id", str(execution.id), "--executor_input", executor_input,
                   "--component_spec", go_json(execution.component), "--pod_name", "$(KFP_POD_NAME)",
                   "--pod_uid", "$(KFP_POD_UID)", "--ml_pipeline_server_address", ML_PIPELINE[0],
                   "--ml_pipeline_server_port", ML_PIPELINE[1], "--mlmd_server_address", MLMD[0],
                   "--mlmd_server_port", MLMD[1], "--publish_logs", "true", "--publish_logs", "true", "--"]
        limits: dict[str, str] = {}
        resources = container.get("resources", {})
        for key, name in (("resourceCpuLimit", "cpu"), ("resourceMemoryLimit", "memory")):
            if resources.get(key):
                limits[name] = resolve(resources[key])
        accelerator = resources.get("accelerator", {})
        kind = resolve(accelerator.get("resourceType", "")) or accelerator.get("type", "")
        count = resolve(accelerator.get("resourceCount", "")) or str(accelerator.get("count", ""))
        if kind and count:
            limits[kind] = count
        env = [{"name": e["name"], "value": e.get("value", "")} for e in container.get("env", [])]
        main: dict[str, Any] = {"name": "main", "image": resolve(container["image"]), "command": command,
                                "args": [resolve(a) for a in [*container.get("command", []),
                                                              *container.get("args", [])]],
                                "resources": {"limits": limits} if limits else {}}
        pod: dict[str, Any] = {"containers": [main]}
        for secret in k8s.get("secretAsEnv", []):
            env += [{"name": kv["envVar"], "valueFrom": {"secretKeyRef": {
                "name": secret["secretName"], "key": kv["secretKey"], "optional": secret.get("optional", False)}}}
                    for kv in secret["keyToEnv"]]
        for config_map in k8s.get("configMapAsEnv", []):
            env += [{"name": kv["envVar"], "valueFrom": {"configMapKeyRef": {
                "name": config_map["configMapName"], "key": kv["configMapKey"],
                "optional": config_map.get("optional", False)}}} for kv in config_map["keyToEnv"]]
        for field_path in k8s.get("fieldPathAsEnv", []):
            env.append({"name": field_path["name"], "valueFrom": {"fieldRef": {"fieldPath": field_path["fieldPath"]}}})
        if env:
            main["env"] = env
        for mount in k8s.get("emptyDirMounts", []):
            pod.setdefault("volumes", []).append({"name": mount["volumeName"], "emptyDir": {
                k: v for k, v in (("medium", mount.get("medium")), ("sizeLimit", mount.get("sizeLimit"))) if v}})
            main.setdefault("volumeMounts", []).append({"name": mount["volumeName"], "mountPath": mount["mountPath"]})
        selector = k8s.get("nodeSelector", {})
        if "nodeSelectorJson" in selector:
            value = self._k8s_value(selector["nodeSelectorJson"], parent, task)
            if isinstance(value, dict) and value:
                pod["nodeSelector"] = value
        elif selector.get("labels"):
            pod["nodeSelector"] = selector["labels"]
        tolerations = []
        for toleration in k8s.get("tolerations", []):
            if "tolerationJson" in toleration:
                value = self._k8s_value(toleration["tolerationJson"], parent, task)
                tolerations += [value] if isinstance(value, dict) else list(value or [])
            else:
                tolerations.append(toleration)
        if tolerations:
            pod["tolerations"] = [_go_values(t) for t in tolerations if t]
        secrets = []
        for secret in k8s.get("imagePullSecret", []):
            if "secretNameParameter" in secret:
                secrets.append(_text(self._k8s_value(secret["secretNameParameter"], parent, task)))
            else:
                secrets.append(secret["secretName"])
        if secrets:
            pod["imagePullSecrets"] = [{"name": s} for s in secrets]
        return pod


# ------------------------------------------------------------------------------------------------ the Argo controller


@dataclass
class ArgoConfig:
    """The workflow controller's settings that change the nodes: KFP 2.17.0's manifests add a template default
    retry strategy (every template invocation a Retry node), and every KFP install archives logs (a main-logs
    artifact on every pod)."""
    name: str
    template_default_retry: bool = False
    archive_logs: bool = True


ARGO_PLAIN = ArgoConfig("kfp-2.15-2.16-manifests")
ARGO_KFP_2_17 = ArgoConfig("kfp-2.17-manifests", template_default_retry=True)


@dataclass
class Node:
    status: dict
    template: str  # the template it ran ("" for a task group)
    kind: str  # what runs: container-driver, dag-driver, executor, dag, task-group, retry
    owner: str = ""  # the node that holds it: its DAG, task group or retry node ("" for the workflow's)

    @property
    def id(self) -> str:
        return self.status["id"]


_PLACEHOLDER = re.compile(r"\{\{([^{}]+)\}\}")


def _timestamp(seconds: int) -> str:
    """``CREATED`` plus ``seconds``, as RFC 3339 (a metav1.Time's JSON)."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(CREATED_EPOCH + seconds))


class ArgoRun:
    """The run's ``status.nodes`` once it has succeeded, built as ``workflow/controller`` builds them from the
    compiled Workflow, with :class:`KfpDriver` answering for the driver pods."""

    def __init__(self, workflow: dict, driver: KfpDriver, config: ArgoConfig = ARGO_PLAIN):
        self.workflow = workflow
        self.driver = driver
        self.config = config
        self.templates = {t["name"]: t for t in workflow["spec"]["templates"]}
        self.globals = {f"workflow.parameters.{p['name']}": p["value"]
                        for p in workflow["spec"]["arguments"]["parameters"]}
        self.globals |= {"workflow.uid": RUN_ID, "workflow.name": WORKFLOW_NAME,
                         "workflow.creationTimestamp": CREATED}
        self.nodes: dict[str, Node] = {}
        self._execute(WORKFLOW_NAME, "entrypoint", {}, "")

    # ---------------------------------------------------------------- nodes

    def _node(self, name: str, node_type: str, template: str, boundary: str, kind: str,
              inputs: list[dict] | None = None) -> Node:
        status: dict[str, Any] = {"id": node_id(name), "name": name, "displayName": self._display(name, boundary),
                                  "type": node_type}
        if template:
            status["templateName"] = template
        status |= {"templateScope": f"local/{WORKFLOW_NAME}", "phase": "Succeeded"}
        if boundary:
            status["boundaryID"] = boundary
        started = _timestamp(len(self.nodes))  # a second a node: times as distinct as a real run's
        status |= {"startedAt": started, "finishedAt": _timestamp(len(self.nodes) + 7)}
        if inputs:
            status["inputs"] = {"parameters": inputs}
        node = self.nodes[status["id"]] = Node(status, template, kind)
        return node

    def _display(self, name: str, boundary: str) -> str:
        if boundary and boundary in self.nodes:
            display = name[len(self.nodes[boundary].status["name"]):] if name.startswith(
                self.nodes[boundary].status["name"]) else name
            return re.sub(r"^\.", "", display)
        return name

    def _child(self, parent: Node, child: Node) -> None:
        children = parent.status.setdefault("children", [])
        if child.id not in children:
            children.append(child.id)

    def outbound(self, node: Node) -> list[str]:
        """``getOutboundNodes``."""
        node_type = node.status["type"]
        if node_type in ("Pod", "Skipped"):
            return [node.id]
        if node_type == "TaskGroup":
            found = []
            for child in node.status.get("children", []):
                found += self.outbound(self.nodes[child])
            return found or [node.id]
        if node_type == "Retry":
            return [node.status["children"][-1]] if node.status.get("children") else []
        found = []
        for out in node.status.get("outboundNodes", []):
            found += self.outbound(self.nodes[out])
        return found

    # ---------------------------------------------------------------- templates

    def _substitute(self, text: str, scope: dict[str, str]) -> str:
        def one(match: re.Match) -> str:
            key = match.group(1).strip()
            if key in scope:
                return scope[key]
            if key in self.globals:
                return self.globals[key]
            return match.group(0)  # left for a later pass (retries, pod name)
        return _PLACEHOLDER.sub(one, text)

    def _inputs(self, template: dict, args: dict[str, str]) -> list[dict]:
        """The template's inputs with the arguments' values (``ProcessArgs``): a given value, else the default."""
        found = []
        for p in template.get("inputs", {}).get("parameters", []):
            resolved = dict(p)
            if p["name"] in args:
                resolved["value"] = args[p["name"]]
            elif "default" in p:
                resolved["value"] = p["default"]
            found.append(resolved)
        return found

    def _execute(self, name: str, template_name: str, args: dict[str, str], boundary: str) -> Node:
        template = self.templates[template_name]
        inputs = self._inputs(template, args)
        retried = "retryStrategy" in template or self.config.template_default_retry
        if not retried:
            return self._leaf(name, template, inputs, boundary)
        retry = self._node(name, "Retry", template_name, boundary, "retry", inputs)
        attempt = self._leaf(f"{name}(0)", template, inputs, boundary)
        attempt.owner = retry.id
        self._child(retry, attempt)
        if "outputs" in attempt.status:
            retry.status["outputs"] = copy.deepcopy(attempt.status["outputs"])
        return retry

    def _leaf(self, name: str, template: dict, inputs: list[dict], boundary: str) -> Node:
        values = {p["name"]: p.get("value", "") for p in inputs}
        if "container" in template:
            kind = {"system-container-driver": "container-driver", "system-dag-driver": "dag-driver"}.get(
                template["name"], "executor")
            node = self._node(name, "Pod", template["name"], boundary, kind, inputs)
            outputs: dict[str, Any] = {}
            if kind != "executor":
                written = (self.driver.container_driver if kind == "container-driver" else self.driver.dag_driver)(
                    values)
                outputs["parameters"] = []
                for p in template["outputs"]["parameters"]:
                    value = written.get(p["name"], p["valueFrom"].get("default", p.get("default", "")))
                    outputs["parameters"].append({**p, "value": value})
            if self.config.archive_logs:
                pod = pod_name(name, template["name"])
                outputs["artifacts"] = [{"name": "main-logs", "s3": {
                    "key": f"private-artifacts/{NAMESPACE}/{WORKFLOW_NAME}/2026/12/02/{pod}/main.log"}}]
            outputs["exitCode"] = "0"
            node.status |= {"progress": "1/1", "resourcesDuration": {"cpu": 2, "memory": 9}, "outputs": outputs,
                            "hostNodeName": HOST_NODE, "taskResultSynced": True}
            return node
        node = self._node(name, "DAG", template["name"], boundary, "dag", inputs)
        self._dag(node, template, values)
        return node

    def _dag(self, node: Node, template: dict, values: dict[str, str]) -> None:
        tasks = {t["name"]: t for t in template["dag"]["tasks"]}
        deps = {name: re.findall(r"([\w-]+)\.Succeeded", t.get("depends", "")) for name, t in tasks.items()}
        done: dict[str, Node] = {}
        scope = {f"inputs.parameters.{k}": v for k, v in values.items()}
        while len(done) < len(tasks):
            ready = [n for n in tasks if n not in done and all(d in done for d in deps[n])]
            if not ready:
                raise ValueError(f"dependency cycle in {template['name']}")
            name = ready[0]
            task = tasks[name]
            task_name = f"{node.status['name']}.{name}"

            def connect(child: Node, _deps=deps[name]) -> None:
                if not _deps:
                    self._child(node, child)
                for dep in _deps:
                    for out in self.outbound(done[dep]):
                        self._child(self.nodes[out], child)

            args = {p["name"]: self._substitute(p.get("value", ""), scope)
                    for p in task.get("arguments", {}).get("parameters", [])}
            if "withSequence" in task:
                count = int(self._substitute(task["withSequence"]["count"], scope))
                group = self._node(task_name, "TaskGroup", task["template"], node.id, "task-group")
                group.template = ""
                group.owner = node.id
                connect(group)
                for i in range(count):
                    expanded = {k: v.replace("{{item}}", str(i)) for k, v in args.items()}
                    child = self._execute(f"{task_name}({i}:{i})", task["template"], expanded, node.id)
                    child.owner = group.id
                    self._child(group, child)
                result = group
            else:
                when = self._substitute(task.get("when", ""), scope)
                if when and not self._when(when):
                    result = self._node(task_name, "Skipped", task["template"], node.id, "skipped")
                    connect(result)
                else:
                    result = self._execute(task_name, task["template"], args, node.id)
                    connect(result)
                result.owner = node.id
            done[name] = result
            for p in result.status.get("outputs", {}).get("parameters", []):
                scope[f"tasks.{name}.outputs.parameters.{p['name']}"] = p["value"]
            hook = task.get("hooks", {}).get("exit")
            if hook:
                hook_args = {p["name"]: self._substitute(p.get("value", ""), scope)
                             for p in hook["arguments"]["parameters"]}
                on_exit = self._execute(f"{result.status['name']}.onExit", hook["template"], hook_args, node.id)
                on_exit.owner = node.id
                self._child(result, on_exit)
        leaves = [n for n in tasks if not any(n in d for d in deps.values())]
        outbound = []
        for leaf in sorted(leaves):
            outbound += self.outbound(done[leaf])
        if outbound:
            node.status["outboundNodes"] = outbound

    @staticmethod
    def _when(expression: str) -> bool:
        left, op, right = re.fullmatch(r"\s*(\S*)\s*(!=|==)\s*(\S*)\s*", expression).groups()
        return (left != right) if op == "!=" else (left == right)

    # ---------------------------------------------------------------- the finished workflow

    def finish(self) -> None:
        """Progress and resource durations summed up the tree (``progress.UpdateProgress``,
        ``resource.UpdateResourceDurations``): a pod counts for every node that holds it."""
        held = {key: 0 for key in self.nodes}
        for node in self.nodes.values():
            if node.status["type"] == "Pod":
                owner = node.owner
                while owner:
                    held[owner] += 1
                    owner = self.nodes[owner].owner
        for node in self.nodes.values():
            if node.status["type"] != "Pod":
                pods = held[node.id]
                node.status["progress"] = f"{pods}/{pods}"
                node.status["resourcesDuration"] = {"cpu": 2 * pods, "memory": 9 * pods}

    def status(self) -> dict:
        pods = sum(1 for n in self.nodes.values() if n.status["type"] == "Pod")
        return {"phase": "Succeeded", "startedAt": CREATED, "finishedAt": CREATED, "progress": f"{pods}/{pods}",
                "nodes": {n.id: n.status for n in self.nodes.values()},
                "conditions": [{"type": "PodRunning", "status": "False"}, {"type": "Completed", "status": "True"}],
                "resourcesDuration": {"cpu": 2 * pods, "memory": 9 * pods},
                "artifactRepositoryRef": {"configMap": "artifact-repositories", "key": "default-v1",
                                          "namespace": NAMESPACE, "artifactRepository": {"archiveLogs": True, "s3": {
                                              "endpoint": f"seaweedfs.{NAMESPACE}.svc:9000", "bucket": "mlpipeline",
                                              "insecure": True,
                                              "accessKeySecret": {"name": "mlpipeline-minio-artifact",
                                                                  "key": "accesskey"},
                                              "secretKeySecret": {"name": "mlpipeline-minio-artifact",
                                                                  "key": "secretkey"},
                                              "keyFormat": "private-artifacts/{{workflow.namespace}}/"
                                                           "{{workflow.name}}/{{workflow.creationTimestamp.Y}}/"
                                                           "{{workflow.creationTimestamp.m}}/"
                                                           "{{workflow.creationTimestamp.d}}/{{pod.name}}"}}},
                "artifactGCStatus": {"notSpecified": True}}


# ------------------------------------------------------------------------------------------------ sizes


def compress_encode(text: str) -> str:
    """``util/file`` ``CompressEncodeString``: gzip at the default level, then standard base64 (Argo's default
    implementation is klauspost/pgzip, ``GZIP_IMPLEMENTATION``: the same format, compressed in parallel blocks)."""
    return base64.b64encode(gzip.compress(text.encode(), compresslevel=6, mtime=0)).decode()


@dataclass
class WorkflowSizes:
    """The bytes ``workflow/packer/packer.go`` measures (``getSize``: the whole Workflow's JSON) in each form the
    controller may write it (``workflow/hydrator/hydrator.go`` ``Dehydrate``)."""
    spec: int  # the Workflow without status.nodes
    nodes: int  # status.nodes' JSON alone
    uncompressed: int  # with status.nodes
    compressed: int  # with status.compressedNodes instead (gzip + base64 of the nodes' JSON)
    offloaded: int  # with neither: the nodes in the persistence database, an offloadNodeStatusVersion kept

    def verdict(self, limit: int = MAX_WORKFLOW_SIZE) -> str:
        """What the controller does (``Dehydrate``): nodes as they are up to ``limit``, compressed when that fits,
        otherwise offloaded, which needs ``persistence.nodeStatusOffLoad``; without it the run fails with
        "workflow is longer than maximum allowed size ... offload node status is not supported"."""
        if self.uncompressed <= limit:
            return "nodes"
        if self.compressed <= limit:
            return "compressed"
        return "offload-needed"


def workflow_sizes(workflow: dict, status: dict, node_json: dict[str, str] | None = None) -> WorkflowSizes:
    """The sizes of ``workflow`` with ``status``; ``node_json``: each node's JSON by id, when already written
    (``status.nodes`` is a map, written with its keys sorted as Go writes a map)."""
    node_json = node_json if node_json is not None else {k: go_json(v) for k, v in status["nodes"].items()}
    nodes_json = "{" + ",".join(f"{go_json(k)}:{node_json[k]}" for k in sorted(node_json)) + "}"
    rest = {k: v for k, v in status.items() if k != "nodes"}
    without = len(go_json({**workflow, "status": rest}).encode())
    nodes = len(nodes_json.encode())
    compressed = {**workflow, "status": {**rest, "compressedNodes": compress_encode(nodes_json)}}
    offloaded = {**workflow, "status": {**rest, "offloadNodeStatusVersion": "fnv:1234567890"}}
    return WorkflowSizes(spec=without, nodes=nodes,
                         uncompressed=without + len('"nodes":'.encode()) + nodes + len(","),
                         compressed=len(go_json(compressed).encode()), offloaded=len(go_json(offloaded).encode()))


# ------------------------------------------------------------------------------------------------ one run


@dataclass
class RunModel:
    workflow: dict
    run: ArgoRun
    driver: KfpDriver

    def status(self) -> dict:
        return self.run.status()

    def node_json(self) -> dict[str, str]:
        """Each node's JSON, by id."""
        return {node.id: go_json(node.status) for node in self.run.nodes.values()}

    def sizes(self, node_json: dict[str, str] | None = None) -> WorkflowSizes:
        return workflow_sizes(self.workflow, self.status(), node_json)

    def counts(self) -> dict[str, int]:
        """Nodes by type, and pods by what they run."""
        nodes = list(self.run.nodes.values())
        found = {"nodes": len(nodes)}
        for kind in ("Pod", "DAG", "TaskGroup", "Retry", "Skipped"):
            found[f"nodes_{kind}"] = sum(1 for n in nodes if n.status["type"] == kind)
        pods = [n for n in nodes if n.status["type"] == "Pod"]
        found["pods"] = len(pods)
        found["driver_pods"] = sum(1 for n in pods if n.kind in ("container-driver", "dag-driver"))
        found["executor_pods"] = sum(1 for n in pods if n.kind == "executor")
        return found

    def executor_pods(self) -> list[tuple[str, dict]]:
        """Each executor pod's KFP task path (``exit-handler-1/label-workers/for-loop-1/label-part``, as the
        driver emulator names them) and its executor input's parameter values."""
        found = []

        def walk(execution: Execution, path: str) -> None:
            for key, child in execution.children.items():
                if child.kind == "container":
                    found.append((f"{path}{key}", child.inputs))
                elif child.kind == "loop":
                    for iteration in child.iterations:
                        walk(iteration, f"{path}{key}/")
                else:
                    walk(child, f"{path}{key}/")

        [root] = [e for e in self.driver.executions.values() if e.kind == "dag" and not e.task]
        walk(root, "")
        return found


def model_run(spec: dict, platform: dict | None, parameters: dict[str, Any], task_outputs: TaskOutputs,
              config: ArgoConfig = ARGO_PLAIN) -> RunModel:
    """The pipeline ``spec`` compiled for ``parameters`` and run to success on Argo with ``config``."""
    compiler = ArgoCompiler(spec, platform, parameters)
    workflow = compiler.workflow()
    if config.template_default_retry:  # the controller merges workflowDefaults into the stored spec
        workflow["spec"] |= KFP_2_17_WORKFLOW_DEFAULTS
    driver = KfpDriver(compiler, task_outputs)
    run = ArgoRun(workflow, driver, config)
    run.finish()
    return RunModel(workflow, run, driver)
