"""The pipeline stages, in pipeline order: each a pure function of (config, inputs) writing one content-addressed
output, declared by a :class:`~fourm_kfp.contract.StageSpec` in its own module (``SPEC``)."""

from __future__ import annotations

from fourm_kfp.contract.spec import StageSpec
from fourm_kfp.stages import evaluate, prepare_data, pretokenize, pretrain, train_tokenizers

#: The pipeline, in order; every stage's upstream stages come before it.
PIPELINE: tuple[StageSpec, ...] = (prepare_data.SPEC, train_tokenizers.SPEC, pretokenize.SPEC, pretrain.SPEC,
                                   evaluate.SPEC)
STAGES: dict[str, StageSpec] = {spec.name: spec for spec in PIPELINE}


def get_stage(name: str) -> StageSpec:
    try:
        return STAGES[name]
    except KeyError:
        raise KeyError(f"unknown stage {name!r}; stages: {', '.join(STAGES)}") from None
