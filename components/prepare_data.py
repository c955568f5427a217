"""The prepare-data component: synthetic scenes or real images → aligned per-modality shards."""

from typing import NamedTuple

from kfp import dsl

from fourm_kfp.images import CPU_IMAGE


@dsl.component(base_image=CPU_IMAGE, install_kfp_package=False)
def prepare_data(preset: str, config_overrides: list, store_uri: str, s3_endpoint: str, mlflow_tracking_uri: str,
                 parent_run_id: str, force: bool,
                 report: dsl.Output[dsl.Markdown],
                 metrics: dsl.Output[dsl.Metrics]) -> NamedTuple("Outputs", [("output_uri", str), ("result", str)]):
    """Run the prepare-data stage; outputs the committed dataset URI and the stage result as JSON."""
    import json
    from collections import namedtuple

    from fourm_kfp.launchers.kfp_runtime import run_stage_component

    outcome = run_stage_component("prepare-data", preset, config_overrides, store_uri, s3_endpoint,
                                  mlflow_tracking_uri, parent_run_id, force, report_path=report.path,
                                  metrics=metrics)
    return namedtuple("Outputs", ["output_uri", "result"])(outcome.output_uri, json.dumps(outcome.to_dict()))
