"""A stage's multi-node job (a PyTorchJob or a TrainJob) as parameters: what a run may ask of it, checked before
anything is created. The job kinds are records in :mod:`.job_kinds`, which render a request through
:mod:`.job_render` into the manifest templates shipped with the package.

Two stages can run as a job (:data:`JOB_STAGES`): pretrain (by default) and train-tokenizers (``in-pod`` by default;
at 4m-b its ViT VQ-VAEs train for days on one GPU). Both render from the same templates through the same
:class:`JobParams`, whose fields are each stage's ``<stage>_<field>`` pipeline parameters.

The templates are ``manifests/base/pytorchjob-template.yaml`` and ``manifests/base/trainjob-template.yaml``, the very
files a user may submit by hand (package data of ``fourm_kfp.manifests``); nothing here repeats their pod spec.
:func:`fourm_kfp.cluster.job_kinds.render_job` fills in what changes per run:

- the name ``fourm-<stage>-<content address>`` (:func:`job_name`), so a restarted launcher finds its own job;
- labels with the stage, the address and the KFP run id, and an ownerReference to the run's Argo Workflow
  (:class:`Owner`; deleting the run deletes the job, while a launcher pod lost to a drained node does not);
  ``blockOwnerDeletion`` stays off, which needs no permission on the owner's finalizers;
- nodes (PyTorchJob: Master plus ``nodes - 1`` Workers, no Worker spec at all for one node), an integer number of
  processes per node, the accelerator, CPU and memory per node, node selector, tolerations, deadline, and an
  optional ``elasticPolicy`` (PyTorchJob; at least 2 nodes, since the webhook requires a Worker, and with the
  rendezvous on the Master's service, not the operator's default ``<job>-worker-0``);
- the PyTorchJob's restart budget, scaled with the nodes (:func:`backoff_limit`): the operator counts restarts summed
  over all pods, and one crash restarts every node;
- the container's arguments: ``torchrun --rdzv-conf=... --no-python fourm-kfp stage <stage> ...`` (the launcher's
  :func:`fourm_kfp.launchers.remote.stage_command`); torchrun reads the rendezvous from the operator's ``PET_*``
  variables, and ``--rdzv-conf`` makes the started nodes wait ``rendezvous_timeout_s`` for the others
  (:func:`rendezvous_args`). Credentials stay in the Secret;
- the run-wide :class:`ClusterParams`: the ``scheduler`` (:func:`parse_scheduler`; Volcano gang scheduling through
  the PyTorchJob's ``runPolicy.schedulingPolicy`` or the TrainJob's runtime :data:`TRAINJOB_RUNTIMES`, Kueue through
  its queue label on the job), the image pull secret on every pod, the GPU node selector and tolerations on the pods
  of a job that requests an accelerator, the optional RDMA device and ``NCCL_*`` settings on every pod of a job
  (:func:`parse_rdma_resource`, off by default); and the :data:`KEEP_LABEL` on a job the launcher will not delete.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, fields
from typing import Any, Mapping, Sequence

from fourm_kfp.config.schema import ConfigError
from fourm_kfp.contract.spec import param_prefix
from fourm_kfp.stages import STAGES

#: Where a job stage trains (``<stage>_launcher``): in its own pod, or in a multi-node job it creates and follows,
#: named by its job kind (a Kubeflow Training Operator PyTorchJob, or a Kubeflow Trainer v2 TrainJob: one record each,
#: :data:`fourm_kfp.cluster.job_kinds.JOB_KINDS`, which says all that differs between them).
IN_POD = "in-pod"
JOB_LAUNCHERS = ("pytorchjob", "trainjob")
LAUNCHERS = (IN_POD, *JOB_LAUNCHERS)

#: Label keys the launcher sets and reads back (adoption checks them).
ADDRESS_LABEL = "fourm-kfp.org/address"
RUN_ID_LABEL = "fourm-kfp.org/kfp-run-id"
STAGE_LABEL = "fourm-kfp.org/stage"
#: On a job that is kept after it ends (``<stage>_delete_job=false``), value "true".
KEEP_LABEL = "fourm-kfp.org/keep"
#: Kueue's label naming the LocalQueue a job is submitted to (``kueue.x-k8s.io/queue-name``): Kueue's webhook suspends
#: a job that has it until its Workload is admitted, all nodes at once.
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
#: Volcano's queue annotation, read by Trainer v2's Volcano plugin from the TrainJob's runtime patch (JobSet metadata).
VOLCANO_QUEUE_ANNOTATION = "scheduling.volcano.sh/queue-name"
#: The accelerator a GPU pod requests, and the toleration of the taint GPU nodes carry (the job templates' own, the
#: pipeline's GPU steps', torchx's GPU replicas').
GPU_RESOURCE = "nvidia.com/gpu"
GPU_TOLERATION = {"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}
#: The pod's local folder: ``--root`` of the stage (ranks share no file system; outputs go to the store).
POD_ROOT = "/scratch/run"
#: Crashes a PyTorchJob survives, each followed by a resume from the newest complete checkpoint; the next one fails it.
RESTARTS = 3
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")
_QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(m|k|Ki|M|Mi|G|Gi|T|Ti|P|Pi|E|Ei)?$")
#: ``rdma_resource``: an extended resource ``<domain>/<name>`` and an optional ``=<count>`` per node (default 1).
_RDMA_RESOURCE = re.compile(r"^(?P<name>[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)"
                            r"(=(?P<count>[1-9][0-9]*))?$")
_NCCL_NAME = re.compile(r"^NCCL_[A-Z0-9_]+$")
#: The capability RDMA needs in the container: verbs pin (lock) the memory they register, beyond the default
#: RLIMIT_MEMLOCK (the RDMA device plugins' own example pods add it: Mellanox/k8s-rdma-shared-dev-plugin
#: ``example/test-hca-pod.yaml``).
RDMA_CAPABILITY = "IPC_LOCK"


def check_launcher(launcher: str, stage: str, jobs_only: bool = False) -> str:
    """``launcher`` if it is a launcher kind (a job kind with ``jobs_only``), else an error naming the stage's
    parameter."""
    allowed = JOB_LAUNCHERS if jobs_only else LAUNCHERS
    if launcher not in allowed:
        raise ConfigError(f"{param_prefix(stage)}_launcher={launcher!r}: expected one of {', '.join(LAUNCHERS)}"
                          + (" (a job kind here)" if jobs_only else ""))
    return launcher


@dataclass(frozen=True)
class Owner:
    """The job's owner (an ownerReference): the KFP run's Argo Workflow, whose deletion deletes the job, and which
    outlives the launcher pod (:func:`fourm_kfp.launchers.kubernetes_job.workflow_owner`)."""

    api_version: str
    kind: str
    name: str
    uid: str


@dataclass(frozen=True)
class JobParams:
    """A job stage's cluster job, declared once: the pipeline's ``<stage>_<field>`` parameters and the stage
    component's ``<field>`` parameters are these fields with the stage's defaults (:data:`JOB_STAGES`;
    ``tests/test_pipeline_compile.py`` checks both), and the component builds one with :meth:`of`."""

    launcher: str = "pytorchjob"  # IN_POD or a job kind's name (JOB_LAUNCHERS)
    nodes: int = 1
    procs_per_node: int = 1
    accelerator: str = "nvidia.com/gpu"  # "" or "cpu": CPU nodes (no accelerator request or toleration)
    cpu_per_node: str = ""  # "" keeps the template's request
    memory_per_node: str = ""
    node_selector: dict[str, str] = field(default_factory=dict)
    tolerations: list[dict[str, Any]] = field(default_factory=list)
    deadline_s: int = 259200
    min_nodes: int = 0  # PyTorchJob only: > 0 makes the job elastic between min_nodes and nodes
    delete_job: bool = True  # delete the finished job (its pods' logs go with it)

    @classmethod
    def of(cls, values: Mapping[str, Any]) -> "JobParams":
        """The fields present in ``values`` (e.g. a component's parameters, ``locals()``), defaults for the rest."""
        return cls(**{f.name: values[f.name] for f in fields(cls) if f.name in values})


#: ``scheduler``: how a job's pods are placed. "" the default scheduler, pod by pod; "volcano" or "volcano:<queue>"
#: gang scheduling by Volcano (all of a job's nodes at once, or none); "kueue:<local queue>" admission by Kueue.
SCHEDULER_KINDS = ("", "volcano", "kueue")
#: What a PyTorchJob's ``scheduler`` must end with to be queued by Kueue: Kueue 0.19 turned its PyTorchJob
#: integration off by default (kubernetes-sigs/kueue PR #12606, ``integrations.frameworks`` of its Configuration no
#: longer lists ``kubeflow.org/pytorchjob``), and with it off Kueue ignores the queue label and the job runs at once,
#: unqueued. The suffix is the user's statement that their Kueue has it on; a TrainJob (on by default) needs none.
KUEUE_PYTORCHJOB_STATEMENT = "pytorchjob-integration-on"
#: The pull secret every step and job names unless ``image_pull_secret`` names another. KFP's driver refuses an empty
#: name (``resolveInputParameterStr`` in ``backend/src/v2/driver/resolve.go``: "Expected a non-empty string", every
#: step failing), so "none" cannot be said; a Secret that does not exist is what the kubelet tolerates: it records a
#: ``FailedToRetrieveImagePullSecret`` Warning on the pod and pulls without it (``getPullSecretsForPod``).
DEFAULT_PULL_SECRET = "fourm-image-pull"
#: The ClusterTrainingRuntime a TrainJob refers to, per scheduler kind (``manifests/cluster/trainer-runtimes.yaml``,
#: applied once per cluster). Trainer v2.2 takes the PodGroup policy and the pods' ``schedulerName`` from the runtime
#: only (a TrainJob's runtime patch reaches neither), so gang scheduling is a runtime of its own.
TRAINJOB_RUNTIMES = {"": "fourm-torch-distributed", "volcano": "fourm-torch-distributed-volcano",
                     "kueue": "fourm-torch-distributed"}


@dataclass(frozen=True)
class ClusterParams:
    """Run-wide cluster settings, one pipeline parameter each (same names, no stage prefix): they apply to every
    step and job of the run, where :class:`JobParams` is one stage's job.

    ``gpu_node_selector`` and ``gpu_tolerations`` go on every pod that requests an accelerator (in-pod GPU steps and
    the jobs' pods), beside the accelerator's own toleration; ``image_pull_secret`` (a
    ``kubernetes.io/dockerconfigjson`` Secret in the run's namespace, :data:`DEFAULT_PULL_SECRET` unless told
    otherwise: the kubelet pulls without it when it does not exist) on every pod; ``scheduler`` on the jobs
    (:data:`SCHEDULER_KINDS`, :func:`parse_scheduler`);
    ``rendezvous_timeout_s``: how long a job's started nodes wait at torchrun's rendezvous for the others (longer than
    the nodes take to be scheduled, so a partly placed job waits instead of crashing);
    ``rdma_resource`` (off: ""): the RDMA device every pod of a job requests, ``<domain>/<name>[=<count>]`` as the
    cluster's RDMA device plugin names it (e.g. ``rdma/rdma_shared_device_a`` of the NVIDIA network operator's shared
    device plugin; count 1 unless given), which also adds the ``IPC_LOCK`` capability to the training container
    (:data:`RDMA_CAPABILITY`); ``nccl_env`` (off: {}): ``NCCL_*`` variables on every pod of a job (e.g.
    ``NCCL_IB_HCA``, ``NCCL_SOCKET_IFNAME``, ``NCCL_IB_GID_INDEX``), which NCCL reads at start;
    ``queue_timeout_s``: how long a job may wait before all its pods run (in a Volcano or Kueue queue, or
    unschedulable), apart from its ``<stage>_deadline_s``, which counts from when they run: a whole number of seconds,
    at least 1. There is no "no limit" (0 is refused): the job's own ``activeDeadlineSeconds`` is the deadline plus
    this limit, and a step's retry window must hold both (a long wait is a large number, e.g. 604800 for a week)."""

    scheduler: str = ""
    image_pull_secret: str = DEFAULT_PULL_SECRET
    gpu_node_selector: dict[str, str] = field(default_factory=dict)
    gpu_tolerations: list[dict[str, Any]] = field(default_factory=list)
    rendezvous_timeout_s: int = 1800
    queue_timeout_s: int = 86400
    rdma_resource: str = ""
    nccl_env: dict[str, str] = field(default_factory=dict)

    @classmethod
    def of(cls, values: Mapping[str, Any]) -> "ClusterParams":
        """The fields present in ``values`` (a component's parameters), defaults for the rest."""
        return cls(**{f.name: values[f.name] for f in fields(cls) if f.name in values})


#: The stages that can run as a cluster job, each with its job's defaults, from the stage table
#: (``StageSpec.job_launcher``): pretrain launches a PyTorchJob unless told otherwise; train-tokenizers trains in its
#: own pod unless told otherwise.
JOB_STAGES = {spec.name: JobParams(launcher=spec.job_launcher) for spec in STAGES.values() if spec.job_launcher}


@dataclass(frozen=True, kw_only=True)
class JobRequest(JobParams):
    """A job to render: its parameters and what varies per run (stage, address, the pods' command, image, KFP run,
    owner)."""

    stage: str
    address: str
    stage_args: Sequence[str]
    image: str
    kfp_run_id: str = ""
    owner: Owner | None = None
    cluster: ClusterParams = field(default_factory=ClusterParams)

    @property
    def name(self) -> str:
        return job_name(self.stage, self.address)

    @property
    def gpus_per_node(self) -> int:
        return self.procs_per_node if self.accelerator not in ("", "cpu") else 0


def job_name(stage: str, address: str) -> str:
    """The job's name: one per stage and content address (a valid DNS-1035 label, so also a valid Service name)."""
    if stage not in JOB_STAGES:
        raise ValueError(f"{stage!r} does not run as a job (one of {', '.join(JOB_STAGES)})")
    if not re.fullmatch(r"[0-9a-f]{1,32}", address):
        raise ValueError(f"not a content address: {address!r}")
    return f"fourm-{stage}-{address}"


def backoff_limit(nodes: int) -> int:
    """``runPolicy.backoffLimit`` that lets a job of ``nodes`` pods survive :data:`RESTARTS` crashes.

    Training Operator v1 (``PastBackoffLimit`` in ``pkg/core/job.go``) fails the job once the container restart counts
    summed over all running pods reach the limit, and one crash costs every node a restart (a node's loss makes its
    peers' torchrun exit too): ``RESTARTS`` crashes cost ``RESTARTS * nodes``, which must stay below the limit."""
    return RESTARTS * nodes + 1


def parse_scheduler(scheduler: str) -> tuple[str, str]:
    """``(kind, queue)`` of the ``scheduler`` parameter: ``("", "")``, ``("volcano", "")`` (Volcano's default queue),
    ``("volcano", queue)`` or ``("kueue", local queue)``; an error naming the parameter otherwise. A Kueue queue may
    be followed by ``:`` :data:`KUEUE_PYTORCHJOB_STATEMENT` (:func:`check_kueue_integration`)."""
    kind, colon, queue = scheduler.partition(":") if isinstance(scheduler, str) else ("?", "", "")
    usage = ('"" (the default scheduler), "volcano", "volcano:<queue>" or "kueue:<local queue>" (a PyTorchJob: '
             f'"kueue:<local queue>:{KUEUE_PYTORCHJOB_STATEMENT}")')
    if kind == "kueue":
        queue = queue.removesuffix(f":{KUEUE_PYTORCHJOB_STATEMENT}")
    if kind not in SCHEDULER_KINDS or (kind == "" and colon):
        raise ConfigError(f"scheduler={scheduler!r}: expected {usage}")
    if kind == "kueue" and not queue:
        raise ConfigError(f"scheduler={scheduler!r}: Kueue needs the LocalQueue to submit to, kueue:<local queue>")
    if colon and not (_DNS_SUBDOMAIN.match(queue) and len(queue) <= 63):
        raise ConfigError(f"scheduler={scheduler!r}: {queue!r} is not a queue name (lower-case letters, digits, '-' "
                          f"and '.', at most 63 characters)")
    return kind, queue


def parse_rdma_resource(rdma_resource: str) -> tuple[str, int] | None:
    """``(resource, count per node)`` of the ``rdma_resource`` parameter, None when it is "" (off); an error naming
    the parameter otherwise."""
    if rdma_resource == "":
        return None
    match = _RDMA_RESOURCE.match(rdma_resource) if isinstance(rdma_resource, str) else None
    if match is None or match.group("name").endswith("/gpu"):
        raise ConfigError(f"rdma_resource={rdma_resource!r}: expected \"\" (no RDMA) or the RDMA device plugin's "
                          "extended resource, <domain>/<name> or <domain>/<name>=<count per node>, e.g. "
                          "rdma/rdma_shared_device_a or rdma/rdma_shared_device_a=1")
    return match.group("name"), int(match.group("count") or 1)


def validate_request(req: JobRequest) -> None:
    """Fail on a parameter the API server or the operator would reject, naming the stage's pipeline parameter (what
    depends on the job kind: :func:`fourm_kfp.cluster.job_kinds.check_kind`)."""
    if req.stage not in JOB_STAGES:
        raise ConfigError(f"stage {req.stage!r} does not run as a job (one of {', '.join(JOB_STAGES)})")
    p = param_prefix(req.stage)
    check_launcher(req.launcher, req.stage, jobs_only=True)
    if req.nodes < 1:
        raise ConfigError(f"{p}_nodes={req.nodes}: at least 1")
    if req.procs_per_node < 1:
        raise ConfigError(f"{p}_procs_per_node={req.procs_per_node}: at least 1 (an integer, never 'auto')")
    if req.min_nodes and not 1 <= req.min_nodes <= req.nodes:
        raise ConfigError(f"{p}_min_nodes={req.min_nodes}: 0 (fixed size) or 1..{p}_nodes ({req.nodes})")
    if req.min_nodes and req.nodes < 2:
        raise ConfigError(f"{p}_min_nodes={req.min_nodes} with {p}_nodes={req.nodes}: an elastic job needs "
                          f"{p}_nodes >= 2 (the operator rejects an elastic PyTorchJob without Workers); "
                          f"{p}_min_nodes=0 trains on one node")
    if req.deadline_s < 1:
        raise ConfigError(f"{p}_deadline_s={req.deadline_s}: at least 1 second")
    for param, value in (("cpu_per_node", req.cpu_per_node), ("memory_per_node", req.memory_per_node)):
        if value and not _QUANTITY.match(value):
            raise ConfigError(f"{p}_{param}={value!r} is not a Kubernetes quantity (e.g. 16, 500m, 64Gi)")
    if not isinstance(req.node_selector, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in req.node_selector.items()):
        raise ConfigError(f"{p}_node_selector={req.node_selector!r}: expected a JSON object of strings")
    if not isinstance(req.tolerations, list) or not all(isinstance(t, dict) for t in req.tolerations):
        raise ConfigError(f"{p}_tolerations={req.tolerations!r}: expected a JSON list of toleration objects")
    if not _LABEL_VALUE.match(req.kfp_run_id) or len(req.kfp_run_id) > 63:
        raise ConfigError(f"KFP run id {req.kfp_run_id!r} cannot be a label value")
    validate_cluster(req.cluster)


def validate_cluster(cluster: ClusterParams) -> None:
    """Fail on a run-wide cluster setting the API server or the operators would reject, naming its pipeline
    parameter."""
    parse_scheduler(cluster.scheduler)
    secret = cluster.image_pull_secret
    if not isinstance(secret, str) or secret and not (_DNS_SUBDOMAIN.match(secret) and len(secret) <= 253):
        raise ConfigError(f"image_pull_secret={secret!r}: the name of a Secret in the run's namespace (lower-case "
                          f"letters, digits, '-' and '.'), or \"\" for none")
    if not isinstance(cluster.gpu_node_selector, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in cluster.gpu_node_selector.items()):
        raise ConfigError(f"gpu_node_selector={cluster.gpu_node_selector!r}: expected a JSON object of strings")
    if not isinstance(cluster.gpu_tolerations, list) or not all(isinstance(t, dict) for t in cluster.gpu_tolerations):
        raise ConfigError(f"gpu_tolerations={cluster.gpu_tolerations!r}: expected a JSON list of toleration objects")
    timeout = cluster.rendezvous_timeout_s
    if isinstance(timeout, bool) or not isinstance(timeout, int) or timeout < 1:
        raise ConfigError(f"rendezvous_timeout_s={timeout!r}: a whole number of seconds, at least 1 (longer than "
                          f"a job's nodes take to be scheduled and started)")
    parse_rdma_resource(cluster.rdma_resource)
    if not isinstance(cluster.nccl_env, dict) or not all(
            isinstance(k, str) and _NCCL_NAME.match(k) and isinstance(v, str) for k, v in cluster.nccl_env.items()):
        raise ConfigError(f"nccl_env={cluster.nccl_env!r}: expected a JSON object of NCCL_* variable names to string "
                          'values, e.g. {"NCCL_IB_HCA": "mlx5", "NCCL_SOCKET_IFNAME": "eth0"}')
    queue = cluster.queue_timeout_s
    if isinstance(queue, bool) or not isinstance(queue, int) or queue < 1:
        raise ConfigError(f"queue_timeout_s={queue!r}: a whole number of seconds a job may wait for all its pods to "
                          "run, at least 1; 0 does not mean \"no limit\" (there is none: the job's own deadline is "
                          "<stage>_deadline_s + queue_timeout_s); give a large number instead, "
                          "e.g. 604800 for a week")
