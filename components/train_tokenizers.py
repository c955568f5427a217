"""The train-tokenizers component: a VQ-VAE per image modality and the WordPiece text tokenizer, trained in this pod
(``launcher="in-pod"``, the default), or by a multi-node PyTorchJob / TrainJob this step launches and follows
(``pytorchjob`` / ``trainjob``). Its job parameters (``launcher`` ... ``delete_job``) are the fields of
:class:`fourm_kfp.cluster.job_spec.JobParams` with the train-tokenizers defaults of ``JOB_STAGES`` (and
``scheduler`` ... ``nccl_env`` those of :class:`~fourm_kfp.cluster.job_spec.ClusterParams`),
written out (KFP runs the function's own source, without this module's imports)."""

from typing import NamedTuple

from kfp import dsl

from fourm_kfp.images import GPU_IMAGE


@dsl.component(base_image=GPU_IMAGE, install_kfp_package=False)
def train_tokenizers(preset: str, config_overrides: list, store_uri: str, s3_endpoint: str, mlflow_tracking_uri: str,
                     parent_run_id: str, force: bool, dataset: str, tokenizers: dsl.Output[dsl.Model],
                     report: dsl.Output[dsl.Markdown],
                     metrics: dsl.Output[dsl.Metrics], job_spec: dsl.Output[dsl.Artifact],
                     launcher: str = "in-pod", nodes: int = 1, procs_per_node: int = 1,
                     accelerator: str = "nvidia.com/gpu", cpu_per_node: str = "", memory_per_node: str = "",
                     node_selector: dict = {}, tolerations: list = [], deadline_s: int = 259200, min_nodes: int = 0,
                     delete_job: bool = True, kfp_run_id: str = "", scheduler: str = "",
                     image_pull_secret: str = "fourm-image-pull", gpu_node_selector: dict = {}, gpu_tolerations: list = [],
                     rendezvous_timeout_s: int = 1800,
                     queue_timeout_s: int = 86400, rdma_resource: str = "", nccl_env: dict = {}
                     ) -> NamedTuple("Outputs", [("output_uri", str), ("result", str)]):
    """Train the tokenizers on the ``dataset`` (its layers' URIs by stage, as the dataset steps pass it on); outputs
    the committed tokenizer bundle's URI (also as the ``tokenizers`` artifact) and, in the job modes, the rendered
    job spec."""
    import json
    from collections import namedtuple

    from fourm_kfp.cluster.job_spec import ClusterParams, JobParams
    from fourm_kfp.launchers.kfp_dataset import dataset_uris
    from fourm_kfp.launchers.kfp_steps import run_job_component

    job = JobParams.of(locals())  # launcher, nodes, ..., delete_job: the parameters named like its fields
    cluster = ClusterParams.of(locals())  # scheduler, ..., nccl_env: the run-wide cluster settings
    outcome = run_job_component(
        "train-tokenizers", preset, config_overrides, store_uri, s3_endpoint, mlflow_tracking_uri, parent_run_id,
        force, input_uris=dataset_uris(dataset), job=job, cluster=cluster, kfp_run_id=kfp_run_id,
        report_path=report.path, metrics=metrics, job_spec_path=job_spec.path, artifact=tokenizers)
    return namedtuple("Outputs", ["output_uri", "result"])(outcome.output_uri, json.dumps(outcome.to_dict()))
