"""``fourm-kfp launch pretrain`` through torchx: a ``local_cwd`` ``dist.ddp -j 2x1`` run (two single-process
"nodes" with a real c10d rendezvous) commits the very bytes a plain 2-process torchrun commits; a relaunch plans
first and creates no app; missing inputs fail before anything is scheduled; the app, the scheduler config and the
rendezvous ports; and the environment's one known broken requirement (torchx's stale urllib3 bound)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

from fourm_kfp.config.schema import ConfigError
from fourm_kfp.contract.manifest import MANIFEST_NAME, IncompleteOutputError
from fourm_kfp.launchers.remote import stage_command
from fourm_kfp.launchers.stage import RunContext
from fourm_kfp.storage import open_store
from fourm_kfp.distributed import free_port
from fourm_kfp.launchers.torchx_job import (KUBERNETES_ROOT, TORCHX_SIGNALS, TorchxParams, build_app,
                                     keeping_signal_handlers, launch_torchx, replica_resources, rendezvous_port,
                                     scheduler_config)
from tests.train.pretrain_helpers import input_args, smoke_upstream

BIN = Path(sys.executable).parent
ENV = {**os.environ, "MLFLOW_TRACKING_URI": "none", "OMP_NUM_THREADS": "1"}
SETS = ("train.steps=4", "train.checkpoint_every=2")
ADDRESS = "0123456789abcdef"


def _sets() -> list[str]:
    return [arg for item in SETS for arg in ("--set", item)]


def _manifest(output_uri: str) -> dict:
    return json.loads(open_store(output_uri).get_bytes(MANIFEST_NAME))


@pytest.fixture
def no_torchx_app(monkeypatch):
    """Fail the test if anything asks torchx for a runner (the only way to create an app)."""
    import torchx.runner

    def refuse(*args, **kwargs):
        raise AssertionError("a torchx runner was created")

    monkeypatch.setattr(torchx.runner, "get_runner", refuse)


@pytest.mark.slow
def test_local_cwd_ddp_commits_what_torchrun_commits_and_a_relaunch_creates_no_app(tmp_path, monkeypatch,
                                                                                     no_torchx_app):
    upstream = smoke_upstream(open_store(str(tmp_path / "upstream"), create=True))
    inputs = input_args(upstream)
    # The torchx path, as users run it (replicas start in the current folder: tmp_path).
    launched = subprocess.run(
        [str(BIN / "fourm-kfp"), "launch", "pretrain", "--scheduler", "local_cwd", "-j", "2x1", "--preset", "smoke",
         "--root", str(tmp_path / "tx"), *_sets(), *inputs, "--json", str(tmp_path / "tx.json")],
        cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=600)
    assert launched.returncode == 0, launched.stdout[-3000:] + launched.stderr[-3000:]
    assert "local_cwd dist.ddp -j 2x1, rendezvous port" in launched.stdout
    assert "[0]:" in launched.stdout and "pretrain step 4/4" in launched.stdout  # replica 0's log, streamed
    outcome = json.loads((tmp_path / "tx.json").read_text())
    assert outcome["status"] == "ran" and outcome["metrics"]["steps"] == 4.0
    assert outcome["metrics"]["replica_divergence"] == 0.0
    [app_dir] = (tmp_path / "tx" / "torchx").glob("*/fourm-pretrain-*")
    assert sorted(p.name for p in (app_dir / "cli").iterdir()) == ["0", "1"]  # two nodes, one process each

    # The same stage on one "node" with two processes, into another store.
    torchrun = [str(BIN / "torchrun"), "--nproc-per-node", "2", "--master-port", str(free_port()),
                "-m", "fourm_kfp.cli"]
    ref = subprocess.run([*torchrun, "stage", "pretrain", "--preset", "smoke", "--root", str(tmp_path / "ref"),
                          *_sets(), *inputs, "--json", str(tmp_path / "ref.json")],
                         cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=600)
    assert ref.returncode == 0, ref.stderr[-3000:]
    reference = json.loads((tmp_path / "ref.json").read_text())
    assert outcome["output_uri"].rsplit("/", 1)[1] == reference["output_uri"].rsplit("/", 1)[1]  # same address
    assert outcome["output_uri"] != reference["output_uri"]
    launched_manifest, reference_manifest = _manifest(outcome["output_uri"]), _manifest(reference["output_uri"])
    assert launched_manifest["deterministic"] is True
    assert launched_manifest["payload_digest"] == reference_manifest["payload_digest"]  # bit-identical payload

    # Plan first: the output is committed, so a relaunch creates no torchx app (no_torchx_app) and reports it.
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "none")
    lines: list[str] = []
    again = launch_torchx("pretrain", RunContext("smoke", SETS, str(tmp_path / "tx")), root=tmp_path / "tx",
                            input_uris=upstream, params=TorchxParams(scheduler="local_cwd", j="2x1"),
                            out=lines.append)
    assert lines == [f"[torchx] pretrain {outcome['output_uri'].rsplit('/', 1)[1]} is committed at "
                     f"{outcome['output_uri']}: creating no torchx app"]
    assert again.status == "skipped" and again.output_uri == outcome["output_uri"]
    assert again.manifest_digest == outcome["manifest_digest"]


def test_missing_inputs_fail_before_anything_is_scheduled(tmp_path, monkeypatch, no_torchx_app):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "none")
    with pytest.raises(IncompleteOutputError, match="input 'pretokenize' of stage 'pretrain'"):
        launch_torchx("pretrain", RunContext("smoke", SETS, str(tmp_path)), root=tmp_path, out=print)
    with pytest.raises(ConfigError, match="local folder the pods cannot see"):
        launch_torchx("pretrain", RunContext("smoke", SETS, str(tmp_path)), root=tmp_path,
                        params=TorchxParams(scheduler="kubernetes"), out=print)


def test_the_app_is_dist_ddp_running_the_stage_on_its_own_rendezvous_port(tmp_path):
    inputs = {"pretokenize": "s3://b/p/pretokenize/1", "train-tokenizers": "s3://b/p/train-tokenizers/2"}
    args = stage_command("pretrain", RunContext("smoke", ["train.steps=4"], "s3://b/p", "http://s3:9000"), inputs,
                         str(tmp_path))
    assert args[:2] == ["stage", "pretrain"] and args[args.index("--root") + 1] == str(tmp_path)
    assert "--force" not in args  # a retried replica resumes; a forced output is cleared once, by the launcher
    app = build_app(args, ADDRESS, TorchxParams(scheduler="local_cwd", j="2x1"), 31234)
    [role] = app.roles
    assert app.name == f"fourm-pretrain-{ADDRESS}" and role.num_replicas == 2 and role.entrypoint == "bash"
    command = role.args[1]
    assert re.search(r"--rdzv_endpoint \S*:=localhost}:31234 ", command)  # rank 0's host, this port
    assert "--nnodes 2 --nproc_per_node 1" in command and "-m fourm_kfp.cli stage pretrain" in command
    assert role.env["PATH"].split(os.pathsep)[0] == str(BIN)  # local_cwd runs torchrun from PATH: this one
    # Ports: a free one per local job; elsewhere one derived from the address (or the one asked for).
    assert rendezvous_port("kubernetes", ADDRESS) == rendezvous_port("slurm", ADDRESS) != \
        rendezvous_port("slurm", "fedcba9876543210")
    assert 20000 <= rendezvous_port("slurm", ADDRESS) < 30000 and rendezvous_port("local_cwd", ADDRESS, 29999) == 29999


def test_kubernetes_renders_a_volcano_job_of_the_image_and_scheduler_config_is_checked():
    from torchx.runner import get_runner

    args = stage_command("pretrain", RunContext("smoke", [], "s3://b/p"),
                         {"pretokenize": "s3://b/p/x", "train-tokenizers": "s3://b/p/y"}, KUBERNETES_ROOT)
    params = TorchxParams(scheduler="kubernetes", j="2x4", gpu=4, image="registry.example/fourm:1",
                          env={"AWS_ACCESS_KEY_ID": "k"})
    handlers = [signal.getsignal(s) for s in TORCHX_SIGNALS]
    with get_runner() as runner, keeping_signal_handlers():
        cfg = scheduler_config(runner, "kubernetes", ["queue=default", "namespace=ml"])
        job = runner.dryrun(build_app(args, ADDRESS, params, 21000), "kubernetes", cfg=cfg).request.resource
        with pytest.raises(ConfigError, match="needs --scheduler-arg queue="):
            scheduler_config(runner, "kubernetes", [])
        with pytest.raises(ConfigError, match="slurm has no such option; its options: .*partition"):
            scheduler_config(runner, "slurm", ["queue=default"])
        assert scheduler_config(runner, "local_cwd", ["prepend_cwd=true"]) == {"prepend_cwd": True}
        assert signal.getsignal(signal.SIGTERM) not in handlers  # torchx's local scheduler set its own
    # and the process handles its signals as before: a worker forked later ends on a pool's SIGTERM
    assert [signal.getsignal(s) for s in TORCHX_SIGNALS] == handlers
    assert job["kind"] == "Job" and job["spec"]["queue"] == "default" and len(job["spec"]["tasks"]) == 2
    container = job["spec"]["tasks"][0]["template"].spec.containers[0]
    assert container.image == "registry.example/fourm:1" and "PATH" not in {e.name for e in container.env}
    assert {"name": "AWS_ACCESS_KEY_ID", "value": "k"} in [{"name": e.name, "value": e.value} for e in container.env]
    assert f"--root {KUBERNETES_ROOT} --store s3://b/p" in container.command[2]
    assert container.resources.limits["nvidia.com/gpu"] == "4"
    # sized for a 4-GPU training replica unless told otherwise (torchx's memMB is the container's memory limit)
    assert container.resources.limits["memory"] == f"{4 * 64 * 1024}M" \
        and container.resources.requests["cpu"] == "31900m"  # 32 CPUs less torchx's 100m reserve
    small = TorchxParams(scheduler="kubernetes", cpu=2, mem_mb=4096)
    assert replica_resources(small) == (2, 4096) and replica_resources(TorchxParams()) == (8, 32 * 1024)


def test_pip_check_reports_only_torchxs_stale_urllib3_bound():
    """torchx 0.7.0 is installed with --no-deps (Makefile): its `urllib3<1.27` contradicts kfp's urllib3 pin. That
    is the one complaint `pip check` may make; any other broken requirement fails here."""
    result = subprocess.run([sys.executable, "-m", "pip", "check", "--disable-pip-version-check"],
                            capture_output=True, text=True)
    complaints = [line for line in result.stdout.splitlines() if line and line != "No broken requirements found."]
    expected = re.compile(r"torchx \S+ has requirement urllib3[^ ]*, but you have urllib3 \S+\.")
    assert all(expected.fullmatch(line) for line in complaints), complaints
    try:
        torchx_version = metadata.version("torchx")
    except metadata.PackageNotFoundError:
        torchx_version = None
    if torchx_version == "0.7.0":
        assert complaints == [f"torchx 0.7.0 has requirement urllib3<1.27,>=1.21.1, but you have urllib3 "
                              f"{metadata.version('urllib3')}."]
        assert result.returncode == 1
    else:
        assert result.returncode == 0
