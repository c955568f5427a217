"""``fourm-kfp submit`` against a local emulation of the KFP REST API (``tests/kfp_api_emulator.py``: what it
emulates and what not is listed there; request bodies are validated against the ``kfp-server-api`` models).

The real ``kfp.Client`` does the HTTP. ``--wait`` is followed through success, failure and a gate refusal. The run
itself is emulated: when a run is created, the test writes what the pipeline's evaluate step would have written to
MLflow (a child run of the parent run ``submit`` opened, with its ``gate.json``), into a real SQLite store."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from fourm_kfp.contract import lineage
from fourm_kfp.cli import main as cli_main
from fourm_kfp.errors import UserError
from fourm_kfp.config.loader import load_config
from fourm_kfp.pipeline_runs.kfp_api import check_cron, coerce_parameter, make_client
from fourm_kfp.pipeline_runs.run_outcome import (EXIT_CODES, EXIT_FAILED, EXIT_GATE_REFUSED, EXIT_GATE_UNREAD,
                                                 EXIT_NOT_FOLLOWED, EXIT_SUCCEEDED, EXIT_USER_ERROR, SubmitRequest)
from fourm_kfp.pipeline_runs.submit import TAG_FOLLOWING, attach, submit
from tests.kfp_api_emulator import KfpApiEmulator, model_errors, robfig_cron_parse

STAGES = ("prepare-data", "label", "train-tokenizers", "pretokenize", "pretrain", "evaluate")
BIN = Path(sys.executable).parent


def _frames(final: str) -> list:
    running = {name: "RUNNING" if i == 0 else "PENDING" for i, name in enumerate(STAGES)}
    done = {name: "SUCCEEDED" for name in STAGES}
    if final == "FAILED":
        done = {**done, "pretrain": "FAILED", "evaluate": "SKIPPED"}
    middle = {**{name: "SUCCEEDED" for name in STAGES[:4]}, "pretrain": "RUNNING", "evaluate": "PENDING"}
    return [("PENDING", {}), ("RUNNING", running), ("RUNNING", middle), ("RUNNING", middle), (final, done)]


def _pipeline_writes_gate(tracking: str, promoted: bool):
    """What the evaluate step does in MLflow: a stage child run under the parent run, with gate.json attached."""
    def on_run_created(run: dict) -> None:
        params = run["runtime_config"]["parameters"]
        parent = params["mlflow_parent_run_id"]
        assert params["mlflow_tracking_uri"] == tracking
        with lineage.stage_run(tracking, parent, "evaluate") as tracker:
            tracker.set_tags({lineage.TAG_STATUS: "ran", lineage.TAG_REUSED: "false"})
            gate = {"promoted": promoted, "version": "3",
                    "reason": "lower bound +0.02 above the margin" if promoted else
                    "the 95% interval of the improvement [-0.01, +0.03] does not clear the margin"}
            tracker.log_artifact("gate.json", json.dumps(gate).encode())
    return on_run_created


def _request(emulator, tracking="", **kw) -> SubmitRequest:
    return SubmitRequest(host=emulator.url, preset="smoke", overrides=["train.steps=3"],
                         parameters={"pretrain_nodes": 2, "pretrain_launcher": "pytorchjob"}, poll_s=0.01,
                         tracking_uri=tracking, **kw)


@pytest.mark.parametrize("final,promoted,expected", [("SUCCEEDED", True, EXIT_SUCCEEDED),
                                                     ("SUCCEEDED", False, EXIT_GATE_REFUSED),
                                                     ("FAILED", True, EXIT_FAILED)])
def test_submit_and_wait(tracking, monkeypatch, final, promoted, expected):
    monkeypatch.setenv("GITHUB_SHA", "0123abc")
    monkeypatch.setenv("GITHUB_RUN_ID", "4242")
    monkeypatch.setenv("KFP_TOKEN", "token-from-the-ci-secret-store")
    emulator = KfpApiEmulator(_frames(final), on_run_created=_pipeline_writes_gate(tracking, promoted))
    try:
        lines = []
        result = submit(_request(emulator, tracking, wait=True), out=lines.append)
    finally:
        emulator.close()
    assert not emulator.rejected, emulator.rejected
    assert result.exit_code == expected and result.state == final
    [run] = emulator.runs.values()
    params = run["runtime_config"]["parameters"]
    # the resolved config travels pinned: loaded on the preset, it is the config the submitter resolved
    assert params["preset"] == "smoke" and "train.steps=3" in params["config_overrides"]
    pinned = load_config("smoke", overrides=params["config_overrides"])
    assert pinned == load_config("smoke", overrides=["train.steps=3"])
    assert any(o.startswith("data.image_size=") for o in params["config_overrides"])  # every value, not only --set
    assert params["pretrain_nodes"] == 2 and params["pretrain_launcher"] == "pytorchjob"
    assert lines[0] == f"run {result.run_id} ({run['display_name']}) in experiment fourm-pretrain: " \
                       f"{emulator.url}/#/runs/details/{result.run_id}"
    assert "  pretrain: running" in lines and lines.count("  pretrain: running") == 1  # printed on change only
    assert all(auth == "Bearer token-from-the-ci-secret-store" for _, _, auth in emulator.requests)
    parent = lineage._client(tracking).get_run(result.mlflow_parent_run_id)
    assert parent.data.tags["fourm.ci.github_sha"] == "0123abc" and parent.data.tags["fourm.ci.github_run_id"] == "4242"
    assert parent.info.status == ("FINISHED" if final == "SUCCEEDED" else "FAILED")
    summary = lines[-1]
    assert f"run {result.run_id}: {final.lower()}" in summary and "pretrain" in summary
    if final == "SUCCEEDED":
        assert ("promoted to champion" if promoted else "model gate: refused: the 95% interval") in summary


def test_a_second_submit_uploads_a_version_only_when_the_pipeline_changed(tmp_path):
    emulator = KfpApiEmulator()
    try:
        first = submit(_request(emulator), out=lambda line: None)
        again = submit(_request(emulator), out=lambda line: None)
        changed = tmp_path / "changed.yaml"
        from fourm_kfp.pipeline_runs.submit import pipeline_package

        changed.write_text(pipeline_package().read_text().replace("Pre-train a 4M-style", "Pre-train a 4M style"))
        third = submit(_request(emulator, package=str(changed)), out=lambda line: None)
    finally:
        emulator.close()
    assert not emulator.rejected, emulator.rejected
    assert len(emulator.pipelines) == 1 and first.pipeline_id == again.pipeline_id == third.pipeline_id
    versions = emulator.versions[first.pipeline_id]
    assert first.version_id == again.version_id != third.version_id
    assert len(versions) == 3  # the upload's own version, the content-named one, and the changed one
    assert len(emulator.experiments) == 1 and len(emulator.runs) == 3


def test_schedule_creates_a_recurring_run():
    emulator = KfpApiEmulator()
    try:
        result = submit(_request(emulator, schedule="0 0 3 * * 1"), out=lambda line: None)
    finally:
        emulator.close()
    assert not emulator.rejected and not emulator.runs
    [recurring] = emulator.recurring_runs.values()
    assert recurring["trigger"]["cron_schedule"]["cron"] == "0 0 3 * * 1"
    assert recurring["no_catchup"] is True  # a paused schedule does not start every missed run when resumed
    assert result.recurring_run_id == recurring["recurring_run_id"] and result.exit_code == EXIT_SUCCEEDED


def test_the_emulator_rejects_what_the_real_api_would():
    """The validation the tests rely on can fail: an unknown field, a bad enum, an undeclared run parameter."""
    assert model_errors({"display_name": "x", "colour": "red"}, "V2beta1Experiment")
    assert model_errors({"display_name": "x", "storage_state": "SOMEWHERE"}, "V2beta1Experiment")
    emulator = KfpApiEmulator()
    try:
        client, run, reference = _one_run(emulator)
        with pytest.raises(Exception):
            client.run_pipeline(run["experiment_id"], "bad", params={"no_such_parameter": 1},
                                pipeline_id=reference["pipeline_id"], version_id=reference["pipeline_version_id"])
    finally:
        emulator.close()
    assert any("no_such_parameter" in message for message in emulator.rejected)


def test_unknown_parameters_and_a_bad_config_fail_before_anything_is_sent():
    emulator = KfpApiEmulator()
    try:
        cli = [str(BIN / "fourm-kfp"), "submit", "--no-doctor", "--host", emulator.url, "--preset", "smoke"]
        unknown = subprocess.run(cli + ["--param", "pretrain_gpus=8"], capture_output=True, text=True)
        bad = subprocess.run(cli + ["--set", "data.image_size=x"], capture_output=True, text=True)
        unqueued = subprocess.run(cli + ["--param", "scheduler=kueue:team-a"], capture_output=True, text=True)
        no_secret = subprocess.run(cli + ["--param", "image_pull_secret="], capture_output=True, text=True)
    finally:
        emulator.close()
    assert unknown.returncode == 2 and "pretrain_gpus" in unknown.stderr and "pretrain_nodes" in unknown.stderr
    assert bad.returncode == 2 and "data.image_size" in bad.stderr
    # Kueue >= 0.19 ignores a PyTorchJob's queue label unless its PyTorchJob integration is on: said before the run
    assert unqueued.returncode == 2 and "pytorchjob-integration-on" in unqueued.stderr, unqueued.stderr
    # KFP's driver fails every step that names an empty pull secret (resolveInputParameterStr)
    assert no_secret.returncode == 2 and "empty pull secret" in no_secret.stderr, no_secret.stderr
    assert not emulator.requests


def test_the_cli_exit_status_says_how_the_run_went(tracking):
    emulator = KfpApiEmulator(_frames("SUCCEEDED"), on_run_created=_pipeline_writes_gate(tracking, False))
    try:
        proc = subprocess.run([str(BIN / "fourm-kfp"), "submit", "--no-doctor", "--host", emulator.url, "--preset", "smoke",
                               "--param", "pretrain_nodes=2", "--wait", "--poll", "0.01",
                               "--mlflow-tracking-uri", tracking], capture_output=True, text=True, timeout=300)
    finally:
        emulator.close()
    assert proc.returncode == EXIT_GATE_REFUSED, proc.stderr[-2000:]
    assert "model gate: refused" in proc.stdout and "/#/runs/details/" in proc.stdout


def test_param_values_are_typed_as_the_pipeline_declares_them(capsys):
    """`--param pretrain_cpu_per_node=32` is a STRING parameter: sent as the text "32" (a number is a 400)."""
    emulator = KfpApiEmulator()
    try:
        code = cli_main(["submit", "--no-doctor", "--host", emulator.url, "--preset", "smoke", "--param", "pretrain_cpu_per_node=32",
                         "--param", "pretrain_nodes=2", "--param", "pretrain_force=true",
                         "--param", 'pretrain_node_selector={"pool": "a100"}', "--param", "run_label=7"])
        bad = cli_main(["submit", "--no-doctor", "--host", emulator.url, "--preset", "smoke", "--param", "pretrain_nodes=two"])
    finally:
        emulator.close()
    assert code == EXIT_SUCCEEDED and not emulator.rejected, emulator.rejected
    [run] = emulator.runs.values()
    params = run["runtime_config"]["parameters"]
    assert params["pretrain_cpu_per_node"] == "32" and params["run_label"] == "7"
    assert params["pretrain_nodes"] == 2 and params["pretrain_force"] is True
    assert params["pretrain_node_selector"] == {"pool": "a100"}
    err = capsys.readouterr().err
    assert bad == 2 and "--param pretrain_nodes=two" in err and "NUMBER_INTEGER" in err and "an integer" in err
    assert "Traceback" not in err and len(emulator.runs) == 1


@pytest.mark.parametrize("kind,text,expected", [
    ("STRING", "32", "32"), ("STRING", 32, "32"), ("NUMBER_INTEGER", "3", 3), ("NUMBER_INTEGER", 3.0, 3),
    ("NUMBER_DOUBLE", "0.5", 0.5), ("NUMBER_DOUBLE", "2", 2.0), ("BOOLEAN", "True", True), ("BOOLEAN", False, False),
    ("LIST", '["train.steps=3"]', ["train.steps=3"]), ("STRUCT", "{}", {})])
def test_coerce_parameter_accepts(kind, text, expected):
    value = coerce_parameter("p", text, kind)
    assert value == expected and type(value) is type(expected)


@pytest.mark.parametrize("kind,text", [("NUMBER_INTEGER", "2.5"), ("NUMBER_INTEGER", "true"), ("NUMBER_DOUBLE", "x"),
                                       ("BOOLEAN", "1"), ("BOOLEAN", "yes"), ("LIST", "a,b"), ("LIST", "{}"),
                                       ("STRUCT", "[]"), ("STRING", True), ("STRING", ["a"])])
def test_coerce_parameter_rejects_with_the_name_and_the_type(kind, text):
    with pytest.raises(UserError, match=rf"--param p=.*declares p {kind}; expected"):
        coerce_parameter("p", text, kind)


def _one_run(emulator):
    """A kfp.Client on the emulator, the run one submit created there, and its pipeline version reference."""
    client = make_client(emulator.url)
    submit(_request(emulator), client=client, out=lambda line: None)
    run = next(iter(emulator.runs.values()))
    return client, run, run["pipeline_version_reference"]


def test_the_emulator_rejects_a_mistyped_parameter_as_the_server_does():
    """validatePipelineJobInputs: a number for a STRING parameter, a string for a BOOLEAN one, a bool for a number."""
    emulator = KfpApiEmulator()
    try:
        client, run, reference = _one_run(emulator)
        for params in ({"pretrain_cpu_per_node": 32}, {"pretrain_force": "true"}, {"pretrain_nodes": True}):
            with pytest.raises(Exception, match="400"):
                client.run_pipeline(run["experiment_id"], "bad", params=params,
                                    pipeline_id=reference["pipeline_id"], version_id=reference["pipeline_version_id"])
    finally:
        emulator.close()
    assert [m.split(" requires")[0] for m in emulator.rejected] == [
        "input parameter pretrain_cpu_per_node", "input parameter pretrain_force", "input parameter pretrain_nodes"]


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# Named ids: each xdist worker collects its own closed port, and the workers must collect the same test ids.
@pytest.mark.parametrize("host", [f"http://127.0.0.1:{_closed_port()}", "http://no-such-kfp-host.invalid"],
                         ids=["closed-port", "unresolvable-host"])
def test_an_unreachable_host_is_one_line_and_exit_2(capsys, host):
    code = cli_main(["submit", "--no-doctor", "--host", host, "--preset", "smoke"])
    err = capsys.readouterr().err
    assert code == EXIT_USER_ERROR
    [line] = err.strip().splitlines()
    assert line.startswith(f"Error: --host {host}: cannot reach the KFP API: ")
    assert "Connection refused" in line or "resolve" in line


def test_a_refused_request_is_one_line_and_exit_2(capsys):
    """A 400 at run creation (here: a pipeline that does not take a parameter submit sends) names the server's
    message, no traceback."""
    emulator = KfpApiEmulator()
    try:
        code = cli_main(["submit", "--no-doctor", "--host", emulator.url, "--preset", "smoke", "--run-name", "x"])
        version = next(iter(emulator.versions.values()))[-1]
        emulator.specs[version["pipeline_version_id"]]["root"]["inputDefinitions"]["parameters"].pop("preset")
        again = cli_main(["submit", "--no-doctor", "--host", emulator.url, "--preset", "smoke", "--run-name", "y"])
    finally:
        emulator.close()
    err = capsys.readouterr().err
    assert code == EXIT_SUCCEEDED and again == EXIT_USER_ERROR, err
    line = err.strip().splitlines()[-1]
    assert "Traceback" not in err
    assert line.startswith(f"Error: --host {emulator.url}: the KFP API answered 400 Bad Request: ") and "preset" in line


def test_transient_errors_while_following_are_retried(tracking):
    """A proxy's 503 and 502, a server 500 and connection resets (past urllib3's own 3 retries) during hours of
    polling: the wait goes on to the run's end."""
    faults = [503, 502, "reset", "reset", "reset", "reset", 500]
    emulator = KfpApiEmulator(_frames("SUCCEEDED"), on_run_created=_pipeline_writes_gate(tracking, True),
                              run_faults=faults)
    try:
        lines = []
        result = submit(_request(emulator, tracking, wait=True), out=lines.append)
    finally:
        emulator.close()
    assert result.state == "SUCCEEDED" and result.exit_code == EXIT_SUCCEEDED, lines
    retries = [line for line in lines if line.startswith("  (KFP API: ")]
    assert len(retries) == 4 and "503" in retries[0] and "500" in retries[-1], retries
    assert lines[-1].endswith(f"exit status 0: {EXIT_CODES[0]}")


