"""The ``fourm-kfp`` command: run the pipeline locally, run one stage, plan, verify a committed stage, compile the
pipeline, show configs.

Start-up stays light: heavy modules (torch, kfp, mlflow) are imported inside the commands that need them. A user
error (:class:`fourm_kfp.errors.UserError`) prints one line, ``Error: ...``, and exits 2; ``--debug`` adds the
traceback. The help text (plain, with an example per command) is :mod:`fourm_kfp.cli_help`'s; ``fourm-kfp
completion`` prints the shell completion that :mod:`fourm_kfp.cli_completion` writes from this parser.
"""

from __future__ import annotations

import argparse
import json
import sys
import traceback
from pathlib import Path
from typing import Any

import yaml


def _add_config_args(p: argparse.ArgumentParser) -> None:
    from fourm_kfp.config.loader import available_presets

    p.add_argument("--preset", default="smoke",
                   help=f"named config preset ({', '.join(available_presets())}); default smoke")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override a config value (repeatable), e.g. --set data.image_size=96")


def _add_store_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--root", required=True, help="local run folder: MLflow store (mlflow.db), KFP pipeline root, "
                   "and the default output store")
    p.add_argument("--store", help="root URI of stage outputs (default: --root, or s3://fourm-kfp with --s3-endpoint)")
    p.add_argument("--s3-endpoint", help="S3 endpoint URL (default: $AWS_ENDPOINT_URL); credentials come from "
                   "$AWS_ACCESS_KEY_ID / $AWS_SECRET_ACCESS_KEY")
    p.add_argument("--mlflow-tracking-uri", help="default: $MLFLOW_TRACKING_URI, else sqlite:///<root>/mlflow.db")


def _add_doctor_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--service-account", default="", metavar="NAME",
                   help="doctor: check the launcher's RBAC as this ServiceAccount of the namespace (the runs' "
                        "account: pipeline-runner, default-editor, fourm-pipeline-runner), by impersonation; "
                        "default: as yourself")


