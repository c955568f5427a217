#!/usr/bin/env bash
# Prepared for the next session lent a GPU (one call, ~7 minutes): go.sh's run again, at peak learning rate LR
# (default 4e-3: the rerun at 6e-3 went non-finite at step ~900, rerun-diverged.log), then the probe with the image
# drawn under other sampling settings (SWEEP; the evaluation's: 16 ROAR steps, temperature 1, guidance 3), each
# scored from the caption, from another scene's caption, from the true semseg map and through the semseg map drawn
# from the caption. Carry .whl/ and runs/gpu-proof/train-tokenizers/9dae0de0ba203d9f (overrides.sh's TOKENIZER,
# trained on the CPU: 568 s on 2 cores beside another job).
#   RESERVE=150 bash experiments/2026-11-26-proof-h100-rgb-tokenizer/next.sh 570 > $OUT/call.log 2>&1
set -eo pipefail
: "${OUT:?set OUT to the folder for what this writes (the device sets it)}"
nvidia-smi --query-gpu=name --format=csv,noheader
source experiments/2026-11-26-proof-h100-rgb-tokenizer/overrides.sh
export SWEEP="${SWEEP:-temperature=0.7 temperature=0.5 temperature=0.3 temperature=0.7,guidance=1 guidance=1 top_k=8 temperature=0.7,steps=32 temperature=0.5,guidance=5}"
PRESET=proof ROOT=runs/gpu-proof bash bench/gpu_session.sh budget "${1:-570}" "${SETS[@]}" \
  --set "train.optimizer.base_lr=${LR:-4.0e-3}"
