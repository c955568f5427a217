"""The pod contract, for real: the *rendered* PyTorchJob's container command, run on this machine as node 0 (the
Master pod) and node 1 (the Worker pod), with the environment the Training Operator gives each pod.

What this proves:

- the command of the rendered job (``command + args`` of the Master container, identical in the Worker
  container) trains and commits pretrain's output at the address the job is labelled with, on 2 nodes x
  ``nprocPerNode`` processes, given only the operator's variables (``PYTHONUNBUFFERED``, ``MASTER_ADDR``/
  ``PET_MASTER_ADDR``, ``MASTER_PORT``/``PET_MASTER_PORT``, ``WORLD_SIZE``, ``RANK``/``PET_NODE_RANK``,
  ``PET_NNODES``, ``PET_NPROC_PER_NODE``) and what the Secret and ConfigMap put in (``AWS_*``,
  ``MLFLOW_TRACKING_URI``): torchrun's defaults come from the ``PET_*`` variables, ranks come out right;
- the nodes need no shared folder: each has its own ``--root`` (the pod's emptyDir), ``HOME`` and ``TMPDIR``; inputs,
  checkpoints and the output go through a real S3 server;
- two pods commit the same payload as a local ``torchrun --nproc-per-node 2`` run of the same config;
- an elastic job (``elasticPolicy``, ``<stage>_min_nodes``) trains the same way with the elastic variables the
  operator adds (``PET_RDZV_ENDPOINT`` from ``rdzvHost``, the Master here; ``PET_RDZV_BACKEND``, ``PET_NNODES`` as
  ``min:max``, ``PET_MAX_RESTARTS``): the two agents meet at the Master's rendezvous and commit the same payload;
- a node killed mid-run (SIGKILL to every process of the pod: torchrun starts its worker in a session of its own,
  so killing torchrun's process group alone would leave the worker training) takes its peer down within seconds
  (the job fails instead of hanging), and the pods started again with the same command and master port resume
  from the newest complete checkpoint and end with the uninterrupted run's weights, bit for bit.

What it does not prove: there is no operator, API server, scheduler, DNS or image here (``MASTER_ADDR`` is
127.0.0.1 where a pod has ``<job>-master-0``; ``fourm-kfp`` and ``torchrun`` come from this venv, not the image; the
Worker's init container that waits for the Master's DNS is not run; 127.0.0.1 is every node's own address, so in
the elastic run either agent may host the rendezvous store, where in the cluster the Master's hostname decides it); the
restart is done by this test where the
operator would do it (``restartPolicy: OnFailure``, ``backoffLimit``); CPU and gloo only, no NCCL.

Set ``FOURM_POD_CONTRACT_LOGS=1`` to keep every node's log under ``runs/pod-contract/``.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from fourm_kfp import storage
from fourm_kfp.cluster.job_kinds import render_job
from fourm_kfp.cluster.job_spec import ADDRESS_LABEL, POD_ROOT, JobRequest
from fourm_kfp.config.loader import load_config
from fourm_kfp.contract.addressing import stage_address
from fourm_kfp.contract.manifest import payload_differences, read_manifest
from fourm_kfp.distributed import free_port
from fourm_kfp.launchers.remote import stage_command
from fourm_kfp.launchers.stage import RunContext
from fourm_kfp.model.saved_model import load_model
from fourm_kfp.stages import get_stage
from fourm_kfp.storage import open_store
from fourm_kfp.train.checkpoint import MARKER, step_dir
from tests.train.pretrain_helpers import input_args, losses, smoke_upstream

pytestmark = pytest.mark.slow

VENV_BIN = Path(sys.executable).parent
REPO = Path(__file__).resolve().parents[2]
STEPS, CHECKPOINT_EVERY = 30, 10
OVERRIDES = [f"train.steps={STEPS}", f"train.checkpoint_every={CHECKPOINT_EVERY}", "train.log_every=5"]
NODE_TIMEOUT_S = 180
PEER_DEATH_TIMEOUT_S = 120  # node 0 must fail on its own within this after node 1 is killed


# -- the job and its pods ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RenderedJob:
    job: dict
    address: str  # the fourm-kfp.org/address label
    command: list[str]  # the one container command of Master and Worker
    pods: list[str]  # "master-0", "worker-0", ...: the pod index is the position
    world_size: int  # pods x nprocPerNode, as the operator computes WORLD_SIZE
    nproc_per_node: str
    kubelet_env: dict[str, str]  # the container's env entries as the kubelet resolves them (downward API)


def render(store_uri: str, input_uris: dict[str, str], min_nodes: int = 0) -> RenderedJob:
    config = load_config("smoke", overrides=OVERRIDES)
    address = stage_address(get_stage("pretrain"), config)
    job = render_job(JobRequest(
        launcher="pytorchjob", stage="pretrain", address=address, image="unused-here", nodes=2, procs_per_node=1,
        accelerator="cpu", kfp_run_id="test-run", min_nodes=min_nodes,
        stage_args=stage_command("pretrain", RunContext("smoke", OVERRIDES, store_uri), input_uris, POD_ROOT)))
    commands, pods, kubelet_env = {}, [], {}
    for role, replica in job["spec"]["pytorchReplicaSpecs"].items():
        [container] = replica["template"]["spec"]["containers"]
        # The Secret and the ConfigMap feed the container's env (the test sets what they hold), and the downward API
        # its CPU request, which the kubelet resolves to whole CPUs (divisor 1 rounds up).
        assert [next(iter(s)) for s in container["envFrom"]] == ["secretRef", "configMapRef"]
        assert container["env"] == [{"name": "FOURM_CPU_REQUEST", "valueFrom": {
            "resourceFieldRef": {"resource": "requests.cpu", "divisor": "1"}}}]
        cpu = str(container["resources"]["requests"]["cpu"])
        kubelet_env["FOURM_CPU_REQUEST"] = str(math.ceil(int(cpu[:-1]) / 1000 if cpu.endswith("m") else float(cpu)))
        commands[role] = container["command"] + container["args"]
        pods += [f"{role.lower()}-{i}" for i in range(replica["replicas"])]
    assert set(commands) == {"Master", "Worker"} and commands["Master"] == commands["Worker"], commands
    assert pods == ["master-0", "worker-0"]
    return RenderedJob(job, job["metadata"]["labels"][ADDRESS_LABEL], commands["Master"], pods,
                       len(pods) * int(job["spec"]["nprocPerNode"]), job["spec"]["nprocPerNode"], kubelet_env)


def node_command(command: list[str], root: Path) -> list[str]:
    """The container command with the one substitution this machine needs: ``--root`` (the pod's emptyDir)."""
    i = command.index("--root")
    assert command[i + 1] == POD_ROOT
    return [*command[: i + 1], str(root), *command[i + 2:]]


def base_env(node_dir: Path, s3_env: dict[str, str]) -> dict[str, str]:
    """What a pod has besides the operator's variables: the image's PATH (the venv first), HOME and TMPDIR of its
    own, the Secret's credentials and the ConfigMap's endpoint and tracking URI; one thread per process.

    ``node_dir`` must be a short path: the DataLoader workers pass tensors through a Unix socket under TMPDIR, and
    a path over 107 bytes makes the worker's feeder thread fail, which leaves the trainer waiting forever."""
    assert len(str(node_dir)) <= 64, node_dir  # + /tmp/pymp-XXXXXXXX/listener-XXXXXXXX < 108
    for sub in ("home", "tmp"):
        (node_dir / sub).mkdir(parents=True, exist_ok=True)
    return {"PATH": os.pathsep.join([str(VENV_BIN), "/usr/local/bin", "/usr/bin", "/bin"]),
            "HOME": str(node_dir / "home"), "TMPDIR": str(node_dir / "tmp"), "LANG": "C.UTF-8",
            "OMP_NUM_THREADS": "1", "MLFLOW_TRACKING_URI": "none", **s3_env}


def operator_env(job: RenderedJob, node: int, port: int) -> dict[str, str]:
    """Exactly what the Training Operator v1 sets in a PyTorchJob pod with a Master replica (read from its source, v1.9)."""
    return {"PYTHONUNBUFFERED": "1",
            "MASTER_ADDR": "127.0.0.1", "PET_MASTER_ADDR": "127.0.0.1",  # <job>-master-0 in the cluster
            "MASTER_PORT": str(port), "PET_MASTER_PORT": str(port),
            "WORLD_SIZE": str(job.world_size), "RANK": str(node), "PET_NODE_RANK": str(node),
            "PET_NPROC_PER_NODE": job.nproc_per_node, **nnodes_and_elastic_env(job, port)}


def nnodes_and_elastic_env(job: RenderedJob, port: int) -> dict[str, str]:
    """``PET_NNODES``, and with an ``elasticPolicy`` the operator's elastic variables (``pkg/controller.v1/pytorch/
    elastic.go``): the rendezvous endpoint is ``rdzvHost`` (default ``<job>-worker-0``) at the Worker's port (the
    defaulted ``pytorchjob-port``, the Master's port too), ``PET_NNODES`` the range ``min:max``."""
    policy = job.job["spec"].get("elasticPolicy")
    if policy is None:
        return {"PET_NNODES": str(len(job.pods))}
    name = job.job["metadata"]["name"]
    host = policy.get("rdzvHost", f"{name}-worker-0")
    assert host == f"{name}-master-0", host  # the Master's Service: 127.0.0.1 here, like MASTER_ADDR
    env = {"PET_RDZV_ENDPOINT": f"127.0.0.1:{policy.get('rdzvPort', port)}",
           "PET_RDZV_BACKEND": policy.get("rdzvBackend", "c10d"),
           "PET_NNODES": f"{policy['minReplicas']}:{policy['maxReplicas']}"}
    if "maxRestarts" in policy:
        env["PET_MAX_RESTARTS"] = str(policy["maxRestarts"])
    return env


def _process_table() -> dict[int, tuple[int, int]]:
    """``{pid: (parent pid, session id)}`` of the live (not zombie) processes, from /proc."""
    table = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            if fields[0] != "Z":
                table[int(entry.name)] = (int(fields[1]), int(fields[3]))
    return table


@dataclass
class Node:
    """One pod: its container command run as a session of its own.

    torchrun starts each worker in a new session, so the pod's processes are several sessions: the agent's and one
    per worker (with its DataLoader workers). :meth:`track` records them while the agent lives, and :meth:`kill`
    SIGKILLs every process of every one of them, as losing the pod (its container's cgroup) would."""

    index: int
    dir: Path
    command: list[str]
    env: dict[str, str]
    log: Path | None = None
    proc: subprocess.Popen | None = None
    logs: list[Path] = field(default_factory=list)
    sessions: set[int] = field(default_factory=set)

    def start(self, attempt: str) -> None:
        self.log = self.dir / f"{attempt}.log"
        self.logs.append(self.log)
        with open(self.log, "wb") as out:  # the child keeps its own descriptor
            self.proc = subprocess.Popen(self.command, env=self.env, cwd=self.env["HOME"], stdout=out,
                                         stderr=subprocess.STDOUT, start_new_session=True)
        self.sessions.add(self.proc.pid)

    def track(self) -> None:
        """Add the sessions of the agent's descendants (its workers) to the pod's."""
        if self.proc is None or self.proc.poll() is not None:
            return
        table = _process_table()
        children: dict[int, list[int]] = {}
        for pid, (ppid, _) in table.items():
            children.setdefault(ppid, []).append(pid)
        todo = [self.proc.pid]
        while todo:
            for child in children.get(todo.pop(), []):
                self.sessions.add(table[child][1])
                todo.append(child)

    def running(self) -> bool:
        self.track()
        return self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL every process of the pod: the agent's session and its workers' sessions."""
        self.track()
        for _ in range(100):
            doomed = [pid for pid, (_, sid) in _process_table().items() if sid in self.sessions]
            if not doomed:
                break
            for pid in doomed:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.02)
        if self.proc is not None:
            self.proc.wait()

    def text(self) -> str:
        return self.log.read_text(errors="replace") if self.log and self.log.exists() else ""

    def tail(self, lines: int = 10) -> str:
        """The log's last lines; node 0's closing stage outcome (a JSON object on stdout) is summed up in one."""
        log_lines = self.text().splitlines()
        outcome = []
        if log_lines and log_lines[-1] == "}" and "{" in log_lines:
            start = len(log_lines) - 1 - log_lines[::-1].index("{")
            log_lines, outcome = log_lines[:start], [f"(then the stage outcome: {len(log_lines) - start} lines of "
                                                     "JSON on stdout)"]
        return "\n".join(f"  node {self.index} | {line}" for line in log_lines[-lines:] + outcome)


class Cluster:
    """Two 'pods' started from one rendered job; every node process is killed at teardown if still running."""

    def __init__(self, job: RenderedJob, base: Path, s3_env: dict[str, str], name: str):
        self.job, self.name = job, name
        self.port = free_port()
        self.nodes = []
        for i, _pod in enumerate(job.pods):
            node_dir = base / f"node{i}"
            self.nodes.append(Node(i, node_dir, node_command(job.command, node_dir / "scratch-run"),
                                   {**base_env(node_dir, s3_env), **job.kubelet_env,
                                    **operator_env(job, i, self.port)}))

    def start(self, attempt: str) -> None:
        for node in self.nodes:
            node.start(attempt)

    def wait(self, timeout_s: float = NODE_TIMEOUT_S) -> list[int | None]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and any([n.running() for n in self.nodes]):
            time.sleep(0.2)
        return [n.proc.poll() for n in self.nodes]

    def tails(self, lines: int = 10) -> str:
        return "\n".join(f"--- {self.name} node {n.index} ({n.log.name}) ---\n{n.tail(lines)}" for n in self.nodes)

    def report(self) -> str:
        """The nodes' last lines: printed (pytest shows them on failure) and returned for assertion messages."""
        text = self.tails()
        print(text)
        return text

    def keep_logs(self) -> None:
        """Copy every node log to runs/pod-contract/ when FOURM_POD_CONTRACT_LOGS is set (nothing otherwise)."""
        if not os.environ.get("FOURM_POD_CONTRACT_LOGS"):
            return
        target = REPO / "runs" / "pod-contract"
        target.mkdir(parents=True, exist_ok=True)
        for node in self.nodes:
            for log in node.logs:
                shutil.copyfile(log, target / f"{self.name}-{log.stem}-node{node.index}.log")

    def close(self) -> None:
        for node in self.nodes:
            node.kill()
        self.keep_logs()


# -- fixtures ------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def s3(s3_server):
    """The S3 server's endpoint and credentials in this process's environment too (to build inputs and read outputs);
    a fresh bucket for the module."""
    with pytest.MonkeyPatch.context() as mp:
        for name, value in s3_server.env().items():
            mp.setenv(name, value)
        storage._CLIENTS.clear()
        bucket = f"pod-contract-{uuid.uuid4().hex[:10]}"
        open_store(f"s3://{bucket}", create=True)
        yield s3_server.env(), f"s3://{bucket}"
    storage._CLIENTS.clear()


@pytest.fixture(scope="module")
def upstream(s3) -> dict[str, str]:
    """Committed smoke prepare-data, train-tokenizers and pretokenize outputs in the S3 store (pretrain's inputs)."""
    _, bucket = s3
    return smoke_upstream(open_store(f"{bucket}/store", create=True))


@pytest.fixture
def clusters(tmp_path_factory):
    made: list[Cluster] = []

    def make(job: RenderedJob, name: str, s3_env: dict[str, str]) -> Cluster:
        cluster = Cluster(job, tmp_path_factory.mktemp(name), s3_env, name)
        made.append(cluster)
        return cluster

    yield make
    for cluster in made:
        cluster.close()


@dataclass(frozen=True)
class PodRun:
    job: RenderedJob
    output_uri: str
    manifest: dict
    logs: str  # the nodes' last lines (for assertion messages)
    full_logs: str  # every line of every node (for assertions: a tail can be all one traceback, see below)


@pytest.fixture(scope="module")
def uninterrupted(s3, upstream, tmp_path_factory) -> PodRun:
    """The rendered job's two pods, run once to the end (shared by both tests): the pipeline's store, where the
    upstream outputs are."""
    s3_env, bucket = s3
    store_uri = f"{bucket}/store"
    job = render(store_uri, upstream)
    cluster = Cluster(job, tmp_path_factory.mktemp("uninterrupted"), s3_env, "uninterrupted")
    try:
        cluster.start("attempt-1")
        codes = cluster.wait()
        logs = cluster.report()
        assert codes == [0, 0], f"the pods exited with {codes}\n{logs}"
    finally:
        cluster.close()
    output = open_store(store_uri).child("pretrain", job.address)
    found = read_manifest(output)
    assert found is not None, f"nothing committed at {output.uri}\n{logs}"
    return PodRun(job, output.uri, found[0], logs, "\n".join(node.text() for node in cluster.nodes))


def _weights(output_uri: str, tmp: Path) -> dict[str, torch.Tensor]:
    path = tmp / f"{uuid.uuid4().hex}.safetensors"
    open_store(output_uri).get_file("model/model.safetensors", path)
    return load_file(str(path))


def _assert_same_weights(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert sorted(a) == sorted(b)
    differing = [k for k in a if not torch.equal(a[k], b[k])]
    assert not differing, f"{len(differing)} of {len(a)} tensors differ, e.g. {differing[:5]}"


# -- the tests -----------------------------------------------------------------------------------------------------


def test_two_pods_commit_what_a_local_two_process_run_commits(uninterrupted, s3, upstream, tmp_path_factory):
    run, manifest = uninterrupted, uninterrupted.manifest
    assert manifest["content_hash"] == run.job.address and run.output_uri.endswith(f"/pretrain/{run.job.address}")
    metrics = manifest["metrics"]
    assert metrics["steps"] == STEPS and metrics["resumed"] == 0.0 and metrics["replica_divergence"] == 0.0
    # world size 2: one process per node. Searched in the whole logs: when node 0's agent (it hosts the rendezvous
    # store) exits first, node 1's agent ends its log with a long "Error waiting on exit barrier" traceback (exit
    # status 0), which fills any tail.
    assert "(2 ranks x 1 micro-batches of 2)" in run.full_logs, run.logs
    model, card = load_model(run.output_uri)  # from S3; the card finds the tokenizers beside the output
    assert card["step"] == STEPS and sum(p.numel() for p in model.parameters()) == card["parameters"]

    # The same config as a local 2-process torchrun, into another store.
    s3_env, bucket = s3
    local_store = f"{bucket}/local-torchrun"
    node_dir = tmp_path_factory.mktemp("local")
    env = {**base_env(node_dir, s3_env), "PYTHONUNBUFFERED": "1"}
    sets = [arg for item in OVERRIDES for arg in ("--set", item)]
    cmd = [str(VENV_BIN / "torchrun"), "--nproc-per-node", "2", "--master-port", str(free_port()),
           "-m", "fourm_kfp.cli", "stage", "pretrain", "--preset", "smoke", *sets, "--root", str(node_dir / "root"),
           "--store", local_store, *input_args(upstream)]
    done = subprocess.run(cmd, env=env, cwd=env["HOME"], capture_output=True, text=True, timeout=NODE_TIMEOUT_S)
    assert done.returncode == 0, done.stderr[-4000:]
    outcome = json.loads(done.stdout[done.stdout.index("{"):])
    local = read_manifest(open_store(outcome["output_uri"]))[0]
    assert outcome["output_uri"] == f"{local_store}/pretrain/{run.job.address}"

    assert [f["key"] for f in manifest["files"]] == [f["key"] for f in local["files"]]
    # Same world size, same ranks, gloo on CPU: the very same bytes.
    assert payload_differences(local, manifest) == []
    assert manifest["payload_digest"] == local["payload_digest"]


def test_an_elastic_job_s_pods_meet_at_the_master_s_rendezvous_and_commit_the_same_payload(
        uninterrupted, s3, upstream, clusters):
    s3_env, bucket = s3
    store_uri = f"{bucket}/elastic"
    job = render(store_uri, upstream, min_nodes=1)
    assert job.address == uninterrupted.job.address  # elasticity is not part of the address
    cluster = clusters(job, "elastic", s3_env)
    assert cluster.nodes[1].env["PET_NNODES"] == "1:2" and "PET_RDZV_ENDPOINT" in cluster.nodes[1].env
    cluster.start("attempt-1")
    codes = cluster.wait()
    logs = cluster.report()
    assert codes == [0, 0], f"the pods exited with {codes}\n{logs}"
    full_logs = "\n".join(node.text() for node in cluster.nodes)
    assert "(2 ranks x 1 micro-batches of 2)" in full_logs, logs  # both nodes joined one rendezvous
    output = open_store(store_uri).child("pretrain", job.address)
    manifest = read_manifest(output)[0]
    assert manifest["metrics"]["steps"] == STEPS
    assert payload_differences(uninterrupted.manifest, manifest) == []


def test_a_killed_node_fails_the_job_and_the_restarted_pods_resume_to_the_same_weights(
        uninterrupted, s3, upstream, clusters, tmp_path):
    s3_env, bucket = s3
    store_uri = f"{bucket}/killed"  # the same address as the uninterrupted run, in another store
    job = render(store_uri, upstream)
    assert job.address == uninterrupted.job.address
    output = open_store(store_uri).child("pretrain", job.address)
    first = output.child("checkpoints", step_dir(CHECKPOINT_EVERY))
    cluster = clusters(job, "killed", s3_env)
    master, worker = cluster.nodes

    cluster.start("attempt-1")
    deadline = time.monotonic() + NODE_TIMEOUT_S
    while not first.exists(MARKER):
        assert all([n.running() for n in cluster.nodes]) and time.monotonic() < deadline, \
            f"no complete step-{CHECKPOINT_EVERY} checkpoint while both nodes ran\n{cluster.report()}"
        time.sleep(0.05)
    worker.kill()  # node 1 is lost: every process of the pod
    lost_at = time.monotonic()
    try:
        code = master.proc.wait(timeout=PEER_DEATH_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        master.kill()  # what the operator's restart would do
        pytest.fail(f"node 0 hung for {PEER_DEATH_TIMEOUT_S}s after node 1 was killed\n{cluster.report()}")
    print(f"node 0 exited with {code} {time.monotonic() - lost_at:.1f}s after node 1 was killed")
    killed_logs = cluster.report()
    assert code != 0, f"node 0 exited 0 although its peer was killed\n{killed_logs}"
    assert read_manifest(output) is None, "committed before the kill: make the run longer"

    # The operator restarts the pods: the same command and environment (the master's port stays).
    cluster.start("attempt-2")
    codes = cluster.wait()
    logs = cluster.report()
    assert codes == [0, 0], f"the restarted pods exited with {codes}\n{logs}"
    resumed_at = [int(line.rsplit("(step ", 1)[1].rstrip(")"))
                  for line in master.text().splitlines() if " resumed from " in line]
    assert resumed_at and CHECKPOINT_EVERY <= resumed_at[0] < STEPS, master.text()[-3000:]
    manifest = read_manifest(output)[0]
    assert manifest["metrics"]["resumed"] == 1.0 and manifest["metrics"]["steps"] == STEPS

    # The uninterrupted run's weights, bit for bit, and its losses from step 1: the checkpoint carries the history.
    _assert_same_weights(_weights(output.uri, tmp_path), _weights(uninterrupted.output_uri, tmp_path))
    after, expected = losses(output.uri), losses(uninterrupted.output_uri)
    assert after == expected and min(after) < resumed_at[0]
    # and the uninterrupted run's payload: the model, the DCP files, train_state.json, every rank file with its loader
    # position and RNG states, metrics.jsonl and the reports
    differences = payload_differences(uninterrupted.manifest, manifest)
    assert not differences, differences
    assert manifest["payload_digest"] == uninterrupted.manifest["payload_digest"]
