#!/usr/bin/env bash
set -eo pipefail
: "${OUT:?set OUT to the folder for what this writes (the device sets it)}"
nvidia-smi --query-gpu=name --format=csv,noheader
source bench/device_env.sh
root=runs/gpu-demo-carry
for s in prepare-data train-tokenizers pretokenize; do
  python3 -m fourm_kfp.cli stage "$s" --preset demo --root "$root" --json /tmp/"$s".json > /tmp/"$s".log 2>&1; echo "$s done $SECONDS s"
done
common=(--set train.global_batch_size=256 --set train.optimizer.base_lr=6.0e-3 --set train.optimizer.warmup_steps=100 --set train.steps=300 --set train.loader_workers=-1 --set train.profile_steps=12
        --set train.val_every=0 --set train.snapshot_every=0 --set train.log_every=50 --set train.checkpoint_every=300)
python3 -m fourm_kfp.cli stage pretrain --preset demo --root "$root" "${common[@]}" --json /tmp/pt.json > "$OUT"/pretrain.log 2>&1
echo "pretrain done $SECONDS s"; grep -o "step [0-9]*/300 .*tok/s" "$OUT"/pretrain.log | tail -3
out=$(python3 -c 'import json; print(json.load(open("/tmp/pt.json"))["output_uri"])')
python3 experiments/2026-11-26-pretrain-profile-h200/trace_threads.py "$out"/profile/trace.json | tee "$OUT"/trace_threads.txt
gzip -c "$out"/profile/trace.json > "$OUT"/trace.json.gz; ls -la "$OUT"
python3 bench/train_step.py --help > /dev/null && timeout 60 python3 bench/train_step.py --device cuda --shapes demo --batches 256 --loader-workers -1 --profile --output "$OUT"/train_step-demo.json 2>&1 | tail -40 || true
echo "all done $SECONDS s"
