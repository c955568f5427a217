"""The fourm-pretrain KFP v2 pipeline: prepare-data → label → train-tokenizers → pretokenize → pretrain → evaluate.

Stages exchange URIs of committed, content-addressed outputs, never the bytes (KFP would copy every input artifact
in full). The dataset travels as one ``dataset`` string (its layers' URIs by stage: prepare-data's, then the label
stage's when labelers are configured), so the steps that read it take one parameter whatever its layers. Every stage
opens an MLflow child run under the parent run opened by the first step; an exit handler closes the parent run with
the run's real outcome.

The pipeline has no ``dsl.If`` branches and no ``dsl.OneOf`` joins: before KFP 2.17 a branch that holds a loop never
completes, so its join fails ("processing OneOf: No successful task found", kubeflow/pipelines#11979). Where a step
runs (an accelerator or none, a job's light launcher pod or a training pod) is decided at run time by a
``pod-placement`` step whose outputs the backend resolves into the pod (an accelerator type that resolves to ""
requests none). A fan-out stage's workers are a sub-pipeline (:func:`fan_out_workers`): its inputs reach the loop's
pods, which a pipeline parameter or an upstream output used inside a loop does not. A forced fan-out stage is cleared
once by its fan-out step and recomputed by its workers; no step of a fan-out stage is cached (:func:`_never_cached`).

Parameters are flat. The shared ones configure every stage; the ``<stage>_*`` ones touch one stage only.

Over 400 lines and one concern: the pipeline, written once; most of its length is the parameters' documentation,
which the KFP UI shows beside each parameter.
"""

import inspect
import sys
from dataclasses import fields
from typing import List

from kfp import dsl, kubernetes
from kfp.dsl import pipeline_task

from fourm_kfp.cluster.job_kinds import PYTORCHJOB
from fourm_kfp.cluster.job_spec import DEFAULT_PULL_SECRET, IN_POD, ClusterParams, JobParams, param_prefix
from fourm_kfp.components.evaluate import evaluate
from fourm_kfp.images import IMAGE_TAG, IMAGE_TAG_ENV
from fourm_kfp.stages import get_stage
from fourm_kfp.launchers.kfp_retry import RETRY_WINDOW_S
from fourm_kfp.components.fan_out import fan_out, pod_placement
from fourm_kfp.components.label import label, label_part
from fourm_kfp.components.lineage import close_lineage_run, open_lineage_run
from fourm_kfp.components.prepare_data import prepare_data, prepare_data_part
from fourm_kfp.components.pretokenize import pretokenize, pretokenize_part
from fourm_kfp.components.pretrain import pretrain
from fourm_kfp.components.train_tokenizers import train_tokenizers


class _InspectWithoutSourceLines:
    """What kfp's ``pipeline_task`` module sees as ``inspect``: the same module, but ``stack()`` looks up no files.

    kfp (2.15-2.17, ``kfp/dsl/pipeline_task.py``, ``PipelineTask._ensure_container_spec_exists``) calls
    ``inspect.stack()`` on every ``set_cpu_limit``, ``set_memory_limit``, ``set_accelerator_*`` and
    ``set_env_variable`` only to name that method in an error message (``inspect.stack()[1][3]``). ``inspect.stack``
    finds each frame's source file, and for a frame without a file on disk (the import system's frozen frames, while
    this module is being imported) it scans every loaded module: 24 calls took 1.5-2 s of building this pipeline in a
    process that had imported torch and MLflow (4,000 modules), on every ``fourm-kfp run``, compile and submit. These
    frames carry the same frame, file name, line and function name; only the source lines are left out."""

    def __getattr__(self, name: str):
        return getattr(inspect, name)

    @staticmethod
    def stack(context: int = 1) -> list[inspect.FrameInfo]:
        frames, frame = [], sys._getframe(1)  # from the caller's frame, as inspect.stack() called there
        while frame is not None:
            code = frame.f_code
            frames.append(inspect.FrameInfo(frame, code.co_filename, frame.f_lineno, code.co_name, None, None))
            frame = frame.f_back
        return frames


if pipeline_task.inspect is inspect:  # a later kfp that no longer reads it keeps its own
    pipeline_task.inspect = _InspectWithoutSourceLines()


