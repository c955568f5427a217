"""The ``fourm-kfp`` command: run the pipeline locally or on a Kubeflow Pipelines server, run, plan or verify one
stage, generate with or export a trained model, show the configs.

One module per group of commands, and in it each subcommand declared beside its handler:
:func:`~fourm_kfp.cli.help_text.add_command` adds its parser with ``set_defaults(func=handler)``, the handler's
docstring as its description and its examples; the group's ``COMMANDS`` lists them in the order ``--help`` shows.
The groups: :mod:`~fourm_kfp.cli.running` (run, stage, launch, status, verify), :mod:`~fourm_kfp.cli.model`
(generate, export), :mod:`~fourm_kfp.cli.kubeflow` (submit, doctor), :mod:`~fourm_kfp.cli.mlflow_ui` (ui),
:mod:`~fourm_kfp.cli.definitions` (compile, teachers, config) and :mod:`~fourm_kfp.cli.completion` (completion,
written from the whole parser). This module builds the top parser from them and runs the chosen handler.

Start-up stays light: heavy modules (torch, kfp, mlflow) are imported inside the commands that need them. A user
error (:class:`fourm_kfp.errors.UserError`) prints one line, ``Error: ...``, and exits 2; ``--debug`` adds the
traceback.
"""

from __future__ import annotations

import argparse
import sys
import traceback

from fourm_kfp.cli import completion, definitions, kubeflow, mlflow_ui, model, running

#: The top-level ``--help`` description.
DESCRIPTION = """\
Pre-train 4M-style multimodal masked models: run the pipeline locally (kfp.local) or on a Kubeflow Pipelines
server, run or verify one stage, plan, generate with a trained model, and show the configs.

Start-up stays light: heavy modules (torch, kfp, mlflow) load inside the commands that need them. A user error
prints one line, "Error: ...", and exits 2; --debug adds the traceback."""

#: The groups of commands, in the order ``fourm-kfp --help`` lists their commands (completion comes last).
GROUPS = (running, model, kubeflow, mlflow_ui, definitions)


def build_parser() -> argparse.ArgumentParser:
    """The whole command line: the top-level options and every group's subcommands, each with its handler as
    ``func``."""
    parser = argparse.ArgumentParser(prog="fourm-kfp", description=DESCRIPTION,
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="Run 'fourm-kfp COMMAND --help' for a command's options and examples.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {_package_version()}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks of user errors too")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for group in GROUPS:
        for add in group.COMMANDS:
            add(commands)
    completion.add_completion_command(commands, parser)
    return parser


def _package_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("fourm-kfp")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown (not installed)"


def main(argv: list[str] | None = None) -> int:
    """Run the command line ``argv`` (default: this process's); the exit status."""
    from fourm_kfp.errors import UserError

    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except UserError as exc:
        if args.debug:
            traceback.print_exc()
        print(f"Error: {exc}", file=sys.stderr)
        return 2
