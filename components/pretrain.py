"""The pretrain component: the 4M trainer on the pretokenized data (in the cluster, on the accelerators asked)."""

from typing import NamedTuple

from kfp import dsl

from fourm_kfp.components.images import GPU_IMAGE


@dsl.component(base_image=GPU_IMAGE, install_kfp_package=False)
def pretrain(preset: str, config_overrides: list, store_uri: str, s3_endpoint: str, mlflow_tracking_uri: str,
             parent_run_id: str, force: bool, pretokenized_uri: str, tokenizers_uri: str,
             report: dsl.Output[dsl.Markdown],
             metrics: dsl.Output[dsl.Metrics]) -> NamedTuple("Outputs", [("output_uri", str), ("result", str)]):
    """Train the model; outputs the committed run's URI (exported model, checkpoints, metrics, report)."""
    import json
    from collections import namedtuple

    from fourm_kfp.kfp_runtime import run_stage_component

    outcome = run_stage_component("pretrain", preset, config_overrides, store_uri, s3_endpoint,
                                  mlflow_tracking_uri, parent_run_id, force,
                                  input_uris={"pretokenize": pretokenized_uri, "train-tokenizers": tokenizers_uri},
                                  report_path=report.path, metrics=metrics)
    return namedtuple("Outputs", ["output_uri", "result"])(outcome.output_uri, json.dumps(outcome.to_dict()))
