"""The prepare-data components: the workers (one per part, under ``dsl.ParallelFor``, each writing every
width-th output shard) and the collect step, which checks the shards, writes the reports and commits the dataset."""

from typing import List, NamedTuple

from kfp import dsl

from fourm_kfp.images import CPU_IMAGE


@dsl.component(base_image=CPU_IMAGE, install_kfp_package=False)
def prepare_data_part(part: int, parts: int, preset: str, config_overrides: list, store_uri: str, s3_endpoint: str,
                      mlflow_tracking_uri: str, parent_run_id: str) -> str:
    """Write every ``parts``-th output shard (committed shards are skipped); returns the stage's output URI."""
    from fourm_kfp.launchers.kfp_steps import run_stage_part_component

    return run_stage_part_component("prepare-data", part, parts, preset, config_overrides, store_uri, s3_endpoint,
                                    mlflow_tracking_uri, parent_run_id)


@dsl.component(base_image=CPU_IMAGE, install_kfp_package=False)
def prepare_data(preset: str, config_overrides: list, store_uri: str, s3_endpoint: str, mlflow_tracking_uri: str,
                 parent_run_id: str, parts: int, part_uris: List[str],
                 data: dsl.Output[dsl.Dataset], report: dsl.Output[dsl.Markdown], metrics: dsl.Output[dsl.Metrics]
                 ) -> NamedTuple("Outputs", [("output_uri", str), ("dataset", str), ("result", str)]):
    """Collect the parts and commit the dataset; outputs its URI (also as the ``data`` artifact, with its address,
    digest and preset), the dataset as the next steps take it (its layers by stage: this one so far) and the stage
    result as JSON."""
    import json
    from collections import namedtuple

    from fourm_kfp.launchers.kfp_dataset import with_dataset_layer
    from fourm_kfp.launchers.kfp_steps import run_stage_component

    outcome = run_stage_component("prepare-data", preset, config_overrides, store_uri, s3_endpoint,
                                  mlflow_tracking_uri, parent_run_id, force=False, report_path=report.path,
                                  metrics=metrics, parts=parts, part_uris=part_uris, artifact=data)
    return namedtuple("Outputs", ["output_uri", "dataset", "result"])(
        outcome.output_uri, with_dataset_layer("{}", "prepare-data", outcome.output_uri),
        json.dumps(outcome.to_dict()))
