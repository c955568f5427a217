#!/usr/bin/env bash
# The GPU measurements of the performance table, one device call per argument, for a session lent a GPU.
#
# The device machine's image has PyTorch and most of what the stages need, but not webdataset: prepare its wheels
# here once (`make device-wheels`), then run each command on the device with `.whl` carried. The stages run through
# `python3 -m fourm_kfp.cli stage` with lineage off (the image has no kfp or MLflow; the work is the same as in
# `fourm-kfp run`, whose kfp.local orchestration adds seconds). What comes back is under $OUT (bench/results/
# when run elsewhere).
#
#   bash bench/gpu_session.sh benches    # 4m-b step MFU and the loader ratio in one run; pretokenize vs its encoder
#   bash bench/gpu_session.sh mfu        # 4m-b step MFU at batch 128, 256, 512 (to the first out of memory; other
#                                        # sizes: BATCHES=256,512,1024), with where the best batch's step spends its
#                                        # time (the kernels to work on next)
#   bash bench/gpu_session.sh gpu-demo   # the gpu-demo preset's stages, each timed; resumable: a call that hits the
#                                        # device's 10-minute limit continues where it stopped when run again
#   bash bench/gpu_session.sh budget SECONDS [--set SECTION.KEY=VALUE ...]
#                                        # PRESET's recipe (default gpu-demo) with the overrides, trained for as many
#                                        # steps as fit SECONDS of this call after the data stages: a 300-step run
#                                        # measures the step first. Then evaluate and, where the model has captions
#                                        # and rgb, experiments/tools/caption_to_rgb_probe.py (SWEEP: its --sweep
#                                        # settings, space-separated). Stage outputs already under ROOT (default
#                                        # runs/PRESET) are reused, e.g. carried tokenizers
set -euo pipefail
source bench/device_env.sh
out="${OUT:-bench/results}"
mkdir -p "$out"
gpu=$(python3 -c 'import torch; print(torch.cuda.get_device_name().split()[-1].lower() if torch.cuda.is_available() else "cpu")')
day=$(date +%F)
preset="${PRESET:-gpu-demo}"  # PRESET=smoke rehearses the gpu-demo command on a CPU
stage() {  # stage NAME [ARGS...]: run it under $root, append {stage, status, wall_s, stage_s, output_uri, metrics}
  local name=$1 start
  shift
  start=$(date +%s.%N)
  python3 -m fourm_kfp.cli stage "$name" --preset "$preset" --root "$root" "$@" --json "$root-$name.json" > /dev/null
  python3 - "$name" "$start" "$root-$name.json" >> "$log" <<'PY'
import json, sys, time
name, start, outcome = sys.argv[1], float(sys.argv[2]), json.load(open(sys.argv[3]))
print(json.dumps({"stage": name, "status": outcome["status"], "wall_s": round(time.time() - start, 1),
                  "stage_s": outcome["seconds"], "output_uri": outcome["output_uri"],
                  "metrics": outcome.get("metrics", {})}))
PY
  tail -n 1 "$log"
}
output_uri() {  # output_uri NAME: where the last `stage NAME` committed
  python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["output_uri"])' "$root-$1.json"
}
copy_evaluation() {  # copy_evaluation PREFIX: the last evaluation's JSON, report and figures into $out
  local evaluation figure
  evaluation=$(output_uri evaluate)
  cp "$evaluation/evaluation.json" "$out/$1-evaluation-$gpu-$day.json"
  cp "$evaluation/reports/evaluation_report.md" "$out/$1-evaluation_report-$gpu-$day.md"
  for figure in scores_vs_steps grid_caption-to-rgb; do
    if [ -f "$evaluation/reports/$figure.png" ]; then cp "$evaluation/reports/$figure.png" "$out/$1-$figure-$gpu-$day.png"; fi
  done
}
case "${1:?usage: gpu_session.sh benches|mfu|gpu-demo|budget}" in
  benches)
    python3 bench/train_step.py --device cuda --shapes 4m-b --compile --output "$out/train_step-4m-b-compile-$gpu-$day.json"
    python3 bench/pretokenize.py --device cuda --samples 4096 --output "$out/pretokenize-$gpu-$day.json"
    ;;
  mfu)
    python3 bench/train_step.py --device cuda --shapes 4m-b --compile --batches "${BATCHES:-128,256,512}" --profile \
      --loader-workers -1 --output "$out/train_step-4m-b-mfu-$gpu-$day.json"
    ;;
  gpu-demo)
    root="runs/$preset"
    log="$out/$preset-$gpu-$day.jsonl"
    for name in prepare-data train-tokenizers pretokenize pretrain evaluate; do stage "$name"; done
    copy_evaluation "$preset"
    ;;
  budget)
    seconds="${2:?usage: gpu_session.sh budget SECONDS [--set SECTION.KEY=VALUE ...]}"
    shift 2
    deadline=$(( $(date +%s) + seconds ))
    root="${ROOT:-runs/$preset}"
    log="$out/$preset-budget-$gpu-$day.jsonl"
    for name in prepare-data train-tokenizers pretokenize; do stage "$name" "$@"; done
    stage pretrain "$@" --set train.steps=300 --set train.log_every=50 --set train.val_every=0 \
      --set train.snapshot_every=0 --set train.checkpoint_every=300
    # Steps that leave a fifth of the time left (at least RESERVE s, default 150) for evaluate and the probe; 10%
    # margin on the measured step, which excludes start-up (the first logged interval).
    read -r steps every < <(RESERVE="${RESERVE:-150}" python3 - "$preset" "$root-pretrain.json" "$deadline" "$@" <<'PY'
import json, os, sys, time
from fourm_kfp.config.loader import load_config
preset, outcome, deadline, rest = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4:]
train = load_config(preset, overrides=[v for k, v in zip(rest, rest[1:]) if k == "--set"]).train
step_s = train.global_batch_size * (train.input_budget + train.target_budget) / json.load(open(outcome))["metrics"]["tokens_per_s"]
left = deadline - time.time()
steps = max(500, int((left - max(float(os.environ["RESERVE"]), left / 5) - 30) / (1.1 * step_s)) // 500 * 500)
print(steps, max(100, steps // 6 // 100 * 100))
PY
)
    echo "pretrain: $steps steps, snapshots every $every" >&2
    run=(--set "train.steps=$steps" --set "train.snapshot_every=$every" --set "train.val_every=$every"
         --set "train.checkpoint_every=$every")
    stage pretrain "$@" "${run[@]}"
    stage evaluate "$@" "${run[@]}"
    copy_evaluation "$preset-budget"
    model=$(output_uri pretrain)
    cp "$model/reports/training_curves.png" "$out/$preset-budget-training_curves-$gpu-$day.png"
    if [ $(( deadline - $(date +%s) )) -gt 20 ] && grep -q caption "$model/model/model.json" 2>/dev/null; then
      sweep=()
      for spec in ${SWEEP:-}; do sweep+=(--sweep "$spec"); done
      timeout $(( deadline - $(date +%s) )) python3 experiments/tools/caption_to_rgb_probe.py --preset "$preset" --root "$root" "$@" \
        "${run[@]}" "${sweep[@]}" --output "$out/$preset-budget-caption_to_rgb_probe-$gpu-$day.json" > /dev/null || true
    fi
    ;;
  *) echo "unknown command $1: benches, mfu, gpu-demo or budget" >&2; exit 2 ;;
esac
