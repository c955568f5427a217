"""Commands that show or write what a run is made of, running nothing: ``compile`` (the KFP pipeline's YAML),
``teachers`` (the label stage's teachers and their weights) and ``config`` (a preset's resolved config, or every
config key described)."""

from __future__ import annotations

import argparse

import yaml

from fourm_kfp.cli.help_text import add_command
from fourm_kfp.cli.options import add_config_options


def _add_compile(commands: argparse._SubParsersAction) -> None:
    compile_ = add_command(
        commands, "compile", cmd_compile, "compile the KFP pipeline to YAML",
        ["fourm-kfp compile --output fourm_pretrain.yaml --image-tag 0.1.0"])
    compile_.add_argument("--output", help="default: fourm_pretrain.yaml beside the pipeline definition")
    compile_.add_argument("--image-tag", default="",
                          help="tag of the images the steps and their jobs run, e.g. the commit the image workflow "
                               "built (default: the package version, or $FOURM_IMAGE_TAG)")


def cmd_compile(args: argparse.Namespace) -> int:
    """Compile the KFP pipeline to its YAML package, for the images of the package version or of --image-tag."""
    from fourm_kfp.pipeline_runs.compile import compile_pipeline

    output = compile_pipeline(args.output, image_tag=args.image_tag)
    print(f"wrote {output}")
    return 0


def _add_teachers(commands: argparse._SubParsersAction) -> None:
    teachers = add_command(
        commands, "teachers", cmd_teachers,
        "list the label stage's teachers, where their weights are and where each pinned hub commit was seen in "
        "public; print the commands that fetch the missing model folders",
        ["fourm-kfp teachers --preset photos-4m21"], shared=(add_config_options,))


def cmd_teachers(args: argparse.Namespace) -> int:
    """List each labeler of the label stage with its weights and the hub commits it pins (with where each was seen
    in public), and print the commands that fetch the missing model folders (exit status 1 when one is missing)."""
    # Each labeler of label.labelers with its weights, and under it each hub commit it pins (its source, or hf://
    # weights) with where that commit was seen in public (fourm_kfp.labelers.hub_pins); for a model folder that is
    # missing and names its source, the command that fetches it.
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


def _add_config(commands: argparse._SubParsersAction) -> None:
    config = add_command(
        commands, "config", cmd_config, "print the resolved config (or --describe every field)",
        ["fourm-kfp config --preset demo --set data.image_size=96",
         "fourm-kfp config --describe"], shared=(add_config_options,))
    config.add_argument("--describe", action="store_true",
                        help="list every config key with its type, accepted values, default and doc")


def cmd_config(args: argparse.Namespace) -> int:
    """Print the resolved config of a preset with its overrides applied, as YAML; --describe lists every config key
    instead, with its type, accepted values, default and doc."""
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


#: This group's commands, in the order ``fourm-kfp --help`` lists them: each adds its subcommand.
COMMANDS = (_add_compile, _add_teachers, _add_config)
