"""``fourm-kfp launch pretrain`` (or ``train-tokenizers``): a job stage as a torchx ``dist.ddp`` job, for teams
without Kubeflow.

:func:`launch_torchx` runs the one remote-launch skeleton (:func:`fourm_kfp.launchers.remote.launch_remote`:
plan, skip when committed, open the inputs, start, report the committed output) with :class:`TorchxApp` as its
backend, which does:

1. **build** the app from torchx's ``dist.ddp`` component: ``-j NNODESxNPROC`` replicas each running
   ``torchrun -m fourm_kfp.cli stage <stage> ...``, the one training entry point PyTorchJob pods run too
   (:func:`fourm_kfp.launchers.remote.stage_command`), with the resolved input URIs and no ``--force`` (a
   retried replica resumes; a forced output is cleared once, just before the app is scheduled). Every job gets
   its own rendezvous port (dist.ddp's default, 29500, is fixed): a free port here for ``local_cwd``, one derived
   from the address elsewhere, or ``rdzv_port``;
2. **run** it with :func:`torchx.runner.get_runner` on ``local_cwd``, ``slurm`` or ``kubernetes`` (Volcano; its
   ``queue`` is required): validate the scheduler config (dry run), on ``kubernetes`` complete the dry run's Volcano
   job (:func:`patch_volcano_job`), schedule, stream replica 0's log, wait for a terminal state; a failed or
   cancelled app raises :class:`LaunchFailed` with torchx's error.

Where the replicas run: ``local_cwd`` runs them here, in the current folder, with this interpreter's ``bin/``
first on ``PATH`` (torchx calls ``torchrun`` from ``PATH``); ``slurm`` runs them in the submit (or ``job_dir``)
folder with the submitting environment, so the store and ``--root`` must be on a shared file system;
``kubernetes`` (a Volcano job) runs them in ``image`` (default: the pretrain GPU image), whose own ``torchrun``
starts the stage — there ``--root`` is a folder in the pod, the store must be object storage, and the pods get
only the environment given (``env``) plus the credentials by reference to a Secret (:data:`SECRET_ENV`).

torchx 0.7's Volcano job alone would not do for a shared cluster: its ``role_to_pod`` writes every variable of the
role as a literal ``value`` (anyone who may read vcjobs would read the S3 keys), and it sets no tolerations (so
no pod lands on a GPU node tainted ``nvidia.com/gpu:NoSchedule``), no pull secret and no node selector beyond the
instance type. :func:`patch_volcano_job` edits the dry run's pod templates before they are scheduled (what torchx's
``Runner.schedule`` documents for a setting it has no option for): credentials by ``secretKeyRef``, the
accelerator's toleration and the user's, the node selector and the image pull secret, as the pipeline's jobs have.

torchx 0.7.0 is installed by ``make setup`` with ``--no-deps`` (its ``urllib3<1.27`` bound is stale and contradicts
kfp's pin; see the Makefile); it is imported only when a launch runs, and :func:`require_torchx` tells a user
without it the commands that install it (the ``launch`` extra holds its other requirements).

Over 400 lines and one concern: the torchx backend of a remote launch, from building the app to its end, with
the Volcano job edits that torchx itself has no option for.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

from fourm_kfp.cluster.job_spec import GPU_TOLERATION
from fourm_kfp.config.schema import ConfigError
from fourm_kfp.distributed import free_port
from fourm_kfp.errors import UserError
from fourm_kfp.launchers.remote import RemoteBackend, launch_remote
from fourm_kfp.launchers.stage import LaunchPlan, RunContext

if TYPE_CHECKING:
    from fourm_kfp.contract import StageOutcome

log = logging.getLogger(__name__)

SCHEDULERS = ("local_cwd", "slurm", "kubernetes")
#: The module every replica's torchrun starts: the CLI's ``stage <stage>``, as in the cluster's pods.
ENTRY_MODULE = "fourm_kfp.cli"
#: ``--root`` of the kubernetes replicas: writable in the image (torchx's Volcano pods have no /scratch volume, the
#: PyTorchJob template's ``job_spec.POD_ROOT``); only the default SQLite MLflow store would go there.
KUBERNETES_ROOT = "/tmp/fourm-run"
#: Derived rendezvous ports (schedulers other than local_cwd) fall in [PORT_BASE, PORT_BASE + PORT_SPAN).
PORT_BASE, PORT_SPAN = 20000, 10000
#: The Secret kubernetes replicas read their credentials from (``credentials_secret``): the one manifests/base
#: creates, with the keys ``AWS_ACCESS_KEY_ID`` and ``AWS_SECRET_ACCESS_KEY``.
CREDENTIALS_SECRET = "fourm-s3-credentials"
#: The variables that hold credentials, each read by kubernetes replicas from the same-named key of the credentials
#: Secret and never written into the job (a value given with ``env`` or set in the launching environment is not
#: copied). Every one is optional (``secretKeyRef.optional``), as in the pipeline's jobs: a pod whose
#: ServiceAccount has an IAM role (IRSA) needs no Secret at all, and the storage layer's credential chain takes
#: whatever the pod has.
SECRET_ENV = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "MLFLOW_TRACKING_TOKEN",
              "MLFLOW_TRACKING_PASSWORD")


class LaunchFailed(UserError):
    """The torchx app failed or was cancelled, or it succeeded without committing the stage's output."""


