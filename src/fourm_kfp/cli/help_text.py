"""How a subcommand of ``fourm-kfp`` is declared: the handler it runs, whose docstring is the description under its
usage line; its one-line summary (the line the top ``--help`` lists); and the examples its ``--help`` ends with (as
``kfp``, ``mlflow`` and ``hf`` show theirs).

The text is plain (no reStructuredText, in a handler's docstring too): argparse prints it as written, each paragraph
filled to 100 columns.
"""

from __future__ import annotations

import argparse
import inspect
import textwrap
from collections.abc import Callable, Sequence

#: What a subcommand runs: the parsed arguments in, the exit status out.
Handler = Callable[[argparse.Namespace], int]
#: What adds options several subcommands share (:mod:`fourm_kfp.cli.options`).
SharedOptions = Callable[[argparse.ArgumentParser], None]


def add_command(commands: argparse._SubParsersAction, name: str, handler: Handler, summary: str,
                examples: Sequence[str], shared: Sequence[SharedOptions] = (),
                epilog: str = "") -> argparse.ArgumentParser:
    """Add the subcommand ``name`` to ``commands``, running ``handler`` (``set_defaults(func=handler)``): its
    one-line ``summary``, the handler's docstring as its description (paragraphs apart by a blank line), an epilog
    ending with its ``examples`` (one command line each), and first of its options the ``shared`` ones."""
    description = inspect.cleandoc(handler.__doc__ or summary)  # the summary where docstrings are stripped (-OO)
    shown = "Example:\n" + "\n".join(f"  {line}" for line in examples)
    parser = commands.add_parser(name, help=summary,
                                 description="\n\n".join(textwrap.fill(p, 100) for p in description.split("\n\n")),
                                 epilog=f"{epilog}\n\n{shown}" if epilog else shown,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.set_defaults(func=handler)
    for add_options in shared:
        add_options(parser)
    return parser
