"""The fourm-pretrain KFP v2 pipeline: prepare-data → label → train-tokenizers → pretokenize → pretrain → evaluate.

Stages exchange URIs of committed, content-addressed outputs, never the bytes (KFP would copy every input artifact
in full). The dataset travels as one ``dataset`` string (its layers' URIs by stage: prepare-data's, then the label
stage's when labelers are configured), so the steps that read it take one parameter whatever its layers. Every stage
opens an MLflow child run under the parent run opened by the first step; an exit handler closes the parent run with
the pipeline's final state.

Parameters are flat. The shared ones configure every stage; the ``<stage>_*`` ones touch one stage only.
"""

from dataclasses import fields

from kfp import dsl, kubernetes

from fourm_kfp.cluster.job_spec import (GPU_RESOURCE, GPU_TOLERATION, IN_POD, PYTORCHJOB, ClusterParams, JobParams,
                                        param_prefix)
from fourm_kfp.components.evaluate import evaluate
from fourm_kfp.images import IMAGE_TAG, IMAGE_TAG_ENV
from fourm_kfp.components.fan_out import fan_out, worker_pods
from fourm_kfp.components.label import label, label_part_cpu, label_part_gpu
from fourm_kfp.components.lineage import close_lineage_run, open_lineage_run
from fourm_kfp.components.prepare_data import prepare_data, prepare_data_part
from fourm_kfp.components.pretokenize import pretokenize, pretokenize_part
from fourm_kfp.components.pretrain import pretrain
from fourm_kfp.components.train_tokenizers import train_tokenizers

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
#: Retries of a job stage's launcher step: a drained or preempted launcher pod comes back and adopts its job (the
#: job's own restart budget is separate: a retried launcher does not start a failed job again).
LAUNCHER_RETRIES, LAUNCHER_RETRY_BACKOFF = 3, "60s"


class _Cluster:
    """The run-wide cluster settings (:class:`ClusterParams`, pipeline parameters of the same names) applied to the
    steps: the Secret and ConfigMap env and the image pull secret on every step; the accelerator, its taint's
    toleration, ``gpu_tolerations`` and ``gpu_node_selector`` on every GPU step. All ignored by kfp.local."""

    def __init__(self, image_pull_secret, gpu_node_selector, gpu_tolerations):
        self.image_pull_secret, self.gpu_node_selector = image_pull_secret, gpu_node_selector
        self.gpu_tolerations = gpu_tolerations

    def env(self, task: dsl.PipelineTask) -> dsl.PipelineTask:
        """Credentials from the Secret, defaults from the ConfigMap, and the image pull secret."""
        kubernetes.use_secret_as_env(task, secret_name=S3_SECRET, secret_key_to_env=S3_SECRET_ENV, optional=True)
        kubernetes.use_config_map_as_env(task, config_map_name=SETTINGS_CONFIG_MAP,
                                         config_map_key_to_env=SETTINGS_ENV, optional=True)
        return self.pull(task)

    def pull(self, task: dsl.PipelineTask) -> dsl.PipelineTask:
        """The image pull secret ("" = none: the kubelet skips an empty name), on every step."""
        return kubernetes.set_image_pull_secrets(task, [self.image_pull_secret])

    def gpu(self, task: dsl.PipelineTask) -> dsl.PipelineTask:
        """One accelerator on the run's GPU nodes: the taint's toleration, ``gpu_tolerations`` and
        ``gpu_node_selector``."""
        task.set_accelerator_type(GPU_RESOURCE).set_accelerator_limit(1)
        kubernetes.add_toleration(task, **GPU_TOLERATION)
        kubernetes.add_toleration_json(task, self.gpu_tolerations)
        kubernetes.add_node_selector_json(task, self.gpu_node_selector)
        return task


def _with_shared_memory(task: dsl.PipelineTask) -> dsl.PipelineTask:
    """An in-memory ``/dev/shm`` for a step whose worker processes hand tensors back through shared memory (the
    token loader's workers, pretokenize's decode workers): the container default is 64 MiB. Counted against the
    step's memory limit."""
    kubernetes.empty_dir_mount(task, volume_name="dshm", mount_path="/dev/shm", medium="Memory")
    return task


def _job_args(stage: str, params: dict) -> dict:
    """The job fields of ``stage``'s component (:class:`JobParams`) from the pipeline's ``<stage>_<field>``
    parameters, the run-wide cluster settings (:class:`ClusterParams`, same names), and the KFP run id the job is
    labelled with."""
    prefix = param_prefix(stage)
    return {**{f.name: params[f"{prefix}_{f.name}"] for f in fields(JobParams)},
            **{f.name: params[f.name] for f in fields(ClusterParams)},
            "kfp_run_id": dsl.PIPELINE_JOB_ID_PLACEHOLDER}


