"""The pretrain step in the cluster: plan, render, launch and follow a multi-node job, then report its output.

:func:`launch_pretrain_job` is what the KFP pretrain step runs with ``pretrain_launcher`` ``pytorchjob`` or
``trainjob`` (the step itself is a light CPU pod):

1. **plan** — the pretrain content address follows from the config and the upstream addresses; when that output
   is committed (and ``force`` is off) it is reported through the ordinary stage runner (an MLflow child run tagged
   as reused) and no job is created. The inputs must be committed, as for any stage;
2. **render** the job from the shipped template (:mod:`.job_spec`), save it (``spec_path``: a KFP artifact) and
   attach it to the MLflow parent run;
3. **run** it (:mod:`.job_launcher`): create or adopt, stream the master's log, wait, delete. With ``force`` the
   committed output is cleared once, just before the job is created (the pods never get ``--force``, so a restarted
   pod resumes instead of starting over);
4. **report** the committed output like every stage: a :class:`~fourm_kfp.contract.StageOutcome` with the manifest's
   metrics, and the job spec attached to the MLflow child run the training pod opened.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from fourm_kfp.cluster.job_launcher import JOB_KINDS, FollowSettings, run_job
from fourm_kfp.cluster.job_spec import (PYTORCHJOB, JobRequest, OwnerPod, pretrain_stage_args, render_job,
                                        to_yaml)
from fourm_kfp.contract import StageOutcome, lineage
from fourm_kfp.contract.runner import open_inputs
from fourm_kfp.launchers.stage import committed_outcome, launch_stage, plan_launch

log = logging.getLogger(__name__)
JOB_ARTIFACT_DIR = "pretrain-job"


@dataclass
class JobParams:
    """The pipeline's ``pretrain_*`` cluster parameters."""

    launcher: str = PYTORCHJOB
    nodes: int = 1
    procs_per_node: int = 1
    accelerator: str = "nvidia.com/gpu"
    cpu_per_node: str = ""
    memory_per_node: str = ""
    node_selector: dict[str, str] = field(default_factory=dict)
    tolerations: list[dict[str, Any]] = field(default_factory=list)
    deadline_s: int = 259200
    min_nodes: int = 0
    delete_job: bool = True


def owner_from_environment() -> OwnerPod | None:
    """The launcher pod, from the downward API variables the pipeline sets (``FOURM_POD_NAME``/``_UID``)."""
    name, uid = os.environ.get("FOURM_POD_NAME", ""), os.environ.get("FOURM_POD_UID", "")
    return OwnerPod(name, uid) if name and uid else None


def launch_pretrain_job(*, preset: str, overrides: Sequence[str], store_uri: str, s3_endpoint: str,
                        tracking_uri: str | None, parent_run_id: str, force: bool, input_uris: dict[str, str],
                        params: JobParams, image: str, kfp_run_id: str = "", spec_path: str | None = None,
                        api=None, settings: FollowSettings | None = None, owner: OwnerPod | None = None,
                        out: Callable[[str], None] = print) -> StageOutcome:
    """Plan, launch, follow and report the pretrain stage as a cluster job; see the module docstring."""
    plan = plan_launch("pretrain", preset=preset, overrides=overrides, store_uri=store_uri, s3_endpoint=s3_endpoint)
    address, output = plan.address, plan.output
    if not force and plan.committed:
        out(f"[launcher] pretrain {address} is committed at {output.uri}: creating no job")
        _write(spec_path, f"# pretrain {address} was committed at {output.uri}; no job was created\n")
        return launch_stage("pretrain", preset=preset, overrides=overrides, store_uri=store_uri,
                            s3_endpoint=s3_endpoint, tracking_uri=tracking_uri, parent_run_id=parent_run_id,
                            input_uris=input_uris)
    inputs = open_inputs(plan.spec, plan.config, plan.store, input_uris)  # a missing input fails here, not in N pods
    tracking = lineage.resolve_tracking_uri(tracking_uri, None)
    stage_args = pretrain_stage_args(preset=preset, overrides=overrides, store_uri=store_uri,
                                     input_uris={name: item.uri for name, item in inputs.items()},
                                     s3_endpoint=s3_endpoint, tracking_uri=tracking_uri or "",
                                     parent_run_id=parent_run_id)
    request = JobRequest(launcher=params.launcher, address=address, stage_args=stage_args, image=image,
                         nodes=params.nodes, procs_per_node=params.procs_per_node, accelerator=params.accelerator,
                         cpu_per_node=params.cpu_per_node, memory_per_node=params.memory_per_node,
                         node_selector=params.node_selector, tolerations=params.tolerations,
                         deadline_s=params.deadline_s, min_nodes=params.min_nodes, kfp_run_id=kfp_run_id,
                         owner=owner if owner is not None else owner_from_environment())
    job = render_job(request)
    text = to_yaml(job)
    _write(spec_path, text)
    artifact = f"{JOB_ARTIFACT_DIR}/{request.name}.yaml"
    if tracking and parent_run_id:
        lineage.attach_artifact(tracking, parent_run_id, artifact, text.encode())
    out(f"[launcher] pretrain {address}: {params.launcher} {request.name}, {params.nodes} node(s) x "
        f"{params.procs_per_node} process(es), output {output.uri}")

    def clear_forced_output() -> None:
        if force:
            removed = output.delete_prefix()
            out(f"[launcher] --force: cleared {removed} objects at {output.uri}")

    from fourm_kfp.cluster.kube import KubeApi

    api = api if api is not None else KubeApi.from_environment()
    result = run_job(api, JOB_KINDS[params.launcher], job, params.deadline_s,
                     settings or FollowSettings(delete=params.delete_job), out=out, before_create=clear_forced_output)
    outcome = committed_outcome(plan, f"{params.launcher} {request.name}")
    if tracking and outcome.mlflow_run_id:
        lineage.attach_artifact(tracking, outcome.mlflow_run_id, artifact, text.encode())
    if result.adopted:
        log.info("pretrain: the adopted job %s finished", request.name)
    return outcome


def _write(path: str | None, text: str) -> None:
    if path:
        with open(path, "w") as fh:
            fh.write(text)