def build_parser() -> argparse.ArgumentParser:
    from fourm_kfp.cli_help import DESCRIPTION, subcommand_help
    from fourm_kfp.stages import STAGES

    parser = argparse.ArgumentParser(prog="fourm-kfp", description=DESCRIPTION,
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="Run 'fourm-kfp COMMAND --help' for a command's options and examples.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {_package_version()}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks of user errors too")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    run = sub.add_parser("run", **subcommand_help("run", "run the whole pipeline locally through kfp.local"))
    _add_config_args(run)
    _add_store_args(run)
    run.add_argument("--force", action="append", default=[], choices=list(STAGES), metavar="STAGE",
                     help="recompute this stage even if its output is committed (repeatable)")
    run.add_argument("--summary", help="write the run summary JSON here")
    for spec in STAGES.values():  # one --<stage>-width per fan-out stage of the table
        if spec.run_part is not None:
            run.add_argument(f"--{spec.name}-width", type=int, default=1, metavar="N",
                             help=f"{spec.name} workers in parallel (the pipeline's ParallelFor width; default 1)")
    run.add_argument("--param", action="append", default=[], metavar="NAME=VALUE",
                     help="another pipeline parameter, as in the KFP UI, e.g. --param "
                          "'pretrain_config_overrides=[\"train.steps=3\"]' (values parse as JSON when they can)")

    stage = sub.add_parser("stage", **subcommand_help(
        "stage", "run one stage directly (reusing committed upstream outputs)"))
    stage.add_argument("name", choices=list(STAGES))
    _add_config_args(stage)
    _add_store_args(stage)
    stage.add_argument("--force", action="store_true",
                       help="recompute even if the output is committed (a fan-out stage: every part, in this process)")
    stage.add_argument("--input", action="append", default=[], metavar="STAGE=URI",
                       help="use this committed output as an input instead of finding it by content address")
    stage.add_argument("--parent-run-id", default="", help="MLflow parent run to attach the stage run to")
    stage.add_argument("--json", help="write the stage outcome JSON here")
    stage.add_argument("--parts", type=int, default=1, help="fan-out stages: number of workers (default 1)")
    stage.add_argument("--part", type=int, help="fan-out stages: run only this worker (0..parts-1), no collect")

    from fourm_kfp.cluster.job_spec import JOB_STAGES
    from fourm_kfp.launchers.torchx_job import CREDENTIALS_SECRET, SCHEDULERS

    launch = sub.add_parser("launch", **subcommand_help(
        "launch", "run pretrain or train-tokenizers as a torchx dist.ddp job (local_cwd, slurm, kubernetes), "
                  "without Kubeflow",
        description="Plan first (a committed output is reported, nothing is launched; the inputs must be "
                    "committed), then run 'fourm-kfp stage STAGE' under torchrun in every replica of torchx's "
                    "dist.ddp on the scheduler, stream replica 0's log, wait, and print the stage outcome JSON.\n\n"
                    "Needs torchx, which pip cannot install beside kfp with its dependencies (torchx pins "
                    "urllib3<1.27, kfp urllib3 2): pip install 'fourm-kfp[launch]' && pip install --no-deps "
                    "torchx==0.7.0"))
    launch.add_argument("name", choices=list(JOB_STAGES), metavar="STAGE",
                        help=f"the stage: {' or '.join(JOB_STAGES)} (the multi-node stages)")
    _add_config_args(launch)
    _add_store_args(launch)
    launch.add_argument("--scheduler", choices=SCHEDULERS, default="local_cwd", help="torchx scheduler")
    launch.add_argument("-j", default="1x1", metavar="[MIN:]NODESxPROCS",
                        help="nodes x processes per node, as dist.ddp's -j (default 1x1)")
    launch.add_argument("--scheduler-arg", action="append", default=[], metavar="KEY=VALUE",
                        help="scheduler run config (repeatable): queue= (required) and namespace= (kubernetes), "
                             "partition=, time=, job_dir= (slurm), log_dir= (local_cwd; default <root>/torchx)")
    launch.add_argument("--image", default="", help="kubernetes: container image (default: the GPU image)")
    launch.add_argument("--cpu", type=int, default=0, help="CPUs per replica (default: 8 per GPU, 8 without GPUs)")
    launch.add_argument("--gpu", type=int, default=0, help="GPUs per replica (default 0)")
    launch.add_argument("--mem-mb", type=int, default=0,
                        help="memory per replica in MB (default: 65536 per GPU, 32768 without GPUs); on kubernetes "
                             "the container's limit, requesting 1024 MB less (torchx's reserve for the node)")
    launch.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                        help="environment of the replicas (repeatable; local_cwd and slurm replicas also inherit "
                             "this process's); kubernetes pods get no credentials from here (--credentials-secret)")
    launch.add_argument("--credentials-secret", default=CREDENTIALS_SECRET, metavar="SECRET",
                        help="kubernetes: the Secret the pods read AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (and "
                             "MLFLOW_TRACKING_TOKEN where it holds one) from, by reference; credentials given with "
                             f"--env or set here are never copied into the job (default {CREDENTIALS_SECRET}, the one "
                             "manifests/base creates)")
    launch.add_argument("--toleration", action="append", default=[], metavar="JSON",
                        help="kubernetes: a toleration of the pods (repeatable), a JSON toleration object or a JSON "
                             "list of them as the pipeline's pretrain_tolerations; pods requesting GPUs tolerate "
                             "nvidia.com/gpu:NoSchedule anyway")
    launch.add_argument("--node-selector", action="append", default=[], metavar="KEY=VALUE",
                        help="kubernetes: a node label the pods require (repeatable)")
    launch.add_argument("--image-pull-secret", default="", metavar="SECRET",
                        help="kubernetes: the kubernetes.io/dockerconfigjson Secret the pods pull the image with")
    launch.add_argument("--rdzv-port", type=int, default=0,
                        help="rendezvous port (default: a free one for local_cwd, else derived from the address)")
    launch.add_argument("--force", action="store_true", help="recompute even if the output is committed")
    launch.add_argument("--input", action="append", default=[], metavar="STAGE=URI",
                        help="use this committed output as an input instead of finding it by content address")
    launch.add_argument("--json", help="write the stage outcome JSON here")

    status = sub.add_parser("status", **subcommand_help(
        "status", "print each stage's address and whether it is committed; runs nothing"))
    _add_config_args(status)
    _add_store_args(status)
    status.add_argument("--json", action="store_true", help="print the plan as JSON")

    verify = sub.add_parser("verify", **subcommand_help(
        "verify", "recompute a committed stage into a scratch store and compare it file by file",
        description="Hash the committed payload of STAGE against its manifest, recompute the stage from the same "
                    "committed inputs into a scratch store (lineage off: nothing is registered), and compare "
                    "each payload file. Exit status: 0 the same bytes, 1 a difference (listed), 2 a user error."))
    verify.add_argument("name", choices=list(STAGES), metavar="STAGE")
    _add_config_args(verify)
    _add_store_args(verify)
    verify.add_argument("--scratch", help="where to recompute (a local folder or s3:// URI; default: a temporary "
                                          "folder, deleted afterwards)")
    verify.add_argument("--json", help="write the result JSON here")

    generate = sub.add_parser("generate", **subcommand_help(
        "generate", "any-to-any generation with a trained model (from its URI)"))
    generate.add_argument("--model", required=True, help="a pretrain output URI (local path or s3://...)")
    generate.add_argument("--from", dest="inputs", action="append", default=[], metavar="MODALITY=VALUE",
                          help="an input: an image file for rgb/depth/normal/semseg/edge, a text file or the text "
                               "itself for caption/det (repeatable; none = unconditional)")
    generate.add_argument("--to", required=True, help="comma-separated targets, generated in order (a chain: "
                                                      "each output joins the inputs of the next)")
    generate.add_argument("--out", required=True, help="folder for the outputs (files per target, generate.json)")
    generate.add_argument("--steps", type=int, default=8, help="image targets: MaskGIT/ROAR steps (default 8)")
    generate.add_argument("--order", choices=("maskgit", "roar"), default="maskgit")
    generate.add_argument("--schedule", choices=("cosine", "linear"), default="cosine")
    generate.add_argument("--temperature", type=float, default=0.0, help="0 (default) = most likely tokens")
    generate.add_argument("--top-k", type=int, default=0)
    generate.add_argument("--top-p", type=float, default=1.0)
    generate.add_argument("--guidance", type=float, default=1.0, help="classifier-free guidance (1 = off)")
    generate.add_argument("--seed", type=int, default=0)
    generate.add_argument("--device", help="cpu, cuda, ... (default: cuda when available)")
    generate.add_argument("--s3-endpoint", help="S3 endpoint URL (default: $AWS_ENDPOINT_URL)")

    export = sub.add_parser("export", **subcommand_help(
        "export", "write a trained model in another format (apple/ml-4m's FM folder)"))
    export.add_argument("model", metavar="MODEL_DIR", help="a pretrain output URI (local path or s3://...)")
    export.add_argument("out", metavar="OUT", help="the folder to write (local path or s3://...)")
    export.add_argument("--format", choices=("ml4m",), default="ml4m",
                        help="ml4m: config.json + model.safetensors that ml-4m's FM.from_pretrained loads")
    export.add_argument("--s3-endpoint", help="S3 endpoint URL (default: $AWS_ENDPOINT_URL)")

    from fourm_kfp.pipeline_runs.run_outcome import EXIT_CODES

    submit = sub.add_parser("submit", **subcommand_help(
        "submit", "run the pipeline on a Kubeflow Pipelines server (optionally wait for it)",
        description="Upload the compiled pipeline (a new version when it exists), create a run in an experiment "
                    "with the preset, overrides and stage parameters, and print its UI link. --wait follows it to "
                    "the end and reports the stages and the model gate; --schedule creates a recurring run.\n\n"
                    "Auth: a bearer token from $KFP_TOKEN, else the service-account token file KFP mounts in a pod "
                    "($KF_PIPELINES_SA_TOKEN_PATH or /var/run/secrets/kubeflow/pipelines/token), re-read per request; "
                    "--namespace is the Kubeflow profile namespace of a multi-user install.",
        epilog="exit status:\n" + "\n".join(f"  {code}  {what}" for code, what in sorted(EXIT_CODES.items()))))
    _add_config_args(submit)
    # --endpoint and -n as the kfp CLI spells them (kfp/cli/cli.py: --endpoint, -n/--namespace).
    submit.add_argument("--host", "--endpoint", dest="host", default=None,
                        help="KFP API endpoint, e.g. https://kubeflow.example.com/pipeline (default: $KFP_HOST)")
    submit.add_argument("-n", "--namespace", default="", help="Kubeflow profile namespace (multi-user installs)")
    submit.add_argument("--no-doctor", action="store_true",
                        help="skip the preflight check (fourm-kfp doctor) that otherwise runs before anything is "
                             "created and refuses to submit when a check fails")
    _add_doctor_args(submit)
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

    doctor = sub.add_parser("doctor", **subcommand_help(
        "doctor", "check the cluster a run will use (KFP version, CRDs, RBAC, Secrets, runtimes, Kueue, S3, "
                  "MLflow) before any GPU is held; creates nothing",
        description="One line per check: ok, warn, skipped (with why) or FAIL (with the object and the command that "
                    "fixes it). Nothing is created in the cluster; one test object is written to the S3 store and "
                    "deleted. submit runs the same checks first (--no-doctor skips them).",
        epilog="exit status:\n  0  no check failed\n  2  a check failed (as submit's user error: nothing started)"))
    _add_config_args(doctor)
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
    _add_doctor_args(doctor)
    doctor.add_argument("--json", action="store_true", help="print the checks as JSON")

    ui = sub.add_parser("ui", **subcommand_help(
        "ui", "serve the MLflow UI on a run folder's store (needs the 'ui' extra: make ui)"))
    ui.add_argument("--root", default="runs/demo", help="run folder whose mlflow.db to show (default runs/demo)")
    ui.add_argument("--mlflow-tracking-uri", help="a tracking store instead of <root>/mlflow.db")
    ui.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    ui.add_argument("--port", type=int, default=5000, help="port (default 5000)")

    compile_ = sub.add_parser("compile", **subcommand_help("compile", "compile the KFP pipeline to YAML"))
    compile_.add_argument("--output", help="default: fourm_pretrain.yaml beside the pipeline definition")
    compile_.add_argument("--image-tag", default="",
                          help="tag of the images the steps and their jobs run, e.g. the commit the image workflow "
                               "built (default: the package version, or $FOURM_IMAGE_TAG)")

    teachers = sub.add_parser("teachers", **subcommand_help(
        "teachers", "list the label stage's teachers, where their weights are and where each pinned hub commit "
                    "was seen in public; print the commands that fetch the missing model folders"))
    _add_config_args(teachers)

    config = sub.add_parser("config", **subcommand_help(
        "config", "print the resolved config (or --describe every field)"))
    _add_config_args(config)
    config.add_argument("--describe", action="store_true",
                        help="list every config key with its type, accepted values, default and doc")

    from fourm_kfp.cli_completion import SHELLS

    completion = sub.add_parser("completion", **subcommand_help("completion", "print a shell completion script"))
    completion.add_argument("shell", choices=SHELLS)
    return parser


