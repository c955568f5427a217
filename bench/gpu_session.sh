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
set -euo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH="$PWD/src:$PWD/bench:/tmp/site" MLFLOW_TRACKING_URI=none PYTHONUNBUFFERED=1
out="${OUT:-bench/results}"
mkdir -p "$out"
gpu=$(python3 -c 'import torch; print(torch.cuda.get_device_name().split()[-1].lower() if torch.cuda.is_available() else "cpu")')
day=$(date +%F)
preset="${PRESET:-gpu-demo}"  # PRESET=smoke rehearses the gpu-demo command on a CPU
case "${1:?usage: gpu_session.sh benches|mfu|gpu-demo}" in
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
    for stage in prepare-data train-tokenizers pretokenize pretrain evaluate; do
      start=$(date +%s.%N)
      python3 -m fourm_kfp.cli stage "$stage" --preset "$preset" --root "$root" > "$root-$stage.json"
      python3 - "$stage" "$start" "$root-$stage.json" >> "$out/$preset-$gpu-$day.jsonl" <<'PY'
import json, sys, time
stage, start, outcome = sys.argv[1], float(sys.argv[2]), open(sys.argv[3]).read()
outcome = json.loads(outcome[outcome.index("{"):])
print(json.dumps({"stage": stage, "status": outcome["status"], "wall_s": round(time.time() - start, 1),
                  "stage_s": outcome["seconds"]}))
PY
    done
    evaluation=$(python3 -c 'import json, sys; t = open(sys.argv[1]).read(); print(json.loads(t[t.index("{"):])["output_uri"])' "$root-evaluate.json")
    cp "$evaluation/evaluation.json" "$out/$preset-evaluation-$gpu-$day.json"
    cp "$evaluation/reports/evaluation_report.md" "$out/$preset-evaluation_report-$gpu-$day.md"
    if [ -f "$evaluation/reports/scores_vs_steps.png" ]; then
      cp "$evaluation/reports/scores_vs_steps.png" "$out/$preset-scores_vs_steps-$gpu-$day.png"
    fi
    ;;
  *) echo "unknown command $1: benches, mfu or gpu-demo" >&2; exit 2 ;;
esac
