"""Delete a KFP run's leftover training jobs: what the pipeline's exit handler does when the run ends.

Who deletes a job stage's PyTorchJob or TrainJob:

- the launcher step, once the job succeeded (``<stage>_delete_job``, default true), and when it gives up on a job
  (a refusal, an image that cannot be pulled, the queue limit ``queue_timeout_s``, its deadline). It keeps a job
  that **failed** (a retry of the step finds it and reports the failure rather than spending a new restart budget),
  and on SIGTERM (its pod drained or preempted) or an API outage longer than its limit it leaves the job running
  for the step's retry to adopt;
- this exit handler, which runs on success, failure and stop (KFP's launcher does not forward a stopped run's
  SIGTERM to the step): :func:`stop_run_jobs` lists the jobs of both kinds labelled with the run id
  (``fourm-kfp.org/kfp-run-id``) and deletes each, unfinished or finished, except a finished one labelled to be kept
  (:data:`KEEP_LABEL`, set with ``<stage>_delete_job=false``). A kind whose operator is not installed has no jobs;
- Kubernetes' garbage collector, when the run's Argo Workflow (the job's owner) is deleted;
- the PyTorchJob's ``ttlSecondsAfterFinished`` as a backstop for a finished job nobody deleted.

Outside a Kubernetes pod (``fourm-kfp run`` under kfp.local) there is no cluster and nothing is done.
"""

from __future__ import annotations

import os
from typing import Callable

from fourm_kfp.cluster.job_kinds import JOB_KINDS, terminal_state
from fourm_kfp.cluster.job_spec import KEEP_LABEL, RUN_ID_LABEL
from fourm_kfp.cluster.kube import KubeApi


def delete_run_jobs(api: KubeApi, kfp_run_id: str, out: Callable[[str], None] = print) -> list[str]:
    """Delete the jobs labelled with ``kfp_run_id``, but a finished one labelled :data:`KEEP_LABEL`; their names."""
    deleted: list[str] = []
    if not kfp_run_id:
        return deleted
    for kind in JOB_KINDS.values():
        for job in api.list(kind.resource, f"{RUN_ID_LABEL}={kfp_run_id}"):
            labels = job["metadata"].get("labels") or {}
            state = terminal_state(kind, job)
            if labels.get(RUN_ID_LABEL) != kfp_run_id or (state is not None and labels.get(KEEP_LABEL) == "true"):
                continue
            name = job["metadata"]["name"]
            if api.delete(kind.resource, name):
                why = "ended before it" if state is None else f"ended; the job had {state}"
                out(f"[exit handler] deleted {kind.resource.kind} {name}: KFP run {kfp_run_id} {why}")
                deleted.append(name)
    return deleted


def stop_run_jobs(kfp_run_id: str, out: Callable[[str], None] = print) -> list[str]:
    """In a pod: :func:`delete_run_jobs` in the pod's namespace with its service account; else nothing."""
    if not os.environ.get("KUBERNETES_SERVICE_HOST"):
        out("[exit handler] not in a Kubernetes pod: no cluster jobs to stop")
        return []
    return delete_run_jobs(KubeApi.from_environment(), kfp_run_id, out)