PIPELINE_NAME = "fourm-pretrain"
#: Kubernetes Secret holding the S3 credentials (manifests/base); never a pipeline parameter.
S3_SECRET = "fourm-s3-credentials"
S3_SECRET_ENV = {"AWS_ACCESS_KEY_ID": "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY": "AWS_SECRET_ACCESS_KEY"}
#: Optional ConfigMap with cluster-wide defaults (MLflow server, S3 endpoint).
SETTINGS_CONFIG_MAP = "fourm-settings"
SETTINGS_ENV = {"MLFLOW_TRACKING_URI": "MLFLOW_TRACKING_URI", "AWS_ENDPOINT_URL": "AWS_ENDPOINT_URL"}
#: A job stage's launcher pod, through the downward API: its name (to find the run's Workflow, the job's owner) and
#: namespace (where the job is created); fourm_kfp.launchers.kubernetes_job and cluster.kube read these.
LAUNCHER_POD_FIELDS = {"FOURM_POD_NAME": "metadata.name", "FOURM_POD_NAMESPACE": "metadata.namespace"}
#: Retries of a job stage's step: a drained or preempted launcher pod comes back and adopts its job where Argo records
#: the lost pod's failure (ARGO_POD_STATUS_CAPTURE_FINALIZER=true on its workflow controller; without it the step
#: ends Error, which Argo's default OnFailure policy never retries: docs/cluster.md). The job's own
#: restart budget is separate: a retried launcher does not start a failed job again; in-pod training resumes from its
#: newest checkpoint. KFP hands Argo the window as the retry strategy's maxDuration, counted from the first attempt's
#: start (the SDK's default, 3600 s, would end retries, and kill a retried pod, an hour into a multi-day training):
#: it must hold the job's queue time and deadline, which the step checks (kfp_retry.RETRY_WINDOW_S). Cluster runs
#: only: ``fourm-kfp run`` clears them (fourm_kfp.pipeline_runs.local.without_step_retries), as kfp.local would retry
#: a step's own error.
LAUNCHER_RETRIES, LAUNCHER_RETRY_BACKOFF = 3, "60s"
LAUNCHER_RETRY_WINDOW = f"{RETRY_WINDOW_S}s"


class _Cluster:
    """The run-wide cluster settings (:class:`ClusterParams`, pipeline parameters of the same names) applied to the
    steps: the Secret and ConfigMap env and the image pull secret on every step; a ``pod-placement`` step's outputs
    (accelerator, node selector, tolerations, CPU and memory) on a placed one. All ignored by kfp.local."""

    def __init__(self, image_pull_secret):
        self.image_pull_secret = image_pull_secret

    def env(self, task: dsl.PipelineTask) -> dsl.PipelineTask:
        """Credentials from the Secret, defaults from the ConfigMap, and the image pull secret."""
        kubernetes.use_secret_as_env(task, secret_name=S3_SECRET, secret_key_to_env=S3_SECRET_ENV, optional=True)
        kubernetes.use_config_map_as_env(task, config_map_name=SETTINGS_CONFIG_MAP,
                                         config_map_key_to_env=SETTINGS_ENV, optional=True)
        return self.pull(task)

    def pull(self, task: dsl.PipelineTask) -> dsl.PipelineTask:
        """The image pull secret, on every step (never empty: :data:`DEFAULT_PULL_SECRET`)."""
        return kubernetes.set_image_pull_secrets(task, [self.image_pull_secret])


def _place(task: dsl.PipelineTask, accelerator, node_selector, tolerations, cpu_limit, memory_limit
           ) -> dsl.PipelineTask:
    """One accelerator of type ``accelerator`` (a channel; "" requests none), and the node selector, tolerations, CPU
    and memory limits that go with it (:func:`fourm_kfp.launchers.kfp_placement.pod_placement`)."""
    task.set_accelerator_type(accelerator).set_accelerator_limit(1)
    task.set_cpu_limit(cpu_limit).set_memory_limit(memory_limit)
    kubernetes.add_node_selector_json(task, node_selector)
    kubernetes.add_toleration_json(task, tolerations)
    return task


def _placed(task: dsl.PipelineTask, placement: dsl.PipelineTask) -> dsl.PipelineTask:
    """``task`` placed by a ``pod-placement`` step's outputs."""
    return _place(task, *(placement.outputs[key] for key in ("accelerator", "node_selector", "tolerations",
                                                             "cpu_limit", "memory_limit")))


