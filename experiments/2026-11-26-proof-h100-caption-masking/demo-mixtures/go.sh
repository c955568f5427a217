#!/usr/bin/env bash
set -eo pipefail
: "${OUT:?set OUT to the folder for what this writes (the device sets it)}"
nvidia-smi --query-gpu=name --format=csv,noheader
source bench/device_env.sh
root=runs/gpu-demo-carry
source experiments/2026-11-26-proof-h100-caption-masking/demo-mixtures/sets.sh
for s in prepare-data train-tokenizers pretokenize; do
  python3 -m fourm_kfp.cli stage "$s" --preset demo --root "$root" --json "$OUT/$s.json" > "$OUT/$s.log" 2>&1; echo "$s done $SECONDS s"
done
run() {
  tag=$1; shift
  python3 -m fourm_kfp.cli stage pretrain --preset demo --root "$root" --set train.loader_workers=-1 "$@" --json "$OUT/$tag-pretrain.json" > "$OUT/$tag-pretrain.log" 2>&1
  python3 -m fourm_kfp.cli stage evaluate --preset demo --root "$root" --set train.loader_workers=-1 "$@" --json "$OUT/$tag-evaluate.json" > "$OUT/$tag-evaluate.log" 2>&1
  echo "== $tag $SECONDS s"; grep -o "evaluate [a-z-]*: [a-z_0-9]* [0-9.]* .*interval[^)]*" "$OUT/$tag-evaluate.log" || true
}
run A
run B --set "$MIXB"
run C --set "$MIXC" --set train.fill_budgets=false