@dataclass
class TorchxParams:
    """How to run the job: scheduler, size, per-replica resources, image, scheduler config."""

    scheduler: str = "local_cwd"
    j: str = "1x1"  # [MIN_NODES:]NODESxPROCS_PER_NODE, as torchx's dist.ddp -j
    scheduler_args: Sequence[str] = ()  # KEY=VALUE items of the scheduler's run config (queue=, partition=, ...)
    image: str = ""  # kubernetes: the container image (default: the pretrain GPU image); slurm/local_cwd ignore it
    cpu: int = 0  # per replica; 0: see replica_resources
    gpu: int = 0
    mem_mb: int = 0  # per replica; 0: see replica_resources
    env: dict[str, str] = field(default_factory=dict)  # extra environment of the replicas (see SECRET_ENV)
    rdzv_port: int = 0  # 0: a free port (local_cwd) or one derived from the address
    max_retries: int = 0
    wait_interval_s: float = 0.0  # 0: 1 s for local_cwd, 10 s elsewhere
    # kubernetes only (patch_volcano_job): where the pods' credentials come from, and where the pods may run
    credentials_secret: str = CREDENTIALS_SECRET
    tolerations: list[dict[str, Any]] = field(default_factory=list)  # Kubernetes toleration objects
    node_selector: dict[str, str] = field(default_factory=dict)
    image_pull_secret: str = ""  # a kubernetes.io/dockerconfigjson Secret of the job's namespace


#: Per-replica defaults off this machine (``cpu``/``mem_mb`` 0): per GPU, and for a replica without GPUs: what a
#: training replica must live within, loader workers and pinned host buffers included. On Slurm torchx passes
#: ``mem_mb`` as ``--mem``. On Kubernetes torchx 0.7 (``role_to_pod``) assumes a replica takes the whole node: the
#: container's memory limit is ``mem_mb`` and its request ``max(mem_mb - 1024, 0)`` (``RESERVED_MEMMB``, left to
#: the node's system), both with the suffix ``M`` (10^6 bytes: 65536 is 65.5 GB, 61 GiB); likewise the CPU limit is
#: ``cpu`` and the request 100m less (``RESERVED_MILLICPU``); GPUs are requested and limited alike.
CPU_PER_GPU, MEM_MB_PER_GPU = 8, 64 * 1024
CPU_REPLICA_CPU, CPU_REPLICA_MEM_MB = 8, 32 * 1024


