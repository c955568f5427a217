"""The pretokenize components: the workers (one per part, under ``dsl.ParallelFor``) and the collect step."""

from typing import List, NamedTuple

from kfp import dsl

from fourm_kfp.images import CPU_IMAGE, GPU_IMAGE


@dsl.component(base_image=GPU_IMAGE, install_kfp_package=False)
def pretokenize_part(part: int, parts: int, preset: str, config_overrides: list, store_uri: str, s3_endpoint: str,
                     mlflow_tracking_uri: str, parent_run_id: str, dataset: str, tokenizers_uri: str,
                     accelerator: str = "") -> str:
    """Pretokenize every ``parts``-th input shard (committed shards are skipped) in a pod that requested
    ``accelerator`` ("" = none); returns the stage's output URI."""
    from fourm_kfp.launchers.kfp_dataset import dataset_uris
    from fourm_kfp.launchers.kfp_steps import run_stage_part_component

    return run_stage_part_component("pretokenize", part, parts, preset, config_overrides, store_uri, s3_endpoint,
                                    mlflow_tracking_uri, parent_run_id,
                                    input_uris={**dataset_uris(dataset), "train-tokenizers": tokenizers_uri},
                                    accelerator=accelerator)


@dsl.component(base_image=CPU_IMAGE, install_kfp_package=False)
def pretokenize(preset: str, config_overrides: list, store_uri: str, s3_endpoint: str, mlflow_tracking_uri: str,
                parent_run_id: str, parts: int, part_uris: List[str], dataset: str, tokenizers_uri: str,
                tokens: dsl.Output[dsl.Dataset], report: dsl.Output[dsl.Markdown],
                metrics: dsl.Output[dsl.Metrics]) -> NamedTuple("Outputs", [("output_uri", str), ("result", str)]):
    """Collect the parts: check keys, counts and decoded tokens, then commit the pretokenized dataset; outputs its
    URI (also as the ``tokens`` artifact) and the stage outcome."""
    import json
    from collections import namedtuple

    from fourm_kfp.launchers.kfp_dataset import dataset_uris
    from fourm_kfp.launchers.kfp_steps import run_stage_component

    outcome = run_stage_component("pretokenize", preset, config_overrides, store_uri, s3_endpoint,
                                  mlflow_tracking_uri, parent_run_id, force=False,
                                  input_uris={**dataset_uris(dataset), "train-tokenizers": tokenizers_uri},
                                  report_path=report.path, metrics=metrics, parts=parts, part_uris=part_uris,
                                  artifact=tokens)
    return namedtuple("Outputs", ["output_uri", "result"])(outcome.output_uri, json.dumps(outcome.to_dict()))
