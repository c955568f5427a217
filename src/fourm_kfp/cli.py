"""The ``fourm-kfp`` command: run the pipeline locally, run one stage, compile the pipeline, show configs."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import yaml



def _add_config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--preset", default="smoke", help="named config preset (smoke, demo, 4m-b); default smoke")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override a config value (repeatable), e.g. --set data.image_size=96")


def _add_store_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--root", required=True, help="local run folder: MLflow store (mlflow.db), KFP pipeline root, "
                   "and the default output store")
    p.add_argument("--store", help="root URI of stage outputs (default: --root, or s3://fourm-kfp with --s3-endpoint)")
    p.add_argument("--s3-endpoint", help="S3 endpoint URL (default: $AWS_ENDPOINT_URL); credentials come from "
                   "$AWS_ACCESS_KEY_ID / $AWS_SECRET_ACCESS_KEY")
    p.add_argument("--mlflow-tracking-uri", help="default: $MLFLOW_TRACKING_URI, else sqlite:///<root>/mlflow.db")


def build_parser() -> argparse.ArgumentParser:
    from fourm_kfp.stages import STAGES

    parser = argparse.ArgumentParser(prog="fourm-kfp", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run the whole pipeline locally through kfp.local")
    _add_config_args(run)
    _add_store_args(run)
    run.add_argument("--force", action="append", default=[], choices=list(STAGES), metavar="STAGE",
                     help="recompute this stage even if its output is committed (repeatable)")
    run.add_argument("--summary", help="write the run summary JSON here")

    stage = sub.add_parser("stage", help="run one stage directly (reusing committed upstream outputs)")
    stage.add_argument("name", choices=list(STAGES))
    _add_config_args(stage)
    _add_store_args(stage)
    stage.add_argument("--force", action="store_true", help="recompute even if the output is committed")
    stage.add_argument("--input", action="append", default=[], metavar="STAGE=URI",
                       help="use this committed output as an input instead of finding it by content address")
    stage.add_argument("--parent-run-id", default="", help="MLflow parent run to attach the stage run to")
    stage.add_argument("--json", help="write the stage outcome JSON here")

    compile_ = sub.add_parser("compile", help="compile the KFP pipeline to YAML")
    compile_.add_argument("--output", help="default: fourm_pretrain.yaml beside the pipeline definition")

    config = sub.add_parser("config", help="print the resolved config (or --describe every field)")
    _add_config_args(config)
    config.add_argument("--describe", action="store_true", help="list every config key with its type and doc")
    return parser


def cmd_run(args: argparse.Namespace) -> int:
    from fourm_kfp.local_run import PipelineFailed, run_pipeline_locally

    try:
        summary = run_pipeline_locally(args.preset, args.root, store=args.store, s3_endpoint=args.s3_endpoint,
                                       overrides=args.overrides, force=args.force,
                                       tracking_uri=args.mlflow_tracking_uri, summary_path=args.summary)
    except PipelineFailed as exc:
        print(json.dumps(exc.summary, indent=2))
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(summary, indent=2))
    return 0


def cmd_stage(args: argparse.Namespace) -> int:
    from fourm_kfp import distributed, lineage
    from fourm_kfp.config.loader import load_config
    from fourm_kfp.config.schema import ConfigError
    from fourm_kfp.kfp_runtime import setup_logging
    from fourm_kfp.local_run import default_store
    from fourm_kfp.stage_runner import run_stage
    from fourm_kfp.stages import get_stage
    from fourm_kfp.storage import open_store

    setup_logging()
    distributed.init_from_env()  # under torchrun: every rank runs the stage, rank 0 commits
    inputs = {}
    for item in args.input:
        name, sep, uri = item.partition("=")
        if not sep:
            raise ConfigError(f"--input {item!r}: expected STAGE=URI")
        inputs[name] = uri
    root = Path(args.root).resolve()
    config = load_config(args.preset, overrides=args.overrides)
    store = open_store(args.store or default_store(root, args.s3_endpoint), s3_endpoint=args.s3_endpoint, create=True)
    outcome = run_stage(get_stage(args.name), config, store, force=args.force, input_uris=inputs,
                        tracking_uri=lineage.resolve_tracking_uri(args.mlflow_tracking_uri, root),
                        parent_run_id=args.parent_run_id or None)
    text = json.dumps(outcome.to_dict(), indent=2)
    if args.json and distributed.is_primary():
        Path(args.json).write_text(text + "\n")
    print(text)
    return 0


def cmd_compile(args: argparse.Namespace) -> int:
    from fourm_kfp.pipeline_compiler import compile_pipeline

    output = compile_pipeline(args.output)
    print(f"wrote {output}")
    return 0


def cmd_config(args: argparse.Namespace) -> int:
    from fourm_kfp.config.fourm_config import SECTIONS
    from fourm_kfp.config.loader import load_config
    from fourm_kfp.config.schema import describe, to_dict

    if args.describe:
        for section, cls in SECTIONS.items():
            for key, type_name, doc in describe(cls, f"{section}."):
                print(f"{key:40s} {type_name:24s} {doc}")
        return 0
    print(yaml.safe_dump(to_dict(load_config(args.preset, overrides=args.overrides)), sort_keys=False), end="")
    return 0


def main(argv: list[str] | None = None) -> int:
    from fourm_kfp.config.schema import ConfigError
    from fourm_kfp.manifest import IncompleteOutputError
    from fourm_kfp.storage import StorageError

    args = build_parser().parse_args(argv)
    handler = {"run": cmd_run, "stage": cmd_stage, "compile": cmd_compile, "config": cmd_config}[args.command]
    try:
        return handler(args)
    except (ConfigError, StorageError, IncompleteOutputError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
