"""The two training operators, one record each (:class:`JobKind`): :data:`PYTORCHJOB` (Kubeflow Training Operator v1)
and :data:`TRAINJOB` (Kubeflow Trainer v2). A record holds all that differs between them: the launcher's name for it
(``<stage>_launcher``), the resource, the manifest template and its renderer (:mod:`.job_render`), the training
container, the pods' selectors, the success condition, the pods a job asks for, whether it can be elastic, Kueue's
name for it and whether Kueue integrates it by default, and how to install its operator. Also here: rendering a
request (:func:`render_job`, after the checks that depend on the kind), a job's terminal state from its conditions,
and :class:`JobFailed`, the error of a job that failed or that the launcher gave up on.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from importlib import resources
from typing import Any, Callable

import yaml

from fourm_kfp.cluster import job_render, job_spec
from fourm_kfp.cluster.kube import Resource
from fourm_kfp.config.schema import ConfigError
from fourm_kfp.contract.spec import param_prefix
from fourm_kfp.errors import UserError


@dataclass(frozen=True)
class JobKind:
    """One training operator's job: everything the launcher, the renderer, the watcher and the doctor need to know."""

    name: str  # the ``<stage>_launcher`` value that asks for it
    resource: Resource
    template: str  # its template in manifests/base (package data of fourm_kfp.manifests)
    render: Callable[[job_spec.JobRequest, dict[str, Any]], dict[str, Any]]  # (request, template) -> the job
    container: str  # the training container's name
    pod_selector: Callable[[str], str]  # all pods of the job
    is_master: Callable[[dict[str, Any]], bool]
    succeeded: str  # the terminal success condition; "Failed" is the failure condition of both
    expected_pods: Callable[[dict[str, Any]], int]  # the pods the job's spec asks for
    elastic: bool  # can run between min_nodes and nodes (``<stage>_min_nodes``)
    kueue_framework: str  # its name in Kueue's ``integrations.frameworks``
    kueue_by_default: bool  # Kueue integrates it unless configured otherwise
    install: str  # the command that installs its operator (manifests/README.md, Prerequisites)

    def load_template(self) -> dict[str, Any]:
        """The template as shipped (a fresh copy: YAML anchors become shared objects, so nothing is edited in
        place)."""
        text = resources.files("fourm_kfp.manifests").joinpath("base", self.template).read_text()
        return copy.deepcopy(yaml.safe_load(text))


def _labels(pod: dict[str, Any]) -> dict[str, str]:
    return pod.get("metadata", {}).get("labels") or {}


PYTORCHJOB = JobKind(
    name="pytorchjob",
    resource=Resource("kubeflow.org", "v1", "pytorchjobs", "PyTorchJob"),
    template="pytorchjob-template.yaml",
    render=job_render.render_pytorchjob,
    container="pytorch",
    pod_selector=lambda name: f"training.kubeflow.org/job-name={name}",
    is_master=lambda pod: _labels(pod).get("training.kubeflow.org/replica-type", "").lower() == "master",
    succeeded="Succeeded",
    expected_pods=lambda job: sum(int(spec.get("replicas", 1))
                                  for spec in ((job.get("spec") or {}).get("pytorchReplicaSpecs") or {}).values()),
    elastic=True,
    kueue_framework="kubeflow.org/pytorchjob",
    kueue_by_default=False,  # Kueue >= 0.19 (kubernetes-sigs/kueue PR #12606)
    install='kubectl apply --server-side -k "github.com/kubeflow/training-operator.git/manifests/overlays/'
            'standalone?ref=v1.9.2"',
)
TRAINJOB = JobKind(
    name="trainjob",
    resource=Resource("trainer.kubeflow.org", "v1alpha1", "trainjobs", "TrainJob"),
    template="trainjob-template.yaml",
    render=job_render.render_trainjob,
    container="node",
    pod_selector=lambda name: f"jobset.sigs.k8s.io/jobset-name={name}",
    is_master=lambda pod: (_labels(pod).get("jobset.sigs.k8s.io/job-index") == "0"
                           and _labels(pod).get("batch.kubernetes.io/job-completion-index", "0") == "0"),
    succeeded="Complete",
    expected_pods=lambda job: int(((job.get("spec") or {}).get("trainer") or {}).get("numNodes") or 1),
    elastic=False,
    kueue_framework="trainer.kubeflow.org/trainjob",
    kueue_by_default=True,
    install='kubectl apply --server-side -k "github.com/kubeflow/trainer.git/manifests/overlays/manager?ref=v2.2.0"',
)
#: The job kinds by the launcher's name for them (:data:`fourm_kfp.cluster.job_spec.JOB_LAUNCHERS`, in its order).
JOB_KINDS = {kind.name: kind for kind in (PYTORCHJOB, TRAINJOB)}


def check_kueue_integration(scheduler: str, launcher: str, stage: str) -> None:
    """Refuse a job of a kind Kueue does not integrate by default (a PyTorchJob) queued by Kueue unless
    ``scheduler`` states that the integration is on (:data:`~fourm_kfp.cluster.job_spec.KUEUE_PYTORCHJOB_STATEMENT`):
    off (Kueue 0.19's default), the queue label is ignored and the job runs unqueued, which nothing would say."""
    kind, queue = job_spec.parse_scheduler(scheduler)
    job_kind = JOB_KINDS.get(launcher)
    statement = job_spec.KUEUE_PYTORCHJOB_STATEMENT
    if kind == "kueue" and job_kind and not job_kind.kueue_by_default and not scheduler.endswith(f":{statement}"):
        p = param_prefix(stage)
        others = [k.name for k in JOB_KINDS.values() if k.kueue_by_default]
        raise ConfigError(
            f"scheduler={scheduler!r} with {p}_launcher={launcher}: Kueue >= 0.19 leaves its {job_kind.resource.kind} "
            "integration off by default (kubernetes-sigs/kueue PR #12606), and then the job runs at once, unqueued. If "
            f"your Kueue's Configuration lists {job_kind.kueue_framework} in integrations.frameworks, say so with "
            f"scheduler=kueue:{queue}:{statement}; or use {p}_launcher={' or '.join(others)} (Kueue's "
            f"{', '.join(JOB_KINDS[o].resource.kind for o in others)} integration is on by default)")


def check_kind(req: job_spec.JobRequest) -> JobKind:
    """The job kind of ``req``, after the checks that depend on it (elasticity, Kueue's integration)."""
    p = param_prefix(req.stage)
    kind = JOB_KINDS[job_spec.check_launcher(req.launcher, req.stage, jobs_only=True)]
    if req.min_nodes and not kind.elastic:
        elastic = " or ".join(k.name for k in JOB_KINDS.values() if k.elastic)
        raise ConfigError(f"{p}_min_nodes: elastic training needs {p}_launcher={elastic}")
    check_kueue_integration(req.cluster.scheduler, req.launcher, req.stage)
    return kind


def render_job(req: job_spec.JobRequest) -> dict[str, Any]:
    """The job object of ``req``, after checking the request (:func:`~fourm_kfp.cluster.job_spec.validate_request`,
    :func:`check_kind`)."""
    job_spec.validate_request(req)
    kind = check_kind(req)
    return kind.render(req, kind.load_template())


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
