"""Commands that run stages on this machine or in a torchx job, and the two that look at a run's stages without
running the pipeline: ``run`` (the whole pipeline through kfp.local), ``stage`` (one stage in this process),
``launch`` (a multi-node stage as a torchx dist.ddp job), ``status`` (the plan: each stage's address and whether it
is committed) and ``verify`` (recompute a committed stage and compare)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from fourm_kfp.cli.help_text import add_command
from fourm_kfp.cli.options import RUN_OPTIONS, pairs
from fourm_kfp.stages import STAGES


# ------------------------------------------------------------------------------------------------------------ run

def _add_run(commands: argparse._SubParsersAction) -> None:
    run = add_command(
        commands, "run", cmd_run, "run the whole pipeline locally through kfp.local",
        ["fourm-kfp run --preset demo --root runs/demo",
         "fourm-kfp run --preset smoke --root runs/smoke --set train.steps=20 --force pretrain"], shared=RUN_OPTIONS)
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


def cmd_run(args: argparse.Namespace) -> int:
    """Run the whole pipeline (prepare-data, label, train-tokenizers, pretokenize, pretrain, evaluate) on this machine
    through kfp.local. A stage whose output is committed under its content address is reused, not recomputed
    (--force recomputes it). The outputs go to --store (default: --root), the lineage to MLflow."""
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


def _widths(args: argparse.Namespace) -> dict[str, int]:
    """The ``<stage>_width`` pipeline parameters of the fan-out stages, from ``--<stage>-width``."""
    from fourm_kfp.contract.spec import param_prefix
    return {f"{param_prefix(name)}_width": getattr(args, f"{param_prefix(name)}_width")
            for name, spec in STAGES.items() if spec.run_part is not None}


def _typed_parameters(items: list[str]) -> dict[str, Any]:
    """``--param NAME=VALUE`` for a local run: the value as JSON when it parses (numbers, booleans, lists, objects),
    else text (``submit`` sends the text and the server types it by the compiled pipeline)."""
    parameters: dict[str, Any] = {}
    for name, text in pairs(items, "--param", "NAME=VALUE", empty_ok=True).items():
        try:
            parameters[name] = json.loads(text)
        except json.JSONDecodeError:
            parameters[name] = text
    return parameters


# ---------------------------------------------------------------------------------------------------------- stage

def _add_stage(commands: argparse._SubParsersAction) -> None:
    stage = add_command(
        commands, "stage", cmd_stage, "run one stage directly (reusing committed upstream outputs)",
        ["fourm-kfp stage prepare-data --preset smoke --root runs/smoke",
         "fourm-kfp stage pretrain --preset smoke --root runs/smoke --force --json outcome.json"], shared=RUN_OPTIONS)
    stage.add_argument("name", choices=list(STAGES))
    stage.add_argument("--force", action="store_true",
                       help="recompute even if the output is committed (a fan-out stage: every part, in this process)")
    stage.add_argument("--input", action="append", default=[], metavar="STAGE=URI",
                       help="use this committed output as an input instead of finding it by content address")
    stage.add_argument("--parent-run-id", default="", help="MLflow parent run to attach the stage run to")
    stage.add_argument("--json", help="write the stage outcome JSON here")
    stage.add_argument("--parts", type=int, default=1, help="fan-out stages: number of workers (default 1)")
    stage.add_argument("--part", type=int, help="fan-out stages: run only this worker (0..parts-1), no collect")


def cmd_stage(args: argparse.Namespace) -> int:
    """Run one stage in this process, reading its inputs from the committed outputs of the stages before it (found
    by content address, or named with --input), and print its outcome as JSON. Fan-out stages run every part here,
    or one with --parts/--part."""
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


def _input_uris(items: list[str]) -> dict[str, str]:
    return pairs(items, "--input", "STAGE=URI")


def _run_context(args: argparse.Namespace, root: Path):
    """The run a stage command describes: ``--preset``/``--set``, the store, lineage (``--parent-run-id`` where the
    command has it)."""
    from fourm_kfp.launchers.stage import RunContext, resolve_store_uri

    return RunContext(args.preset, args.overrides, resolve_store_uri(root, args.store, args.s3_endpoint),
                      args.s3_endpoint or "", args.mlflow_tracking_uri or "", getattr(args, "parent_run_id", "") or "")


# --------------------------------------------------------------------------------------------------------- launch

def _add_launch(commands: argparse._SubParsersAction) -> None:
    from fourm_kfp.cluster.job_spec import JOB_STAGES
    from fourm_kfp.launchers.torchx_job import CREDENTIALS_SECRET, SCHEDULERS

    launch = add_command(
        commands, "launch", cmd_launch,
        "run pretrain or train-tokenizers as a torchx dist.ddp job (local_cwd, slurm, kubernetes), without Kubeflow",
        ["fourm-kfp launch pretrain --preset smoke --root runs/smoke -j 1x2",
         "fourm-kfp launch pretrain --preset 4m-b --root runs/4m-b --store s3://fourm-kfp --scheduler kubernetes "
         "-j 2x8 --gpu 8 --scheduler-arg queue=default --scheduler-arg namespace=team"],
        shared=RUN_OPTIONS)
    launch.add_argument("name", choices=list(JOB_STAGES), metavar="STAGE",
                        help=f"the stage: {' or '.join(JOB_STAGES)} (the multi-node stages)")
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


def cmd_launch(args: argparse.Namespace) -> int:
    """Plan first (a committed output is reported, nothing is launched; the inputs must be committed), then run
    'fourm-kfp stage STAGE' under torchrun in every replica of torchx's dist.ddp on the scheduler, stream replica 0's
    log, wait, and print the stage outcome JSON.

    Needs torchx, which pip cannot install beside kfp with its dependencies (torchx pins urllib3<1.27, kfp urllib3
    2): pip install 'fourm-kfp[launch]' && pip install --no-deps torchx==0.7.0"""
    from fourm_kfp.launchers.stage import local_root
    from fourm_kfp.launchers.torchx_job import TorchxParams, launch_torchx, tolerations_from_json

    env = pairs(args.env, "--env", empty_ok=True)
    root = local_root(args.root)
    params = TorchxParams(scheduler=args.scheduler, j=args.j, scheduler_args=args.scheduler_arg, image=args.image,
                          cpu=args.cpu, gpu=args.gpu, mem_mb=args.mem_mb, env=env, rdzv_port=args.rdzv_port,
                          credentials_secret=args.credentials_secret,
                          tolerations=tolerations_from_json(args.toleration),
                          node_selector=pairs(args.node_selector, "--node-selector"),
                          image_pull_secret=args.image_pull_secret)
    outcome = launch_torchx(args.name, _run_context(args, root), root=root, force=args.force,
                            input_uris=_input_uris(args.input), params=params)
    text = json.dumps(outcome.to_dict(), indent=2)
    if args.json:
        Path(args.json).write_text(text + "\n")
    print(text)
    return 0


# --------------------------------------------------------------------------------------------------------- status

def _add_status(commands: argparse._SubParsersAction) -> None:
    status = add_command(
        commands, "status", cmd_status, "print each stage's address and whether it is committed; runs nothing",
        ["fourm-kfp status --preset demo --root runs/demo",
         "fourm-kfp status --preset smoke --root runs/smoke --json"], shared=RUN_OPTIONS)
    status.add_argument("--json", action="store_true", help="print the plan as JSON")


def cmd_status(args: argparse.Namespace) -> int:
    """Print, for each stage of the preset, its content address and whether an output is committed there (with its
    MLflow run and URI). Nothing is run or written."""
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


# --------------------------------------------------------------------------------------------------------- verify

def _add_verify(commands: argparse._SubParsersAction) -> None:
    verify = add_command(
        commands, "verify", cmd_verify,
        "recompute a committed stage into a scratch store and compare it file by file",
        ["fourm-kfp verify pretokenize --preset demo --root runs/demo"], shared=RUN_OPTIONS)
    verify.add_argument("name", choices=list(STAGES), metavar="STAGE")
    verify.add_argument("--scratch", help="where to recompute (a local folder or s3:// URI; default: a temporary "
                                          "folder, deleted afterwards)")
    verify.add_argument("--json", help="write the result JSON here")


def cmd_verify(args: argparse.Namespace) -> int:
    """Hash the committed payload of STAGE against its manifest, recompute the stage from the same committed inputs
    into a scratch store (lineage off: nothing is registered), and compare each payload file. Exit status: 0 the
    same bytes, 1 a difference (listed), 2 a user error."""
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


#: This group's commands, in the order ``fourm-kfp --help`` lists them: each adds its subcommand.
COMMANDS = (_add_run, _add_stage, _add_launch, _add_status, _add_verify)