def test_following_gives_up_after_too_many_errors_in_a_row(tracking):
    emulator = KfpApiEmulator(_frames("SUCCEEDED"), on_run_created=_pipeline_writes_gate(tracking, True),
                              run_faults=[503] * 4)
    try:
        lines = []
        result = submit(_request(emulator, tracking, wait=True, max_poll_errors=3), out=lines.append)
    finally:
        emulator.close()
    assert result.exit_code == EXIT_NOT_FOLLOWED and "failed 4 times in a row (last: 503" in result.stopped
    assert lineage._client(tracking).get_run(result.mlflow_parent_run_id).info.status == "RUNNING"
    assert f"exit status {EXIT_NOT_FOLLOWED}: " in lines[-1]


def test_a_non_transient_error_while_following_is_not_retried(tracking):
    """A 404 on the run's read is not retried; the run exists, so following stops with exit 5 (not exit 2)."""
    emulator = KfpApiEmulator(_frames("SUCCEEDED"), on_run_created=_pipeline_writes_gate(tracking, True),
                              run_faults=[404])
    try:
        lines: list[str] = []
        result = submit(_request(emulator, tracking, wait=True), out=lines.append)
    finally:
        emulator.close()
    _stopped_with_the_lineage_open(tracking, result, lines, emulator)
    assert "answered 404" in result.stopped and not any(line.startswith("  (KFP API: ") for line in lines)


