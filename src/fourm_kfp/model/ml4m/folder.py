"""ml-4m's model files: a folder of ``config.json`` + ``model.safetensors`` (what ``FM.save_pretrained`` writes and
``FM.from_pretrained`` reads), or one ``.safetensors`` file whose metadata holds the config
(``fourm.utils.load_safetensors``), local or ``s3://``: :func:`read_ml4m` and :func:`write_ml4m`.

A folder this pipeline writes also holds ``fourm-kfp.json`` (:data:`EXPORT_CARD`: what the model is, in our terms),
which ml-4m ignores.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import torch
import yaml
from safetensors import safe_open
from safetensors.torch import save_file

from fourm_kfp.model.ml4m.domains import Ml4mError
from fourm_kfp.storage import Store, file_store, open_store

CONFIG, WEIGHTS = "config.json", "model.safetensors"
#: What this pipeline adds to an ml-4m folder it exports: the exported model's card (not ml-4m's).
EXPORT_CARD = "fourm-kfp.json"
#: what an ml-4m ``FM`` config must name
REQUIRED = ("domains_in", "domains_out", "dim", "encoder_depth", "decoder_depth", "num_heads")


def write_ml4m(store: Store, state: dict[str, torch.Tensor], config: dict[str, Any],
               card: dict[str, Any] | None = None) -> None:
    """``config.json``, ``model.safetensors`` (keys sorted, the config also in its metadata, as JSON values, which
    ml-4m's YAML reads back) and, given a ``card``, ``fourm-kfp.json``, into ``store``."""
    metadata = {key: json.dumps(value) for key, value in config.items()}
    with tempfile.TemporaryDirectory(prefix="fourm-ml4m-") as tmp:
        path = Path(tmp) / WEIGHTS
        save_file(dict(sorted(state.items())), str(path), metadata=metadata)
        store.put_file(WEIGHTS, path)
    store.put_bytes(CONFIG, json.dumps(config, indent=2).encode())
    if card is not None:
        store.put_bytes(EXPORT_CARD, json.dumps(card, indent=2, sort_keys=True).encode())


def read_ml4m(source: str | Path) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """``(config, tensors)`` of an ml-4m folder (``config.json`` + ``model.safetensors``) or ``.safetensors``
    file (config in its metadata), local or ``s3://``."""
    uri = str(source)
    with tempfile.TemporaryDirectory(prefix="fourm-ml4m-") as tmp:
        local = Path(tmp) / WEIGHTS
        if uri.endswith(".safetensors"):
            store, name = file_store(uri)
            if not name or not store.exists(name):
                raise Ml4mError(f"{uri}: no such file")
            store.get_file(name, local)
            config = None
        else:
            store = open_store(uri)
            for key in (CONFIG, WEIGHTS):
                if not store.exists(key):
                    raise Ml4mError(f"{store.uri_of(key)}: missing (an ml-4m folder holds {CONFIG} and {WEIGHTS})")
            config = json.loads(store.get_bytes(CONFIG))
            store.get_file(WEIGHTS, local)
        with safe_open(str(local), framework="pt") as f:
            tensors = {k: f.get_tensor(k) for k in f.keys()}
            if config is None:
                metadata = f.metadata() or {}
                config = {k: _metadata_value(v) for k, v in metadata.items()}
    for key in REQUIRED:
        if key not in config:
            raise Ml4mError(f"{uri}: the config has no {key!r} (is this an ml-4m FM model?)")
    return config, tensors


def _metadata_value(text: str) -> Any:
    """A safetensors metadata value as ml-4m reads it (YAML, ``None`` as null)."""
    try:
        return yaml.safe_load(text.replace("None", "null"))
    except yaml.YAMLError:
        return text
