"""``fourm-kfp submit``: run the pipeline on a Kubeflow Pipelines server, optionally wait for it and read the gate.

:func:`submit`:

1. takes the compiled pipeline (the committed ``fourm_pretrain.yaml``, or a fresh compile) and uploads it: a new
   pipeline the first time, else a new **version** named after the YAML's content hash (the same YAML reuses its
   version, found across every page of the list); with ``namespace``, into that profile's namespace;
2. opens the MLflow parent run itself when it will wait and a tracking URI is given, tagged with the CI job that
   asked (``GITHUB_*``/``CI_*`` variables), so the lineage says which commit and job retrained; without waiting the
   pipeline opens and closes its own;
3. creates a run in the experiment (or, with ``schedule``, a recurring run with that cron expression, checked as
   the server's 6-field seconds-first cron and created with ``no_catchup``) with the preset, overrides and stage
   parameters, and prints the run's UI link;
4. with ``wait``, follows the run: each task's state as it changes, then the stage table and the model gate's
   verdict, read from the evaluate stage's MLflow run (``gate.json``).

Exit codes (:data:`EXIT_CODES`): 0 the run succeeded (the model was promoted or the gate kept the champion without
refusing), 1 the run failed or was cancelled, 2 a user error (bad arguments, or the KFP API unreachable or refusing
the request: one line, no traceback), 3 the run succeeded but the gate refused the model, 4 the run succeeded but the
gate's verdict could not be read (no tracking URI, no evaluate run, an artifact store this machine cannot read: the
reason is printed), 5 following stopped before the run ended (the run goes on). While following, transient API
errors (5xx, 429, a connection reset, a 401 when the token is re-read from a file) are retried with backoff, up to
``max_poll_errors`` in a row.

The client, its credentials and errors, and the server's rules checked before anything is sent (parameter types,
cron, namespaces, paged lists) are :mod:`.kfp_api`; ``--namespace`` is the Kubeflow profile namespace of a
multi-user install.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from fourm_kfp.errors import UserError
from fourm_kfp.launchers.kfp_api import (check_cron, coerce_parameters, kfp_api_errors, make_client, package_spec,
                                         pipeline_parameter_types, transient_error, upload)

EXIT_SUCCEEDED, EXIT_FAILED, EXIT_USER_ERROR, EXIT_GATE_REFUSED = 0, 1, 2, 3
EXIT_GATE_UNREAD, EXIT_NOT_FOLLOWED = 4, 5
EXIT_CODES = {EXIT_SUCCEEDED: "the run was created (with --wait: it succeeded and the gate did not refuse the model)",
              EXIT_FAILED: "the run failed or was cancelled",
              EXIT_USER_ERROR: "a user error: bad arguments or parameters, or the KFP API unreachable or refusing "
                               "a request (before the run is created: nothing was started)",
              EXIT_GATE_REFUSED: "the run succeeded but the model gate refused the model (--wait)",
              EXIT_GATE_UNREAD: "the run succeeded but the model gate's verdict could not be read (--wait; the "
                                "reason is printed): the model was not checked",
              EXIT_NOT_FOLLOWED: "following stopped before the run ended (--timeout, interrupted, or the KFP API "
                                 "failed too many times in a row); the run goes on: --attach RUN_ID follows it"}
#: Tags on the MLflow parent run submit opens: that submit opened it (so --attach may close it), and how following
#: it went (stopped, with the command to reattach, or followed to its end).
TAG_OPENED_BY, OPENED_BY_SUBMIT, TAG_FOLLOWING = "fourm.opened_by", "fourm-kfp submit", "fourm.submit.following"
MAX_BACKOFF_S = 300.0
TERMINAL_STATES = {"SUCCEEDED", "FAILED", "SKIPPED", "CANCELED"}
STAGE_NAMES = ("prepare-data", "train-tokenizers", "pretokenize", "pretrain", "evaluate")
#: Environment variables naming the CI job that submitted (GitHub Actions, GitLab CI), recorded on the MLflow run.
CI_VARIABLES = ("GITHUB_REPOSITORY", "GITHUB_SHA", "GITHUB_REF", "GITHUB_RUN_ID", "GITHUB_RUN_ATTEMPT",
                "GITHUB_WORKFLOW", "GITHUB_SERVER_URL", "CI_PROJECT_PATH", "CI_COMMIT_SHA", "CI_PIPELINE_ID",
                "CI_JOB_ID")


@dataclass
class SubmitRequest:
    host: str
    preset: str
    overrides: Sequence[str] = ()
    parameters: dict[str, Any] = field(default_factory=dict)  # other pipeline parameters (stage parameters)
    namespace: str = ""
    experiment: str = "fourm-pretrain"
    pipeline_name: str = "fourm-pretrain"
    package: str = ""  # a compiled pipeline YAML; "" = the committed one
    image_tag: str = ""  # compile for the images of this tag (e.g. a commit); "" = the package's version
    run_name: str = ""
    schedule: str = ""  # a cron expression: create a recurring run instead
    wait: bool = False
    timeout_s: float = 7 * 24 * 3600
    poll_s: float = 10.0
    max_poll_errors: int = 8  # consecutive transient API errors tolerated while following (backoff in between)
    tracking_uri: str = ""


@dataclass
class SubmitResult:
    run_id: str
    url: str
    state: str = ""
    stages: list[dict[str, Any]] = field(default_factory=list)
    gate: dict[str, Any] | None = None
    mlflow_parent_run_id: str = ""
    recurring_run_id: str = ""
    pipeline_id: str = ""
    version_id: str = ""
    stopped: str = ""  # why following stopped before the run ended ("" = it was followed to its end, or not at all)
    gate_error: str = ""  # why the gate's verdict of a succeeded run could not be read

    @property
    def exit_code(self) -> int:
        if self.stopped:
            return EXIT_NOT_FOLLOWED
        if self.recurring_run_id or not self.state:
            return EXIT_SUCCEEDED
        if self.state != "SUCCEEDED":
            return EXIT_FAILED
        if self.gate_error:
            return EXIT_GATE_UNREAD
        if self.gate and not self.gate.get("skipped") and not self.gate.get("promoted"):
            return EXIT_GATE_REFUSED
        return EXIT_SUCCEEDED


class LostContact(Exception):
    """The KFP API failed more times in a row than following tolerates."""


def read_run(client, run_id: str, request: "SubmitRequest", out: Callable[[str], None], deadline: float):
    """``client.get_run``, retrying transient errors with exponential backoff (from ``poll_s``, at most
    :data:`MAX_BACKOFF_S`); :class:`LostContact` after ``max_poll_errors`` in a row or past the deadline."""
    failures = 0
    while True:
        try:
            return client.get_run(run_id)
        except Exception as exc:
            reason = transient_error(exc, client)
            if reason is None:
                raise
            failures += 1
            if failures > request.max_poll_errors or time.monotonic() > deadline:
                raise LostContact(f"the KFP API failed {failures} times in a row (last: {reason})") from None
            delay = min(max(request.poll_s, 0.001) * 2 ** failures, MAX_BACKOFF_S)
            out(f"  (KFP API: {reason}; try {failures + 1} of {request.max_poll_errors + 1} in {delay:.0f}s)")
            time.sleep(delay)


def pipeline_package(path: str = "", image_tag: str = "", workdir: str | None = None) -> Path:
    """The compiled pipeline to upload: ``path``, else a fresh compile for the images of ``image_tag`` (in
    ``workdir``), else the committed one (kept current by the tests and CI)."""
    from fourm_kfp.launchers.compile import compile_pipeline, default_output

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


def run_url(host: str, run_id: str) -> str:
    return f"{host.rstrip('/')}/#/runs/details/{run_id}"


def submit(request: SubmitRequest, client=None, out: Callable[[str], None] = print) -> SubmitResult:
    """Upload, create the run (or recurring run), and with ``wait`` follow it; see the module docstring."""
    from fourm_kfp.config.loader import load_config
    from fourm_kfp.contract import lineage
    from fourm_kfp.launchers.kfp_runtime import open_pipeline_run

    from fourm_kfp.config.loader import pinned_overrides

    config = load_config(request.preset, overrides=list(request.overrides))  # a bad config fails here
    schedule = check_cron(request.schedule) if request.schedule else ""
    package = pipeline_package(request.package, request.image_tag)
    parameters = coerce_parameters(request.parameters, pipeline_parameter_types(package))
    with kfp_api_errors(request.host):
        client = client if client is not None else make_client(request.host, request.namespace)
        pipeline_id, version_id = upload(client, package, request.pipeline_name, request.namespace)
        experiment = client.create_experiment(request.experiment, namespace=request.namespace or None)
    label = request.run_name or f"{request.pipeline_name}-{time.strftime('%Y%m%d-%H%M%S')}"
    # The resolved config travels with the run, every value pinned: the pods load exactly it, whatever their image's
    # preset files say, and the lineage records the same (issue: presets changed on main, images did not).
    params: dict[str, Any] = {"preset": request.preset, "config_overrides": pinned_overrides(config), **parameters}
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
    tracking = lineage.resolve_tracking_uri(request.tracking_uri or None, None) if request.wait else None
    parent = ""
    if tracking:
        parent = open_pipeline_run(label, request.preset, list(request.overrides),
                                   str(params.get("store_uri", "s3://fourm-kfp")), tracking,
                                   {"fourm.kfp_host": request.host, TAG_OPENED_BY: OPENED_BY_SUBMIT, **ci_tags()})
        params.update(mlflow_tracking_uri=tracking, mlflow_parent_run_id=parent, run_label=label)
    try:
        with kfp_api_errors(request.host):
            run = client.run_pipeline(experiment.experiment_id, label, params=params, pipeline_id=pipeline_id,
                                      version_id=version_id)
    except UserError:
        if parent:
            lineage.finish_run(tracking, parent, "FAILED")  # no KFP run: nothing will ever close it
        raise
    result = SubmitResult(run.run_id, run_url(request.host, run.run_id), mlflow_parent_run_id=parent,
                          pipeline_id=pipeline_id, version_id=version_id)
    out(f"run {run.run_id} ({label}) in experiment {request.experiment}: {result.url}")
    if not request.wait:
        return result
    return watch(client, result, request, out, stage_tasks(package_spec(package)), tracking, close_parent=True)


def watch(client, result: SubmitResult, request: SubmitRequest, out: Callable[[str], None], keys: dict[str, str],
          tracking: str | None, close_parent: bool) -> SubmitResult:
    """Follow the run to its end, then close the parent run (when ``close_parent``: submit opened it) by the run's
    final state and read the gate. When following stops first (``--timeout``, Ctrl-C/SIGTERM, the API failing too
    often) the KFP run goes on: its parent run stays open, tagged with why, and the way to reattach is printed."""
    from fourm_kfp.contract import lineage

    try:
        follow_run(client, result, request, out, keys)
    except KeyboardInterrupt:
        result.stopped = "interrupted"
    parent = result.mlflow_parent_run_id
    if result.stopped:
        again = f"fourm-kfp submit --attach {result.run_id} --host {request.host}" + \
            (f" --namespace {request.namespace}" if request.namespace else "")
        if close_parent and tracking and parent:
            _tag_run(tracking, parent, {TAG_FOLLOWING: f"stopped ({result.stopped}); reattach: {again}"})
        out(f"  run {result.run_id} goes on; follow it to its end and read its gate with: {again}")
    else:
        if close_parent and tracking and parent:
            _tag_run(tracking, parent, {TAG_FOLLOWING: f"followed to its end: {result.state.lower()}"})
            lineage.finish_run(tracking, parent, "FINISHED" if result.state == "SUCCEEDED" else "FAILED")
        if result.state == "SUCCEEDED":
            read_gate(result, tracking)
    out(describe(result))
    return result


def _tag_run(tracking: str, run_id: str, tags: dict[str, str]) -> None:
    from fourm_kfp.contract import lineage

    lineage.MLflowTracker(lineage._client(tracking), run_id).set_tags(tags)


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
    the gate under it. The tracking URI is ``request.tracking_uri``, else the run's ``mlflow_tracking_uri``."""
    from fourm_kfp.contract import lineage
    from fourm_kfp.launchers.kfp_runtime import TAG_KFP_RUN_ID

    with kfp_api_errors(request.host):
        client = client if client is not None else make_client(request.host, request.namespace)
        run = client.get_run(run_id)
        spec = version_spec(client, run) or package_spec(pipeline_package(request.package))
    params = (run.runtime_config.parameters if run.runtime_config else None) or {}
    tracking = lineage.resolve_tracking_uri(request.tracking_uri or str(params.get("mlflow_tracking_uri") or ""),
                                            None)
    parent, opened_by_submit = str(params.get("mlflow_parent_run_id") or ""), False
    if tracking:  # the parent the run's first step claimed or opened (a cloned run's own), tagged with the run id
        found = lineage.find_run_by_tag(tracking, TAG_KFP_RUN_ID, run_id)
        parent = found.info.run_id if found is not None else parent
    if tracking and parent:
        opened_by_submit = lineage._client(tracking).get_run(parent).data.tags.get(TAG_OPENED_BY) == OPENED_BY_SUBMIT
    reference = run.pipeline_version_reference
    result = SubmitResult(run_id, run_url(request.host, run_id), mlflow_parent_run_id=parent,
                          pipeline_id=getattr(reference, "pipeline_id", "") or "",
                          version_id=getattr(reference, "pipeline_version_id", "") or "")
    out(f"attached to run {run_id} ({run.display_name}): {result.url}")
    return watch(client, result, request, out, stage_tasks(spec), tracking, close_parent=opened_by_submit)


