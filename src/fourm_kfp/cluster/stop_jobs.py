"""Delete a KFP run's unfinished training jobs: what the pipeline's exit handler does when the run ends.

A job stage's PyTorchJob or TrainJob has an ownerReference to its launcher pod, but that fires only when the pod
object is deleted, and KFP on Argo sets no podGC; nor does KFP's launcher forward SIGTERM to the step. So when a
run is stopped, its job would train on until its deadline. The pipeline's exit handler runs on success, failure
and stop: :func:`stop_run_jobs` lists the jobs of both kinds labelled with the run id
(``fourm-kfp.org/kfp-run-id``) and deletes each that has not finished (a finished one, kept with
``<stage>_delete_job=false``, stays). A kind whose operator is not installed has no jobs.

Outside a Kubernetes pod (``fourm-kfp run`` under kfp.local) there is no cluster and nothing is done.
"""

from __future__ import annotations

import os
from typing import Callable

from fourm_kfp.cluster.job_launcher import JOB_KINDS, terminal_state
from fourm_kfp.cluster.job_spec import RUN_ID_LABEL
from fourm_kfp.cluster.kube import KubeApi


def delete_unfinished_jobs(api: KubeApi, kfp_run_id: str, out: Callable[[str], None] = print) -> list[str]:
    """Delete the jobs labelled with ``kfp_run_id`` that have not finished; their names."""
    deleted: list[str] = []
    if not kfp_run_id:
        return deleted
    for kind in JOB_KINDS.values():
        for job in api.list(kind.resource, f"{RUN_ID_LABEL}={kfp_run_id}"):
            labels = job["metadata"].get("labels") or {}
            if labels.get(RUN_ID_LABEL) != kfp_run_id or terminal_state(kind, job) is not None:
                continue
            name = job["metadata"]["name"]
            if api.delete(kind.resource, name):
                out(f"[exit handler] deleted {kind.resource.kind} {name}: KFP run {kfp_run_id} ended before it")
                deleted.append(name)
    return deleted


def stop_run_jobs(kfp_run_id: str, out: Callable[[str], None] = print) -> list[str]:
    """In a pod: :func:`delete_unfinished_jobs` in the pod's namespace with its service account; else nothing."""
    if not os.environ.get("KUBERNETES_SERVICE_HOST"):
        out("[exit handler] not in a Kubernetes pod: no cluster jobs to stop")
        return []
    return delete_unfinished_jobs(KubeApi.from_environment(), kfp_run_id, out)
