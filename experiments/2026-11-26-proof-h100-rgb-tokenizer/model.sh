#!/usr/bin/env bash
# The second device call: go.sh's model again (same stages, settings and seed as its 7500-step pretrain, without
# the 300-step measurement, evaluate or probe), its weights sent back in 15 MB parts so that sampling settings can be
# compared on the CPU afterwards (the device returns at most 8 files of 16 MiB).
set -eo pipefail
: "${OUT:?set OUT to the folder for what this writes (the device sets it)}"
source bench/device_env.sh
source experiments/2026-11-26-proof-h100-rgb-tokenizer/overrides.sh
run=(--set train.steps=7500 --set train.snapshot_every=1200 --set train.val_every=1200 --set train.checkpoint_every=1200)
for name in prepare-data train-tokenizers pretokenize pretrain; do
  python3 -m fourm_kfp.cli stage "$name" --preset proof --root runs/gpu-proof "${SETS[@]}" "${run[@]}" \
    --json "/tmp/$name.json" > /dev/null 2>> "$OUT/model.log"
  cat "/tmp/$name.json" >> "$OUT/stages.json"
  echo "$name done at $SECONDS s"
done
model=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["output_uri"])' /tmp/pretrain.json)
cp "$model/_MANIFEST.json" "$OUT/"
cp "$model/model/model.json" "$OUT/"
split -b 15000000 -d "$model/model/model.safetensors" "$OUT/model.safetensors.part"
ls -la "$OUT"