#: How bad each exit status is when several runs are reported at once (the worst one is the report's).
REPORT_SEVERITY = (EXIT_SUCCEEDED, EXIT_NOT_FOLLOWED, EXIT_GATE_UNREAD, EXIT_GATE_REFUSED, EXIT_FAILED)


@dataclass
class ReportResult:
    """``submit --report``: the runs of the experiment that ended in the window, each attached to and read."""

    results: list[SubmitResult] = field(default_factory=list)
    running: list[str] = field(default_factory=list)  # run ids still going (reported by a later --report)

    @property
    def exit_code(self) -> int:
        return max((r.exit_code for r in self.results), key=REPORT_SEVERITY.index, default=EXIT_SUCCEEDED)


def report(request: SubmitRequest, since_hours: float, client=None, out: Callable[[str], None] = print,
           now: dt.datetime | None = None) -> ReportResult:
    """``fourm-kfp submit --report HOURS``: for runs longer than any CI job. Every run of ``request.experiment``
    that ended in the last ``since_hours`` hours is attached to (:func:`attach`: its stages, its MLflow parent run
    closed if submit opened it, its gate read); the exit status is the worst of theirs, so a scheduled CI job
    fails when the gate refused a model a run submitted days before. Runs still going are listed."""
    now = now or dt.datetime.now(dt.timezone.utc)
    since = now - dt.timedelta(hours=since_hours)
    result = ReportResult()
    with kfp_api_errors(request.host):
        client = client if client is not None else make_client(request.host, request.namespace)
        try:
            experiment = client.get_experiment(experiment_name=request.experiment,
                                               namespace=request.namespace or None)
        except ValueError:
            out(f"no experiment {request.experiment!r}: no run was submitted to it")
            return result
        runs, token = [], ""
        while True:
            page = client.list_runs(experiment_id=experiment.experiment_id, page_token=token, page_size=100,
                                    sort_by="created_at desc", namespace=request.namespace or None)
            runs += page.runs or []
            token = page.next_page_token or ""
            if not token:
                break
    ended = []
    for run in runs:
        state = str(run.state or "")
        if state not in TERMINAL_STATES:
            result.running.append(run.run_id)
            out(f"run {run.run_id} ({run.display_name}): {state.lower() or 'pending'}, not reported yet")
        elif run.finished_at is not None and run.finished_at >= since:
            ended.append(run)
    out(f"{len(ended)} run(s) of experiment {request.experiment} ended in the last {since_hours:g} h")
    for run in sorted(ended, key=lambda r: r.finished_at):
        result.results.append(attach(request, run.run_id, client=client, out=out))
    return result