def _with_shared_memory(task: dsl.PipelineTask) -> dsl.PipelineTask:
    """An in-memory ``/dev/shm`` for a step whose worker processes hand tensors back through shared memory (the
    token loader's workers, pretokenize's decode workers, a teacher's loader): the container default is 64 MiB.
    Counted against the step's memory limit, and only as far as it is used."""
    kubernetes.empty_dir_mount(task, volume_name="dshm", mount_path="/dev/shm", medium="Memory")
    return task


def _never_cached(task: dsl.PipelineTask) -> dsl.PipelineTask:
    """A step of a fan-out stage (its fan-out step, a worker, its collect step): it clears or writes the stage's
    output, which KFP's cache, keyed by the step's parameters alone, cannot see. Cached, a forced run's workers and
    collect step would be handed an earlier run's outputs after the fan-out step cleared the store (the parameters
    match whenever the parent run id does: "" for every run without MLflow). Reuse comes from the content address:
    a step whose output is committed reports it and computes nothing."""
    return task.set_caching_options(False)


def _job_args(stage: str, params: dict) -> dict:
    """The job fields of ``stage``'s component (:class:`JobParams`) from the pipeline's ``<stage>_<field>``
    parameters, the run-wide cluster settings (:class:`ClusterParams`, same names), and the KFP run id the job is
    labelled with."""
    prefix = param_prefix(stage)
    return {**{f.name: params[f"{prefix}_{f.name}"] for f in fields(JobParams)},
            **{f.name: params[f.name] for f in fields(ClusterParams)},
            "kfp_run_id": dsl.PIPELINE_JOB_ID_PLACEHOLDER}


def _job_stage(task: dsl.PipelineTask, placement: dsl.PipelineTask, cluster: _Cluster) -> dsl.PipelineTask:
    """A job stage's step: it trains in its own pod, or (``<stage>_launcher`` a job kind) is a light CPU pod that
    launches and follows the job, knowing its own name and namespace through the downward API (the job is created in
    its namespace and owned by the run's workflow, which owns this pod) and its own image tag (the job runs the same
    image). Retried within :data:`LAUNCHER_RETRY_WINDOW`: a launcher pod lost to a drained or preempted node comes
    back (where Argo's status-capture finalizer is on) and adopts its job, which trains on meanwhile; in-pod training resumes from its newest checkpoint."""
    _with_shared_memory(_placed(cluster.env(task), placement))
    task.set_retry(LAUNCHER_RETRIES, backoff_duration=LAUNCHER_RETRY_BACKOFF,
                   backoff_max_duration=LAUNCHER_RETRY_WINDOW)
    for env_name, field_path in LAUNCHER_POD_FIELDS.items():
        kubernetes.use_field_path_as_env(task, env_name=env_name, field_path=field_path)
    task.set_env_variable(IMAGE_TAG_ENV, IMAGE_TAG)  # a job's pods run the image this step runs
    return task


#: What a fan-out worker may take from its loop item (kfp.local resolves an upstream output used inside a loop of
#: width > 1 to the loop item, so they travel in it: :func:`fourm_kfp.launchers.kfp_placement.fan_out_items`).
CARRIED = ("parent_run_id", "dataset", "tokenizers_uri")


def fan_out_workers(stage: str, worker, cpu_limit: str, memory_limit: str):
    """A fan-out stage's workers as a sub-pipeline: one ``worker`` step per item of its fan-out step, each writing
    every ``parts``-th piece of the stage's output; it returns their output URIs (``dsl.Collected``) for the stage's
    collect step. A worker that takes an ``accelerator`` runs in a pod that requests one of that type ("" = none),
    with the node selector and tolerations that go with it (the sub-pipeline's inputs: only inputs of the loop's own
    DAG reach its pods' resources, and the worker takes the type as an input so that the compiler passes it in)."""
    inputs = set(worker.component_spec.inputs or {})
    placed = "accelerator" in inputs

    @dsl.pipeline(name=f"{stage}-workers", description=f"The {stage} workers, one per part.")
    def workers(items: list, parts: int, preset: str, config_overrides: list, store_uri: str, s3_endpoint: str,
                mlflow_tracking_uri: str, image_pull_secret: str, accelerator: str = "", node_selector: dict = {},
                tolerations: list = []) -> List[str]:
        cluster = _Cluster(image_pull_secret)
        with dsl.ParallelFor(items, name=f"{stage}-parts") as item:
            carried = {name: getattr(item, name) for name in CARRIED if name in inputs}
            task = worker(part=item.part, parts=parts, preset=preset, config_overrides=config_overrides,
                          store_uri=store_uri, s3_endpoint=s3_endpoint, mlflow_tracking_uri=mlflow_tracking_uri,
                          **carried, **({"accelerator": accelerator} if placed else {}))
            _never_cached(task).set_display_name(f"{stage}-part")
            cluster.env(task)
            if placed:
                _with_shared_memory(_place(task, accelerator, node_selector, tolerations, cpu_limit, memory_limit))
            else:
                task.set_cpu_limit(cpu_limit).set_memory_limit(memory_limit)
        return dsl.Collected(task.output)

    return workers


