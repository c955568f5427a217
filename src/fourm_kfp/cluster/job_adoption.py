"""Create the job, or adopt the one this run made before: what a launcher does first, and what keeps a step's
retries from multiplying the job's restart budget.

A job's name is fixed by its content address (:mod:`.job_spec`), so a job of that name may exist when the launcher
starts. :func:`create_or_adopt` adopts it when its labels carry this launcher's content address:

- labelled with this KFP run's id: the step's retry after its launcher pod was lost to a node drain or a
  preemption, or a create whose answer was lost and whose retry came back 409;
- labelled with another run's id, and not failed: a **rerun of the same configuration** after a run whose launcher
  was lost and not retried (KFP compiles no ``retryPolicy``, so Argo retries only ``OnFailure``, and a launcher pod
  deleted before the workflow controller saw it fail ends ``Error``: ``workflow/controller/operator.go`` at
  argo-workflows v3.7.3), whose exit handler kept the job (``<stage>_delete_job=false``) or did not run. The job
  trains on; the rerun follows it instead of starting a second one. It keeps the labels and the owner of the run
  that made it (the launcher's Role may not patch jobs), so this run's exit handler, which deletes by run id,
  leaves it alone, and a job kept with an owner (its run's exit handler never ran) goes with that run's Workflow;
  the launcher still deletes it once it succeeded (``<stage>_delete_job``). Another run's **failed** job spent that
  run's restart budget: it is replaced (a new run is a first attempt).

Any other job of that name (another content address, or no labels of ours) fails the launcher and is named, never
adopted nor touched.

An own job that already **failed** spent its restart budget; a step retry (``KFP_RETRY_INDEX`` > 0) must report it
rather than start it again. Only a first attempt (``KFP_RETRY_INDEX`` = 0: a run retried by hand, a new attempt of
the step) replaces it. ``KFP_RETRY_INDEX`` is Argo's ``{{retries}}``, which the KFP backend sets in a step's
executor from 2.16.1 on (``backend/src/v2/compiler/argocompiler/container.go``); on 2.15.0 and 2.16.0 it is absent,
and a first attempt cannot be told from a retry: the failed job is then reported too (:func:`step_retry_index`
returns None), with the command that deletes it.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any, Callable

from fourm_kfp.cluster.job_kinds import JobFailed, JobKind, describe_conditions, terminal_state
from fourm_kfp.cluster.job_spec import ADDRESS_LABEL, RUN_ID_LABEL
from fourm_kfp.cluster.kube import JobConflict, KubeApi

log = logging.getLogger(__name__)


def step_retry_index() -> int | None:
    """Which attempt of the KFP step this is, from ``KFP_RETRY_INDEX`` (0: the first); None when it is not set (KFP
    before 2.16.1, or not run by KFP): then nobody can tell."""
    value = os.environ.get("KFP_RETRY_INDEX")
    if value is None or not value.strip().isdigit():
        return None
    return int(value.strip())


def _labels(job: dict[str, Any]) -> dict[str, str]:
    return job.get("metadata", {}).get("labels") or {}


def _wait_gone(api: KubeApi, kind: JobKind, name: str, poll_s: float, timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while api.get(kind.resource, name) is not None:
        if time.monotonic() > deadline:
            raise JobFailed(f"{kind.resource.kind} {name!r} is still being deleted after {timeout_s:.0f}s")
        time.sleep(poll_s)


def _failed_before(where: str, existing: dict[str, Any], retry_index: int | None, delete: str) -> JobFailed:
    """The report of an own job that failed before this attempt, which must not start it again."""
    if retry_index is None:
        why = ("KFP_RETRY_INDEX is not set (the KFP backend sets it from 2.16.1 on), so this attempt cannot be told "
               "from a retry of the step, and a retry must not start the job again (that would multiply its restart "
               "budget)")
    else:
        why = f"this is retry {retry_index} of the step: its restart budget is spent"
    return JobFailed(f"{where} failed before this attempt: {describe_conditions(existing)}. It is not started "
                     f"again: {why}. To train on from the newest complete checkpoint, delete it (`{delete}`) and "
                     "retry the run, or start a new run (the run's exit handler deletes it when this run ends)")


def create_or_adopt(api: KubeApi, kind: JobKind, job: dict[str, Any], poll_s: float,
                    before_create: Callable[[], None] | None = None, retry_index: int | None = None) -> bool:
    """Create ``job``, or adopt the existing one of that name if it carries this stage's content address; returns
    whether it was adopted. This run's and failed: replaced on a first attempt (``retry_index`` 0), else reported
    (:class:`JobFailed`); another run's and failed: replaced (see the module docstring)."""
    name = job["metadata"]["name"]
    labels = job["metadata"]["labels"]
    address, run_id = labels[ADDRESS_LABEL], labels[RUN_ID_LABEL]
    existing = api.get(kind.resource, name)
    if existing is not None:
        where = f"{kind.resource.kind} {name!r} in namespace {api.namespace!r}"
        delete = f"kubectl delete {kind.resource.plural}.{kind.resource.group} {name} -n {api.namespace}"
        state, creator = terminal_state(kind, existing), _labels(existing).get(RUN_ID_LABEL)
        if _labels(existing).get(ADDRESS_LABEL) != address:
            raise JobConflict(
                f"{where} exists ({state or 'running'}) and is not this stage's to adopt (its content address is "
                f"{_labels(existing).get(ADDRESS_LABEL) or 'not labelled'}, this stage's is {address}; it was created "
                f"for KFP run {creator or 'unknown'}): wait for it to finish, or remove it with `{delete}`")
        ours = creator == run_id
        if state == "failed" and ours and retry_index != 0:
            raise _failed_before(where, existing, retry_index, delete)
        if state == "failed":
            log.warning("%s failed before this launcher attempt (%s, created by KFP run %s); deleting it and starting "
                        "again (training resumes from the newest complete checkpoint)", where,
                        describe_conditions(existing), creator or "unknown")
            api.delete(kind.resource, name)
            _wait_gone(api, kind, name, poll_s)
        else:
            log.info("adopting %s (%s, %s, created by %s)", where, state or "running",
                     f"content address {address}", "this run" if ours else f"KFP run {creator or 'unknown'}")
            return True
    if before_create is not None:
        before_create()
    try:
        api.create(kind.resource, job)
    except JobConflict:  # created between our get and create, or our create's answer was lost: adopt only ours
        return create_or_adopt(api, kind, job, poll_s, before_create=None, retry_index=retry_index)
    log.info("created %s %s in namespace %s", kind.resource.kind, name, api.namespace)
    return False