def test_help_says_what_each_exit_code_means():
    proc = subprocess.run([str(BIN / "fourm-kfp"), "submit", "--help"], capture_output=True, text=True)
    for code, meaning in EXIT_CODES.items():
        assert f"  {code}  {meaning.split()[0]}" in proc.stdout
    assert "--max-poll-errors" in proc.stdout


def test_a_five_field_schedule_is_refused_with_its_six_field_form(capsys):
    """KFP would accept `0 3 * * 1` as second 0, minute 3, every hour, in January: refuse it before sending."""
    emulator = KfpApiEmulator()
    try:
        code = cli_main(["submit", "--no-doctor", "--host", emulator.url, "--preset", "smoke", "--schedule", "0 3 * * 1"])
    finally:
        emulator.close()
    err = capsys.readouterr().err
    assert code == EXIT_USER_ERROR and "'0 0 3 * * 1'" in err and "month 1" in err, err
    assert not emulator.requests
    assert robfig_cron_parse("0 3 * * 1")[1:5] == [{3}, set(range(24)), set(range(1, 32)), {1}]  # the trap


SCHEDULES = ["0 0 3 * * 1", "0 0 3 * * mon", "*/30 * * * * *", "0 0 0 1-15/2 * ?", "0 0 12 * jan-mar 1,3,5",
             "0 5/10 * * * *", "@weekly", "@every 6h30m", "60 0 3 * * 1", "0 0 24 * * *", "0 0 3 0 * *",
             "0 0 3 * 13 *", "0 0 3 * * 7", "0 0 3 * * 5-1", "0 */0 * * * *", "0 0 3 * * x", "0 0 3 1/2/3 * *",
             "0 0 3 * * * *", "@fortnightly", "0 0 3 * * 1-2-3"]