def stage_tasks(spec: dict) -> dict[str, str]:
    """The pipeline's stage tasks by DAG task key (what a KFP server shows as a task's ``display_name``, e.g.
    ``pretrain-3`` for the third branch that runs pretrain), found by their component (``comp-pretrain-3`` runs the
    pretrain stage). Tasks of other components, and the DAGs around them, are not stages."""
    keys: dict[str, str] = {}
    for component in [spec["root"], *spec.get("components", {}).values()]:
        for key, task in (component.get("dag") or {}).get("tasks", {}).items():
            ref = task.get("componentRef", {}).get("name", "")
            stage = re.sub(r"-[0-9]+$", "", ref.removeprefix("comp-"))
            if stage in STAGE_NAMES and "dag" not in spec["components"].get(ref, {}):
                keys[key] = stage
    return keys


def stage_table(tasks: Sequence[Any], keys: dict[str, str]) -> list[dict[str, Any]]:
    """One row per stage, in pipeline order, from the run's task details: the executed branch's task (the node
    named by its task key; its ``-driver`` node and the ``executor`` pod node under it are not stages); a stage that
    never started is ``NOT_RUN``."""
    rows = {name: {"name": name, "state": "NOT_RUN", "seconds": None} for name in STAGE_NAMES}
    for task in sorted(tasks, key=lambda t: str(t.start_time or "")):
        stage = keys.get(task.display_name or "")
        if stage:
            rows[stage] = {"name": stage, "state": str(task.state or ""), "task": task.display_name,
                           "seconds": _seconds(task.start_time, task.end_time)}
    return list(rows.values())


