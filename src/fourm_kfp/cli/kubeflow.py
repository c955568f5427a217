"""Commands for a Kubeflow Pipelines server: ``submit`` (run the pipeline there, follow it, attach to it, report on
recent runs, schedule it) and ``doctor`` (check the cluster a run will use, as submit does first)."""

from __future__ import annotations

import argparse
from typing import Any

from fourm_kfp.cli.help_text import add_command
from fourm_kfp.cli.options import add_config_options, pairs


def _add_service_account_option(p: argparse.ArgumentParser) -> None:
    """``--service-account``: whose RBAC doctor checks (submit's preflight and ``doctor``)."""
    p.add_argument("--service-account", default="", metavar="NAME",
                   help="doctor: check the launcher's RBAC as this ServiceAccount of the namespace (the runs' "
                        "account: pipeline-runner, default-editor, fourm-pipeline-runner), by impersonation; "
                        "default: as yourself")


def _add_submit(commands: argparse._SubParsersAction) -> None:
    from fourm_kfp.pipeline_runs.run_outcome import EXIT_CODES

    submit = add_command(
        commands, "submit", cmd_submit, "run the pipeline on a Kubeflow Pipelines server (optionally wait for it)",
        ["fourm-kfp submit --preset demo --endpoint https://kubeflow.example.com/pipeline -n team --wait",
         "fourm-kfp submit --preset 4m-b --host $KFP_HOST --param pretrain_nodes=2 --schedule '0 0 3 * * 1'"],
        shared=(add_config_options,),
        epilog="exit status:\n" + "\n".join(f"  {code}  {what}" for code, what in sorted(EXIT_CODES.items())))
    # --endpoint and -n as the kfp CLI spells them (kfp/cli/cli.py: --endpoint, -n/--namespace).
    submit.add_argument("--host", "--endpoint", dest="host", default=None,
                        help="KFP API endpoint, e.g. https://kubeflow.example.com/pipeline (default: $KFP_HOST)")
    submit.add_argument("-n", "--namespace", default="", help="Kubeflow profile namespace (multi-user installs)")
    submit.add_argument("--no-doctor", action="store_true",
                        help="skip the preflight check (fourm-kfp doctor) that otherwise runs before anything is "
                             "created and refuses to submit when a check fails")
    _add_service_account_option(submit)
    submit.add_argument("--experiment", default="fourm-pretrain", help="experiment name (created if missing)")
    submit.add_argument("--param", action="append", default=[], metavar="NAME=VALUE",
                        help="another pipeline parameter, e.g. --param pretrain_nodes=2 --param "
                             "pretrain_launcher=trainjob (each value is typed as the pipeline declares it: "
                             "text, integer, number, true/false, or a JSON list/object)")
    submit.add_argument("--package", default="", help="compiled pipeline YAML (default: the committed one)")
    submit.add_argument("--image-tag", default="",
                        help="compile for the images of this tag and upload that, e.g. the commit the image "
                             "workflow built (CI passes $GITHUB_SHA); default: the committed pipeline, whose "
                             "images carry the package version")
    submit.add_argument("--run-name", default="", help="run name, also the MLflow run label (default: dated)")
    submit.add_argument("--schedule", default="", metavar="CRON",
                        help="create a recurring run with this cron expression, as KFP reads it: 6 fields, seconds "
                             "first ('0 0 3 * * 1' = Mondays 03:00; a 5-field one is refused), or @daily, "
                             "@every 6h; missed runs are not caught up")
    submit.add_argument("--wait", action="store_true", help="follow the run to its end; exit status says how it went")
    submit.add_argument("--attach", default="", metavar="RUN_ID",
                        help="submit nothing: follow an existing run to its end (e.g. after --wait stopped), close "
                             "the MLflow parent run submit opened for it, read its gate; same exit status")
    submit.add_argument("--report", type=float, default=0, metavar="HOURS",
                        help="submit nothing: report every run of --experiment that ended in the last HOURS hours "
                             "(as --attach does each; for runs longer than a CI job); exit status: the worst one")
    submit.add_argument("--timeout", type=float, default=7 * 24 * 3600,
                        help="--wait: stop following after this many seconds (the run goes on; exit 5)")
    submit.add_argument("--poll", type=float, default=10.0, help="--wait: seconds between status reads")
    submit.add_argument("--max-poll-errors", type=int, default=8, metavar="N",
                        help="--wait: give up following after N transient API errors in a row (5xx, resets; "
                             "retried with backoff from --poll up to 5 minutes; default 8)")
    submit.add_argument("--mlflow-tracking-uri", default=None,
                        help="the MLflow server the run records its lineage and gate on, passed to it as its "
                             "mlflow_tracking_uri (waited for or not); with --wait, submit opens the parent run there "
                             "(tagged with the CI job) and reads the gate. --attach/--report read the gate where the "
                             "run wrote it (its mlflow_tracking_uri), this only when it names none (default: "
                             "$MLFLOW_TRACKING_URI)")


