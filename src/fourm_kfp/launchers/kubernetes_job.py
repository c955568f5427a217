"""A stage as a multi-node Kubernetes job: the backend of :func:`.remote.launch_remote` that renders a PyTorchJob or
TrainJob from the shipped templates (:mod:`fourm_kfp.cluster.job_spec`), creates or adopts it, streams the master's
log, waits and deletes it (:mod:`fourm_kfp.cluster.job_launcher`).

:func:`launch_stage_job` is what the KFP pretrain and train-tokenizers steps run with ``<stage>_launcher``
``pytorchjob`` or ``trainjob`` (the step itself is then a light CPU pod). The rendered job is saved (``spec_path``:
a KFP artifact) and attached to the MLflow parent run before the job starts, and to the child run the training
pod opened after it.
"""

from __future__ import annotations

import logging
import os
from dataclasses import fields
from typing import Callable, Sequence

from fourm_kfp.cluster.job_launcher import JOB_KINDS, FollowSettings, run_job
from fourm_kfp.cluster.job_spec import POD_ROOT, JobParams, JobRequest, OwnerPod, render_job, to_yaml
from fourm_kfp.contract import StageOutcome, lineage
from fourm_kfp.launchers.remote import RemoteBackend, launch_remote
from fourm_kfp.launchers.stage import LaunchPlan, RunContext

log = logging.getLogger(__name__)


def owner_from_environment() -> OwnerPod | None:
    """The launcher pod, from the downward API variables the pipeline sets (``FOURM_POD_NAME``/``_UID``)."""
    name, uid = os.environ.get("FOURM_POD_NAME", ""), os.environ.get("FOURM_POD_UID", "")
    return OwnerPod(name, uid) if name and uid else None


class KubernetesJob(RemoteBackend):
    """A PyTorchJob or TrainJob (``params.launcher``) through the Kubernetes API ``api`` (the in-cluster or
    kubeconfig client when ``None``)."""

    prefix, what, root = "[launcher]", "job", POD_ROOT

    def __init__(self, run: RunContext, params: JobParams, image: str, *, kfp_run_id: str = "",
                 spec_path: str | None = None, api=None, settings: FollowSettings | None = None,
                 owner: OwnerPod | None = None, out: Callable[[str], None] = print):
        self.run, self.params, self.image, self.kfp_run_id = run, params, image, kfp_run_id
        self.spec_path, self.api, self.settings, self.out = spec_path, api, settings, out
        self.owner = owner if owner is not None else owner_from_environment()
        self.tracking = lineage.resolve_tracking_uri(run.tracking_uri or None, None)
        self.text = self.artifact = ""

    def skipped(self, plan: LaunchPlan) -> None:
        _write(self.spec_path, f"# {plan.stage} {plan.address} was committed at {plan.output.uri}; no job was "
                               "created\n")

    def start(self, plan: LaunchPlan, command: Sequence[str], clear_output: Callable[[], None]) -> str:
        params = self.params
        request = JobRequest(**{f.name: getattr(params, f.name) for f in fields(JobParams)}, stage=plan.stage,
                             address=plan.address, stage_args=command, image=self.image,
                             kfp_run_id=self.kfp_run_id, owner=self.owner)
        job = render_job(request)
        self.text = to_yaml(job)
        _write(self.spec_path, self.text)
        self.artifact = f"{plan.stage}-job/{request.name}.yaml"
        if self.tracking and self.run.parent_run_id:
            lineage.attach_artifact(self.tracking, self.run.parent_run_id, self.artifact, self.text.encode())
        self.out(f"{self.prefix} {plan.stage} {plan.address}: {params.launcher} {request.name}, {params.nodes} "
                 f"node(s) x {params.procs_per_node} process(es), output {plan.output.uri}")

        from fourm_kfp.cluster.kube import KubeApi

        api = self.api if self.api is not None else KubeApi.from_environment()
        result = run_job(api, JOB_KINDS[params.launcher], job, params.deadline_s,
                         self.settings or FollowSettings(delete=params.delete_job), out=self.out,
                         before_create=clear_output)
        if result.adopted:
            log.info("%s: the adopted job %s finished", plan.stage, request.name)
        return f"{params.launcher} {request.name}"

    def finished(self, plan: LaunchPlan, outcome: StageOutcome) -> None:
        if self.tracking and outcome.mlflow_run_id:
            lineage.attach_artifact(self.tracking, outcome.mlflow_run_id, self.artifact, self.text.encode())


def launch_stage_job(stage: str, run: RunContext, *, force: bool, input_uris: dict[str, str], params: JobParams,
                     image: str, kfp_run_id: str = "", spec_path: str | None = None, api=None,
                     settings: FollowSettings | None = None, owner: OwnerPod | None = None,
                     out: Callable[[str], None] = print) -> StageOutcome:
    """Stage ``stage`` (one of :data:`fourm_kfp.cluster.job_spec.JOB_STAGES`) as a PyTorchJob / TrainJob; see the
    module docstring."""
    backend = KubernetesJob(run, params, image, kfp_run_id=kfp_run_id, spec_path=spec_path, api=api,
                            settings=settings, owner=owner, out=out)
    return launch_remote(stage, run, backend, force=force, input_uris=input_uris, out=out)


def _write(path: str | None, text: str) -> None:
    if path:
        with open(path, "w") as fh:
            fh.write(text)
