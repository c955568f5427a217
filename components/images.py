"""The container images the components run in (built from ``images/``; see images/README.md).

The names contain "python" on purpose: ``kfp.local``'s SubprocessRunner warns about images that don't.
"""

from fourm_kfp import __version__

REGISTRY = "ghcr.io/fourm-kfp"
#: CPU stages: prepare-data, pretokenize, evaluate, and the lineage bookkeeping steps.
CPU_IMAGE = f"{REGISTRY}/fourm-kfp-python:{__version__}"
#: GPU stages: train-tokenizers, pretrain.
GPU_IMAGE = f"{REGISTRY}/fourm-kfp-python-gpu:{__version__}"
