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
    assert "AWS_ACCESS_KEY_ID" not in {e.name for e in container.env}  # a credential never enters the app
    assert f"--root {KUBERNETES_ROOT} --store s3://b/p" in container.command[2]
    assert container.resources.limits["nvidia.com/gpu"] == "4"
    # sized for a 4-GPU training replica unless told otherwise (torchx: memMB is the limit, 1024 less the request)
    assert container.resources.limits["memory"] == f"{4 * 64 * 1024}M" \
        and container.resources.requests["cpu"] == "31900m"  # 32 CPUs less torchx's 100m reserve
    small = TorchxParams(scheduler="kubernetes", cpu=2, mem_mb=4096)
    assert replica_resources(small) == (2, 4096) and replica_resources(TorchxParams()) == (8, 32 * 1024)


class ScheduleCapture:
    """A torchx runner that dry-runs with the real one (torchx's own KubernetesScheduler; no cluster is needed) and
    records what :meth:`schedule` is given instead of creating it: the app then "succeeds" at once."""

    def __init__(self, runner):
        self.runner, self.scheduled = runner, []

    def scheduler_run_opts(self, scheduler):
        return self.runner.scheduler_run_opts(scheduler)

    def dryrun(self, *args, **kwargs):
        return self.runner.dryrun(*args, **kwargs)

    def schedule(self, info):
        self.scheduled.append(info)
        return "kubernetes://torchx/ml:fourm-pretrain-0123456789abcdef-x"

    def log_lines(self, *args, **kwargs):
        return iter(())

    def wait(self, handle, wait_interval):
        from torchx.specs import AppState, AppStatus

        return AppStatus(AppState.SUCCEEDED)


K8S_SECRETS = {"AWS_ACCESS_KEY_ID": "AKIA-given-with-env", "AWS_SECRET_ACCESS_KEY": "s3cr3t-given-with-env",
               "MLFLOW_TRACKING_TOKEN": "mlflow-token-given-with-env"}
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


def _schedule_kubernetes(tmp_path, params: TorchxParams) -> tuple[dict, list[str]]:
    """``TorchxApp.start`` on the kubernetes scheduler up to what it schedules: the Volcano job as the API server
    would receive it (torchx's own serialization), and the launcher's lines."""
    from types import SimpleNamespace

    from torchx.runner import get_runner
    from torchx.schedulers.kubernetes_scheduler import sanitize_for_serialization

    from fourm_kfp.launchers.torchx_job import TorchxApp

    plan = SimpleNamespace(stage="pretrain", address=ADDRESS, output=SimpleNamespace(uri=f"s3://b/p/x/{ADDRESS}"))
    args = stage_command("pretrain", RunContext("smoke", [], "s3://b/p"), {"pretokenize": "s3://b/p/x"},
                         KUBERNETES_ROOT)
    lines: list[str] = []
    with get_runner() as real, keeping_signal_handlers():
        capture = ScheduleCapture(real)
        TorchxApp(params, tmp_path, runner=capture, out=lines.append).start(plan, args, lambda: None)
    [info] = capture.scheduled
    return sanitize_for_serialization(info.request.resource), lines


def test_kubernetes_pods_read_credentials_from_the_secret_never_as_values(tmp_path, monkeypatch):
    """Point 10: torchx writes a role's env as literal values into the vcjob (readable by anyone who may read
    vcjobs); the launcher sends the credentials by reference to the Secret instead, whether they were given with
    --env or are in the launching environment, and says so without printing them."""
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s3cr3t-of-the-launching-env")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIA-of-the-launching-env")
    params = TorchxParams(scheduler="kubernetes", j="2x4", gpu=4, scheduler_args=["queue=default", "namespace=ml"],
                          env={**K8S_SECRETS, "FOURM_TEST_SETTING": "kept"})
    job, lines = _schedule_kubernetes(tmp_path, params)
    text = json.dumps(job)
    for value in [*K8S_SECRETS.values(), "s3cr3t-of-the-launching-env", "AKIA-of-the-launching-env"]:
        assert value not in text and not any(value in line for line in lines)
    assert len(job["spec"]["tasks"]) == 2
    for task in job["spec"]["tasks"]:
        [container] = task["template"]["spec"]["containers"]
        env = {e["name"]: e for e in container["env"]}
        assert env["FOURM_TEST_SETTING"] == {"name": "FOURM_TEST_SETTING", "value": "kept"}  # not a credential
        # the Secret's keys (manifests/base) and a token it may hold, each optional: a pod with an IAM role
        # (IRSA) and no Secret still starts
        for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "MLFLOW_TRACKING_TOKEN"):
            assert env[key] == {"name": key, "valueFrom": {"secretKeyRef": {"name": "fourm-s3-credentials",
                                                                            "key": key, "optional": True}}}
    [said] = [line for line in lines if "Secret" in line]
    assert "fourm-s3-credentials" in said and "not copied into the job" in said
    assert all(name in said for name in K8S_SECRETS)
    # another Secret by name
    job, _ = _schedule_kubernetes(tmp_path, TorchxParams(scheduler="kubernetes", scheduler_args=["queue=q"],
                                                         credentials_secret="team-s3"))
    [container] = job["spec"]["tasks"][0]["template"]["spec"]["containers"]
    assert {e["valueFrom"]["secretKeyRef"]["name"] for e in container["env"] if "valueFrom" in e} == {"team-s3"}


