"""The pipeline stages: each a pure function of (config, inputs) writing one content-addressed output.

``STAGES`` lists them in pipeline order. Each entry names the function implementing the stage (imported only
when the stage runs, so the CLI stays light), the config keys whose versioned fields address its output, and the
upstream stages it reads.
"""

from __future__ import annotations

from fourm_kfp.stage_runner import StageSpec

STAGES: dict[str, StageSpec] = {
    spec.name: spec
    for spec in (
        StageSpec(
            name="prepare-data",
            entry="fourm_kfp.stages.prepare_data:run",
            config_keys=("data.image_size", "data.modalities", "prepare_data"),
            source_fingerprint="fourm_kfp.stages.prepare_data:source_fingerprint",
            code_version=2,  # 2: closer camera in the synthetic scenes (objects ~12% of pixels, was ~6%)
        ),
        StageSpec(
            name="train-tokenizers",
            entry="fourm_kfp.stages.train_tokenizers:run",
            config_keys=("data.image_size", "train_tokenizers"),
            inputs=("prepare-data",),
        ),
    )
}


def get_stage(name: str) -> StageSpec:
    try:
        return STAGES[name]
    except KeyError:
        raise KeyError(f"unknown stage {name!r}; stages: {', '.join(STAGES)}") from None
