"""Save and load an image tokenizer as a plain directory: ``config.json`` + ``model.safetensors``.

``config.json`` holds the :class:`~fourm_kfp.tokenizers.vqvae.VQVAEConfig` (normalisation statistics
included) under ``"config"`` next to a ``"format"`` tag; ``model.safetensors`` holds every parameter and
persistent buffer (codebook and its EMA statistics included). Nothing is pickled, so loading needs only
``json`` and ``safetensors`` — never ``torch.load``. The stage moves these directories to and from object
storage.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from safetensors.torch import load_file, save_file

from fourm_kfp.tokenizers.vqvae import VQVAE, VQVAEConfig

FORMAT = "fourm-kfp-vqvae/1"
CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"


def save_image_tokenizer(model: VQVAE, directory: str | os.PathLike) -> Path:
    """Write ``model`` (unwrapped from DDP) to ``directory`` (created if needed); returns the directory."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tensors = {name: t.detach().cpu().contiguous() for name, t in model.state_dict().items()}
    # One metadata entry only: safetensors writes the metadata map in hash-map order, which differs from process
    # to process, so two entries would make the same weights different bytes (the modality is in config.json).
    save_file(tensors, str(directory / WEIGHTS_FILE), metadata={"format": FORMAT})
    document = {"format": FORMAT, "config": model.config.to_dict()}
    (directory / CONFIG_FILE).write_text(json.dumps(document, indent=2, sort_keys=True) + "\n")
    return directory


def load_image_tokenizer(directory: str | os.PathLike, device: str = "cpu") -> VQVAE:
    """The tokenizer saved in ``directory``, in eval mode on ``device``."""
    directory = Path(directory)
    document = json.loads((directory / CONFIG_FILE).read_text())
    if document.get("format") != FORMAT:
        raise ValueError(f"{directory / CONFIG_FILE}: format {document.get('format')!r}, expected {FORMAT!r}")
    model = VQVAE(VQVAEConfig.from_dict(document["config"]))
    model.load_state_dict(load_file(str(directory / WEIGHTS_FILE)), strict=True)
    return model.to(device).eval()