def _package_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("fourm-kfp")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown (not installed)"


def _widths(args: argparse.Namespace) -> dict[str, int]:
    """The ``<stage>_width`` pipeline parameters of the fan-out stages, from ``--<stage>-width``."""
    from fourm_kfp.contract.spec import param_prefix
    from fourm_kfp.stages import STAGES

    return {f"{param_prefix(name)}_width": getattr(args, f"{param_prefix(name)}_width")
            for name, spec in STAGES.items() if spec.run_part is not None}


def cmd_run(args: argparse.Namespace) -> int:
    from fourm_kfp.console import closing_summary
    from fourm_kfp.pipeline_runs.local import PipelineFailed, run_pipeline_locally

    try:
        summary = run_pipeline_locally(args.preset, args.root, store=args.store, s3_endpoint=args.s3_endpoint,
                                       overrides=args.overrides, force=args.force,
                                       tracking_uri=args.mlflow_tracking_uri, summary_path=args.summary,
                                       pipeline_arguments={**_widths(args), **_typed_parameters(args.param)})
    except PipelineFailed as exc:
        print(closing_summary(exc.summary))
        print(f"Error: {exc}", file=sys.stderr)
        return 1
    print(closing_summary(summary))
    return 0


def _pairs(items: list[str], flag: str, shape: str = "KEY=VALUE", empty_ok: bool = False) -> dict[str, str]:
    """``--flag KEY=VALUE`` arguments as a dict; a malformed one is a user error naming the flag."""
    from fourm_kfp.config.schema import ConfigError

    pairs = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key or not (value or empty_ok):
            raise ConfigError(f"{flag} {item!r}: expected {shape}")
        pairs[key] = value
    return pairs