PREPARE_DATA_WORKERS = fan_out_workers("prepare-data", prepare_data_part, *get_stage("prepare-data").step_resources)
LABEL_WORKERS = fan_out_workers("label", label_part, *get_stage("label").step_resources)
PRETOKENIZE_WORKERS = fan_out_workers("pretokenize", pretokenize_part, *get_stage("pretokenize").step_resources)


@dsl.pipeline(name=PIPELINE_NAME, description="Pre-train a 4M-style massively multimodal masked model.")
def fourm_pretrain(
    preset: str = "demo",
    config_overrides: list = [],
    store_uri: str = "s3://fourm-kfp",
    s3_endpoint: str = "",
    mlflow_tracking_uri: str = "",
    run_label: str = "",
    mlflow_parent_run_id: str = "",
    prepare_data_force: bool = False,
    prepare_data_width: int = 1,
    label_force: bool = False,
    label_width: int = 1,
    train_tokenizers_force: bool = False,
    train_tokenizers_accelerator: str = "nvidia.com/gpu",
    train_tokenizers_launcher: str = IN_POD,
    train_tokenizers_nodes: int = 1,
    train_tokenizers_procs_per_node: int = 1,
    train_tokenizers_cpu_per_node: str = "",
    train_tokenizers_memory_per_node: str = "",
    train_tokenizers_node_selector: dict = {},
    train_tokenizers_tolerations: list = [],
    train_tokenizers_deadline_s: int = 259200,
    train_tokenizers_min_nodes: int = 0,
    train_tokenizers_delete_job: bool = True,
    pretokenize_force: bool = False,
    pretokenize_width: int = 1,
    pretrain_force: bool = False,
    pretrain_config_overrides: list = [],
    pretrain_accelerator: str = "nvidia.com/gpu",
    pretrain_launcher: str = PYTORCHJOB.name,
    pretrain_nodes: int = 1,
    pretrain_procs_per_node: int = 1,
    pretrain_cpu_per_node: str = "",
    pretrain_memory_per_node: str = "",
    pretrain_node_selector: dict = {},
    pretrain_tolerations: list = [],
    pretrain_deadline_s: int = 259200,
    pretrain_min_nodes: int = 0,
    pretrain_delete_job: bool = True,
    evaluate_force: bool = False,
    scheduler: str = "",
    image_pull_secret: str = DEFAULT_PULL_SECRET,
    gpu_node_selector: dict = {},
    gpu_tolerations: list = [],
    rendezvous_timeout_s: int = 1800,
    queue_timeout_s: int = 86400,
    rdma_resource: str = "",
    nccl_env: dict = {},
):
    """Pre-train a 4M-style model.

    Args:
        preset: Named config preset (smoke, demo, 4m-b); default "demo", the README's main job.
        config_overrides: List of ``section.key=value`` overrides, e.g. ``["data.image_size=96"]``; default
            none. They beat the preset's files; a value may contain spaces.
        store_uri: Root of all stage outputs (``s3://bucket/prefix`` or a local path); default the ``fourm-kfp``
            bucket. Outputs land at ``<store_uri>/<stage>/<content hash>``.
        s3_endpoint: S3 endpoint URL; default empty = ``AWS_ENDPOINT_URL`` from the ``fourm-settings`` ConfigMap.
        mlflow_tracking_uri: MLflow tracking URI; default empty = ``MLFLOW_TRACKING_URI`` from the environment.
        run_label: Label of this run in MLflow; default empty = the KFP run id.
        mlflow_parent_run_id: An MLflow run opened by whoever launched this run (``fourm-kfp run``, CI), which
            then also closes it; default empty = the pipeline opens and closes its own parent run.
        prepare_data_force: Recompute prepare-data even if its output is committed: its fan-out step clears the
            output once, then its prepare_data_width workers recompute it (as long as a first run at that width);
            default false.
        prepare_data_width: prepare-data workers running in parallel, each writing every width-th output shard
            (the same bytes whatever the width); default 1.
        label_force: Recompute the labels even if they are committed: cleared once, then recomputed by the
            label_width workers; default false.
        label_width: Label workers running in parallel, each on every width-th shard; their pods request an
            accelerator when a configured labeler is a teacher network (and pretrain_accelerator is not "cpu"), else
            none; default 1. With no labelers configured
            (label.labelers) the label steps do nothing.
        train_tokenizers_force: Recompute train-tokenizers even if its output is committed; default false.
        train_tokenizers_accelerator: "nvidia.com/gpu" (default) or "cpu": the kind of node the tokenizers train
            on, as pretrain_accelerator.
        train_tokenizers_launcher: "in-pod" (default: train in the step's own pod on one accelerator),
            "pytorchjob" or "trainjob" (the step, a light CPU pod, launches and follows a multi-node job, as
            pretrain_launcher; worth it for large presets, whose ViT VQ-VAEs train for days on one GPU).
        train_tokenizers_nodes: Job modes: pods (nodes) of the tokenizer job; default 1.
        train_tokenizers_procs_per_node: Job modes: training processes per node = accelerators per node; default 1.
        train_tokenizers_cpu_per_node: Job modes: CPU request per node; default empty = the template's.
        train_tokenizers_memory_per_node: Job modes: memory per node; default empty = the template's.
        train_tokenizers_node_selector: Job modes: node selector of the tokenizer job's pods; default none.
        train_tokenizers_tolerations: Job modes: tolerations added to the tokenizer job's pods; default none.
        train_tokenizers_deadline_s: Job modes: how long the tokenizer job may train, from when its pods run, as
            pretrain_deadline_s; default 3 days.
        train_tokenizers_min_nodes: PyTorchJob only: above 0, the tokenizer job is elastic between this many and
            train_tokenizers_nodes nodes; default 0 = fixed size.
        train_tokenizers_delete_job: Job modes: delete the tokenizer job when it is over; default true.
        pretokenize_force: Recompute pretokenize even if its output is committed: cleared once, then recomputed by
            the pretokenize_width workers; default false.
        pretokenize_width: Pretokenize workers running in parallel, each on every width-th shard; default 1 (the
            smoke and demo presets have one or a few shards).
        pretrain_force: Recompute pretrain even if its output is committed (else a committed run is reused and an
            interrupted one resumes from its newest checkpoint); default false.
        pretrain_config_overrides: ``train.*`` and ``evaluate.*`` overrides for pretrain and evaluate only, e.g.
            ``["train.steps=2000"]``; default none. A rerun that changes only these recomputes pretrain and
            evaluate and reuses every upstream output by its content address. The other pretrain_* parameters
            say where and on what pretrain runs, not what it computes: changing only them reuses a committed
            pretrain output (pretrain_force recomputes it).
        pretrain_accelerator: "nvidia.com/gpu" (default: pretraining requests GPUs) or "cpu" (no accelerator
            request, so a CPU-only cluster can run it; the image runs on CPUs too, and precision "auto" then trains
            in fp32); the pretokenize workers, the label workers of a teacher network and the evaluate step follow
            it on the same kind of node. The steps on CPUs get no GPU tolerations or node selector, so they never land
            on GPU nodes.
        pretrain_launcher: "pytorchjob" (default: the step, a light CPU pod, submits a multi-node Kubeflow
            Training Operator PyTorchJob, streams its master's log, waits for it and deletes it), "trainjob" (the
            same with a Kubeflow Trainer v2 TrainJob on the fourm-torch-distributed runtime of manifests/cluster)
            or "in-pod" (train inside the step's own pod on one accelerator; ``fourm-kfp run`` under kfp.local uses
            it). Either job mode first computes the pretrain address and creates nothing when that output is
            committed. The step is retried 3 times within 30 days of its start: a launcher pod lost to a drained node
            adopts its job where Argo's status-capture finalizer is on (docs/cluster.md).
        pretrain_nodes: Job modes: pods (nodes) of the job; default 1.
        pretrain_procs_per_node: Job modes: training processes per node = accelerators per node; default 1.
        pretrain_cpu_per_node: Job modes: CPU request per node, e.g. "32"; default empty = the template's.
        pretrain_memory_per_node: Job modes: memory per node, e.g. "256Gi"; default empty = the template's.
        pretrain_node_selector: Job modes: node selector of the training pods, e.g.
            ``{"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}``; default none.
        pretrain_tolerations: Job modes: tolerations added to the training pods (a list of Kubernetes
            toleration objects); the accelerator's own toleration is always there; default none.
        pretrain_deadline_s: Job modes: how long the job may train, counted from when its pods run (its
            activeDeadlineSeconds is this plus queue_timeout_s, a backstop); default 3 days.
        pretrain_min_nodes: PyTorchJob only: above 0, the job is elastic between this many and pretrain_nodes
            nodes (elasticPolicy, c10d rendezvous); training resumes from its newest checkpoint on a new world
            size; default 0 = fixed size.
        pretrain_delete_job: Job modes: delete the job when it is over (its pods' logs were streamed into this
            step's log); default true. A stopped KFP run's exit handler deletes its unfinished jobs. False keeps a
            finished job (no owner, no TTL): it outlives the run until deleted by hand.
        evaluate_force: Re-evaluate even if this model's evaluation is committed (registers a new model version
            and applies the gate again); default false.
        scheduler: Job modes: how the jobs' pods are placed: empty (default) = the cluster's default scheduler,
            pod by pod; "volcano" or "volcano:<queue>" = gang scheduling by Volcano (all of a job's nodes at once or
            none); "kueue:<local queue>" = admitted by Kueue when the queue has quota for the whole job. Kueue >= 0.19
            leaves its PyTorchJob integration off by default: a PyTorchJob needs
            "kueue:<local queue>:pytorchjob-integration-on", stating that yours has it on.
        image_pull_secret: A Secret of type kubernetes.io/dockerconfigjson in the run's namespace that every step
            and job pulls the images with (GHCR packages start private); default "fourm-image-pull": create it for
            private images; while it does not exist, the pods pull without it (the kubelet notes it in a Warning
            event). Never empty: KFP's driver fails every step that names an empty pull secret.
        gpu_node_selector: Node selector of every pod that requests an accelerator (the GPU steps and the jobs'
            pods), e.g. ``{"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}``; default none. A job's
            <stage>_node_selector adds to it.
        gpu_tolerations: Tolerations of every pod that requests an accelerator, beside the nvidia.com/gpu taint's
            that they always have (a list of Kubernetes toleration objects); default none. A job's
            <stage>_tolerations add to them.
        rendezvous_timeout_s: Job modes: how long a job's started nodes wait at the rendezvous for the others
            (longer than scheduling the job's pods may take, so a partly placed job waits instead of crashing and
            spending its restart budget); default 30 minutes.
        queue_timeout_s: Job modes: how long a job may wait for all its pods to run (queued by Volcano or Kueue, or
            unschedulable) before the step gives up and deletes it; default 1 day, at least 1 second (0 is refused:
            there is no "no limit"). A job's <stage>_deadline_s counts from when its pods run, not from when it was
            queued.
        rdma_resource: Job modes: the RDMA device every pod of a job requests, as the cluster's RDMA device plugin
            names it, <domain>/<name>[=<count per node>] (e.g. rdma/rdma_shared_device_a); it adds the IPC_LOCK
            capability to the training container. Default "" (none: NCCL over the pod network).
        nccl_env: Job modes: NCCL_* variables on every pod of a job (a JSON object, e.g. {"NCCL_IB_HCA": "mlx5",
            "NCCL_SOCKET_IFNAME": "eth0"}); default none.
    """
    params = dict(locals())  # the parameters by name: the job stages' <stage>_<field> ones (_job_args)
    cluster = _Cluster(image_pull_secret)
    closer = cluster.env(close_lineage_run(run_label=run_label, kfp_run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER,
                                           mlflow_tracking_uri=mlflow_tracking_uri,
                                           mlflow_parent_run_id=mlflow_parent_run_id))
    with dsl.ExitHandler(closer, name="stages"):
        opener = cluster.env(open_lineage_run(
            run_label=run_label, kfp_run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER, preset=preset,
            config_overrides=config_overrides, store_uri=store_uri, mlflow_tracking_uri=mlflow_tracking_uri,
            mlflow_parent_run_id=mlflow_parent_run_id))
        opener.set_caching_options(False)  # a new parent run every time
        opener.set_display_name("open-lineage-run")
        shared = dict(preset=preset, config_overrides=config_overrides, store_uri=store_uri,
                      s3_endpoint=s3_endpoint, mlflow_tracking_uri=mlflow_tracking_uri, parent_run_id=opener.output)
        fan_args = dict(preset=preset, config_overrides=config_overrides, store_uri=store_uri, s3_endpoint=s3_endpoint,
                        parent_run_id=opener.output)
        part_args = dict(preset=preset, config_overrides=config_overrides, store_uri=store_uri,
                         s3_endpoint=s3_endpoint, mlflow_tracking_uri=mlflow_tracking_uri,
                         image_pull_secret=image_pull_secret)
        gpu = dict(gpu_node_selector=gpu_node_selector, gpu_tolerations=gpu_tolerations)

        def placement(stage: str, accelerator, launcher=IN_POD) -> dsl.PipelineTask:
            task = cluster.pull(pod_placement(stage=stage, preset=preset, config_overrides=config_overrides,
                                              accelerator=accelerator, launcher=launcher, **gpu))
            return task.set_display_name(f"{stage}-placement")

        def fanned_out(stage: str, workers, width, force, place=None, **carried) -> dsl.PipelineTask:
            """A fan-out stage's fan-out step and its workers (placed by ``place``, a ``pod-placement`` step);
            returns the workers, whose output is the list the stage's collect step checks. ``force``
            (``<stage>_force``) goes to the fan-out step, which clears the output once before the workers start:
            they recompute it, each its own part, and the collect step commits it, unforced."""
            items = _never_cached(cluster.env(fan_out(stage=stage, width=width, force=force, **carried, **fan_args)))
            items.set_display_name(f"{stage}-fan-out")
            where = {} if place is None else {key: place.outputs[key] for key in ("accelerator", "node_selector",
                                                                                  "tolerations")}
            return workers(items=items.output, parts=width, **part_args, **where).set_display_name(
                f"{stage}-workers")

        data_parts = fanned_out("prepare-data", PREPARE_DATA_WORKERS, prepare_data_width, prepare_data_force)
        data = _never_cached(cluster.env(prepare_data(parts=prepare_data_width, part_uris=data_parts.output,
                                                      **shared)))
        data.set_display_name("prepare-data")
        label_parts = fanned_out("label", LABEL_WORKERS, label_width, label_force,
                                 placement("label", pretrain_accelerator), dataset=data.outputs["dataset"])
        labels = _never_cached(cluster.env(label(parts=label_width, part_uris=label_parts.output,
                                                 dataset=data.outputs["dataset"], **shared)))
        labels.set_display_name("label")
        dataset = labels.outputs["dataset"]
        tokenizers = _job_stage(train_tokenizers(**_job_args("train-tokenizers", params), force=train_tokenizers_force,
                                                 dataset=dataset, **shared),
                                placement("train-tokenizers", train_tokenizers_accelerator, train_tokenizers_launcher),
                                cluster)
        tokenizers.set_display_name("train-tokenizers")
        stage_inputs = dict(dataset=dataset, tokenizers_uri=tokenizers.outputs["output_uri"])
        token_parts = fanned_out("pretokenize", PRETOKENIZE_WORKERS, pretokenize_width, pretokenize_force,
                                 placement("pretokenize", pretrain_accelerator), **stage_inputs)
        tokens = _never_cached(cluster.env(pretokenize(parts=pretokenize_width, part_uris=token_parts.output,
                                                       **stage_inputs, **shared)))
        tokens.set_display_name("pretokenize")
        model = _job_stage(pretrain(**_job_args("pretrain", params), force=pretrain_force,
                                    pretokenized_uri=tokens.outputs["output_uri"],
                                    tokenizers_uri=stage_inputs["tokenizers_uri"],
                                    stage_overrides=pretrain_config_overrides, **shared),
                           placement("pretrain", pretrain_accelerator, pretrain_launcher), cluster)
        model.set_display_name("pretrain")
        evaluation = cluster.env(evaluate(force=evaluate_force, model_uri=model.outputs["output_uri"],
                                          pretokenized_uri=tokens.outputs["output_uri"], **stage_inputs,
                                          stage_overrides=pretrain_config_overrides, **shared))
        _placed(evaluation, placement("evaluate", pretrain_accelerator)).set_display_name("evaluate")