def replica_resources(params: TorchxParams) -> tuple[int, int]:
    """``(cpu, mem_mb)`` of each replica: the ones asked for, else sized by the replica's GPUs (8 CPUs and 65536 MB
    per GPU; 8 CPUs and 32768 MB without GPUs). torchx's ``memMB``: on Kubernetes the container's limit, requesting
    1024 MB less (see :data:`MEM_MB_PER_GPU`). ``local_cwd`` runs on this machine and enforces neither."""
    if params.gpu:
        defaults = (CPU_PER_GPU * params.gpu, MEM_MB_PER_GPU * params.gpu)
    else:
        defaults = (CPU_REPLICA_CPU, CPU_REPLICA_MEM_MB)
    return params.cpu or defaults[0], params.mem_mb or defaults[1]


def rendezvous_port(scheduler: str, address: str, requested: int = 0) -> int:
    """``requested``, else a free port (``local_cwd``: every replica is on this machine), else one derived from the
    content address (rank 0's node is not known here; distinct runs get distinct ports)."""
    if requested:
        return requested
    if scheduler == "local_cwd":
        return free_port()
    return PORT_BASE + int(hashlib.sha256(address.encode()).hexdigest(), 16) % PORT_SPAN


def build_app(stage_args: Sequence[str], address: str, params: TorchxParams, rdzv_port: int):
    """The torchx ``AppDef``: ``dist.ddp`` running ``torchrun -m fourm_kfp.cli <stage_args>`` (``stage <stage> ...``)
    on ``params.j``."""
    from torchx.components.dist import ddp

    from fourm_kfp.cluster.job_spec import job_name

    env = dict(params.env)
    if params.scheduler == "kubernetes":  # torchx writes env values into the job: credentials go by reference
        env = {name: value for name, value in env.items() if name not in SECRET_ENV}
    bin_dir = str(Path(sys.executable).parent)
    if params.scheduler == "local_cwd":
        # torchx's local_cwd runs `torchrun` from PATH, the role's PATH first: this environment's torchrun.
        env["PATH"] = os.pathsep.join(p for p in (bin_dir, env.get("PATH")) if p)
    elif params.scheduler == "slurm":
        # srun exports the submitting environment with the role's variables over it (a shared file system).
        env["PATH"] = os.pathsep.join(p for p in (bin_dir, env.get("PATH") or os.environ.get("PATH")) if p)
    image = params.image
    if not image:
        if params.scheduler == "kubernetes":
            from fourm_kfp.images import GPU_IMAGE

            image = GPU_IMAGE
        else:
            image = os.getcwd()  # local_cwd and slurm run in a folder, not an image
    cpu, mem_mb = replica_resources(params)
    return ddp(*stage_args, m=ENTRY_MODULE, j=params.j, name=job_name(stage_args[1], address), image=image,
               cpu=cpu, gpu=params.gpu, memMB=mem_mb, env=env, rdzv_port=rdzv_port, max_retries=params.max_retries)


def tolerations_from_json(items: Sequence[str]) -> list[dict[str, Any]]:
    """``--toleration`` arguments (each a JSON toleration object or a JSON list of them, as the pipeline's
    ``pretrain_tolerations``) as one list; checked as Kubernetes tolerations by :func:`pod_tolerations`."""
    import json

    tolerations: list[dict[str, Any]] = []
    for item in items:
        try:
            value = json.loads(item)
        except json.JSONDecodeError:
            value = None
        values = value if isinstance(value, list) else [value]
        if not values or not all(isinstance(v, dict) for v in values):
            raise ConfigError(f"--toleration {item!r}: expected a JSON toleration object or a JSON list of them, e.g. "
                              '\'{"key": "team", "operator": "Exists", "effect": "NoSchedule"}\'')
        tolerations += values
    return tolerations