def _typed_parameters(items: list[str]) -> dict[str, Any]:
    """``--param NAME=VALUE`` for a local run: the value as JSON when it parses (numbers, booleans, lists, objects),
    else text (``submit`` sends the text and the server types it by the compiled pipeline)."""
    parameters: dict[str, Any] = {}
    for name, text in _pairs(items, "--param", "NAME=VALUE", empty_ok=True).items():
        try:
            parameters[name] = json.loads(text)
        except json.JSONDecodeError:
            parameters[name] = text
    return parameters


def _input_uris(items: list[str]) -> dict[str, str]:
    return _pairs(items, "--input", "STAGE=URI")


def _run_context(args: argparse.Namespace, root: Path):
    """The run a stage command describes: ``--preset``/``--set``, the store, lineage (``--parent-run-id`` where the
    command has it)."""
    from fourm_kfp.launchers.stage import RunContext, resolve_store_uri

    return RunContext(args.preset, args.overrides, resolve_store_uri(root, args.store, args.s3_endpoint),
                      args.s3_endpoint or "", args.mlflow_tracking_uri or "", getattr(args, "parent_run_id", "") or "")


def cmd_stage(args: argparse.Namespace) -> int:
    from fourm_kfp import distributed
    from fourm_kfp.launchers.stage import launch_stage, launch_stage_part, local_root

    root = local_root(args.root)
    run, inputs = _run_context(args, root), _input_uris(args.input)
    if args.part is not None and args.force:
        from fourm_kfp.config.schema import ConfigError

        raise ConfigError(f"--force with --part: a worker never clears {args.name}'s output (the other workers' parts "
                          f"are in it); `stage {args.name} --force --parts N` recomputes every part in this process, "
                          f"`run --force {args.name} --{args.name}-width N` in N workers")
    if args.part is not None:
        result: Any = launch_stage_part(args.name, run, args.part, args.parts, root=root, input_uris=inputs)
    else:
        result = launch_stage(args.name, run, root=root, force=args.force, input_uris=inputs,
                              parts=args.parts).to_dict()
    if not distributed.is_primary():
        return 0  # under torchrun, rank 0 reports for all
    text = json.dumps(result, indent=2)
    if args.json:
        Path(args.json).write_text(text + "\n")
    print(text)
    return 0


