# The H100 run's recipe (../2026-11-26-proof-h100-caption-masking/overrides.sh: the proof preset's mixture plus ml-4m's caption-bias,
# fill_budgets false, batch 256) with a better-trained rgb tokenizer: 4800 steps of 16 images from all 16000 train
# scenes (the preset: 1200 steps of 4 from 4000); every image tokenizer reads all 16000 (max_train_images 0).
# shellcheck shell=bash disable=SC2034
source experiments/2026-11-26-proof-h100-caption-masking/overrides.sh
TOKENIZER=(--set train_tokenizers.max_train_images=0 --set 'train_tokenizers.per_modality.rgb={steps: 4800, batch_size: 16}')
SETS+=("${TOKENIZER[@]}")
