"""``fourm-kfp submit``: run the pipeline on a Kubeflow Pipelines server, optionally wait for it and read the gate.

:func:`submit`:

1. takes the compiled pipeline (the committed ``fourm_pretrain.yaml``, or a fresh compile), refuses a KFP server
   older than the pipeline needs (:func:`.kfp_api.check_server_version`), and uploads it: a new pipeline the first
   time, else a new **version** named after the YAML's content hash (the same YAML reuses its version, found across
   every page of the list); with ``namespace``, into that profile's namespace;
2. gives the run the resolved MLflow tracking URI (``tracking_uri``, else ``$MLFLOW_TRACKING_URI``) as its
   ``mlflow_tracking_uri`` parameter, waited for or not, so its lineage goes where the submitter (and a later
   ``--attach``/``--report``) reads it; opens the MLflow parent run itself when it will wait, tagged with the CI job
   that asked (``GITHUB_*``/``CI_*`` variables), so the lineage says which commit and job retrained; without waiting
   the pipeline opens and closes its own;
3. creates a run in the experiment (or, with ``schedule``, a recurring run with that cron expression, checked as
   the server's 6-field seconds-first cron and created with ``no_catchup``) with the preset, overrides and stage
   parameters, and prints the run's UI link;
4. with ``wait``, follows the run: each task's state as it changes, then the stage table and the model gate's
   verdict, read from the evaluate stage's MLflow run (``gate.json``). Once the run exists, nothing stops it: an
   error while following (one that is not retried, e.g. an expired ``KFP_TOKEN`` or a TLS failure) stops following
   only, with exit 5 and the command that reattaches, as ``--timeout`` does.

The request, the result and what its exit status means are :mod:`.run_outcome`; following a run is :mod:`.follow`
(transient API errors — 5xx, 429, a connection reset, a 401 when the token is re-read from a file — retried with
backoff, up to ``max_poll_errors`` in a row); the gate's verdict is :mod:`.gate_verdict`; ``--report`` is
:mod:`.run_report`. ``--attach RUN_ID`` (:func:`attach`) follows an existing run as step 4 does and reads its gate
where the run wrote it (its ``mlflow_tracking_uri``).

The client, its credentials and errors, and the server's rules checked before anything is sent (parameter types,
cron, namespaces, paged lists) are :mod:`.kfp_api`; ``--namespace`` is the Kubeflow profile namespace of a
multi-user install.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path
from typing import Any, Callable

from fourm_kfp.contract.lineage import kfp_run_page
from fourm_kfp.errors import UserError
from fourm_kfp.pipeline_runs.follow import follow_run, stage_tasks
from fourm_kfp.pipeline_runs.gate_verdict import read_gate
from fourm_kfp.pipeline_runs.kfp_api import (check_cron, check_server_version, coerce_parameters, kfp_api_errors,
                                             make_client, package_spec, pipeline_parameter_types, upload)
from fourm_kfp.pipeline_runs.run_outcome import SubmitRequest, SubmitResult, describe, error_line

#: Tags on the MLflow parent run submit opens: that submit opened it (so --attach may close it), and how following
#: it went (stopped, with the command to reattach, or followed to its end).
TAG_OPENED_BY, OPENED_BY_SUBMIT, TAG_FOLLOWING = "fourm.opened_by", "fourm-kfp submit", "fourm.submit.following"
#: Environment variables naming the CI job that submitted (GitHub Actions, GitLab CI), recorded on the MLflow run.
CI_VARIABLES = ("GITHUB_REPOSITORY", "GITHUB_SHA", "GITHUB_REF", "GITHUB_RUN_ID", "GITHUB_RUN_ATTEMPT",
                "GITHUB_WORKFLOW", "GITHUB_SERVER_URL", "CI_PROJECT_PATH", "CI_COMMIT_SHA", "CI_PIPELINE_ID",
                "CI_JOB_ID")


def pipeline_package(path: str = "", image_tag: str = "", workdir: str | None = None) -> Path:
    """The compiled pipeline to upload: ``path``, else a fresh compile for the images of ``image_tag`` (in
    ``workdir``), else the committed one (kept current by the tests and CI)."""
    from fourm_kfp.pipeline_runs.compile import compile_pipeline, default_output

    if image_tag:
        if path:
            raise UserError("--image-tag compiles the pipeline for those images: leave out --package")
        import tempfile

        return compile_pipeline(Path(workdir or tempfile.mkdtemp(prefix="fourm-submit-")) / "fourm_pretrain.yaml",
                                image_tag=image_tag)
    package = Path(path) if path else default_output()
    if not package.is_file():
        raise UserError(f"--package {package}: no such compiled pipeline (fourm-kfp compile --output {package})")
    return package


def ci_tags() -> dict[str, str]:
    return {f"fourm.ci.{name.lower()}": os.environ[name] for name in CI_VARIABLES if os.environ.get(name)}


def shown_uri(uri: str) -> str:
    """A tracking URI as printed: any ``user:password@`` in it replaced by ``***@``."""
    return re.sub(r"//[^/@]*@", "//***@", uri)


def check_job_parameters(parameters: dict[str, Any]) -> None:
    """Refuse, before anything is created, run parameters that the run would fail on: an empty ``image_pull_secret``
    (KFP's driver fails every step that names an empty pull secret), and a PyTorchJob queued by Kueue without the
    statement that Kueue's PyTorchJob integration is on (every job stage refuses it)."""
    from fourm_kfp.cluster.job_kinds import check_kueue_integration
    from fourm_kfp.cluster.job_spec import DEFAULT_PULL_SECRET, JOB_STAGES, param_prefix

    if parameters.get("image_pull_secret", DEFAULT_PULL_SECRET) == "":
        raise UserError("--param image_pull_secret=: KFP's driver fails every step that names an empty pull secret; "
                        f"leave it out (the default, {DEFAULT_PULL_SECRET}, is used when that Secret exists and "
                        "skipped by the kubelet when it does not) or name your Secret")

    for stage, defaults in JOB_STAGES.items():
        launcher = parameters.get(f"{param_prefix(stage)}_launcher", defaults.launcher)
        check_kueue_integration(parameters.get("scheduler", ""), launcher, stage)  # a ConfigError: a UserError


def submit(request: SubmitRequest, client=None, out: Callable[[str], None] = print,
           preflight: Callable[[Any, dict[str, Any], str], None] | None = None) -> SubmitResult:
    """Upload, create the run (or recurring run), and with ``wait`` follow it; see the module docstring.
    ``preflight(client, parameters, tracking_uri)`` (``fourm-kfp doctor``'s checks) runs once the server's version
    is read and before anything is created; it raises to stop the submission."""
    from fourm_kfp.config.loader import load_config, pinned_overrides
    from fourm_kfp.contract import lineage
    from fourm_kfp.launchers.kfp_lineage import open_pipeline_run

    config = load_config(request.preset, overrides=list(request.overrides))  # a bad config fails here
    schedule = check_cron(request.schedule) if request.schedule else ""
    package = pipeline_package(request.package, request.image_tag)
    parameters = coerce_parameters(request.parameters, pipeline_parameter_types(package))
    check_job_parameters(parameters)
    with kfp_api_errors(request.host):
        client = client if client is not None else make_client(request.host, request.namespace)
        check_server_version(client, request.host, out)
    if preflight is not None:
        preflight(client, parameters, lineage.resolve_tracking_uri(request.tracking_uri or None, None) or "")
    with kfp_api_errors(request.host):
        pipeline_id, version_id = upload(client, package, request.pipeline_name, request.namespace)
        experiment = client.create_experiment(request.experiment, namespace=request.namespace or None)
    label = request.run_name or f"{request.pipeline_name}-{time.strftime('%Y%m%d-%H%M%S')}"
    # The resolved config travels with the run, every value pinned: the pods load exactly it, whatever their image's
    # preset files say, and the lineage records the same (issue: presets changed on main, images did not).
    params: dict[str, Any] = {"preset": request.preset, "config_overrides": pinned_overrides(config), **parameters}
    # The lineage's address travels with the run, waited for or not: the pipeline writes there (not where its
    # cluster's default points), and --attach/--report read the gate there.
    tracking = lineage.resolve_tracking_uri(request.tracking_uri or None, None)
    if tracking:
        params["mlflow_tracking_uri"] = tracking
    if request.schedule:
        with kfp_api_errors(request.host):
            # no_catchup: a schedule paused (or a server down) for a week does not start every missed run at once
            recurring = client.create_recurring_run(experiment.experiment_id, label, cron_expression=schedule,
                                                    pipeline_id=pipeline_id, version_id=version_id, params=params,
                                                    no_catchup=True)
        out(f"recurring run {recurring.recurring_run_id} ({schedule}) in experiment {request.experiment}: "
            f"{request.host.rstrip('/')}/#/recurringrun/details/{recurring.recurring_run_id}")
        return SubmitResult("", "", recurring_run_id=recurring.recurring_run_id, pipeline_id=pipeline_id,
                            version_id=version_id)
    parent = ""
    if tracking and request.wait:
        parent = open_pipeline_run(label, request.preset, list(request.overrides),
                                   str(params.get("store_uri", "s3://fourm-kfp")), tracking,
                                   {"fourm.kfp_host": request.host, TAG_OPENED_BY: OPENED_BY_SUBMIT, **ci_tags()})
        params.update(mlflow_parent_run_id=parent, run_label=label)
    try:
        with kfp_api_errors(request.host):
            run = client.run_pipeline(experiment.experiment_id, label, params=params, pipeline_id=pipeline_id,
                                      version_id=version_id)
    except UserError:
        if parent:
            lineage.finish_run(tracking, parent, "FAILED")  # no KFP run: nothing will ever close it
        raise
    result = SubmitResult(run.run_id, kfp_run_page(request.host, run.run_id), mlflow_parent_run_id=parent,
                          pipeline_id=pipeline_id, version_id=version_id)
    out(f"run {run.run_id} ({label}) in experiment {request.experiment}: {result.url}")
    if not request.wait:
        return result
    return watch(client, result, request, out, stage_tasks(package_spec(package)), tracking, close_parent=True)


def watch(client, result: SubmitResult, request: SubmitRequest, out: Callable[[str], None], keys: dict[str, str],
          tracking: str | None, close_parent: bool) -> SubmitResult:
    """Follow the run to its end, then close the parent run (when ``close_parent``: submit opened it) by the run's
    final state and read the gate. When following stops first (``--timeout``, Ctrl-C/SIGTERM, the API failing too
    often, or any error, e.g. an expired token or a TLS failure) the KFP run goes on: its parent run stays open,
    tagged with why, and the way to reattach is printed (exit 5)."""
    try:
        follow_run(client, result, request, out, keys)
    except KeyboardInterrupt:
        result.stopped = "interrupted"
    except Exception as exc:  # the run exists and goes on, whatever stopped following it
        result.stopped = str(exc) if isinstance(exc, UserError) else error_line(exc)
        out(f"  stopped following run {result.run_id}: {result.stopped}")
    parent = result.mlflow_parent_run_id
    if result.stopped:
        again = f"fourm-kfp submit --attach {result.run_id} --host {request.host}" + \
            (f" --namespace {request.namespace}" if request.namespace else "")
        if close_parent and tracking and parent:
            _update_parent(out, tracking, parent, f"stopped ({result.stopped}); reattach: {again}")
        out(f"  run {result.run_id} goes on; follow it to its end and read its gate with: {again}")
    else:
        if close_parent and tracking and parent:
            _update_parent(out, tracking, parent, f"followed to its end: {result.state.lower()}",
                           "FINISHED" if result.state == "SUCCEEDED" else "FAILED")
        if result.state == "SUCCEEDED":
            read_gate(result, tracking)
    out(describe(result))
    return result


def _update_parent(out: Callable[[str], None], tracking: str, run_id: str, following: str, status: str = "") -> None:
    """Tag the MLflow parent run with how following went (:data:`TAG_FOLLOWING`) and, with ``status``, close it; an
    MLflow server that fails here is reported in a line and does not change the exit status (the run's outcome)."""
    from fourm_kfp.contract import lineage

    try:
        lineage.MLflowTracker(lineage._client(tracking), run_id).set_tags({TAG_FOLLOWING: following})
        if status:
            lineage.finish_run(tracking, run_id, status)
    except Exception as exc:
        out(f"  MLflow parent run {run_id} at {shown_uri(tracking)} not updated ({following}): {error_line(exc)}")


def version_spec(client, run) -> dict | None:
    """The pipeline spec of the version a run was created from (None when the run names none)."""
    reference = getattr(run, "pipeline_version_reference", None)
    if reference is None or not reference.pipeline_version_id:
        return None
    version = client.get_pipeline_version(reference.pipeline_id, reference.pipeline_version_id)
    return version.pipeline_spec if isinstance(version.pipeline_spec, dict) else None


def attach(request: SubmitRequest, run_id: str, client=None, out: Callable[[str], None] = print) -> SubmitResult:
    """``fourm-kfp submit --attach RUN_ID``: follow an existing run to its end with the same exit codes; close the
    MLflow parent run named in its parameters when ``submit`` opened it (the pipeline closes its own), and read
    the gate under it. The tracking URI is where the run wrote its lineage, its ``mlflow_tracking_uri`` parameter;
    ``request.tracking_uri`` (else ``$MLFLOW_TRACKING_URI``) only when the run names none. The address read is
    printed."""
    from fourm_kfp.contract import lineage
    from fourm_kfp.launchers.kfp_lineage import TAG_KFP_RUN_ID

    with kfp_api_errors(request.host):
        client = client if client is not None else make_client(request.host, request.namespace)
        run = client.get_run(run_id)
        spec = version_spec(client, run) or package_spec(pipeline_package(request.package))
    params = (run.runtime_config.parameters if run.runtime_config else None) or {}
    run_tracking = str(params.get("mlflow_tracking_uri") or "")
    tracking = lineage.resolve_tracking_uri(run_tracking or request.tracking_uri or None, None)
    parent, opened_by_submit = str(params.get("mlflow_parent_run_id") or ""), False
    if tracking:  # the parent the run's first step claimed or opened (a cloned run's own), tagged with the run id
        found = lineage.find_run_by_tag(tracking, TAG_KFP_RUN_ID, run_id, kind="pipeline")
        parent = found.info.run_id if found is not None else parent
    if tracking and parent:
        opened_by_submit = lineage._client(tracking).get_run(parent).data.tags.get(TAG_OPENED_BY) == OPENED_BY_SUBMIT
    reference = run.pipeline_version_reference
    result = SubmitResult(run_id, kfp_run_page(request.host, run_id), mlflow_parent_run_id=parent,
                          pipeline_id=getattr(reference, "pipeline_id", "") or "",
                          version_id=getattr(reference, "pipeline_version_id", "") or "")
    out(f"attached to run {run_id} ({run.display_name}): {result.url}")
    if tracking:
        source = "the run's mlflow_tracking_uri parameter" if run_tracking else \
            "--mlflow-tracking-uri or $MLFLOW_TRACKING_URI: the run names none"
        out(f"reading the gate at {shown_uri(tracking)} ({source})")
    return watch(client, result, request, out, stage_tasks(spec), tracking, close_parent=opened_by_submit)

