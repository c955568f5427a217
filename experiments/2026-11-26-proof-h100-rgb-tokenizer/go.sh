#!/usr/bin/env bash
# One device call, from the repository root with .whl/ and runs/gpu-proof/train-tokenizers/9dae0de0ba203d9f (the
# train-tokenizers output of overrides.sh's TOKENIZER, trained on the CPU) carried: gpu_session.sh budget with overrides.sh.
set -eo pipefail
: "${OUT:?set OUT to the folder for what this writes (the device sets it)}"
nvidia-smi --query-gpu=name --format=csv,noheader
source experiments/2026-11-26-proof-h100-rgb-tokenizer/overrides.sh
PRESET=proof ROOT=runs/gpu-proof bash bench/gpu_session.sh budget "${1:-480}" "${SETS[@]}"