@pytest.mark.parametrize("expression", SCHEDULES)
def test_submit_accepts_a_six_field_schedule_exactly_when_the_server_would(expression):
    try:
        robfig_cron_parse(expression)
        server = True
    except ValueError:
        server = False
    try:
        check_cron(expression)
        ours = True
    except UserError:
        ours = False
    assert ours == server


def test_the_emulator_parses_cron_as_the_server_does():
    emulator = KfpApiEmulator()
    try:
        client, run, reference = _one_run(emulator)
        for cron in ("0 0 3 * * 7", "1 * *"):
            with pytest.raises(Exception, match="400"):
                client.create_recurring_run(run["experiment_id"], "bad", cron_expression=cron,
                                            pipeline_id=reference["pipeline_id"],
                                            version_id=reference["pipeline_version_id"])
    finally:
        emulator.close()
    assert emulator.rejected == [
        "Schedule cron is not a supported format(https://godoc.org/github.com/robfig/cron). Error: End of range (7) "
        "above maximum (6): 7",
        "Schedule cron is not a supported format(https://godoc.org/github.com/robfig/cron). Error: Expected 5 to 6 "
        "fields, found 3: 1 * *"]


def _variant(tmp_path, i: int) -> str:
    """The committed pipeline with a changed description: another content hash, so another version."""
    from fourm_kfp.pipeline_runs.submit import pipeline_package

    path = tmp_path / f"variant-{i}.yaml"
    path.write_text(pipeline_package().read_text().replace("Pre-train a 4M-style", f"Pre-train ({i}) a 4M-style"))
    return str(path)


def test_a_resubmitted_older_pipeline_finds_its_version_on_a_later_page(tmp_path):
    """Versions are listed page by page (the emulator's pages hold 2): an older YAML's version is found, not
    uploaded again (a duplicate version name is a 409)."""
    emulator = KfpApiEmulator(max_page_size=2)
    try:
        first = [submit(_request(emulator, package=_variant(tmp_path, i)), out=lambda line: None) for i in range(4)]
        again = submit(_request(emulator, package=_variant(tmp_path, 1)), out=lambda line: None)
    finally:
        emulator.close()
    assert not emulator.rejected, emulator.rejected
    assert again.version_id == first[1].version_id and again.pipeline_id == first[0].pipeline_id
    assert len(emulator.versions[again.pipeline_id]) == 5  # the upload's own version and the four content-named ones


def test_the_emulator_answers_a_duplicate_version_with_409(tmp_path):
    emulator = KfpApiEmulator()
    try:
        client = make_client(emulator.url)
        result = submit(_request(emulator), client=client, out=lambda line: None)
        name = next(v["display_name"] for v in emulator.versions[result.pipeline_id]
                    if v["pipeline_version_id"] == result.version_id)
        with pytest.raises(Exception, match="409"):
            client.upload_pipeline_version(_variant(tmp_path, 0), pipeline_version_name=name,
                                           pipeline_id=result.pipeline_id)
    finally:
        emulator.close()


def test_with_a_namespace_the_pipeline_is_uploaded_and_found_there(capsys):
    """A multi-user install with REQUIRE_NAMESPACE_FOR_PIPELINES: --namespace puts the pipeline in the profile's
    namespace (each namespace has its own); without one the upload is refused, in one line that says what to do."""
    emulator = KfpApiEmulator(multi_user=True, require_namespace=True, max_page_size=1)
    try:
        team_a = submit(_request(emulator, namespace="team-a"), out=lambda line: None)
        again = submit(_request(emulator, namespace="team-a"), out=lambda line: None)
        team_b = submit(_request(emulator, namespace="team-b"), out=lambda line: None)
        shared = cli_main(["submit", "--no-doctor", "--host", emulator.url, "--preset", "smoke"])
    finally:
        emulator.close()
    assert team_a.pipeline_id == again.pipeline_id != team_b.pipeline_id
    assert team_a.version_id == again.version_id
    assert emulator.pipelines[team_a.pipeline_id]["namespace"] == "team-a"
    assert emulator.pipelines[team_b.pipeline_id]["namespace"] == "team-b"
    assert {e["namespace"] for e in emulator.experiments.values()} == {"team-a", "team-b"}
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert shared == EXIT_USER_ERROR and "Namespace is required for pipeline operations" in err
    assert "--namespace" in err


def test_the_service_account_token_file_is_used_with_an_explicit_host(tmp_path, monkeypatch, tracking):
    """kfp.Client(host=...) skips its in-cluster credentials: submit passes the token file itself, re-read for each
    request, so a token the kubelet rotated is picked up after the server's 401 on the expired one."""
    token = tmp_path / "token"
    token.write_text("sa-token-1\n")
    monkeypatch.delenv("KFP_TOKEN", raising=False)
    monkeypatch.setenv("KF_PIPELINES_SA_TOKEN_PATH", str(token))
    gate = _pipeline_writes_gate(tracking, True)

    def rotate(run: dict) -> None:
        gate(run)
        token.write_text("sa-token-2\n")  # the kubelet rotates the projected token; the old one expires
    emulator = KfpApiEmulator(_frames("SUCCEEDED"), on_run_created=rotate, run_faults=[401])
    try:
        result = submit(_request(emulator, tracking, wait=True), out=lambda line: None)
    finally:
        emulator.close()
    assert result.exit_code == EXIT_SUCCEEDED and result.state == "SUCCEEDED"
    headers = [auth for _, _, auth in emulator.requests]
    assert headers[0] == "Bearer sa-token-1" and headers[-1] == "Bearer sa-token-2"
    assert set(headers) == {"Bearer sa-token-1", "Bearer sa-token-2"}