def follow_run(client, result: SubmitResult, request: SubmitRequest, out: Callable[[str], None],
               keys: dict[str, str]) -> None:
    """Poll the run to a terminal state, printing each stage's state when it changes; fills ``result``.
    ``keys``: :func:`stage_tasks` of the run's pipeline."""
    seen: dict[str, str] = {}
    deadline = time.monotonic() + request.timeout_s
    while True:
        try:
            with kfp_api_errors(request.host):
                run = read_run(client, result.run_id, request, out, deadline)
        except LostContact as exc:
            result.stopped = str(exc)
            out(f"  stopped following run {result.run_id}: {exc}")
            return
        tasks = (run.run_details.task_details if run.run_details else None) or []
        for row in stage_table(tasks, keys):
            if row["state"] != "NOT_RUN" and seen.get(row["name"]) != row["state"]:
                seen[row["name"]] = row["state"]
                out(f"  {row['name']}: {row['state'].lower()}")
        result.state = str(run.state or "")
        if result.state in TERMINAL_STATES:
            result.stages = stage_table(tasks, keys)
            if run.error and result.state != "SUCCEEDED":
                out(f"  error: {getattr(run.error, 'message', run.error)}")
            return
        if time.monotonic() > deadline:
            result.stopped = f"still {result.state.lower()} after {request.timeout_s:.0f}s (--timeout)"
            out(f"  stopped following run {result.run_id}: {result.stopped}")
            return
        time.sleep(request.poll_s)