def cmd_launch(args: argparse.Namespace) -> int:
    from fourm_kfp.launchers.stage import local_root
    from fourm_kfp.launchers.torchx_job import TorchxParams, launch_torchx, tolerations_from_json

    env = _pairs(args.env, "--env", empty_ok=True)
    root = local_root(args.root)
    params = TorchxParams(scheduler=args.scheduler, j=args.j, scheduler_args=args.scheduler_arg, image=args.image,
                          cpu=args.cpu, gpu=args.gpu, mem_mb=args.mem_mb, env=env, rdzv_port=args.rdzv_port,
                          credentials_secret=args.credentials_secret,
                          tolerations=tolerations_from_json(args.toleration),
                          node_selector=_pairs(args.node_selector, "--node-selector"),
                          image_pull_secret=args.image_pull_secret)
    outcome = launch_torchx(args.name, _run_context(args, root), root=root, force=args.force,
                              input_uris=_input_uris(args.input), params=params)
    text = json.dumps(outcome.to_dict(), indent=2)
    if args.json:
        Path(args.json).write_text(text + "\n")
    print(text)
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    from fourm_kfp.contract.planning import plan_stages
    from fourm_kfp.launchers.stage import local_root, open_run
    from fourm_kfp.stages import PIPELINE

    config, store = open_run(_run_context(args, local_root(args.root)), create=False)
    plan = plan_stages(PIPELINE, config, store)
    if args.json:
        print(json.dumps([p.to_dict() for p in plan], indent=2))
        return 0
    print(f"{'stage':18s} {'address':16s}  {'state':9s} {'mlflow run':32s}  output")
    for p in plan:
        state = "off" if p.off else "committed" if p.committed else "to run"
        print(f"{p.name:18s} {p.address or '-':16s}  {state:9s} {p.mlflow_run_id or '-':32s}  {p.output_uri or '-'}")
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    import tempfile

    from fourm_kfp.contract.verify import verify_stage
    from fourm_kfp.launchers.stage import local_root, open_run, setup_logging
    from fourm_kfp.stages import get_stage
    from fourm_kfp.storage import open_store

    setup_logging()
    config, store = open_run(_run_context(args, local_root(args.root)), create=False)
    with tempfile.TemporaryDirectory(prefix="fourm-verify-") as tmp:
        scratch = open_store(args.scratch or tmp, s3_endpoint=args.s3_endpoint, create=True)
        result = verify_stage(get_stage(args.name), config, store, scratch)
    if args.json:
        Path(args.json).write_text(json.dumps(result.to_dict(), indent=2) + "\n")
    print(f"{result.stage}: committed {result.committed_uri} ({result.files} payload files)")
    print(f"  payload digest  committed  {result.payload_digest or '-'}")
    print(f"                  recomputed {result.recomputed_payload_digest}")
    for key, how in result.differences:
        print(f"  {how:8s} {key}")
    if result.inputs_changed:
        print(f"  note: its inputs {result.inputs_changed} were recommitted since; differences may come from them")
    if not result.deterministic:
        print(f"  note: the committed output is marked not deterministic: {'; '.join(result.nondeterminism)}")
    if result.matches:
        print("  verified: the same bytes, file by file")
        return 0
    print(f"  NOT verified: {len(result.differences)} of {result.files} payload files differ "
          f"(first: {result.differences[0][0]})")
    return 1


