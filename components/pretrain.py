"""The pretrain component: the 4M trainer in this pod (``launcher="in-pod"``), or the launcher of a multi-node
PyTorchJob / TrainJob that follows the job and reports its committed output (``pytorchjob`` / ``trainjob``). Its job
parameters (``launcher`` ... ``delete_job``) are the fields of :class:`fourm_kfp.cluster.job_spec.JobParams`, and
``scheduler`` ... ``nccl_env`` those of :class:`~fourm_kfp.cluster.job_spec.ClusterParams`, their
defaults written out (KFP runs the function's own source, without this module's imports)."""

from typing import NamedTuple

from kfp import dsl

from fourm_kfp.images import GPU_IMAGE


@dsl.component(base_image=GPU_IMAGE, install_kfp_package=False)
def pretrain(preset: str, config_overrides: list, store_uri: str, s3_endpoint: str, mlflow_tracking_uri: str,
             parent_run_id: str, force: bool, pretokenized_uri: str, tokenizers_uri: str, model: dsl.Output[dsl.Model],
             report: dsl.Output[dsl.Markdown], report_html: dsl.Output[dsl.HTML], metrics: dsl.Output[dsl.Metrics],
             job_spec: dsl.Output[dsl.Artifact],
             launcher: str = "pytorchjob", nodes: int = 1, procs_per_node: int = 1,
             accelerator: str = "nvidia.com/gpu", cpu_per_node: str = "", memory_per_node: str = "",
             node_selector: dict = {}, tolerations: list = [], deadline_s: int = 259200, min_nodes: int = 0,
             delete_job: bool = True, kfp_run_id: str = "", scheduler: str = "", image_pull_secret: str = "fourm-image-pull",
             gpu_node_selector: dict = {}, gpu_tolerations: list = [], rendezvous_timeout_s: int = 1800,
             queue_timeout_s: int = 86400, rdma_resource: str = "", nccl_env: dict = {},
             stage_overrides: list = []) -> NamedTuple("Outputs", [("output_uri", str), ("result", str)]):
    """Train the model; outputs the committed run's URI (exported model, checkpoints, metrics, report; also as the
    ``model`` artifact), the report
    with the loss curves inline (HTML, shown in the UI) and, in the job modes, the rendered job spec."""
    import json
    from collections import namedtuple

    from fourm_kfp.cluster.job_spec import ClusterParams, JobParams
    from fourm_kfp.launchers.kfp_steps import run_job_component, with_stage_overrides

    job = JobParams.of(locals())  # launcher, nodes, ..., delete_job: the parameters named like its fields
    cluster = ClusterParams.of(locals())  # scheduler, ..., nccl_env: the run-wide cluster settings
    overrides = with_stage_overrides(config_overrides, stage_overrides)
    outcome = run_job_component(
        "pretrain", preset, overrides, store_uri, s3_endpoint, mlflow_tracking_uri, parent_run_id, force,
        input_uris={"pretokenize": pretokenized_uri, "train-tokenizers": tokenizers_uri}, job=job,
        cluster=cluster, kfp_run_id=kfp_run_id, report_path=report.path, metrics=metrics, job_spec_path=job_spec.path,
        html_path=report_html.path, artifact=model)
    return namedtuple("Outputs", ["output_uri", "result"])(outcome.output_uri, json.dumps(outcome.to_dict()))