def test_kfp_token_wins_and_its_401_is_not_retried(tmp_path, monkeypatch, capsys):
    """A static KFP_TOKEN is not re-read, so its 401 is not retried; the run was created, so it is exit 5 (the run goes
    on), with the command that reattaches to it, not exit 2 ("nothing was started")."""
    token = tmp_path / "token"
    token.write_text("sa-token")
    monkeypatch.setenv("KF_PIPELINES_SA_TOKEN_PATH", str(token))
    monkeypatch.setenv("KFP_TOKEN", "ci-token")
    emulator = KfpApiEmulator(_frames("SUCCEEDED"), run_faults=[401])
    try:
        code = cli_main(["submit", "--no-doctor", "--host", emulator.url, "--preset", "smoke", "--wait", "--poll", "0.01",
                         "--mlflow-tracking-uri", "none"])
    finally:
        emulator.close()
    out = capsys.readouterr().out
    [run_id] = emulator.runs
    assert code == EXIT_NOT_FOLLOWED, out
    assert f"fourm-kfp submit --attach {run_id} --host {emulator.url}" in out and "answered 401" in out
    assert {auth for _, _, auth in emulator.requests} == {"Bearer ci-token"}
    assert [path for _, path, _ in emulator.requests].count(f"/apis/v2beta1/runs/{run_id}") == 1  # not retried


def _stopped_with_the_lineage_open(tracking: str, result, lines: list[str], emulator) -> None:
    """Following stopped after the run was created: exit 5, the parent run open and tagged with how to reattach."""
    assert result.exit_code == EXIT_NOT_FOLLOWED and result.stopped, lines
    parent = lineage._client(tracking).get_run(result.mlflow_parent_run_id)
    hint = f"fourm-kfp submit --attach {result.run_id} --host {emulator.url}"
    assert parent.info.status == "RUNNING" and hint in parent.data.tags[TAG_FOLLOWING]
    assert any(hint in line for line in lines)
    assert lines[-1].splitlines()[-1] == f"exit status 5: {EXIT_CODES[EXIT_NOT_FOLLOWED]}"


def test_an_expired_static_token_while_following_stops_following_not_the_run(tracking, monkeypatch):
    """The CI secret's token expires while the run goes on (the server's TokenReview answers 401 from then on)."""
    monkeypatch.setenv("KFP_TOKEN", "static-token")
    emulator = KfpApiEmulator(_long_frames(), on_run_created=_pipeline_writes_gate(tracking, True))
    emulator.reject_tokens.add("static-token")
    try:
        lines: list[str] = []
        result = submit(_request(emulator, tracking, wait=True), out=lines.append)
    finally:
        emulator.close()
    _stopped_with_the_lineage_open(tracking, result, lines, emulator)
    assert "answered 401" in result.stopped and "token has expired" in result.stopped


@pytest.mark.filterwarnings("ignore:This client only works with Kubeflow Pipeline v2:FutureWarning")
def test_a_tls_failure_while_following_stops_following_not_the_run(tracking, monkeypatch):
    """The server's certificate changes to one this machine does not trust while the run goes on."""
    import kfp

    monkeypatch.delenv("KFP_TOKEN", raising=False)
    emulator = KfpApiEmulator(_long_frames(), tls=True)
    gate = _pipeline_writes_gate(tracking, True)

    def created(run: dict) -> None:
        gate(run)
        emulator.rotate_certificate()
    emulator.on_run_created = created
    try:
        client = kfp.Client(host=emulator.url, ssl_ca_cert=emulator.ca_path)
        lines: list[str] = []
        result = submit(_request(emulator, tracking, wait=True, max_poll_errors=1), client=client, out=lines.append)
    finally:
        emulator.close()
    _stopped_with_the_lineage_open(tracking, result, lines, emulator)
    assert "CERTIFICATE_VERIFY_FAILED" in result.stopped


def test_without_a_token_no_authorization_is_sent(tmp_path, monkeypatch):
    monkeypatch.delenv("KFP_TOKEN", raising=False)
    monkeypatch.setenv("KF_PIPELINES_SA_TOKEN_PATH", str(tmp_path / "absent"))
    emulator = KfpApiEmulator()
    try:
        submit(_request(emulator), out=lambda line: None)
    finally:
        emulator.close()
    assert {auth for _, _, auth in emulator.requests} == {None}


def test_the_stage_table_maps_tasks_to_stages_by_component():
    """A real server names tasks by DAG task key and lists driver, executor and DAG nodes too: the table still has
    the six stages, each from its own step, and nothing else is printed as a stage."""
    emulator = KfpApiEmulator(_frames("SUCCEEDED"))
    try:
        lines = []
        result = submit(_request(emulator, wait=True), out=lines.append)
    finally:
        emulator.close()
    names = {task["display_name"] for task in next(iter(emulator.runs.values()))["run_details"]["task_details"]}
    assert {"pretrain", "pretrain-driver", "executor", "train-tokenizers", "label", "exit-handler-1"} <= names
    assert not any(name.startswith("condition-") for name in names)  # no branches (KFP < 2.17 cannot join them)
    assert [row["name"] for row in result.stages] == list(STAGES)
    assert [row["task"] for row in result.stages] == list(STAGES)
    assert all(row["state"] == "SUCCEEDED" and row["seconds"] == 42.0 for row in result.stages)
    printed = [line.strip().split(":")[0] for line in lines if line.startswith("  ") and ": " in line]
    assert set(printed) <= set(STAGES) and "pretrain" in printed
    table = lines[-1].splitlines()
    assert table[2].split() == ["prepare-data", "succeeded", "42.0"]


def test_a_stage_that_never_started_is_shown_as_not_run():
    emulator = KfpApiEmulator(_frames("FAILED"))
    try:
        result = submit(_request(emulator, wait=True), out=lambda line: None)
    finally:
        emulator.close()
    rows = {row["name"]: row["state"] for row in result.stages}
    assert rows == {"prepare-data": "SUCCEEDED", "label": "SUCCEEDED", "train-tokenizers": "SUCCEEDED",
                    "pretokenize": "SUCCEEDED", "pretrain": "FAILED", "evaluate": "NOT_RUN"}


def _pipeline_records_evaluate_without_gate(tracking: str):
    def on_run_created(run: dict) -> None:
        with lineage.stage_run(tracking, run["runtime_config"]["parameters"]["mlflow_parent_run_id"], "evaluate") \
                as tracker:
            tracker.set_tags({lineage.TAG_STATUS: "ran", lineage.TAG_REUSED: "false"})
    return on_run_created


def test_an_unreadable_verdict_is_its_own_exit_code_with_the_reason(tmp_path):
    """The evaluate run's artifacts live under an s3:// root this machine has no client (boto3) or credentials for,
    as on a CI runner without S3 secrets: the run succeeded, but the model was not checked, so not exit 0."""
    from mlflow.tracking import MlflowClient

    tracking = f"sqlite:///{tmp_path / 'mlflow.db'}"
    MlflowClient(tracking_uri=tracking).create_experiment(lineage.EXPERIMENT,
                                                          artifact_location="s3://fourm-kfp/mlartifacts")
    emulator = KfpApiEmulator(_frames("SUCCEEDED"), on_run_created=_pipeline_records_evaluate_without_gate(tracking))
    try:
        lines = []
        result = submit(_request(emulator, tracking, wait=True), out=lines.append)
    finally:
        emulator.close()
    assert result.state == "SUCCEEDED" and result.exit_code == EXIT_GATE_UNREAD
    assert "cannot read gate.json of evaluate run" in result.gate_error and "s3://fourm-kfp" in result.gate_error
    assert "model gate: verdict not read: cannot read gate.json" in lines[-1]
    assert lines[-1].endswith(f"exit status 4: {EXIT_CODES[EXIT_GATE_UNREAD]}")