def _job_launcher(task: dsl.PipelineTask, cluster: _Cluster) -> dsl.PipelineTask:
    """A job stage's step in the job modes: a light CPU pod (the training runs in the job's pods) that knows its
    own name and namespace through the downward API (the job is created in its namespace and owned by the run's
    workflow, which owns this pod) and its own image tag (the job runs the same image). Retried: a launcher pod lost
    to a drained or preempted node comes back and adopts its job, which trains on meanwhile."""
    cluster.env(task).set_cpu_limit("1").set_memory_limit("2Gi")
    task.set_retry(LAUNCHER_RETRIES, backoff_duration=LAUNCHER_RETRY_BACKOFF)
    for env_name, field_path in LAUNCHER_POD_FIELDS.items():
        kubernetes.use_field_path_as_env(task, env_name=env_name, field_path=field_path)
    task.set_env_variable(IMAGE_TAG_ENV, IMAGE_TAG)  # the job's pods run the image this step runs
    return task


def _pretokenize_worker(item, parts, part_args: dict, cluster: _Cluster) -> dsl.PipelineTask:
    """A pretokenize worker (one loop item's part), on CPUs; :meth:`_Cluster.gpu` puts it on an accelerator."""
    task = _with_shared_memory(cluster.env(pretokenize_part(
        part=item.part, parts=parts, dataset=item.dataset, tokenizers_uri=item.tokenizers_uri,
        parent_run_id=item.parent_run_id, **part_args)))
    return task.set_display_name("pretokenize-part").set_cpu_limit("8").set_memory_limit("16Gi")