def pod_tolerations(params: TorchxParams) -> list[Any]:
    """The tolerations of a kubernetes replica's pod (``V1Toleration``): :data:`GPU_TOLERATION` when the replicas
    request GPUs, then ``params.tolerations`` not already there. A toleration with a field Kubernetes does not have
    is an error naming it."""
    from kubernetes.client import V1Toleration

    fields_ = {api: attr for attr, api in V1Toleration.attribute_map.items()}  # tolerationSeconds -> toleration_seconds
    wanted = [GPU_TOLERATION] if params.gpu else []
    for toleration in params.tolerations:
        if not isinstance(toleration, dict):
            raise ConfigError(f"--toleration {toleration!r}: expected a Kubernetes toleration object")
        unknown = sorted(set(toleration) - set(fields_))
        if unknown:
            raise ConfigError(f"--toleration {toleration!r}: {', '.join(map(repr, unknown))} is not a field of a "
                              f"Kubernetes toleration; its fields: {', '.join(sorted(fields_))}")
        if toleration not in wanted:
            wanted.append(toleration)
    return [V1Toleration(**{fields_[k]: v for k, v in toleration.items()}) for toleration in wanted]


def patch_volcano_job(job: dict[str, Any], params: TorchxParams) -> None:
    """Complete torchx 0.7's Volcano job ``job`` (a dry run's ``request.resource``: its tasks' ``template`` are
    ``V1Pod`` objects) in place, on every task's pod, before it is scheduled:

    - every :data:`SECRET_ENV` variable from the same-named key of ``params.credentials_secret``
      (``valueFrom.secretKeyRef``; the optional ones ``optional: true``), in place of any literal value;
    - :func:`pod_tolerations` after torchx's (none), ``params.node_selector`` over torchx's (at most the instance
      type), and ``params.image_pull_secret`` as ``imagePullSecrets``."""
    from kubernetes.client import V1EnvVar, V1EnvVarSource, V1LocalObjectReference, V1SecretKeySelector

    if not isinstance(params.node_selector, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in params.node_selector.items()):
        raise ConfigError(f"--node-selector {params.node_selector!r}: expected labels, KEY=VALUE strings")
    tolerations = pod_tolerations(params)

    def secret_env() -> list[Any]:
        return [V1EnvVar(name=name, value_from=V1EnvVarSource(secret_key_ref=V1SecretKeySelector(
                    name=params.credentials_secret, key=name, optional=True)))
                for name in SECRET_ENV]

    for task in job["spec"]["tasks"]:
        spec = task["template"].spec
        for container in spec.containers:
            container.env = [e for e in container.env or [] if e.name not in SECRET_ENV] + secret_env()
        if tolerations:
            spec.tolerations = [*(spec.tolerations or []), *tolerations]
        if params.node_selector:
            spec.node_selector = {**(spec.node_selector or {}), **params.node_selector}
        if params.image_pull_secret:
            spec.image_pull_secrets = [V1LocalObjectReference(name=params.image_pull_secret)]


def credentials_line(params: TorchxParams, namespace: str) -> str:
    """Where the kubernetes pods' credentials come from, naming (never showing) those given with ``env`` or set in
    this environment, which are not copied into the job."""
    found = [name for name in SECRET_ENV if name in params.env or name in os.environ]
    not_copied = f"{', '.join(found)} (given with --env or set here) not copied into the job; " if found else ""
    return (f"credentials: {not_copied}the pods read {', '.join(SECRET_ENV)} from Secret "
            f"{params.credentials_secret} of namespace {namespace} where it holds them (optional: without it, the "
            "pod's own identity, e.g. an IAM role through IRSA)")


#: The signals whose handlers torchx's local schedulers replace, for the process and for good, when they are created
#: (with one raising an exception, so that Ctrl-C or SIGTERM while an app is followed stops its processes).
TORCHX_SIGNALS = (signal.SIGTERM, signal.SIGINT)


