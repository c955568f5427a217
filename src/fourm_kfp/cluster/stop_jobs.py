"""Delete a KFP run's leftover training jobs: what the pipeline's exit handler does when the run ends.

Who deletes a job stage's PyTorchJob or TrainJob:

- the launcher step, once the job succeeded (``<stage>_delete_job``, default true), and when it gives up on a job
  (a refusal, an image that cannot be pulled, the queue limit ``queue_timeout_s``, its deadline). It keeps a job
  that **failed** (a retry of the step finds it and reports the failure rather than spending a new restart budget),
  and on SIGTERM (its pod drained or preempted) or an API outage longer than its limit it leaves the job running
  for the step's retry to adopt;
- this exit handler, which runs on success, failure and stop (KFP's launcher does not forward a stopped run's
  SIGTERM to the step): :func:`stop_run_jobs` lists the jobs of both kinds labelled with the run id
  (``fourm-kfp.org/kfp-run-id``). A job **still running** is reported (the run failed or was stopped while it
  trained, e.g. after its launcher pod was deleted and Argo did not retry the step: KFP compiles no
  ``retryPolicy``, and under Argo's default ``OnFailure`` a pod deleted before the controller saw it fail ends
  ``Error``, which is not retried) and deleted, unless it is labelled to be kept (:data:`KEEP_LABEL`, set with
  ``<stage>_delete_job=false``): then it trains on, and a rerun of the same configuration adopts it by its content
  address (:mod:`.job_adoption`). A finished job is deleted, except one labelled to be kept. A kind whose operator
  is not installed has no jobs;
- Kubernetes' garbage collector, when the run's Argo Workflow (the job's owner) is deleted;
- the PyTorchJob's ``ttlSecondsAfterFinished`` as a backstop for a finished job nobody deleted.

Outside a Kubernetes pod (``fourm-kfp run`` under kfp.local) there is no cluster and nothing is done.
"""

from __future__ import annotations

import os
from typing import Callable

from fourm_kfp.cluster.job_kinds import JOB_KINDS, terminal_state
from fourm_kfp.cluster.job_spec import KEEP_LABEL, RUN_ID_LABEL, STAGE_LABEL
from fourm_kfp.cluster.kube import KubeApi


def delete_run_jobs(api: KubeApi, kfp_run_id: str, out: Callable[[str], None] = print) -> list[str]:
    """Delete the jobs labelled with ``kfp_run_id``, but those labelled :data:`KEEP_LABEL`; report each job still
    running, deleted or kept (see the module docstring); the names of the deleted ones."""
    deleted: list[str] = []
    if not kfp_run_id:
        return deleted
    for kind in JOB_KINDS.values():
        for job in api.list(kind.resource, f"{RUN_ID_LABEL}={kfp_run_id}"):
            labels = job["metadata"].get("labels") or {}
            if labels.get(RUN_ID_LABEL) != kfp_run_id:
                continue
            name, state = job["metadata"]["name"], terminal_state(kind, job)
            what = f"{kind.resource.kind} {name}" + (f" (stage {labels[STAGE_LABEL]})" if STAGE_LABEL in labels else "")
            kept = labels.get(KEEP_LABEL) == "true"
            if state is None and kept:
                out(f"[exit handler] {what} is still running after KFP run {kfp_run_id} ended, and is kept "
                    f"(delete_job=false): a rerun of the same configuration adopts it; to stop it: `kubectl delete "
                    f"{kind.resource.plural}.{kind.resource.group} {name} -n {api.namespace}`")
            if kept:
                continue
            if api.delete(kind.resource, name):
                why = ("ended while it was still running (its launcher lost or stopped): deleted, as "
                       "delete_job=true asks" if state is None else f"ended; the job had {state}")
                out(f"[exit handler] deleted {what}: KFP run {kfp_run_id} {why}")
                deleted.append(name)
    return deleted


def stop_run_jobs(kfp_run_id: str, out: Callable[[str], None] = print) -> list[str]:
    """In a pod: :func:`delete_run_jobs` in the pod's namespace with its service account; else nothing."""
    if not os.environ.get("KUBERNETES_SERVICE_HOST"):
        out("[exit handler] not in a Kubernetes pod: no cluster jobs to stop")
        return []
    return delete_run_jobs(KubeApi.from_environment(), kfp_run_id, out)
