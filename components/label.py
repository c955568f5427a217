"""The label components: the workers (one per part, under ``dsl.ParallelFor``, in the GPU image, which runs on CPUs
too; their pod requests an accelerator only for a teacher network: ``pod_placement``) and the collect step, which passes the dataset on with the labels as its top layer.

With no labelers configured the label stage is off: the workers and the collect step do nothing, and the dataset
passes on unchanged."""

from typing import List, NamedTuple

from kfp import dsl

from fourm_kfp.images import CPU_IMAGE, GPU_IMAGE


@dsl.component(base_image=GPU_IMAGE, install_kfp_package=False)
def label_part(part: int, parts: int, preset: str, config_overrides: list, store_uri: str, s3_endpoint: str,
               mlflow_tracking_uri: str, parent_run_id: str, dataset: str, accelerator: str = "") -> str:
    """Label every ``parts``-th input shard (committed shards are skipped) in a pod that requested ``accelerator``
    ("" = none); returns the stage's output URI ("" when the stage is off)."""
    from fourm_kfp.launchers.kfp_dataset import dataset_uris
    from fourm_kfp.launchers.kfp_steps import run_stage_part_component, stage_is_on

    if not stage_is_on("label", preset, config_overrides):
        return ""
    return run_stage_part_component("label", part, parts, preset, config_overrides, store_uri, s3_endpoint,
                                    mlflow_tracking_uri, parent_run_id, input_uris=dataset_uris(dataset),
                                    accelerator=accelerator)


@dsl.component(base_image=CPU_IMAGE, install_kfp_package=False)
def label(preset: str, config_overrides: list, store_uri: str, s3_endpoint: str, mlflow_tracking_uri: str,
          parent_run_id: str, parts: int, part_uris: List[str], dataset: str, labels: dsl.Output[dsl.Dataset],
          report: dsl.Output[dsl.Markdown], metrics: dsl.Output[dsl.Metrics]
          ) -> NamedTuple("Outputs", [("output_uri", str), ("dataset", str), ("result", str)]):
    """Collect the parts: check the shards, apply the data gate, commit the labels; outputs their URI ("" when the
    stage is off; also as the ``labels`` artifact), the dataset with them as its top layer, and the stage outcome."""
    import json
    from collections import namedtuple

    from fourm_kfp.launchers.kfp_artifacts import fill_output_artifact, off_record
    from fourm_kfp.launchers.kfp_dataset import dataset_uris, with_dataset_layer
    from fourm_kfp.launchers.kfp_steps import run_stage_component, stage_is_on

    outputs = namedtuple("Outputs", ["output_uri", "dataset", "result"])
    if not stage_is_on("label", preset, config_overrides):
        with open(report.path, "w") as fh:
            fh.write("# label\n\nOff: no labelers are configured (label.labelers), so the dataset passes on as "
                     "prepare-data wrote it.\n")
        fill_output_artifact(labels, off_record("label", preset))
        return outputs("", dataset, json.dumps({"name": "label", "status": "off"}))
    outcome = run_stage_component("label", preset, config_overrides, store_uri, s3_endpoint, mlflow_tracking_uri,
                                  parent_run_id, force=False, input_uris=dataset_uris(dataset), report_path=report.path,
                                  metrics=metrics, parts=parts, part_uris=part_uris, artifact=labels)
    return outputs(outcome.output_uri, with_dataset_layer(dataset, "label", outcome.output_uri),
                   json.dumps(outcome.to_dict()))
