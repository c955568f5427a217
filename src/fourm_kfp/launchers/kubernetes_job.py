"""A stage as a multi-node Kubernetes job: the backend of :func:`.remote.launch_remote` that renders a PyTorchJob or
TrainJob from the shipped templates (:mod:`fourm_kfp.cluster.job_spec`), creates or adopts it, streams the master's
log, waits and deletes it once it succeeded (:mod:`fourm_kfp.cluster.job_launcher`).

:func:`launch_stage_job` is what the KFP pretrain and train-tokenizers steps run with ``<stage>_launcher``
``pytorchjob`` or ``trainjob`` (the step itself is then a light CPU pod). The rendered job is saved (``spec_path``:
a KFP artifact) and attached to the MLflow parent run before the job starts, and to the child run the training
pod opened after it.

The job's owner is the run's Argo Workflow (KFP runs each run as one, and Argo makes it the controller owner of every
step's pod): :func:`workflow_owner` reads it from the launcher's own pod (``FOURM_POD_NAME``). Not the launcher pod,
whose loss (a node drain, a spot preemption) would have the garbage collector delete the training with it; the step's
retry (when Argo retries it: :mod:`fourm_kfp.cluster.job_launcher`, step 4) or a rerun of the same configuration
adopts the job instead. Deleting the run's Workflow deletes the job; the launcher
deletes it once it succeeded, the run's exit handler when the run ends (:mod:`fourm_kfp.cluster.stop_jobs`).
Without a Workflow (not run by Argo, or the pod cannot be read) the job has no owner, and the step's log says so.
"""

from __future__ import annotations

import logging
import os
from dataclasses import fields
from typing import Callable, Sequence

from fourm_kfp.cluster.job_kinds import render_job
from fourm_kfp.cluster.job_launcher import JOB_KINDS, FollowSettings, run_job
from fourm_kfp.cluster.job_render import to_yaml
from fourm_kfp.cluster.job_spec import POD_ROOT, ClusterParams, JobParams, JobRequest, Owner, param_prefix
from fourm_kfp.contract import StageOutcome, lineage
from fourm_kfp.errors import UserError
from fourm_kfp.launchers.remote import RemoteBackend, launch_remote
from fourm_kfp.launchers.stage import LaunchPlan, RunContext

log = logging.getLogger(__name__)


#: The owner KFP's Argo backend gives every step's pod (a controller reference): the run's Workflow.
WORKFLOW_API_GROUP, WORKFLOW_KIND = "argoproj.io", "Workflow"


def workflow_owner(api, pod_name: str | None = None) -> Owner | None:
    """The owner (apiVersion, kind, name, uid) of the Argo Workflow that controls the launcher pod
    ``pod_name`` (default ``$FOURM_POD_NAME``), read through ``api``; None when there is no such pod or owner, or the
    pod cannot be read (the reason is logged)."""
    pod_name = os.environ.get("FOURM_POD_NAME", "") if pod_name is None else pod_name
    if not pod_name:
        return None
    try:
        pod = api.pod(pod_name)
    except UserError as exc:
        log.warning("cannot read the launcher pod %s to find its Workflow: %s", pod_name, exc)
        return None
    for ref in ((pod or {}).get("metadata") or {}).get("ownerReferences") or []:
        if (ref.get("controller") and ref.get("kind") == WORKFLOW_KIND
                and str(ref.get("apiVersion", "")).split("/")[0] == WORKFLOW_API_GROUP):
            return Owner(ref["apiVersion"], ref["kind"], ref["name"], ref["uid"])
    return None


