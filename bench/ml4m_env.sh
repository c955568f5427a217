#!/usr/bin/env bash
# The reference environment for apple/ml-4m's tokenizer code (issue 56): /work/main/.venv-ml4m (ignored by git).
#
#   bash bench/ml4m_env.sh            # creates or completes .venv-ml4m beside this script's repository
#   FOURM_REFERENCE=/tmp/ml-4m .venv-ml4m/bin/python bench/ml4m_tokenizer_reference.py
#
# Why a second environment: ml-4m pins versions our product does not use (diffusers 0.20.0, huggingface_hub at most
# 0.24.0, numpy below 2), and `fourm.vq.vqvae` imports diffusers at its top. Nothing of ml-4m is installed: its source
# stays a checkout named by FOURM_REFERENCE, loaded by bench/ml4m_reference.py's package registration.
#
# What it installs, and why each:
#   torch==2.13.0            the same torch as .venv (pip takes the local CPU wheel); ml-4m asks torch>=2.1.0
#   torchvision==0.28.0      torch 2.13's own torchvision (ml-4m: >=0.16.0); fourm.utils.misc and
#                            fourm.data.modality_transforms import torchvision.transforms(.functional). PyPI's
#                            wheel is CUDA-built: its C++ ops cannot load beside the CPU torch, and its
#                            `torchvision._meta_registrations` then fails at import. Whoever imports it here puts an
#                            empty module in its place first (bench/ml4m_tokenizer_reference.py's load_vq does;
#                            only the detection ops' fake-tensor registrations are lost; transforms are pure Python)
#   diffusers==0.20.0        ml-4m's pin; fourm/vq/vqvae.py, its schedulers and its UNet import it at module level
#   huggingface_hub==0.24.0  the top of ml-4m's range (>=0.20.0,<=0.24.0): PyTorchModelHubMixin (save_pretrained,
#                            from_pretrained, config.json); diffusers 0.20 also needs its `cached_download`
#   einops>=0.7.0            ml-4m's pin; every fourm/vq module rearranges with it
#   numpy>=1.26.4,<2.0.0     ml-4m's pin
#   safetensors              what save_pretrained writes (model.safetensors)
#   Pillow                   modality_transforms (PIL images), ml-4m: >=9.3.0
#   opencv-python-headless   modality_transforms imports cv2 at its top (ml-4m: >=4.6.0.66)
#   albumentations==1.4.0    ml-4m's pin; modality_transforms imports it at its top
#   PyYAML                   albumentations needs it (also an ml-4m pin, >=6.0)
#   tokenizers>=0.15.2       ml-4m's pin; fourm/data/unified_datasets.py and the masking code (UnifiedMasking, which
#                            bench/ml4m_fm_reference.py runs for its batches) import it
# Nothing else of ml-4m's list (boto3, webdataset, wandb, datasets, torchmetrics, ...) is needed by fourm/vq or by the
# transforms' classes the references use; bench/ml4m_tokenizer_reference.py says what it stands in for.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${ML4M_VENV:-$ROOT/.venv-ml4m}"
PYTHON="${PYTHON:-python3.11}"
command -v "$PYTHON" >/dev/null || PYTHON=python3

if [ ! -x "$VENV/bin/python" ]; then
    "$PYTHON" -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip install --disable-pip-version-check)

"${PIP[@]}" "torch==2.13.0"
"${PIP[@]}" "torchvision==0.28.0" "torch==2.13.0"
"${PIP[@]}" "torch==2.13.0" \
    "diffusers==0.20.0" \
    "huggingface_hub==0.24.0" \
    "einops>=0.7.0" \
    "numpy>=1.26.4,<2.0.0" \
    "safetensors" \
    "Pillow>=9.3.0" \
    "PyYAML>=6.0" \
    "tokenizers>=0.15.2"
"${PIP[@]}" "torch==2.13.0" "numpy>=1.26.4,<2.0.0" \
    "opencv-python-headless>=4.6.0.66" \
    "albumentations==1.4.0"

"$VENV/bin/python" - <<'EOF'
import sys, types
sys.modules["torchvision._meta_registrations"] = types.ModuleType("torchvision._meta_registrations")
import diffusers, huggingface_hub, einops, numpy, safetensors, torch, torchvision
print("ml4m reference env:", {m.__name__: m.__version__ for m in
      (torch, torchvision, diffusers, huggingface_hub, einops, numpy, safetensors)})
EOF
