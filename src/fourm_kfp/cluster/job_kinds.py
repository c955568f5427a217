"""What differs between the two training operators, and how to read a job's state: :class:`JobKind` (the resource,
the training container, the pods' labels, the success condition, the pods a job asks for), :data:`PYTORCHJOB`
(Training Operator v1) and :data:`TRAINJOB` (Trainer v2), a job's terminal state from its conditions, and
:class:`JobFailed`, the error of a job that failed or that the launcher gave up on.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from fourm_kfp.cluster import job_spec
from fourm_kfp.cluster.kube import Resource
from fourm_kfp.errors import UserError


@dataclass(frozen=True)
class JobKind:
    """What differs between the operators: the resource, the training container, the pod labels and conditions."""

    resource: Resource
    container: str
    pod_selector: Callable[[str], str]  # all pods of the job
    is_master: Callable[[dict[str, Any]], bool]
    succeeded: str  # the terminal success condition; "Failed" is the failure condition of both
    expected_pods: Callable[[dict[str, Any]], int]  # the pods the job's spec asks for


def _labels(pod: dict[str, Any]) -> dict[str, str]:
    return pod.get("metadata", {}).get("labels") or {}


PYTORCHJOB = JobKind(
    resource=Resource("kubeflow.org", "v1", "pytorchjobs", "PyTorchJob"),
    container="pytorch",
    pod_selector=lambda name: f"training.kubeflow.org/job-name={name}",
    is_master=lambda pod: _labels(pod).get("training.kubeflow.org/replica-type", "").lower() == "master",
    succeeded="Succeeded",
    expected_pods=lambda job: sum(int(spec.get("replicas", 1))
                                  for spec in ((job.get("spec") or {}).get("pytorchReplicaSpecs") or {}).values()),
)
TRAINJOB = JobKind(
    resource=Resource("trainer.kubeflow.org", "v1alpha1", "trainjobs", "TrainJob"),
    container="node",
    pod_selector=lambda name: f"jobset.sigs.k8s.io/jobset-name={name}",
    is_master=lambda pod: (_labels(pod).get("jobset.sigs.k8s.io/job-index") == "0"
                           and _labels(pod).get("batch.kubernetes.io/job-completion-index", "0") == "0"),
    succeeded="Complete",
    expected_pods=lambda job: int(((job.get("spec") or {}).get("trainer") or {}).get("numNodes") or 1),
)
JOB_KINDS = {job_spec.PYTORCHJOB: PYTORCHJOB, job_spec.TRAINJOB: TRAINJOB}


class JobFailed(UserError):
    """The job failed or the launcher gave up on it; the message says why (conditions, last log lines, a limit)."""


def conditions_of(job: dict[str, Any]) -> list[dict[str, Any]]:
    return list((job.get("status") or {}).get("conditions") or [])


def terminal_state(kind: JobKind, job: dict[str, Any]) -> str | None:
    """``"succeeded"``, ``"failed"`` or None while the job runs."""
    true = {c.get("type") for c in conditions_of(job) if str(c.get("status")) == "True"}
    if "Failed" in true:
        return "failed"
    if kind.succeeded in true:
        return "succeeded"
    return None


def describe_conditions(job: dict[str, Any]) -> str:
    parts = [f"{c.get('type')}={c.get('status')}" + (f" ({c.get('reason')}: {c.get('message')})"
                                                     if c.get("reason") or c.get("message") else "")
             for c in conditions_of(job)]
    return "; ".join(parts) or "no conditions yet"


def running_pods(pods: list[dict[str, Any]]) -> int:
    """How many of ``pods`` are in phase Running."""
    return sum(1 for pod in pods if (pod.get("status") or {}).get("phase") == "Running")
