"""The ``pretrain`` stage: the 4M model trained on the pretokenized data, resumable, single- or multi-process.

One function for every launcher: a plain process, ``torchrun``/torchx with several processes, or a PyTorchJob pod
(rank and world from the environment; ranks share no file system). Everything heavy lives in
:mod:`fourm_kfp.train.pretraining`; this module declares the stage.
"""

from __future__ import annotations

from fourm_kfp.contract import StageContext, StageResult, StageSpec
from fourm_kfp.stages import pretokenize, train_tokenizers


def run(ctx: StageContext) -> StageResult:
    from fourm_kfp.train.pretraining import pretrain

    return pretrain(ctx)


SPEC = StageSpec(
    name="pretrain",
    run=run,
    config_keys=("train", "data", "alphas"),
    upstream=(pretokenize.SPEC, train_tokenizers.SPEC),
    resumable=True,  # a restarted run keeps its checkpoints and continues from the newest complete one
    code_version=7,  # 2: reproducible bytes (no timings, store-relative URIs, DCP metadata without save ids);
    # 3: fused AdamW on the CPU too (the same update up to rounding, so not the same bytes as version 2);
    # 4: in-place token-table gradients in one CPU process (autograd's values summed in another order)
    # 5: gradient clipping inside the fused AdamW (its grad_scale divides; clip_grad_norm_ multiplied)
    # 6: the decoder's context is the projected encoder output plus the inputs' position and modality embeddings
    # 7: the encoder table has one placeholder row for a pixel-input modality, not its vocabulary; the head and its
    # cross-entropy in one function (the same values up to rounding); no encoder mask when every slot is valid
)