@pytest.mark.parametrize("case", ["no evaluate run", "no tracking uri"])
def test_a_verdict_never_recorded_or_not_looked_for_is_not_a_pass(tracking, case):
    emulator = KfpApiEmulator(_frames("SUCCEEDED"))
    try:
        result = submit(_request(emulator, tracking if case == "no evaluate run" else "none", wait=True),
                        out=lambda line: None)
    finally:
        emulator.close()
    assert result.exit_code == EXIT_GATE_UNREAD
    expected = "no evaluate stage run under MLflow run" if case == "no evaluate run" else "no MLflow tracking URI"
    assert expected in result.gate_error


def _long_frames() -> list:
    """A run still going after the first reads, then succeeding."""
    middle = {**{name: "SUCCEEDED" for name in STAGES[:4]}, "pretrain": "RUNNING", "evaluate": "PENDING"}
    return [("RUNNING", middle)] * 3 + [("SUCCEEDED", {name: "SUCCEEDED" for name in STAGES})]


def test_a_wait_that_times_out_leaves_the_lineage_open_and_attach_finishes_it(tracking, capsys):
    """--timeout stops following, not the run: the parent run stays open (tagged with how to reattach), exit 5.
    `submit --attach RUN_ID` follows the same run to its end, closes that parent run and reads the gate."""
    emulator = KfpApiEmulator(_long_frames(), on_run_created=_pipeline_writes_gate(tracking, True))
    try:
        lines = []
        first = submit(_request(emulator, tracking, wait=True, timeout_s=0), out=lines.append)
        parent = lineage._client(tracking).get_run(first.mlflow_parent_run_id)
        code = cli_main(["submit", "--attach", first.run_id, "--host", emulator.url, "--poll", "0.01"])
    finally:
        emulator.close()
    assert first.exit_code == EXIT_NOT_FOLLOWED and first.stopped.startswith("still running after 0s (--timeout)")
    assert parent.info.status == "RUNNING"
    hint = f"fourm-kfp submit --attach {first.run_id} --host {emulator.url}"
    assert hint in parent.data.tags[TAG_FOLLOWING] and any(hint in line for line in lines)
    assert lines[-1].splitlines()[-1] == f"exit status 5: {EXIT_CODES[EXIT_NOT_FOLLOWED]}"
    out = capsys.readouterr().out
    assert code == EXIT_SUCCEEDED, out
    assert f"attached to run {first.run_id}" in out and "model gate: promoted to champion" in out
    closed = lineage._client(tracking).get_run(first.mlflow_parent_run_id)
    assert closed.info.status == "FINISHED" and closed.data.tags[TAG_FOLLOWING] == "followed to its end: succeeded"
    assert len(emulator.runs) == 1  # attach submitted nothing


def test_an_interrupted_wait_leaves_the_lineage_open(tracking):
    """Ctrl-C (or the SIGTERM of a cancelled CI job, which the CLI turns into the same) while following."""
    emulator = KfpApiEmulator(_long_frames(), on_run_created=_pipeline_writes_gate(tracking, True))

    def out(line: str) -> None:
        if line == "  pretrain: running":
            raise KeyboardInterrupt
    try:
        result = submit(_request(emulator, tracking, wait=True), out=out)
    finally:
        emulator.close()
    assert result.exit_code == EXIT_NOT_FOLLOWED and result.stopped == "interrupted"
    parent = lineage._client(tracking).get_run(result.mlflow_parent_run_id)
    assert parent.info.status == "RUNNING" and "stopped (interrupted)" in parent.data.tags[TAG_FOLLOWING]


def test_attach_to_a_run_whose_pipeline_opened_its_own_parent(tracking):
    """A run submitted without --wait: its first step opened the parent run (tagged with the KFP run id) and its
    exit handler closes it; attach finds it by that tag, reads the gate under it and leaves it to the pipeline."""
    def pipeline_opens_its_parent(run: dict) -> None:
        parent = lineage.start_pipeline_run(tracking, "fourm-pretrain x", {}, {"fourm.kfp_run_id": run["run_id"]})
        run["runtime_config"]["parameters"]["mlflow_parent_run_id"] = ""
        with lineage.stage_run(tracking, parent, "evaluate") as tracker:
            tracker.set_tags({lineage.TAG_STATUS: "ran", lineage.TAG_REUSED: "false"})
            tracker.log_artifact("gate.json", json.dumps({"promoted": False, "reason": "worse"}).encode())
    emulator = KfpApiEmulator(_long_frames(), on_run_created=pipeline_opens_its_parent)
    try:
        submitted = submit(_request(emulator, "none"), out=lambda line: None)
        result = attach(_request(emulator, tracking), submitted.run_id, out=lambda line: None)
    finally:
        emulator.close()
    assert result.exit_code == EXIT_GATE_REFUSED and result.gate["reason"] == "worse"
    assert [row["state"] for row in result.stages] == ["SUCCEEDED"] * 6
    assert lineage._client(tracking).get_run(result.mlflow_parent_run_id).info.status == "RUNNING"


def test_an_image_tag_submits_a_pipeline_compiled_for_those_images(tmp_path):
    """The retrain workflow submits with the commit's tag: the uploaded pipeline's every step names that tag, and
    the committed pipeline (the version's images) is not what runs."""
    emulator = KfpApiEmulator()
    try:
        submit(_request(emulator, image_tag="0123abc"), out=lambda line: None)
        with pytest.raises(UserError, match="--image-tag compiles the pipeline for those images: leave out --package"):
            submit(_request(emulator, image_tag="0123abc", package=str(tmp_path / "x.yaml")), out=lambda line: None)
    finally:
        emulator.close()
    assert not emulator.rejected, emulator.rejected
    images = {e["container"]["image"] for spec in emulator.specs.values()
              for e in spec["deploymentSpec"]["executors"].values()}
    assert images and all(image.endswith(":0123abc") for image in images), images


