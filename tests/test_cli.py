"""The ``fourm-kfp`` command as a user meets it: the README's real-data recipe as written, plan before run, and
user errors as one clear line without a traceback."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.photos import write_photo_folder

CLI = str(Path(sys.executable).parent / "fourm-kfp")
README = Path(__file__).resolve().parents[1] / "README.md"


def _cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([CLI, *args], capture_output=True, text=True, cwd=cwd, timeout=300,
                          env={**os.environ, "MLFLOW_TRACKING_URI": "none"})


def _readme_own_images_commands() -> list[list[str]]:
    """The README's "Your own images" fourm-kfp commands, each as its words up to a pipe (continuation lines
    joined, comments dropped), from every bash block of the section before its first subsection."""
    section = README.read_text().split("## Your own images", 1)[1].split("\n## ", 1)[0].split("\n### ", 1)[0]
    commands = []
    for block in section.split("```bash")[1:]:
        for line in block.split("```", 1)[0].replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            if words and words[0] == ".venv/bin/fourm-kfp":
                commands.append(words[:words.index("|")] if "|" in words else words)
    return commands


def test_readme_own_images_commands_parse_and_read_a_folder_as_written(tmp_path):
    from fourm_kfp.cli import build_parser

    commands = _readme_own_images_commands()
    assert [c[1:4] for c in commands] == [["teachers", "--preset", "photos-4m21"],
                                          ["run", "--preset", "photos-4m21"], ["run", "--preset", "demo"],
                                          ["run", "--preset", "photos"]]
    for words in commands:
        build_parser().parse_args(words[1:])  # exits non-zero on a flag the CLI does not have
    # The run on a team's folder: its --set overrides, through prepare-data of the photos-4m21 preset (which needs
    # no teacher folder: the labels come a stage later).
    photos = tmp_path / "my photos"  # a folder name with a space: overrides travel as a list, never re-split
    write_photo_folder(photos, good=12)
    own = commands[1]
    sets = [w.replace("/data/photos", str(photos)) for i, w in enumerate(own) if own[i - 1] == "--set"]
    assert any(s.startswith("prepare_data.source_uri=") for s in sets)
    args = ["stage", "prepare-data", "--preset", "photos-4m21", "--root", str(tmp_path / "run")]
    proc = _cli(*args, *[w for s in sets for w in ("--set", s)], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    outcome = json.loads(proc.stdout)
    assert outcome["status"] == "ran" and outcome["metrics"]["samples_train"] + outcome["metrics"]["samples_val"] == 12
    out = Path(outcome["output_uri"])
    assert sorted({p.parent.name for p in out.glob("*/*/shard-*.tar")}) == ["_source", "caption", "rgb"]  # sizes


def test_too_many_bad_samples_is_one_line_without_traceback(tmp_path):
    photos = tmp_path / "photos"
    write_photo_folder(photos, good=2, bad=3)
    common = ["stage", "prepare-data", "--root", str(tmp_path / "run"), "--set", "prepare_data.source=image_folder",
              "--set", f"prepare_data.source_uri={photos}", "--set", "data.modalities=[rgb,caption]",
              "--set", "data.input_modalities=[rgb,caption]", "--set", "data.target_modalities=[rgb,caption]"]
    proc = _cli(*common)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    [error] = [line for line in proc.stderr.splitlines() if line.startswith("Error:")]
    assert "max_bad_fraction" in error and "broken0.jpg" in error
    debug = _cli("--debug", *common)
    assert debug.returncode == 2 and "Traceback" in debug.stderr


@pytest.mark.parametrize("args, needle", [
    (["stage", "prepare-data", "--root", "s3://bucket/runs"], "--store s3://"),
    (["stage", "prepare-data", "--root", "{tmp}", "--set", "data.image_size=huge"], "data.image_size"),
    (["stage", "train-tokenizers", "--root", "{tmp}"], "has no _MANIFEST.json"),
    (["stage", "train-tokenizers", "--root", "{tmp}", "--part", "0"], "does not fan out"),
    (["stage", "prepare-data", "--root", "{tmp}", "--part", "0", "--parts", "2", "--force"],
     "a worker never clears prepare-data's output"),
])
def test_user_errors_are_one_clear_line(tmp_path, args, needle):
    proc = _cli(*[a.replace("{tmp}", str(tmp_path)) for a in args])
    assert proc.returncode == 2, proc.stdout
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("Error: ") and needle in proc.stderr
    assert not (tmp_path / "s3:").exists()


def test_status_plans_without_running(tmp_path):
    before = _cli("status", "--root", str(tmp_path), "--json")
    assert before.returncode == 0, before.stderr
    plan = json.loads(before.stdout)
    assert [p["name"] for p in plan][:3] == ["prepare-data", "label", "train-tokenizers"]
    assert plan[1]["off"] and not plan[1]["address"]  # the smoke preset asks for no labelers
    assert not any(p["committed"] for p in plan) and not list(tmp_path.glob("*/*/_MANIFEST.json"))
    assert _cli("stage", "prepare-data", "--root", str(tmp_path)).returncode == 0
    after = {p["name"]: p for p in json.loads(_cli("status", "--root", str(tmp_path), "--json").stdout)}
    assert after["prepare-data"]["committed"] and not after["train-tokenizers"]["committed"]
    assert after["prepare-data"]["address"] == plan[0]["address"]
    table = _cli("status", "--root", str(tmp_path)).stdout
    assert re.search(rf"prepare-data\s+{plan[0]['address']}\s+committed", table)


def test_cli_start_up_stays_light():
    """Building the parser (every stage's spec included) imports neither torch nor kfp nor mlflow."""
    code = ("import sys, fourm_kfp.cli as c; c.build_parser(); "
            "print(sorted(m for m in ('torch', 'kfp', 'mlflow') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_the_mlflow_ui_serves_one_browser_with_one_worker_and_no_job_consumers():
    """`fourm-kfp ui` on a 2-core machine: MLflow's defaults start four web workers and several GenAI job consumers
    (MLflow 3.17 `mlflow ui --help`: workers default 4; MLFLOW_SERVER_ENABLE_JOB_EXECUTION defaults to true)."""
    from fourm_kfp.cli import build_parser
    from fourm_kfp.cli.mlflow_ui import ui_server_command

    argv, env = ui_server_command("mlflow", "sqlite:////r/mlflow.db", "127.0.0.1", 5000)
    assert argv[argv.index("--workers") + 1] == "1" and argv[argv.index("--backend-store-uri") + 1].endswith(".db")
    assert env["MLFLOW_SERVER_ENABLE_JOB_EXECUTION"] == "false"
    from mlflow.environment_variables import MLFLOW_SERVER_ENABLE_JOB_EXECUTION

    assert MLFLOW_SERVER_ENABLE_JOB_EXECUTION.name == "MLFLOW_SERVER_ENABLE_JOB_EXECUTION"  # the name MLflow reads
    assert build_parser().parse_args(["ui", "--root", "runs/x"]).root == "runs/x"


def test_doctor_prints_one_line_per_check_or_json_and_exits_as_submit_does(tmp_path):
    """``fourm-kfp doctor`` where there is no cluster (its checks skipped, saying why) and lineage is off: exit 0;
    a local MLflow store, which no pod can write to, fails with its fix: exit 2, as submit's user error."""
    env = {**os.environ, "KUBECONFIG": str(tmp_path / "no-kubeconfig"), "MLFLOW_TRACKING_URI": "none"}
    env.pop("AWS_ACCESS_KEY_ID", None)
    env.pop("KFP_HOST", None)
    args = [CLI, "doctor", "--param", f"store_uri={tmp_path / 'store'}"]
    proc = subprocess.run(args + ["--json"], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    checks = {check["name"]: check for check in json.loads(proc.stdout)}
    assert {name: checks[name]["state"] for name in ("kfp version", "kubernetes", "s3", "mlflow")} == \
        {"kfp version": "skipped", "kubernetes": "skipped", "s3": "skipped", "mlflow": "skipped"}
    assert "no-kubeconfig" in checks["kubernetes"]["detail"] or "kube-config" in checks["kubernetes"]["detail"]
    local = subprocess.run(args + ["--mlflow-tracking-uri", f"sqlite:///{tmp_path / 'mlflow.db'}"],
                           capture_output=True, text=True, env=env, timeout=300)
    assert local.returncode == 2
    lines = local.stdout.splitlines()
    failed = [i for i, line in enumerate(lines) if line.startswith("FAIL")]
    assert [lines[i].split()[1] for i in failed] == ["mlflow"] and "fix: " in lines[failed[0] + 1]
    assert lines[-1] == "doctor: 1 of 4 checks failed"


# ------------------------------------------------------------------------------------ as kfp, mlflow and hf answer

def _subcommands() -> dict:
    import argparse

    from fourm_kfp.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {"": parser, **sub.choices}


RST_MARKUP = ("``", ":func:", ":class:", ":mod:", ":meth:", "::")


def test_version_prints_the_installed_package_version():
    from importlib.metadata import version

    proc = _cli("--version")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"fourm-kfp {version('fourm-kfp')}"


def test_every_command_help_has_a_description_an_example_and_no_rst():
    commands = _subcommands()
    assert {"run", "stage", "status", "config", "submit", "launch", "completion"} <= set(commands)
    for name, parser in commands.items():
        text = parser.format_help()
        assert not [m for m in RST_MARKUP if m in text], (name or "fourm-kfp", text)
        if name:
            assert parser.description and len(parser.description) > 40, name
            example = text.split("Example:\n", 1)
            assert len(example) == 2, f"{name}: no example in its --help"
            assert example[1].lstrip().startswith(f"fourm-kfp {name}") or name == "completion", (name, example[1])
    top = _cli("--help")
    assert top.returncode == 0 and not [m for m in RST_MARKUP if m in top.stdout], top.stdout


def test_each_command_runs_its_own_handler_whose_docstring_is_its_description():
    """A command lives in one place: its group module declares it beside its handler (``set_defaults(func=...)``),
    and the handler's docstring is the description its --help shows."""
    import inspect

    commands = {name: parser for name, parser in _subcommands().items() if name}
    handlers = {name: parser.get_default("func") for name, parser in commands.items()}
    assert all(callable(handler) for handler in handlers.values()), handlers
    assert len({id(handler) for handler in handlers.values()}) == len(handlers), "two commands share a handler"
    for name, handler in handlers.items():
        assert handler.__module__.startswith("fourm_kfp.cli."), (name, handler.__module__)
        assert inspect.getdoc(handler), f"{name}: its handler has no docstring, the command's description"
        shown, written = ("".join(text.split()) for text in (commands[name].description, inspect.getdoc(handler)))
        assert shown == written, name  # the same words, wrapped (argparse may break a line at a hyphen)


def _bash_complete(script: Path, words: list[str]) -> set[str]:
    """What the bash completion function offers for the command line ``words`` (the last one being completed)."""
    line = " ".join(shlex.quote(w) for w in words)
    proc = subprocess.run(["bash", "-c", f'source {shlex.quote(str(script))}; COMP_WORDS=({line}); '
                          f'COMP_CWORD={len(words) - 1}; _fourm_kfp; printf "%s\\n" "${{COMPREPLY[@]}}"'],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return set(proc.stdout.split())


def test_bash_completion_offers_the_parsers_commands_options_stages_and_presets(tmp_path):
    from fourm_kfp.config.loader import available_presets
    from fourm_kfp.stages import STAGES

    proc = _cli("completion", "bash")
    assert proc.returncode == 0, proc.stderr
    script = tmp_path / "fourm-kfp.bash"
    script.write_text(proc.stdout)
    syntax = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert syntax.returncode == 0, syntax.stderr
    commands = {name for name in _subcommands() if name}
    assert commands <= _bash_complete(script, ["fourm-kfp", ""])
    assert _bash_complete(script, ["fourm-kfp", "st"]) == {n for n in commands if n.startswith("st")}
    assert _bash_complete(script, ["fourm-kfp", "--debug", "stage", ""]) >= set(STAGES)
    assert _bash_complete(script, ["fourm-kfp", "run", "--preset", ""]) == set(available_presets())
    assert _bash_complete(script, ["fourm-kfp", "submit", "--end"]) == {"--endpoint"}
    launch_options = {o for a in _subcommands()["launch"]._actions for o in a.option_strings}
    assert _bash_complete(script, ["fourm-kfp", "launch", "--"]) == {o for o in launch_options if o.startswith("--")}
    assert _bash_complete(script, ["fourm-kfp", "launch", "pretrain", "--scheduler", "k"]) == {"kubernetes"}
    assert _bash_complete(script, ["fourm-kfp", "stage", "pretrain", "--root", ""]) == set()  # a path: bash's own


def test_zsh_and_fish_completion_cover_every_command():
    commands = {name for name in _subcommands() if name}
    zsh = _cli("completion", "zsh").stdout
    assert zsh.startswith("#compdef fourm-kfp") and "bashcompinit" in zsh and "complete -o default -F _fourm_kfp" in zsh
    fish = _cli("completion", "fish").stdout
    offered = set(re.findall(r"^complete -c fourm-kfp -n __fish_use_subcommand -a (\S+)", fish, re.M))
    assert offered == commands
    assert "complete -c fourm-kfp -n '__fish_seen_subcommand_from submit' -l endpoint -r -F" in fish
    assert "complete -c fourm-kfp -n '__fish_seen_subcommand_from submit' -s n -r -F" in fish


def test_submit_and_doctor_take_the_kfp_clis_endpoint_and_n():
    from kfp.cli.cli import cli as kfp_cli

    from fourm_kfp.cli import build_parser

    kfp_options = {o for p in kfp_cli.params for o in p.opts}
    assert {"--endpoint", "-n", "--namespace"} <= kfp_options  # the spellings, as kfp 2.17's CLI declares them
    for command in ("submit", "doctor"):
        args = build_parser().parse_args([command, "--endpoint", "https://kfp.example/pipeline", "-n", "team"])
        assert (args.host, args.namespace) == ("https://kfp.example/pipeline", "team")
        args = build_parser().parse_args([command, "--host", "https://other", "--namespace", "ns"])
        assert (args.host, args.namespace) == ("https://other", "ns")


@pytest.mark.parametrize("args, needle", [
    (["config", "--set", "data.image_sz=96"], "unknown key(s) 'image_sz' (did you mean 'image_size'?)"),
    (["config", "--set", "dta.image_size=96"], "unknown section 'dta' (did you mean 'data'?)"),
    (["config", "--preset", "smok"], "unknown preset 'smok' (did you mean 'smoke'?)"),
    (["status", "--preset", "dmeo", "--root", "unused"], "unknown preset 'dmeo' (did you mean 'demo'?)"),
])
def test_a_mistyped_key_or_preset_gets_the_closest_name(args, needle, capsys):
    from fourm_kfp.cli import main

    assert main(args) == 2
    assert needle in capsys.readouterr().err


def test_config_describe_lists_each_fields_type_choices_and_default(capsys):
    import dataclasses
    import typing

    from fourm_kfp.cli import main
    from fourm_kfp.config.fourm_config import SECTIONS

    assert main(["config", "--describe"]) == 0
    out = capsys.readouterr().out
    prepare = SECTIONS["prepare_data"]
    source = next(f for f in dataclasses.fields(prepare) if f.name == "source")
    choices = typing.get_args(typing.get_type_hints(prepare)["source"])
    line = next(line for line in out.splitlines() if line.startswith("prepare_data.source "))
    assert f"default {json.dumps(source.default)}" in line and f"one of {', '.join(choices)}" in line
    for name, cls in SECTIONS.items():  # every plain field of every section is listed
        for f in dataclasses.fields(cls):
            if not dataclasses.is_dataclass(typing.get_type_hints(cls)[f.name]):
                assert re.search(rf"^{name}\.{f.name} +\(", out, re.M), f"{name}.{f.name}"


def test_launch_without_torchx_says_what_to_install(tmp_path, monkeypatch, capsys):
    from fourm_kfp.cli import main

    monkeypatch.setitem(sys.modules, "torchx", None)  # `import torchx` raises ImportError, as where it is absent
    assert main(["launch", "pretrain", "--preset", "smoke", "--root", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    pin = next(line for line in (Path(__file__).resolve().parents[1] / "constraints.txt").read_text().splitlines()
               if line.startswith("torchx=="))
    assert "'fourm-kfp[launch]'" in err and f"-m pip install --no-deps {pin}" in err, err
    assert not (tmp_path / "torchx").exists()  # nothing was planned or launched