def _seconds(start, end) -> float | None:
    """A task's duration; None while it runs (the server then gives the zero time, or nothing, as its end)."""
    try:
        seconds = (end - start).total_seconds()
    except TypeError:
        return None
    return round(seconds, 1) if seconds >= 0 else None


class GateUnreadable(Exception):
    """The gate's verdict of a succeeded run could not be read; the message says why."""


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")


def gate_verdict(tracking_uri: str, parent_run_id: str) -> dict[str, Any]:
    """The evaluate stage's ``gate.json`` (from the run that produced a reused evaluation, if it was reused);
    :class:`GateUnreadable` with the reason when there is none or it cannot be read (e.g. an ``s3://`` artifact
    root this machine has no credentials or client for)."""
    import tempfile

    from fourm_kfp.contract import lineage

    try:
        runs = lineage.child_runs(tracking_uri, parent_run_id)
    except Exception as exc:
        raise GateUnreadable(f"cannot search the stage runs under MLflow run {parent_run_id} at "
                             f"{tracking_uri}: {_first_line(exc)}") from None
    evaluate = [run for run in runs if run.data.tags.get(lineage.TAG_STAGE) == "evaluate"]
    if not evaluate:
        raise GateUnreadable(f"no evaluate stage run under MLflow run {parent_run_id}: the run did not record it")
    run = evaluate[-1]
    reused = run.data.tags.get(lineage.TAG_REUSED) == "true"
    source = run.data.tags.get(lineage.TAG_PRODUCED_BY) if reused else run.info.run_id
    if not source:
        raise GateUnreadable(f"the reused evaluate run {run.info.run_id} names no run that produced it")
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    with tempfile.TemporaryDirectory() as tmp:
        try:
            path = lineage._client(tracking_uri).download_artifacts(source, "gate.json", tmp)
            gate = json.loads(Path(path).read_text())
        except Exception as exc:
            where = run.info.artifact_uri if source == run.info.run_id else f"run {source}"
            raise GateUnreadable(f"cannot read gate.json of evaluate run {source} ({where}): "
                                 f"{_first_line(exc)}") from None
    if not isinstance(gate, dict):
        raise GateUnreadable(f"gate.json of evaluate run {source} is not a JSON object")
    return gate


