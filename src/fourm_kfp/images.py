"""The container images the components run in (built from ``images/``; see images/README.md).

The names contain "python" on purpose: ``kfp.local``'s SubprocessRunner warns about images that don't.

Both images carry one tag, :data:`IMAGE_TAG`: the package version, or what ``$FOURM_IMAGE_TAG`` says when the
pipeline is compiled (``fourm-kfp compile --image-tag``, ``fourm-kfp submit --image-tag``: e.g. the commit the
image workflow built them from). The pipeline sets the same variable on its job-launching steps, so the
PyTorchJob / TrainJob a step renders runs the image the step itself runs, not the version's.
"""

import os
import re

from fourm_kfp import __version__

REGISTRY = "ghcr.io/fourm-kfp"
IMAGE_TAG_ENV = "FOURM_IMAGE_TAG"
#: A Docker tag: what ``docker tag`` and the registries accept.
IMAGE_TAG_PATTERN = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
IMAGE_TAG = os.environ.get(IMAGE_TAG_ENV) or __version__
if not IMAGE_TAG_PATTERN.fullmatch(IMAGE_TAG):
    raise ValueError(f"${IMAGE_TAG_ENV}={IMAGE_TAG!r} is not a Docker image tag ([A-Za-z0-9_][A-Za-z0-9_.-]*, "
                     "at most 128 characters)")
#: The steps that need no accelerator: prepare-data (its workers and its collect step), the collect steps of label and
#: pretokenize, the fan-out and pod-placement steps, and the lineage bookkeeping steps.
CPU_IMAGE = f"{REGISTRY}/fourm-kfp-python:{IMAGE_TAG}"
#: The steps that may run on an accelerator (torch with CUDA): the label and pretokenize workers, train-tokenizers,
#: pretrain and evaluate, and the PyTorchJob / TrainJob / TorchX jobs a step launches.
GPU_IMAGE = f"{REGISTRY}/fourm-kfp-python-gpu:{IMAGE_TAG}"