def cmd_submit(args: argparse.Namespace) -> int:
    """Upload the compiled pipeline (a new version when it exists), create a run in an experiment with the preset,
    overrides and stage parameters, and print its UI link. --wait follows it to the end and reports the stages and
    the model gate; --schedule creates a recurring run.

    Auth: a bearer token from $KFP_TOKEN, else the service-account token file KFP mounts in a pod
    ($KF_PIPELINES_SA_TOKEN_PATH or /var/run/secrets/kubeflow/pipelines/token), re-read per request; --namespace
    is the Kubeflow profile namespace of a multi-user install."""
    import os
    import signal

    from fourm_kfp.launchers.stage import setup_logging
    from fourm_kfp.pipeline_runs.run_outcome import SubmitRequest
    from fourm_kfp.pipeline_runs.run_report import report
    from fourm_kfp.pipeline_runs.submit import attach, submit

    setup_logging()
    host = args.host or os.environ.get("KFP_HOST", "")
    if not host:
        from fourm_kfp.errors import UserError

        raise UserError("--host (or $KFP_HOST): the KFP API endpoint to submit to")
    request = SubmitRequest(host=host, preset=args.preset, overrides=args.overrides,
                            parameters=pairs(args.param, "--param", "NAME=VALUE", empty_ok=True),
                            namespace=args.namespace, experiment=args.experiment, package=args.package,
                            image_tag=args.image_tag, run_name=args.run_name, schedule=args.schedule,
                            wait=args.wait, timeout_s=args.timeout, poll_s=args.poll,
                            max_poll_errors=args.max_poll_errors, tracking_uri=args.mlflow_tracking_uri or "")

    def stop(signum, frame):  # a cancelled CI job: stop following as Ctrl-C does, the run goes on
        raise KeyboardInterrupt

    def preflight(client, parameters: dict[str, Any], tracking: str) -> None:  # before anything is created
        from fourm_kfp.pipeline_runs import doctor

        doctor_request = _doctor_request(args, host, parameters, tracking)
        kube, error = doctor.connect(doctor_request.namespace)
        doctor_request.namespace = kube.namespace if kube is not None else doctor_request.namespace
        doctor.preflight(doctor_request, client, kube=kube, kube_error=error)

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        if args.report:
            return report(request, args.report).exit_code
        if args.attach:
            return attach(request, args.attach).exit_code
        return submit(request, preflight=None if args.no_doctor else preflight).exit_code
    finally:
        signal.signal(signal.SIGTERM, previous)


def _add_doctor(commands: argparse._SubParsersAction) -> None:
    doctor = add_command(
        commands, "doctor", cmd_doctor,
        "check the cluster a run will use (KFP version, CRDs, RBAC, Secrets, runtimes, Kueue, S3, MLflow) before any "
        "GPU is held; creates nothing",
        ["fourm-kfp doctor --preset 4m-b --host https://kubeflow.example.com/pipeline --namespace team"],
        shared=(add_config_options,),
        epilog="exit status:\n  0  no check failed\n  2  a check failed (as submit's user error: nothing started)")
    doctor.add_argument("--host", "--endpoint", dest="host", default=None,
                        help="KFP API endpoint (default: $KFP_HOST; none: no version check)")
    doctor.add_argument("-n", "--namespace", default="", help="the namespace the run's pods run in (default: the "
                        "kubeconfig's, or the pod's)")
    doctor.add_argument("--param", action="append", default=[], metavar="NAME=VALUE",
                        help="a pipeline parameter as submit takes it (pretrain_launcher, scheduler, "
                             "image_pull_secret, store_uri, ...)")
    doctor.add_argument("--s3-endpoint", default="", help="S3 endpoint to check (default: the run's s3_endpoint, "
                        "$AWS_ENDPOINT_URL, else the settings ConfigMap's)")
    doctor.add_argument("--mlflow-tracking-uri", default="", help="MLflow server to check (default: "
                        "$MLFLOW_TRACKING_URI, else the settings ConfigMap's)")
    _add_service_account_option(doctor)
    doctor.add_argument("--json", action="store_true", help="print the checks as JSON")


def _doctor_request(args: argparse.Namespace, host: str, parameters: dict[str, Any], tracking_uri: str = "",
                    s3_endpoint: str = ""):
    """What doctor checks for a run with these pipeline ``parameters`` (submit's preflight and ``doctor``)."""
    from fourm_kfp.pipeline_runs.doctor import DoctorRequest, run_parameters

    return DoctorRequest(namespace=args.namespace, service_account=args.service_account,
                         parameters=run_parameters(parameters), host=host, s3_endpoint=s3_endpoint,
                         tracking_uri=tracking_uri)


def cmd_doctor(args: argparse.Namespace) -> int:
    """One line per check: ok, warn, skipped (with why) or FAIL (with the object and the command that fixes it).
    Nothing is created in the cluster; one test object is written to the S3 store and deleted. submit runs the same
    checks first (--no-doctor skips them)."""
    import os

    from fourm_kfp.config.loader import load_config
    from fourm_kfp.errors import UserError
    from fourm_kfp.pipeline_runs import doctor
    from fourm_kfp.pipeline_runs.kfp_api import (coerce_parameters, kfp_api_errors, make_client,
                                                 pipeline_parameter_types)
    from fourm_kfp.pipeline_runs.submit import pipeline_package

    load_config(args.preset, overrides=args.overrides)  # a bad config fails here, as submit's does
    host = args.host or os.environ.get("KFP_HOST", "")
    parameters = coerce_parameters(pairs(args.param, "--param", "NAME=VALUE", empty_ok=True),
                                   pipeline_parameter_types(pipeline_package()))
    request = _doctor_request(args, host, parameters, args.mlflow_tracking_uri, args.s3_endpoint)
    kube, error = doctor.connect(request.namespace)
    if kube is not None:
        request.namespace = kube.namespace
    client, kfp_error = None, ""
    if host:
        try:
            with kfp_api_errors(host):
                client = make_client(host, args.namespace)
        except UserError as exc:
            kfp_error = str(exc)
    checks = doctor.run_doctor(request, kube, client, error, kfp_error)
    doctor.report(checks, as_json=args.json)
    return doctor.exit_code(checks)


#: This group's commands, in the order ``fourm-kfp --help`` lists them: each adds its subcommand.
COMMANDS = (_add_submit, _add_doctor)
