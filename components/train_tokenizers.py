"""The train-tokenizers component: a VQ-VAE per image modality and the WordPiece text tokenizer."""

from typing import NamedTuple

from kfp import dsl

from fourm_kfp.components.images import GPU_IMAGE


@dsl.component(base_image=GPU_IMAGE, install_kfp_package=False)
def train_tokenizers(preset: str, config_overrides: list, store_uri: str, s3_endpoint: str, mlflow_tracking_uri: str,
                     parent_run_id: str, force: bool, data_uri: str, report: dsl.Output[dsl.Markdown],
                     metrics: dsl.Output[dsl.Metrics]) -> NamedTuple("Outputs", [("output_uri", str), ("result", str)]):
    """Train the tokenizers on the dataset at ``data_uri``; outputs the committed tokenizer bundle's URI."""
    import json
    from collections import namedtuple

    from fourm_kfp.launchers.kfp_runtime import run_stage_component

    outcome = run_stage_component("train-tokenizers", preset, config_overrides, store_uri, s3_endpoint,
                                  mlflow_tracking_uri, parent_run_id, force, input_uris={"prepare-data": data_uri},
                                  report_path=report.path, metrics=metrics)
    return namedtuple("Outputs", ["output_uri", "result"])(outcome.output_uri, json.dumps(outcome.to_dict()))