def _evaluate_on(task: dsl.PipelineTask, cluster: _Cluster, accelerator: bool) -> dsl.PipelineTask:
    cluster.env(task).set_display_name("evaluate").set_cpu_limit("8").set_memory_limit("32Gi")
    return cluster.gpu(task) if accelerator else task


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
    pretrain_launcher: str = PYTORCHJOB,
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
    image_pull_secret: str = "",
    gpu_node_selector: dict = {},
    gpu_tolerations: list = [],
    rendezvous_timeout_s: int = 1800,
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
        prepare_data_force: Recompute prepare-data even if its output is committed (in the collect step,
            serially); default false.
        prepare_data_width: prepare-data workers running in parallel, each writing every width-th output shard
            (the same bytes whatever the width); default 1.
        label_force: Recompute the labels even if they are committed (in the collect step, serially); default
            false.
        label_width: Label workers running in parallel, each on every width-th shard; they run in GPU pods when a
            configured labeler is a teacher network, else in CPU pods; default 1. With no labelers configured
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
        train_tokenizers_deadline_s: Job modes: the tokenizer job's activeDeadlineSeconds; default 3 days.
        train_tokenizers_min_nodes: PyTorchJob only: above 0, the tokenizer job is elastic between this many and
            train_tokenizers_nodes nodes; default 0 = fixed size.
        train_tokenizers_delete_job: Job modes: delete the tokenizer job when it is over; default true.
        pretokenize_force: Recompute pretokenize even if its output is committed (in the collect step, serially);
            default false.
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
            it on the same kind of node.
        pretrain_launcher: "pytorchjob" (default: the step, a light CPU pod, submits a multi-node Kubeflow
            Training Operator PyTorchJob, streams its master's log, waits for it and deletes it), "trainjob" (the
            same with a Kubeflow Trainer v2 TrainJob on the fourm-torch-distributed runtime of manifests/cluster)
            or "in-pod" (train inside the step's own pod on one accelerator; ``fourm-kfp run`` under kfp.local uses
            it). Either job mode first computes the pretrain address and creates nothing when that output is
            committed. The step is retried 3 times: a launcher pod lost to a drained node adopts its job.
        pretrain_nodes: Job modes: pods (nodes) of the job; default 1.
        pretrain_procs_per_node: Job modes: training processes per node = accelerators per node; default 1.
        pretrain_cpu_per_node: Job modes: CPU request per node, e.g. "32"; default empty = the template's.
        pretrain_memory_per_node: Job modes: memory per node, e.g. "256Gi"; default empty = the template's.
        pretrain_node_selector: Job modes: node selector of the training pods, e.g.
            ``{"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}``; default none.
        pretrain_tolerations: Job modes: tolerations added to the training pods (a list of Kubernetes
            toleration objects); the accelerator's own toleration is always there; default none.
        pretrain_deadline_s: Job modes: the job's activeDeadlineSeconds, also how long the step waits; default
            3 days.
        pretrain_min_nodes: PyTorchJob only: above 0, the job is elastic between this many and pretrain_nodes
            nodes (elasticPolicy, c10d rendezvous); training resumes from its newest checkpoint on a new world
            size; default 0 = fixed size.
        pretrain_delete_job: Job modes: delete the job when it is over (its pods' logs were streamed into this
            step's log); default true. A stopped KFP run's exit handler deletes its unfinished jobs.
        evaluate_force: Re-evaluate even if this model's evaluation is committed (registers a new model version
            and applies the gate again); default false.
        scheduler: Job modes: how the jobs' pods are placed: empty (default) = the cluster's default scheduler,
            pod by pod; "volcano" or "volcano:<queue>" = gang scheduling by Volcano (all of a job's nodes at once or
            none); "kueue:<local queue>" = admitted by Kueue when the queue has quota for the whole job.
        image_pull_secret: A Secret of type kubernetes.io/dockerconfigjson in the run's namespace that every step
            and job pulls the images with (GHCR packages start private); default empty = none.
        gpu_node_selector: Node selector of every pod that requests an accelerator (the GPU steps and the jobs'
            pods), e.g. ``{"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}``; default none. A job's
            <stage>_node_selector adds to it.
        gpu_tolerations: Tolerations of every pod that requests an accelerator, beside the nvidia.com/gpu taint's
            that they always have (a list of Kubernetes toleration objects); default none. A job's
            <stage>_tolerations add to them.
        rendezvous_timeout_s: Job modes: how long a job's started nodes wait at the rendezvous for the others
            (longer than scheduling the job's pods may take, so a partly placed job waits instead of crashing and
            spending its restart budget); default 30 minutes.
    """
    params = dict(locals())  # the parameters by name: the job stages' <stage>_<field> ones (_job_args)
    cluster = _Cluster(image_pull_secret, gpu_node_selector, gpu_tolerations)
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
        fan_args = dict(preset=preset, config_overrides=config_overrides, parent_run_id=opener.output)
        part_args = dict(preset=preset, config_overrides=config_overrides, store_uri=store_uri,
                         s3_endpoint=s3_endpoint, mlflow_tracking_uri=mlflow_tracking_uri)
        data_parts = cluster.pull(fan_out(stage="prepare-data", width=prepare_data_width, **fan_args))
        data_parts.set_display_name("prepare-data-fan-out")
        with dsl.ParallelFor(data_parts.output, name="prepare-data-parts") as item:
            data_part = cluster.env(prepare_data_part(part=item.part, parts=prepare_data_width,
                                                            parent_run_id=item.parent_run_id, **part_args))
            data_part.set_display_name("prepare-data-part")
            data_part.set_cpu_limit("8").set_memory_limit("16Gi")
        data = cluster.env(prepare_data(force=prepare_data_force, parts=prepare_data_width,
                                              part_uris=dsl.Collected(data_part.output), **shared))
        data.set_display_name("prepare-data")
        label_parts = cluster.pull(fan_out(stage="label", width=label_width, dataset=data.outputs["dataset"],
                                           **fan_args))
        label_parts.set_display_name("label-fan-out")
        label_pods = cluster.pull(worker_pods(stage="label", preset=preset, config_overrides=config_overrides,
                                              accelerator=pretrain_accelerator))
        label_pods.set_display_name("label-worker-pods")
        label_args = dict(force=label_force, parts=label_width, **shared)
        with dsl.If(label_pods.output == "gpu", name="label-on-accelerator"):
            with dsl.ParallelFor(label_parts.output, name="label-parts-gpu") as item:
                gpu_part = cluster.env(label_part_gpu(part=item.part, parts=label_width, dataset=item.dataset,
                                                            parent_run_id=item.parent_run_id, **part_args))
                gpu_part.set_display_name("label-part")
                cluster.gpu(gpu_part.set_cpu_limit("8").set_memory_limit("32Gi"))
            labels_gpu = cluster.env(label(part_uris=dsl.Collected(gpu_part.output),
                                                 dataset=data.outputs["dataset"], **label_args))
        with dsl.Else(name="label-on-cpu"):
            with dsl.ParallelFor(label_parts.output, name="label-parts-cpu") as item:
                cpu_part = cluster.env(label_part_cpu(part=item.part, parts=label_width, dataset=item.dataset,
                                                            parent_run_id=item.parent_run_id, **part_args))
                cpu_part.set_display_name("label-part")
                cpu_part.set_cpu_limit("8").set_memory_limit("16Gi")
            labels_cpu = cluster.env(label(part_uris=dsl.Collected(cpu_part.output),
                                                 dataset=data.outputs["dataset"], **label_args))
        for task in (labels_gpu, labels_cpu):
            task.set_display_name("label")
        dataset = dsl.OneOf(labels_gpu.outputs["dataset"], labels_cpu.outputs["dataset"])
        tokenizer_args = dict(force=train_tokenizers_force, dataset=dataset, **shared)
        with dsl.If(train_tokenizers_launcher != IN_POD, name="train-tokenizers-as-job"):
            tokenizers_job = _job_launcher(train_tokenizers(**_job_args("train-tokenizers", params),
                                                            **tokenizer_args), cluster)
        with dsl.Elif(train_tokenizers_accelerator == "cpu", name="train-tokenizers-on-cpu"):
            tokenizers_cpu = cluster.env(train_tokenizers(launcher=IN_POD, **tokenizer_args))
            tokenizers_cpu.set_cpu_limit("8").set_memory_limit("32Gi")
        with dsl.Else(name="train-tokenizers-on-accelerator"):
            tokenizers_gpu = cluster.env(train_tokenizers(launcher=IN_POD, **tokenizer_args))
            cluster.gpu(tokenizers_gpu.set_cpu_limit("8").set_memory_limit("32Gi"))
        for task in (tokenizers_job, tokenizers_cpu, tokenizers_gpu):
            task.set_display_name("train-tokenizers")
        tokenizers_uri = dsl.OneOf(*(t.outputs["output_uri"] for t in (tokenizers_job, tokenizers_cpu,
                                                                       tokenizers_gpu)))
        stage_inputs = dict(dataset=dataset, tokenizers_uri=tokenizers_uri)
        parts = cluster.pull(fan_out(stage="pretokenize", width=pretokenize_width, **stage_inputs, **fan_args))
        parts.set_display_name("pretokenize-fan-out")
        token_args = dict(force=pretokenize_force, parts=pretokenize_width, **stage_inputs, **shared)
        with dsl.If(pretrain_accelerator == "cpu", name="pretokenize-on-cpu"):  # on the kind of node pretrain uses
            with dsl.ParallelFor(parts.output, name="pretokenize-parts-cpu") as item:
                cpu_worker = _pretokenize_worker(item, pretokenize_width, part_args, cluster)
            tokens_cpu = cluster.env(pretokenize(part_uris=dsl.Collected(cpu_worker.output), **token_args))
        with dsl.Else(name="pretokenize-on-accelerator"):
            with dsl.ParallelFor(parts.output, name="pretokenize-parts-gpu") as item:
                gpu_worker = cluster.gpu(_pretokenize_worker(item, pretokenize_width, part_args, cluster))
            tokens_gpu = cluster.env(pretokenize(part_uris=dsl.Collected(gpu_worker.output), **token_args))
        for task in (tokens_cpu, tokens_gpu):
            task.set_display_name("pretokenize")
        tokens_uri = dsl.OneOf(tokens_cpu.outputs["output_uri"], tokens_gpu.outputs["output_uri"])
        train_args = dict(force=pretrain_force, pretokenized_uri=tokens_uri,
                          tokenizers_uri=tokenizers_uri, stage_overrides=pretrain_config_overrides,
                          **shared)
        eval_args = dict(force=evaluate_force, pretokenized_uri=tokens_uri, **stage_inputs,
                         stage_overrides=pretrain_config_overrides, **shared)
        with dsl.If(pretrain_launcher != IN_POD, name="pretrain-as-job"):
            pretrain_job = _job_launcher(pretrain(**_job_args("pretrain", params), **train_args), cluster)
        with dsl.Elif(pretrain_accelerator == "cpu", name="pretrain-on-cpu"):
            pretrain_cpu = _with_shared_memory(cluster.env(pretrain(launcher=IN_POD, **train_args)))
            pretrain_cpu.set_cpu_limit("16").set_memory_limit("64Gi")
        with dsl.Else(name="pretrain-on-accelerator"):
            pretrain_gpu = _with_shared_memory(cluster.env(pretrain(launcher=IN_POD, **train_args)))
            cluster.gpu(pretrain_gpu.set_cpu_limit("16").set_memory_limit("64Gi"))
        for task in (pretrain_job, pretrain_cpu, pretrain_gpu):
            task.set_display_name("pretrain")
        model_uri = dsl.OneOf(*(t.outputs["output_uri"] for t in (pretrain_job, pretrain_cpu, pretrain_gpu)))
        with dsl.If(pretrain_accelerator == "cpu", name="evaluate-on-cpu"):  # on the kind of node pretrain used
            _evaluate_on(evaluate(model_uri=model_uri, **eval_args), cluster, accelerator=False)
        with dsl.Else(name="evaluate-on-accelerator"):
            _evaluate_on(evaluate(model_uri=model_uri, **eval_args), cluster, accelerator=True)