@contextlib.contextmanager
def keeping_signal_handlers():
    """Whatever torchx does inside, the process handles :data:`TORCHX_SIGNALS` afterwards as it did before: a
    process that goes on (a notebook, a test session, a stage run in the same process) would otherwise keep torchx's
    handler, and a worker it forks later inherits it (a pool's SIGTERM then no longer ends that worker)."""
    if threading.current_thread() is not threading.main_thread():  # handlers are the main thread's to set
        yield
        return
    saved = {signum: signal.getsignal(signum) for signum in TORCHX_SIGNALS}
    try:
        yield
    finally:
        for signum, handler in saved.items():
            if handler is not None:  # None: set outside Python, which cannot be put back from here
                signal.signal(signum, handler)


def scheduler_config(runner, scheduler: str, items: Sequence[str], defaults: dict[str, Any] | None = None
                     ) -> dict[str, Any]:
    """The scheduler's run config from ``KEY=VALUE`` items, typed by torchx; an unknown key is an error."""
    opts = runner.scheduler_run_opts(scheduler)  # creates the scheduler (see keeping_signal_handlers)
    known = {name: opt for name, opt in opts}
    cfg: dict[str, Any] = dict(defaults or {})
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"--scheduler-arg {item!r}: expected KEY=VALUE")
        if key not in known:
            raise ConfigError(f"--scheduler-arg {key}: {scheduler} has no such option; its options: "
                              f"{', '.join(sorted(known))}")
        cfg.update(opts.cfg_from_str(f"{key}={value}"))
    missing = sorted(name for name, opt in known.items() if opt.is_required and name not in cfg)
    if missing:
        raise ConfigError(f"the {scheduler} scheduler needs {', '.join(f'--scheduler-arg {m}=...' for m in missing)}")
    return cfg


def follow(runner, handle: str, role: str, out: Callable[[str], None], wait_interval_s: float):
    """Stream replica 0's log (a thread, retried while the replica is not up yet) and wait for a terminal state."""
    from torchx.specs import is_terminal

    done = threading.Event()

    def stream() -> None:
        shown = 0  # lines already printed: a retried read starts over (a Kubernetes log follow does)
        while True:
            try:
                for i, line in enumerate(runner.log_lines(handle, role, k=0, should_tail=True)):
                    if i >= shown:
                        out(line.rstrip("\n"))
                        shown += 1
                return
            except Exception as exc:  # noqa: BLE001 - the replica is pending, or its log is gone
                if done.is_set():
                    log.debug("log of %s/%s/0: %s", handle, role, exc)
                    return
                time.sleep(max(wait_interval_s, 1.0))

    thread = threading.Thread(target=stream, name="torchx-log", daemon=True)
    thread.start()
    try:
        status = runner.wait(handle, wait_interval=wait_interval_s)
        while status is not None and not is_terminal(status.state):
            status = runner.wait(handle, wait_interval=wait_interval_s)
    finally:
        done.set()
    thread.join(timeout=60)
    return status