class KubernetesJob(RemoteBackend):
    """A PyTorchJob or TrainJob (``params.launcher``) through the Kubernetes API ``api`` (the in-cluster or
    kubeconfig client when ``None``)."""

    prefix, what, root = "[launcher]", "job", POD_ROOT

    def __init__(self, run: RunContext, params: JobParams, image: str, *, kfp_run_id: str = "",
                 spec_path: str | None = None, api=None, settings: FollowSettings | None = None,
                 owner: Owner | None = None, cluster: ClusterParams | None = None,
                 out: Callable[[str], None] = print):
        self.run, self.params, self.image, self.kfp_run_id = run, params, image, kfp_run_id
        self.spec_path, self.api, self.settings, self.out = spec_path, api, settings, out
        self.owner = owner  # None: the launcher pod's Workflow
        self.cluster = cluster or ClusterParams()
        self.tracking = lineage.resolve_tracking_uri(run.tracking_uri or None, None)
        self.text = self.artifact = ""

    def skipped(self, plan: LaunchPlan) -> None:
        _write(self.spec_path, f"# {plan.stage} {plan.address} was committed at {plan.output.uri}; no job was "
                               "created\n")

    def start(self, plan: LaunchPlan, command: Sequence[str], clear_output: Callable[[], None]) -> str:
        from fourm_kfp.cluster.kube import KubeApi

        params = self.params
        api = self.api if self.api is not None else KubeApi.from_environment()
        owner = self.owner if self.owner is not None else workflow_owner(api)
        request = JobRequest(**{f.name: getattr(params, f.name) for f in fields(JobParams)}, stage=plan.stage,
                             address=plan.address, stage_args=command, image=self.image,
                             kfp_run_id=self.kfp_run_id, owner=owner, cluster=self.cluster)
        job = render_job(request)
        self.text = to_yaml(job)
        _write(self.spec_path, self.text)
        self.artifact = f"{plan.stage}-job/{request.name}.yaml"
        if self.tracking and self.run.parent_run_id:
            lineage.attach_artifact(self.tracking, self.run.parent_run_id, self.artifact, self.text.encode())
        self.out(f"{self.prefix} {plan.stage} {plan.address}: {params.launcher} {request.name}, {params.nodes} "
                 f"node(s) x {params.procs_per_node} process(es), output {plan.output.uri}")
        if not params.delete_job:
            self.out(f"{self.prefix} {request.name} is kept ({param_prefix(plan.stage)}_delete_job=false): it has no "
                     "owner and no TTL, so it outlives the run (KFP deletes a finished run's Workflow after a day) "
                     f"until `kubectl delete {params.launcher}s {request.name}`; the run's exit handler does not "
                     "delete it (it reports it if it still runs when the run ends: a rerun of the same configuration "
                     "adopts it)")
        elif owner is not None:
            self.out(f"{self.prefix} {request.name} is owned by {owner.kind} {owner.name} (the KFP run): "
                     "deleting the run deletes it")
        else:
            self.out(f"{self.prefix} {request.name} has no owner (no Argo Workflow found as this pod's): the launcher "
                     "deletes it once it succeeded, the run's exit handler when the run ends; else "
                     f"`kubectl delete {params.launcher}s {request.name}`")
        result = run_job(api, JOB_KINDS[params.launcher], job, params.deadline_s,
                         self.settings or FollowSettings(delete=params.delete_job,
                                                         queue_s=self.cluster.queue_timeout_s), out=self.out,
                         before_create=clear_output)
        if result.adopted:
            log.info("%s: the adopted job %s finished", plan.stage, request.name)
        return f"{params.launcher} {request.name}"

    def finished(self, plan: LaunchPlan, outcome: StageOutcome) -> None:
        if self.tracking and outcome.mlflow_run_id:
            lineage.attach_artifact(self.tracking, outcome.mlflow_run_id, self.artifact, self.text.encode())


def launch_stage_job(stage: str, run: RunContext, *, force: bool, input_uris: dict[str, str], params: JobParams,
                     image: str, kfp_run_id: str = "", spec_path: str | None = None, api=None,
                     settings: FollowSettings | None = None, owner: Owner | None = None,
                     cluster: ClusterParams | None = None, out: Callable[[str], None] = print) -> StageOutcome:
    """Stage ``stage`` (one of :data:`fourm_kfp.cluster.job_spec.JOB_STAGES`) as a PyTorchJob / TrainJob; see the
    module docstring."""
    backend = KubernetesJob(run, params, image, kfp_run_id=kfp_run_id, spec_path=spec_path, api=api,
                            settings=settings, owner=owner, cluster=cluster, out=out)
    return launch_remote(stage, run, backend, force=force, input_uris=input_uris, out=out)


def _write(path: str | None, text: str) -> None:
    if path:
        with open(path, "w") as fh:
            fh.write(text)
