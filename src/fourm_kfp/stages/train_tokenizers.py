"""The ``train-tokenizers`` stage: a VQ-VAE per image modality and one WordPiece tokenizer for text, trained on the
prepared dataset (:mod:`fourm_kfp.tokenizers.bundle_training`), committed as the bundle that
:func:`fourm_kfp.tokenizers.bundle.load_tokenizers` reads back."""

from __future__ import annotations

from fourm_kfp.contract import StageContext, StageResult, StageSpec
from fourm_kfp.stages import prepare_data


def run(ctx: StageContext) -> StageResult:
    from fourm_kfp.tokenizers.bundle_training import train_bundle  # torch: imported when the stage runs

    return train_bundle(ctx)


SPEC = StageSpec(
    name="train-tokenizers",
    run=run,
    config_keys=("data.image_size", "train_tokenizers"),
    upstream=(prepare_data.SPEC,),
    code_version=4,  # 2: reproducible bytes (deterministic WordPiece, no timings or absolute URIs)
    # 3: the conv VQ-VAE's encoder is patch-local (a token is a function of its own patch)
    # 4: the report's usage target is a collapse check (>= 10%), not >= 50%
)
