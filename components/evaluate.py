"""The evaluate component: the trained model against ground truth, with its report (Markdown, HTML, metrics) and
the model gate, whose decision is an output so CI retraining can act on it."""

from typing import NamedTuple

from kfp import dsl

from fourm_kfp.images import GPU_IMAGE


@dsl.component(base_image=GPU_IMAGE, install_kfp_package=False)
def evaluate(preset: str, config_overrides: list, store_uri: str, s3_endpoint: str, mlflow_tracking_uri: str,
             parent_run_id: str, force: bool, model_uri: str, pretokenized_uri: str, tokenizers_uri: str,
             dataset: str, evaluation: dsl.Output[dsl.Artifact], report: dsl.Output[dsl.Markdown],
             report_html: dsl.Output[dsl.HTML], metrics: dsl.Output[dsl.Metrics], stage_overrides: list = []
             ) -> NamedTuple("Outputs", [("output_uri", str), ("promoted", bool), ("gate", str), ("result", str)]):
    """Evaluate the model; outputs the committed evaluation's URI (also as the ``evaluation`` artifact), whether the
    model became champion, the gate's decision (JSON) and the stage outcome."""
    import json
    from collections import namedtuple

    from fourm_kfp.launchers.kfp_dataset import dataset_uris
    from fourm_kfp.launchers.kfp_steps import run_stage_component, with_stage_overrides
    from fourm_kfp.stages import GATE_FILE
    from fourm_kfp.storage import open_store

    overrides = with_stage_overrides(config_overrides, stage_overrides)
    outcome = run_stage_component("evaluate", preset, overrides, store_uri, s3_endpoint,
                                  mlflow_tracking_uri, parent_run_id, force,
                                  input_uris={"pretrain": model_uri, "pretokenize": pretokenized_uri,
                                              "train-tokenizers": tokenizers_uri, **dataset_uris(dataset)},
                                  report_path=report.path, metrics=metrics, html_path=report_html.path,
                                  artifact=evaluation)
    gate = json.loads(open_store(outcome.output_uri).get_bytes(GATE_FILE))
    return namedtuple("Outputs", ["output_uri", "promoted", "gate", "result"])(
        outcome.output_uri, bool(gate.get("promoted", False)), json.dumps(gate), json.dumps(outcome.to_dict()))