def read_gate(result: SubmitResult, tracking: str | None) -> None:
    """Fill ``result.gate`` (or ``result.gate_error``) for a succeeded run."""
    if not tracking or not result.mlflow_parent_run_id:
        result.gate_error = ("no MLflow tracking URI (--mlflow-tracking-uri or $MLFLOW_TRACKING_URI), so no parent "
                             "run to find the evaluate stage's gate.json under")
        return
    try:
        result.gate = gate_verdict(tracking, result.mlflow_parent_run_id)
    except GateUnreadable as exc:
        result.gate_error = str(exc)


def describe(result: SubmitResult) -> str:
    """The job summary: the run's state, the stage table, the gate's verdict, and what the exit status means."""
    state = result.state.lower() + (f" (not followed to its end: {result.stopped})" if result.stopped else "")
    lines = [f"run {result.run_id}: {state}", f"{'stage':18s} {'state':10s} seconds"]
    for stage in result.stages:
        state = stage["state"].lower().replace("_", " ")
        lines.append(f"{stage['name']:18s} {state:10s} {stage['seconds'] if stage['seconds'] is not None else '-'}")
    gate = result.gate
    if result.gate_error:
        lines.append(f"model gate: verdict not read: {result.gate_error}")
    elif gate is None:
        lines.append("model gate: not reached")
    elif gate.get("skipped"):
        lines.append(f"model gate: skipped ({gate['skipped']})")
    else:
        verdict = "promoted to champion" if gate.get("promoted") else "refused"
        lines.append(f"model gate: {verdict}: {gate.get('reason', '')}".rstrip(": "))
    lines.append(f"exit status {result.exit_code}: {EXIT_CODES[result.exit_code]}")
    return "\n".join(lines)


def split_parameters(items: Sequence[str]) -> dict[str, str]:
    """``--param name=value`` as ``{name: "value"}``, the text as given (``submit`` types it by the pipeline)."""
    parameters: dict[str, str] = {}
    for item in items:
        name, sep, text = item.partition("=")
        if not sep or not name:
            raise UserError(f"--param {item!r}: expected NAME=VALUE")
        parameters[name] = text
    return parameters


def parse_parameters(items: Sequence[str]) -> dict[str, Any]:
    """``--param name=value``: the value as JSON when it parses (numbers, booleans, lists, objects), else text."""
    parameters: dict[str, Any] = {}
    for name, text in split_parameters(items).items():
        try:
            parameters[name] = json.loads(text)
        except json.JSONDecodeError:
            parameters[name] = text
    return parameters
