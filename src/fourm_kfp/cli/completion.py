"""``fourm-kfp completion SHELL``: static completion scripts for bash, zsh and fish, written from the argparse parser
itself, so they always list the commands and options the parser has.

What completes: the commands; each command's options; the values of options and positionals that have choices
(stage names, ``--scheduler``, ...) and the preset names for ``--preset``. Other option values complete as file
names. zsh loads the bash script through its ``bashcompinit`` layer (as argcomplete's scripts do).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field

from fourm_kfp.cli.help_text import add_command

SHELLS = ("bash", "zsh", "fish")
FUNCTION = "_fourm_kfp"


@dataclass
class CommandWords:
    """What one subcommand completes: its options, the values of those with a fixed set, its positional choices."""

    name: str
    summary: str
    options: list[str] = field(default_factory=list)
    option_values: dict[str, list[str]] = field(default_factory=dict)  #: option -> its values
    takes_value: list[str] = field(default_factory=list)  #: options followed by a value (a file name if no set)
    positionals: list[str] = field(default_factory=list)


def _values(action: argparse.Action) -> list[str] | None:
    if action.choices is not None:
        return [str(c) for c in action.choices]
    if action.dest == "preset":
        from fourm_kfp.config.loader import available_presets

        return available_presets()
    return None


def _subparsers(parser: argparse.ArgumentParser) -> argparse._SubParsersAction:
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))


def command_words(parser: argparse.ArgumentParser) -> tuple[list[str], list[CommandWords]]:
    """The top-level options and, per subcommand, what it completes."""
    sub = _subparsers(parser)
    summaries = {a.dest: a.help or "" for a in sub._choices_actions}
    top = [o for a in parser._actions for o in a.option_strings]
    commands = []
    for name, command in sub.choices.items():
        words = CommandWords(name, summaries.get(name, ""))
        for action in command._actions:
            values = _values(action)
            if not action.option_strings:
                words.positionals += values or []
                continue
            words.options += action.option_strings
            if action.nargs != 0:
                words.takes_value += action.option_strings
                if values is not None:
                    words.option_values.update({o: values for o in action.option_strings})
        commands.append(words)
    return top, commands


def _bash(parser: argparse.ArgumentParser) -> str:
    top, commands = command_words(parser)
    cases = []
    for c in commands:
        value_cases = "".join(f"                {opt}) COMPREPLY=($(compgen -W \"{' '.join(vals)}\" -- \"$cur\")); "
                              "return ;;\n" for opt, vals in c.option_values.items())
        plain = [o for o in c.takes_value if o not in c.option_values]
        if plain:
            value_cases += f"                {'|'.join(plain)}) return ;;\n"
        cases.append(f"        {c.name})\n            case \"$prev\" in\n{value_cases}            esac\n"
                     f"            words=\"{' '.join(c.options + c.positionals)}\" ;;\n")
    return f"""# bash completion for fourm-kfp (fourm-kfp completion bash)
{FUNCTION}() {{
    local cur prev cmd words i
    cur="${{COMP_WORDS[COMP_CWORD]}}"
    prev="${{COMP_WORDS[COMP_CWORD-1]}}"
    cmd=""
    for ((i = 1; i < COMP_CWORD; i++)); do
        case "${{COMP_WORDS[i]}}" in
            -*) ;;
            *) cmd="${{COMP_WORDS[i]}}"; break ;;
        esac
    done
    case "$cmd" in
        "") words="{' '.join(c.name for c in commands)} {' '.join(top)}" ;;
{''.join(cases)}        *) return ;;
    esac
    COMPREPLY=($(compgen -W "$words" -- "$cur"))
}}
complete -o default -F {FUNCTION} fourm-kfp
"""


def _zsh(parser: argparse.ArgumentParser) -> str:
    return ("#compdef fourm-kfp\n# zsh completion for fourm-kfp (fourm-kfp completion zsh), through bashcompinit\n"
            "autoload -U +X bashcompinit && bashcompinit\n" + _bash(parser).split("\n", 1)[1])


def _fish_quote(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _fish(parser: argparse.ArgumentParser) -> str:
    top, commands = command_words(parser)
    lines = ["# fish completion for fourm-kfp (fourm-kfp completion fish)", "complete -c fourm-kfp -f"]
    for option in top:
        lines.append(f"complete -c fourm-kfp -n __fish_use_subcommand {_fish_flag(option)}")
    for c in commands:
        lines.append(f"complete -c fourm-kfp -n __fish_use_subcommand -a {c.name} -d {_fish_quote(c.summary[:70])}")
        seen = f"-n '__fish_seen_subcommand_from {c.name}'"
        if c.positionals:
            lines.append(f"complete -c fourm-kfp {seen} -a {_fish_quote(' '.join(c.positionals))}")
        for option in c.options:
            if option in c.option_values:
                how = f" -x -a {_fish_quote(' '.join(c.option_values[option]))}"
            else:
                how = " -r -F" if option in c.takes_value else ""
            lines.append(f"complete -c fourm-kfp {seen} {_fish_flag(option)}{how}")
    return "\n".join(lines) + "\n"


def _fish_flag(option: str) -> str:
    return f"-l {option[2:]}" if option.startswith("--") else f"-s {option[1:]}"


def completion_script(parser: argparse.ArgumentParser, shell: str) -> str:
    """The completion script of ``shell`` (one of :data:`SHELLS`) for ``parser``'s commands."""
    return {"bash": _bash, "zsh": _zsh, "fish": _fish}[shell](parser)


def add_completion_command(commands: argparse._SubParsersAction, parser: argparse.ArgumentParser) -> None:
    """``completion``, whose scripts complete ``parser``: the whole command line, ``commands`` included."""

    def cmd_completion(args: argparse.Namespace) -> int:
        """Print a shell completion script for fourm-kfp: its commands, their options and the preset names. Load it
        in the current shell, or install it where the shell looks for completions."""
        print(completion_script(parser, args.shell), end="")
        return 0

    completion = add_command(
        commands, "completion", cmd_completion, "print a shell completion script",
        ["source <(fourm-kfp completion bash)",
         "fourm-kfp completion zsh > \"${fpath[1]}/_fourm-kfp\"",
         "fourm-kfp completion fish > ~/.config/fish/completions/fourm-kfp.fish"])
    completion.add_argument("shell", choices=SHELLS)
