"""The ``evaluate`` stage: the trained model against exact ground truth, with references, a report and the gate.

Masked-modeling loss per modality on the val split; cross-modal generation (rgb → depth/normal/semseg/det/caption,
caption → rgb) scored beside the tokenizer ceiling and a trivial baseline; a Markdown/HTML report with grids; the
model registered in the MLflow registry as ``candidate`` and promoted to ``champion`` when it beats the current
one with confidence (a bootstrap over the val scenes against the champion's per-scene scores). The gate's decision
depends on the registry, not on the inputs: ``gate.json`` and ``reports/model_gate.md`` are run records, outside
the reproducible payload. The body lives in :mod:`fourm_kfp.evaluation.evaluate`; this module declares the stage.
"""

from __future__ import annotations

from fourm_kfp.contract import StageContext, StageResult, StageSpec
from fourm_kfp.stages import prepare_data, pretokenize, pretrain, train_tokenizers


def run(ctx: StageContext) -> StageResult:
    from fourm_kfp.evaluation.evaluate import evaluate

    return evaluate(ctx)


SPEC = StageSpec(
    name="evaluate",
    run=run,
    # train and alphas: the masked-modeling loss uses the training budgets and masking, as pretrain's validation
    config_keys=("evaluate", "data", "train", "alphas"),
    upstream=(pretrain.SPEC, pretokenize.SPEC, train_tokenizers.SPEC, prepare_data.SPEC),
    code_version=2,  # 2: claims with confidence (bootstrap intervals), reproducible bytes (gate in run records)
    run_records=("gate.json", "reports/model_gate.md"),
)
