# Sourced by the device scripts (bench/gpu_session.sh and the experiments' under experiments/), run from the
# repository root on the GPU device machine: installs the wheels its image lacks (`make device-wheels` here, carried
# as .whl/) and points Python at this checkout, with lineage off (the image has no kfp or MLflow).
# shellcheck shell=bash
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH="$PWD/src:$PWD/bench:/tmp/site" MLFLOW_TRACKING_URI=none PYTHONUNBUFFERED=1