def test_report_reads_the_gate_of_every_run_that_ended_in_the_window_and_exits_by_the_worst(tracking):
    """A CI job cannot wait days: the retrain workflow submits a long run and a scheduled `submit --report HOURS`
    reads the verdicts of the runs that ended since, failing when a gate refused."""
    import datetime as dt

    from fourm_kfp.pipeline_runs.run_report import report

    verdicts = iter([True, False])

    def pipeline_opens_its_parent(run: dict) -> None:
        parent = lineage.start_pipeline_run(tracking, "fourm-pretrain x", {}, {"fourm.kfp_run_id": run["run_id"]})
        with lineage.stage_run(tracking, parent, "evaluate") as tracker:
            tracker.set_tags({lineage.TAG_STATUS: "ran", lineage.TAG_REUSED: "false"})
            tracker.log_artifact("gate.json", json.dumps({"promoted": next(verdicts), "reason": "r"}).encode())
    emulator = KfpApiEmulator(_frames("SUCCEEDED"), on_run_created=pipeline_opens_its_parent, max_page_size=1)
    try:
        request = _request(emulator, tracking, experiment="fourm-retrain")
        promoted = submit(_request(emulator, "none", experiment="fourm-retrain"), out=lambda line: None)
        refused = submit(_request(emulator, "none", experiment="fourm-retrain"), out=lambda line: None)
        lines: list[str] = []
        still_going = report(request, 24, out=lines.append)  # both runs are pending: nothing ended yet
        assert still_going.exit_code == EXIT_SUCCEEDED and set(still_going.running) == {promoted.run_id,
                                                                                          refused.run_id}
        for run_id in (promoted.run_id, refused.run_id):
            for _ in range(5):  # the runs go on to their end
                emulator._advance(run_id)
        done = report(request, 24, out=lines.append)
        assert [r.run_id for r in done.results] == [promoted.run_id, refused.run_id] and not done.running
        assert done.exit_code == EXIT_GATE_REFUSED, [r.exit_code for r in done.results]
        later = report(request, 24, out=lines.append, now=dt.datetime.now(dt.timezone.utc) + dt.timedelta(hours=25))
        assert later.results == [] and later.exit_code == EXIT_SUCCEEDED  # reported once, by the window
        missing = report(_request(emulator, tracking, experiment="never-used"), 24, out=lines.append)
        assert missing.results == [] and "no experiment 'never-used'" in lines[-1]
    finally:
        emulator.close()
    assert not emulator.rejected, emulator.rejected
    assert "2 run(s) of experiment fourm-retrain ended in the last 24 h" in lines


def test_an_empty_verdict_is_unreadable_not_a_pass(tracking):
    """gate.json `{}`: neither a decision (`promoted`) nor why the gate did not run (`skipped`): exit 4, not 0."""
    def writes_empty_gate(run: dict) -> None:
        with lineage.stage_run(tracking, run["runtime_config"]["parameters"]["mlflow_parent_run_id"], "evaluate") \
                as tracker:
            tracker.set_tags({lineage.TAG_STATUS: "ran", lineage.TAG_REUSED: "false"})
            tracker.log_artifact("gate.json", b"{}")
    emulator = KfpApiEmulator(_frames("SUCCEEDED"), on_run_created=writes_empty_gate)
    try:
        lines: list[str] = []
        result = submit(_request(emulator, tracking, wait=True), out=lines.append)
    finally:
        emulator.close()
    assert result.state == "SUCCEEDED" and result.exit_code == EXIT_GATE_UNREAD, lines
    assert "gate.json of evaluate run" in result.gate_error and "promoted" in result.gate_error
    assert lines[-1].endswith(f"exit status 4: {EXIT_CODES[EXIT_GATE_UNREAD]}")


def test_the_emulator_answers_healthz_as_the_server_does():
    """newHealthzResponse (apiserver main.go, KFP 2.17): the image's TAG_NAME and COMMIT_SHA, multi_user and the
    pipeline store; kfp-server-api's model keeps only the last two, so the version is read from the raw answer."""
    import urllib.request

    emulator = KfpApiEmulator(tag_name="2.16.1", multi_user=True)
    try:
        with urllib.request.urlopen(f"{emulator.url}/apis/v2beta1/healthz") as answer:
            body = json.loads(answer.read())
        model = make_client(emulator.url, "team-a").get_kfp_healthz().to_dict()
    finally:
        emulator.close()
    assert body == {"commit_sha": emulator.commit_sha, "tag_name": "2.16.1", "multi_user": True,
                    "pipeline_store": "database"}
    assert model == {"multi_user": True, "pipeline_store": "database"}


@pytest.mark.parametrize("tag_name", ["2.14.0", "2.14.4", "v2.5.0", "1.8.5"])
def test_a_server_below_the_version_floor_is_refused_before_anything_is_uploaded(capsys, tag_name):
    """`optional: true` on Secret/ConfigMap env is passed to the pod from KFP 2.15 (an older driver fails every step
    with CreateContainerConfigError when the Secret or a key is missing), so submit refuses an older server."""
    emulator = KfpApiEmulator(tag_name=tag_name)
    try:
        code = cli_main(["submit", "--no-doctor", "--host", emulator.url, "--preset", "smoke"])
        schedule = cli_main(["submit", "--no-doctor", "--host", emulator.url, "--preset", "smoke", "--schedule", "@daily"])
    finally:
        emulator.close()
    err = capsys.readouterr().err
    assert code == schedule == EXIT_USER_ERROR, err
    line = err.strip().splitlines()[-1]
    assert line.startswith(f"Error: --host {emulator.url}: the KFP server is {tag_name.removeprefix('v')}; "
                           "fourm-kfp needs KFP >= 2.15.0"), line
    assert "optional" in line and "CreateContainerConfigError" in line
    assert not emulator.pipelines and not emulator.runs and not emulator.recurring_runs


@pytest.mark.parametrize("tag_name, warned", [("2.15.0", False), ("2.17.0", False), ("2.15.0-rc.1", False),
                                              ("unknown", True), ("master", True), ("1.0-dev", True)])
def test_a_server_at_the_floor_or_of_unknown_version_is_accepted(tag_name, warned):
    """A release image names its version; one built without TAG_NAME answers `unknown`, a master build `master`,
    a dev build e.g. `1.0-dev`: accepted with a warning line."""
    emulator = KfpApiEmulator(tag_name=tag_name)
    try:
        lines: list[str] = []
        result = submit(_request(emulator), out=lines.append)
    finally:
        emulator.close()
    assert result.exit_code == EXIT_SUCCEEDED and len(emulator.runs) == 1
    warnings = [line for line in lines if line.startswith("warning: ")]
    assert bool(warnings) is warned, lines
    if warned:
        assert f"tag_name {tag_name!r}" in warnings[0] and "2.15.0" in warnings[0]