def test_kubernetes_pods_tolerate_the_accelerator_and_get_placement_and_pull_secret(tmp_path):
    """Point 10: torchx adds no tolerations (its node selector is at most the instance type) and no pull secret;
    the launcher adds the accelerator's toleration when the replicas request GPUs, the user's tolerations and node
    selector (Kubernetes objects, as the pipeline's pretrain_tolerations/pretrain_node_selector) and the pull
    secret, on every pod template of the vcjob. Memory as torchx 0.7 sets it: limit memMB, request memMB - 1024."""
    own = {"key": "team", "operator": "Equal", "value": "ml", "effect": "NoExecute", "tolerationSeconds": 60}
    params = TorchxParams(scheduler="kubernetes", j="2x8", gpu=8, mem_mb=900_000, scheduler_args=["queue=default"],
                          tolerations=[own, GPU_TOLERATION], node_selector={"nvidia.com/gpu.product": "H100"},
                          image_pull_secret="regcred")
    from fourm_kfp.cluster.job_kinds import PYTORCHJOB

    # the accelerator's toleration is the one the cluster's job templates carry
    assert GPU_TOLERATION in PYTORCHJOB.load_template()["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"][
        "tolerations"]
    job, _ = _schedule_kubernetes(tmp_path, params)
    for task in job["spec"]["tasks"]:
        spec = task["template"]["spec"]
        assert spec["tolerations"] == [GPU_TOLERATION, own]  # no duplicate of the accelerator's
        assert spec["nodeSelector"] == {"nvidia.com/gpu.product": "H100"}
        assert spec["imagePullSecrets"] == [{"name": "regcred"}]
        [container] = spec["containers"]
        assert container["resources"]["limits"]["memory"] == "900000M"
        assert container["resources"]["requests"]["memory"] == f"{900_000 - 1024}M"
    # CPU replicas: no accelerator toleration (and none at all when none is given), no pull secret unless asked
    job, _ = _schedule_kubernetes(tmp_path, TorchxParams(scheduler="kubernetes", scheduler_args=["queue=q"]))
    spec = job["spec"]["tasks"][0]["template"]["spec"]
    assert "tolerations" not in spec and "imagePullSecrets" not in spec and not spec.get("nodeSelector")
    # a toleration that is not a Kubernetes toleration object fails before anything is scheduled
    with pytest.raises(ConfigError, match=r"--toleration .*'tolerance'.*effect, key, operator, tolerationSeconds"):
        _schedule_kubernetes(tmp_path, TorchxParams(scheduler="kubernetes", scheduler_args=["queue=q"],
                                                    tolerations=[{"key": "a", "tolerance": "Exists"}]))


def test_launch_command_takes_the_kubernetes_pod_options(tmp_path, monkeypatch, capsys):
    from types import SimpleNamespace

    import fourm_kfp.launchers.torchx_job as torchx_job
    from fourm_kfp.cli import main

    given: list[TorchxParams] = []

    def fake_launch(stage, run, *, params, **kwargs):
        given.append(params)
        return SimpleNamespace(to_dict=lambda: {"status": "ran"})

    monkeypatch.setattr(torchx_job, "launch_torchx", fake_launch)
    base = ["launch", "pretrain", "--scheduler", "kubernetes", "--store", "s3://b/p", "--root", str(tmp_path)]
    own = {"key": "team", "operator": "Exists", "effect": "NoSchedule"}
    assert main([*base, "--toleration", json.dumps(own), "--toleration", json.dumps([GPU_TOLERATION]),
                 "--node-selector", "pool=a100", "--image-pull-secret", "regcred",
                 "--credentials-secret", "team-s3"]) == 0
    [params] = given
    assert params.tolerations == [own, GPU_TOLERATION] and params.node_selector == {"pool": "a100"}
    assert params.image_pull_secret == "regcred" and params.credentials_secret == "team-s3"
    assert main(base) == 0 and given[1].credentials_secret == "fourm-s3-credentials"
    assert main([*base, "--toleration", "key=team"]) == 2
    assert "--toleration 'key=team': expected a JSON toleration object or a JSON list of them" in \
        capsys.readouterr().err


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