def cmd_generate(args: argparse.Namespace) -> int:
    from fourm_kfp.errors import UserError
    from fourm_kfp.evaluation.any_to_any import run_generate
    from fourm_kfp.launchers.stage import apply_s3_endpoint
    from fourm_kfp.model.generation import SamplingArgs

    apply_s3_endpoint(args.s3_endpoint)
    inputs = _pairs(args.inputs, "--from", "MODALITY=VALUE")
    targets = [t.strip() for t in args.to.split(",") if t.strip()]
    try:
        sampling = SamplingArgs(steps=args.steps, order=args.order, schedule=args.schedule,
                                temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                                guidance=args.guidance)
        summary = run_generate(args.model, inputs, targets, args.out, sampling, args.seed, args.device)
    except (ValueError, FileNotFoundError) as exc:
        raise UserError(str(exc)) from exc
    for name, paths in summary["written"].items():
        shown = f" \"{summary['text'][name]}\"" if name in summary["text"] else ""
        print(f"{name}: {', '.join(paths)}{shown}")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from fourm_kfp.errors import UserError
    from fourm_kfp.launchers.stage import apply_s3_endpoint
    from fourm_kfp.model.ml4m import Ml4mError, export_ml4m
    from fourm_kfp.model.saved_model import load_model

    apply_s3_endpoint(args.s3_endpoint)
    model, card = load_model(args.model)
    try:
        config = export_ml4m(model, args.out, card=card)
    except Ml4mError as exc:
        raise UserError(f"{args.model}: {exc}") from exc
    print(f"{args.out}: ml-4m model, domains in {', '.join(config['domains_in'])}; out "
          f"{', '.join(config['domains_out'])} (FM.from_pretrained({args.out!r}))")
    return 0


