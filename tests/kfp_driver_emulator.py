"""The pods a KFP 2.17 backend makes from the compiled pipeline for a run, and whether a node would take them.

KFP's driver (``backend/src/v2/driver``) turns each executed task's container spec and its Kubernetes platform
config into the pod's scheduling fields; this module does the same for the fields that decide where a pod lands,
read from the driver's source:

- ``driver.go``: the accelerator limit is ``resourceType`` (a placeholder resolved from the task's inputs, else the
  older ``type``) with ``resourceCount``; when the type resolves to "" no accelerator is requested;
- ``k8s.go``: its parameters are the parent DAG's inputs (``resolve.go``); tolerations are the static ones plus each
  ``tolerationJson`` (one object or a list; a null or empty
  value is skipped); the node selector is ``nodeSelectorJson`` resolved, else the static labels; each
  ``imagePullSecret`` is appended by name (``secretNameParameter`` resolved, else ``secretName``), an empty name
  included (the kubelet skips it);
- which tasks run: a task's ``triggerPolicy.condition`` (CEL over ``inputs.parameter_values``) on its resolved
  inputs; a loop's body once (its items do not change the pod's scheduling fields).

A task output a condition reads (e.g. the label stage's ``worker-pods``) is given by the caller, computed by the
component's own Python function. :func:`schedulable` is the scheduler's taint, node-selector and extended-resource
rules (``k8s.io/component-helpers/scheduling/corev1``: ``ToleratesTaint``).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

_PLACEHOLDER = re.compile(r"^\{\{\$\.inputs\.parameters\['([^']+)'\]\}\}$")


@dataclass
class Pod:
    task: str  # the task's path, e.g. stages/condition-branches-4/condition-5/pretrain
    executor: str
    limits: dict[str, str]
    tolerations: list[dict[str, Any]]
    node_selector: dict[str, str]
    image_pull_secrets: list[str]
    retries: int  # the task's retryPolicy.maxRetryCount (0: none)

    @property
    def step(self) -> str:
        """The component's name: the task key without the compiler's ``-N`` suffix (``pretrain-3`` -> pretrain)."""
        return re.sub(r"-[0-9]+$", "", self.task.rsplit("/", 1)[-1])

    @property
    def accelerators(self) -> dict[str, str]:
        return {k: v for k, v in self.limits.items() if "/" in k}


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


class DriverEmulator:
    """Walks a compiled pipeline (``spec``: the pipeline spec, ``platform``: its Kubernetes platform spec) for one
    run's ``parameters``, producing the pods of the tasks that execute."""

    def __init__(self, spec: dict, platform: dict, task_outputs: dict[str, Any] | None = None):
        self.spec, self.task_outputs = spec, dict(task_outputs or {})
        self.executors = spec["deploymentSpec"]["executors"]
        self.k8s = platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]

    def pods(self, parameters: dict[str, Any]) -> list[Pod]:
        root = self.spec["root"]
        scope = {name: d.get("defaultValue") for name, d in
                 root.get("inputDefinitions", {}).get("parameters", {}).items()}
        unknown = set(parameters) - set(scope)
        if unknown:
            raise KeyError(f"not pipeline parameters: {sorted(unknown)}")
        scope.update(parameters)
        found: list[Pod] = []
        self._walk(root["dag"], scope, "", found)
        return found

    # ------------------------------------------------------------------------------------------------ walk

    def _resolve(self, source: dict, scope: dict) -> Any:
        if "componentInputParameter" in source:
            return scope.get(source["componentInputParameter"])
        if "runtimeValue" in source:
            return source["runtimeValue"].get("constant")
        if "taskOutputParameter" in source:
            return self.task_outputs.get(source["taskOutputParameter"]["producerTask"])
        return None  # taskFinalStatus, a loop item's field: nothing that places a pod

    def _walk(self, dag: dict, scope: dict, path: str, found: list[Pod]) -> None:
        for key, task in dag.get("tasks", {}).items():
            inputs = {name: self._resolve(source, scope)
                      for name, source in task.get("inputs", {}).get("parameters", {}).items()}
            condition = task.get("triggerPolicy", {}).get("condition")
            if condition and not _cel(condition, inputs):
                continue
            component = self.spec["components"][task["componentRef"]["name"]]
            if "dag" in component:
                self._walk(component["dag"], inputs, f"{path}{key}/", found)
            else:
                found.append(self._pod(f"{path}{key}", component["executorLabel"], inputs, scope,
                                       task.get("retryPolicy", {})))

    def _platform_value(self, source: dict, parent: dict, path: str) -> Any:
        """A platform config parameter, resolved as the driver does: a component input parameter is one of the
        *parent DAG's* inputs (``resolveInputParameter``: "parent DAG does not have input parameter")."""
        name = source.get("componentInputParameter")
        if name is not None and name not in parent:
            raise KeyError(f"{path}: parent DAG does not have input parameter {name}")
        return self._resolve(source, parent)

    def _pod(self, path: str, executor: str, inputs: dict, parent: dict, retry: dict) -> Pod:
        resources = self.executors[executor]["container"].get("resources", {})
        limits: dict[str, str] = {}
        accelerator = resources.get("accelerator")
        if accelerator:
            kind = _placeholder(accelerator.get("resourceType"), inputs) if accelerator.get("resourceType") \
                else accelerator.get("type", "")
            count = _placeholder(accelerator.get("resourceCount"), inputs) if accelerator.get("resourceCount") \
                else str(accelerator.get("count") or "")
            if kind and count:
                limits[str(kind)] = str(count)
        config = self.k8s.get(executor, {})
        tolerations: list[dict[str, Any]] = []
        for toleration in config.get("tolerations", []):
            if "tolerationJson" in toleration:
                value = _json(self._platform_value(toleration["tolerationJson"], parent, path))
                if isinstance(value, dict) and value:
                    tolerations.append(value)
                elif isinstance(value, list):
                    tolerations.extend(value)
            else:
                tolerations.append({k: v for k, v in toleration.items() if k != "tolerationJson"})
        selector_spec = config.get("nodeSelector", {})
        if "nodeSelectorJson" in selector_spec:
            node_selector = _json(self._platform_value(selector_spec["nodeSelectorJson"], parent, path)) or {}
        else:
            node_selector = dict(selector_spec.get("labels", {}))
        secrets = []
        for secret in config.get("imagePullSecret", []):
            name = (self._platform_value(secret["secretNameParameter"], parent, path) if "secretNameParameter" in secret
                    else secret.get("secretName"))
            secrets.append(str(name or ""))
        return Pod(path, executor, limits, tolerations, dict(node_selector), secrets,
                   int(retry.get("maxRetryCount") or 0))


def _json(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str) and value else value


def _placeholder(text: str, inputs: dict) -> str:
    match = _PLACEHOLDER.match(text or "")
    return str(inputs.get(match.group(1)) or "") if match else (text or "")


def _cel(condition: str, inputs: dict) -> bool:
    """The KFP compiler's conditions: ``==``/``!=`` comparisons of ``inputs.parameter_values[...]`` with literals,
    joined by ``&&``/``||`` and negated by ``!(...)``; evaluated as Python after a literal translation."""
    text = re.sub(r"!\(", " not (", condition).replace("&&", " and ").replace("||", " or ")
    text = text.replace("inputs.parameter_values", "values")
    return bool(eval(text, {"__builtins__": {}}, {"values": inputs, "true": True, "false": False}))  # noqa: S307