class TorchxApp(RemoteBackend):
    """A torchx ``dist.ddp`` app on ``params.scheduler`` (``runner``: torchx's, made here when ``None``); ``root``:
    the local run folder (the replicas' ``--root`` on ``local_cwd`` and ``slurm``, and torchx's log folder)."""

    prefix, what = "[torchx]", "torchx app"

    def __init__(self, params: TorchxParams, root: str | os.PathLike, runner=None,
                 out: Callable[[str], None] = print):
        if params.scheduler not in SCHEDULERS:
            raise ConfigError(f"--scheduler {params.scheduler!r}: expected one of {', '.join(SCHEDULERS)}")
        self.params, self.local_root, self.runner, self.out = params, Path(root), runner, out
        self.root = KUBERNETES_ROOT if params.scheduler == "kubernetes" else str(root)

    def check(self, plan: LaunchPlan) -> None:
        if self.params.scheduler == "kubernetes" and "://" not in plan.store.uri:
            raise ConfigError(f"--scheduler kubernetes: the store {plan.store.uri} is a local folder the pods cannot "
                              "see; use --store s3://bucket/prefix (with --s3-endpoint)")

    def start(self, plan: LaunchPlan, command: Sequence[str], clear_output: Callable[[], None]) -> str:
        from torchx.runner import get_runner
        from torchx.specs import NONE, AppState

        params = self.params
        port = rendezvous_port(params.scheduler, plan.address, params.rdzv_port)
        app = build_app(command, plan.address, params, port)
        role = app.roles[0].name
        interval = params.wait_interval_s or (1.0 if params.scheduler == "local_cwd" else 10.0)
        own_runner = self.runner is None
        runner = self.runner if self.runner is not None else get_runner()
        with keeping_signal_handlers():  # torchx's while the app is followed, the caller's again after
            try:
                defaults = {"log_dir": str(self.local_root / "torchx")} if params.scheduler == "local_cwd" else {}
                cfg = scheduler_config(runner, params.scheduler, params.scheduler_args, defaults)
                info = runner.dryrun(app, params.scheduler, cfg=cfg)  # a bad config fails before anything is cleared
                if params.scheduler == "kubernetes":
                    patch_volcano_job(info.request.resource, params)
                    self.out(f"{self.prefix} {credentials_line(params, cfg.get('namespace') or 'default')}")
                self.out(f"{self.prefix} {plan.stage} {plan.address}: {params.scheduler} dist.ddp -j {params.j}, "
                         f"rendezvous port {port}, output {plan.output.uri}")
                clear_output()
                handle = runner.schedule(info)
                self.out(f"{self.prefix} app {handle}")
                status = follow(runner, handle, role, self.out, interval)
            finally:
                if own_runner:
                    runner.close()
        if status is None or status.state != AppState.SUCCEEDED:
            state = status.state.name if status is not None else "gone"
            error = status.structured_error_msg if status is not None else NONE
            detail = f": {error}" if error and error != NONE else ""
            where = f" (logs: {status.ui_url})" if status is not None and status.ui_url else ""
            raise LaunchFailed(f"torchx app {handle} {state}{where}{detail}")
        return f"torchx app {handle}"


#: The torchx this launcher is written against (constraints.txt pins the same).
TORCHX_VERSION = "0.7.0"


def install_torchx_commands() -> str:
    """The commands that install torchx beside kfp into this Python: its other requirements (the ``launch`` extra),
    then torchx without its stale ``urllib3<1.27`` bound."""
    pip = f"{sys.executable} -m pip install"
    return f"{pip} 'fourm-kfp[launch]' && {pip} --no-deps torchx=={TORCHX_VERSION}"


def require_torchx() -> None:
    """A :class:`UserError` saying what to install when torchx cannot be imported."""
    try:
        import torchx  # noqa: F401
    except ImportError as exc:
        raise UserError(f"fourm-kfp launch needs torchx ({exc}); pip cannot install it with its dependencies beside "
                        f"kfp (torchx {TORCHX_VERSION} pins urllib3<1.27, kfp urllib3 2), so install it with "
                        f"--no-deps: {install_torchx_commands()}") from None


def launch_torchx(stage: str, run: RunContext, *, root: str | os.PathLike, force: bool = False,
                  input_uris: dict[str, str] | None = None, params: TorchxParams | None = None, runner=None,
                  out: Callable[[str], None] = print) -> StageOutcome:
    """Stage ``stage`` (one of :data:`fourm_kfp.cluster.job_spec.JOB_STAGES`) as a torchx app; see the module
    docstring."""
    require_torchx()
    backend = TorchxApp(params or TorchxParams(), root, runner, out)
    return launch_remote(stage, run, backend, force=force, input_uris=input_uris, root=str(root), out=out)