def cmd_submit(args: argparse.Namespace) -> int:
    import os

    import signal

    from fourm_kfp.pipeline_runs.run_report import report
    from fourm_kfp.pipeline_runs.run_outcome import SubmitRequest
    from fourm_kfp.pipeline_runs.submit import attach, submit
    from fourm_kfp.launchers.stage import setup_logging

    setup_logging()
    host = args.host or os.environ.get("KFP_HOST", "")
    if not host:
        from fourm_kfp.errors import UserError

        raise UserError("--host (or $KFP_HOST): the KFP API endpoint to submit to")
    request = SubmitRequest(host=host, preset=args.preset, overrides=args.overrides,
                            parameters=_pairs(args.param, "--param", "NAME=VALUE", empty_ok=True),
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


def _doctor_request(args: argparse.Namespace, host: str, parameters: dict[str, Any], tracking_uri: str = "",
                    s3_endpoint: str = ""):
    from fourm_kfp.pipeline_runs.doctor import DoctorRequest, run_parameters

    return DoctorRequest(namespace=args.namespace, service_account=args.service_account,
                         parameters=run_parameters(parameters), host=host, s3_endpoint=s3_endpoint,
                         tracking_uri=tracking_uri)


def cmd_doctor(args: argparse.Namespace) -> int:
    import os

    from fourm_kfp.pipeline_runs import doctor
    from fourm_kfp.config.loader import load_config
    from fourm_kfp.errors import UserError
    from fourm_kfp.pipeline_runs.kfp_api import (coerce_parameters, kfp_api_errors, make_client,
                                                 pipeline_parameter_types)
    from fourm_kfp.pipeline_runs.submit import pipeline_package

    load_config(args.preset, overrides=args.overrides)  # a bad config fails here, as submit's does
    host = args.host or os.environ.get("KFP_HOST", "")
    parameters = coerce_parameters(_pairs(args.param, "--param", "NAME=VALUE", empty_ok=True),
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


def cmd_ui(args: argparse.Namespace) -> int:
    """Exec the full MLflow's server on the run folder's store (mlflow-skinny, which the stages use, has no UI)."""
    import os
    import shutil

    from fourm_kfp.contract import lineage
    from fourm_kfp.errors import UserError
    from fourm_kfp.launchers.stage import local_root

    root = local_root(args.root)
    tracking = args.mlflow_tracking_uri or lineage.default_tracking_uri(root)
    if not args.mlflow_tracking_uri and not (root / "mlflow.db").is_file():
        raise UserError(f"--root {root}: no mlflow.db there; run the pipeline first (make demo) or name the store "
                        "with --mlflow-tracking-uri")
    from importlib.metadata import PackageNotFoundError, version

    try:
        version("mlflow")  # the full package: mlflow-skinny's `mlflow ui` serves no UI ("index.html not found")
    except PackageNotFoundError:
        raise UserError("the MLflow UI needs the full mlflow package: make ui (or pip install -e '.[ui]')") from None
    exe = Path(sys.executable).parent / "mlflow"
    argv, env = ui_server_command(str(exe) if exe.exists() else shutil.which("mlflow") or "mlflow", tracking,
                                  args.host, args.port)
    address = f"http://{args.host}:{args.port}/"
    print(f"MLflow UI on {address} for {tracking} (Ctrl-C stops it)", flush=True)
    print(f"runs:                {address}{lineage.experiment_page(tracking)}", flush=True)
    latest = lineage.latest_pipeline_run(tracking)
    if latest:
        print(f"newest pipeline run: {address}{lineage.run_page(tracking, latest)}", flush=True)
    os.execve(argv[0], argv, env)
    return 0  # not reached


def ui_server_command(mlflow: str, tracking: str, host: str, port: int) -> tuple[list[str], dict[str, str]]:
    """The MLflow server's command and environment for one person's browser: one web worker (MLflow's default
    starts four) and no background job consumers (MLflow 3 starts several for GenAI jobs this store never has)."""
    import os

    argv = [mlflow, "ui", "--backend-store-uri", tracking, "--host", host, "--port", str(port), "--workers", "1"]
    return argv, {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}


def cmd_compile(args: argparse.Namespace) -> int:
    from fourm_kfp.pipeline_runs.compile import compile_pipeline

    output = compile_pipeline(args.output, image_tag=args.image_tag)
    print(f"wrote {output}")
    return 0


def cmd_teachers(args: argparse.Namespace) -> int:
    """Each labeler of ``label.labelers`` with its weights, and under it each hub commit it pins (its ``source``, or
    ``hf://`` weights) with where that commit was seen in public (:mod:`fourm_kfp.labelers.hub_pins`); for a model
    folder that is missing and names its ``source``, the command that fetches it (exit status 1 when any is
    missing)."""
    from fourm_kfp.config.loader import load_config
    from fourm_kfp.labelers.base import LabelerError
    from fourm_kfp.labelers.hub_pins import hub_addresses, pin_source
    from fourm_kfp.labelers.registry import labeler_class
    from fourm_kfp.labelers.weights import check_local_folder, fetch_command

    config = load_config(args.preset, overrides=args.overrides)
    missing = []
    for i, entry in enumerate(config.label.labelers):
        where, state = f"label.labelers[{i}]", ""
        if labeler_class(entry.name).weights_kind == "folder":
            try:
                check_local_folder(entry.weights, entry.source, where)
            except LabelerError:
                state = "  MISSING"
                missing.append(fetch_command(entry.source, entry.weights, where) if entry.source
                               else f"# {where}: {entry.weights} (no source: copy the folder there)")
        print(f"{where:20s} {entry.name:18s} {entry.weights or '-'}{state}")
        for uri in hub_addresses(entry.weights, entry.source):
            seen = pin_source(uri, where)
            trace = f"seen in {seen.where}: {seen.what}" if seen else "no public trace of this commit is recorded"
            print(f"{'':20s} pinned {uri}\n{'':22s} {trace}")
    if missing:
        print("\n# fetch the missing model folders:\n" + "\n".join(missing))
    return 1 if missing else 0


def cmd_config(args: argparse.Namespace) -> int:
    from fourm_kfp.config.fourm_config import SECTIONS
    from fourm_kfp.config.loader import load_config
    from fourm_kfp.config.schema import describe, to_dict

    if args.describe:
        for section, cls in SECTIONS.items():
            for field in describe(cls, f"{section}."):
                choices = f"  one of {', '.join(map(str, field.choices))}" if field.choices else ""
                print(f"{field.key}  ({field.type}, default {field.default}){choices}\n    {field.doc}")
        return 0
    print(yaml.safe_dump(to_dict(load_config(args.preset, overrides=args.overrides)), sort_keys=False), end="")
    return 0


def cmd_completion(args: argparse.Namespace) -> int:
    from fourm_kfp.cli_completion import completion_script

    print(completion_script(build_parser(), args.shell), end="")
    return 0


def main(argv: list[str] | None = None) -> int:
    from fourm_kfp.errors import UserError

    args = build_parser().parse_args(argv)
    handler = {"run": cmd_run, "stage": cmd_stage, "launch": cmd_launch, "status": cmd_status, "compile": cmd_compile,
               "config": cmd_config, "generate": cmd_generate, "export": cmd_export, "verify": cmd_verify,
               "submit": cmd_submit, "doctor": cmd_doctor, "ui": cmd_ui, "teachers": cmd_teachers,
               "completion": cmd_completion}[args.command]
    try:
        return handler(args)
    except UserError as exc:
        if args.debug:
            traceback.print_exc()
        print(f"Error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