def test_the_tracking_uri_travels_with_a_run_not_waited_for_and_the_report_reads_the_gate_there(tmp_path,
                                                                                                monkeypatch):
    """Without --wait (the 4m-b preset) the run still gets the submitter's tracking URI as its mlflow_tracking_uri,
    so its pipeline writes its lineage there; --report reads the gate where the run wrote it, not at its own
    --mlflow-tracking-uri (another address, e.g. the CI secret's, where nothing of this run is)."""
    from fourm_kfp.pipeline_runs.run_report import report

    written, elsewhere = (f"sqlite:///{tmp_path / name}.db" for name in ("written", "elsewhere"))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", written)

    def pipeline_opens_its_parent(run: dict) -> None:
        tracking = run["runtime_config"]["parameters"]["mlflow_tracking_uri"]
        parent = lineage.start_pipeline_run(tracking, "fourm-pretrain x", {}, {"fourm.kfp_run_id": run["run_id"]})
        with lineage.stage_run(tracking, parent, "evaluate") as tracker:
            tracker.set_tags({lineage.TAG_STATUS: "ran", lineage.TAG_REUSED: "false"})
            tracker.log_artifact("gate.json", json.dumps({"promoted": False, "reason": "worse"}).encode())
    emulator = KfpApiEmulator(_frames("SUCCEEDED"), on_run_created=pipeline_opens_its_parent)
    try:
        submitted = submit(_request(emulator, experiment="fourm-retrain"), out=lambda line: None)
        params = emulator.runs[submitted.run_id]["runtime_config"]["parameters"]
        assert params["mlflow_tracking_uri"] == written and "mlflow_parent_run_id" not in params
        for _ in range(5):
            emulator._advance(submitted.run_id)
        lines: list[str] = []
        done = report(_request(emulator, elsewhere, experiment="fourm-retrain"), 24, out=lines.append)
    finally:
        emulator.close()
    [result] = done.results
    assert result.exit_code == EXIT_GATE_REFUSED and result.gate["reason"] == "worse", lines
    assert f"reading the gate at {written} (the run's mlflow_tracking_uri parameter)" in lines


def test_attach_reads_the_gate_at_the_option_when_the_run_names_no_tracking_uri(tracking, monkeypatch, capsys):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)

    def pipeline_opens_its_parent(run: dict) -> None:
        assert "mlflow_tracking_uri" not in run["runtime_config"]["parameters"]
        parent = lineage.start_pipeline_run(tracking, "fourm-pretrain x", {}, {"fourm.kfp_run_id": run["run_id"]})
        with lineage.stage_run(tracking, parent, "evaluate") as tracker:
            tracker.set_tags({lineage.TAG_STATUS: "ran", lineage.TAG_REUSED: "false"})
            tracker.log_artifact("gate.json", json.dumps({"promoted": True, "reason": "better"}).encode())
    emulator = KfpApiEmulator(_frames("SUCCEEDED"), on_run_created=pipeline_opens_its_parent)
    try:
        submitted = submit(_request(emulator), out=lambda line: None)
        code = cli_main(["submit", "--attach", submitted.run_id, "--host", emulator.url, "--poll", "0.01",
                         "--mlflow-tracking-uri", tracking])
    finally:
        emulator.close()
    out = capsys.readouterr().out
    assert code == EXIT_SUCCEEDED, out
    assert f"reading the gate at {tracking} (--mlflow-tracking-uri or $MLFLOW_TRACKING_URI: the run names none)" in out


def test_a_tls_failure_kfp_server_api_answers_as_status_0_is_one_line():
    """kfp-server-api turns a urllib3 SSLError it is not retrying into ApiException(status=0, reason="SSLError\\n...")
    (rest.py): that is no answer from the server, so it is said as such, in one line."""
    import kfp_server_api

    from fourm_kfp.pipeline_runs.kfp_api import kfp_api_errors

    with pytest.raises(UserError) as caught:
        with kfp_api_errors("https://kfp.example.com"):
            raise kfp_server_api.ApiException(status=0, reason="SSLError\n[SSL: CERTIFICATE_VERIFY_FAILED] expired")
    assert str(caught.value) == ("--host https://kfp.example.com: cannot reach the KFP API: SSLError "
                                 "[SSL: CERTIFICATE_VERIFY_FAILED] expired")


def test_submit_runs_the_preflight_before_anything_is_created_and_stops_when_it_fails(tmp_path):
    """``fourm-kfp doctor``'s checks run after the server's version is read and before any upload: a failing one
    leaves the server with no pipeline, version, experiment or run."""
    emulator = KfpApiEmulator()
    asked: list[dict] = []

    def failing_preflight(client, parameters, tracking):
        asked.append(parameters)
        raise UserError("preflight (fourm-kfp doctor): s3 secret failed (above); nothing was created")
    try:
        with pytest.raises(UserError, match="preflight"):
            submit(_request(emulator), out=lambda line: None, preflight=failing_preflight)
        assert asked and asked[0]["pretrain_launcher"] == "pytorchjob"  # the run's parameters, typed
        assert not emulator.pipelines and not emulator.experiments and not emulator.runs
        result = submit(_request(emulator), out=lambda line: None, preflight=lambda *args: None)
    finally:
        emulator.close()
    assert result.run_id in emulator.runs


def test_the_cli_runs_doctor_before_submitting_and_no_doctor_skips_it(monkeypatch, capsys):
    """Through the CLI, with the real doctor: no cluster here (its checks skipped), a dead MLflow server fails the
    preflight (exit 2, nothing created); ``--no-doctor`` submits the same request."""
    monkeypatch.setenv("KUBECONFIG", "/nonexistent/kubeconfig")
    monkeypatch.delenv("AWS_ACCESS_KEY_ID", raising=False)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{sock.getsockname()[1]}"
    emulator = KfpApiEmulator()
    try:
        args = ["submit", "--host", emulator.url, "--preset", "smoke", "--mlflow-tracking-uri", dead]
        refused = cli_main(args)
        out = capsys.readouterr()
        assert not emulator.pipelines and not emulator.runs
        skipped = cli_main(args[:1] + ["--no-doctor"] + args[1:])
    finally:
        emulator.close()
    assert refused == EXIT_USER_ERROR and "FAIL    mlflow" in out.out and dead in out.out
    assert "ok      kfp version" in out.out and "skipped kubernetes" in out.out and "--no-doctor" in out.err
    assert skipped == EXIT_SUCCEEDED and len(emulator.runs) == 1
