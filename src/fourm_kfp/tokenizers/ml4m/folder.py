"""An ml-4m tokenizer folder: ``config.json`` (the model's constructor arguments, as ``PyTorchModelHubMixin``'s
``save_pretrained`` writes them) beside ``model.safetensors`` (its state dict), local or ``s3://`` (through
:mod:`fourm_kfp.storage`); Hugging Face's ``EPFL-VILAB/4M_tokenizers_*`` folders, downloaded beforehand, are such
folders. Nothing here fetches from a hub.

:func:`read_folder` gives the config, the tensors and a digest of the two files (sha256 of each, and one over
both), so a run can record which tokenizer it used. :func:`load_into` fills a module from the tensors as leniently
as ml-4m loads its folders (non-strict): tensors the architecture does not use are reported in a warning naming
them and ignored; a missing tensor, or one of the wrong shape, fails naming the folder and the key.
"""

from __future__ import annotations

import hashlib
import json
import logging
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import torch
from safetensors import SafetensorError, safe_open

from fourm_kfp.errors import UserError
from fourm_kfp.storage import open_store

CONFIG, WEIGHTS = "config.json", "model.safetensors"
log = logging.getLogger(__name__)


class TokenizerFolderError(UserError, ValueError):
    """A tokenizer folder that cannot be read or does not fit its config; the message names the folder (and the
    key)."""


@dataclass
class TokenizerFolder:
    uri: str
    config: dict[str, Any]
    tensors: dict[str, torch.Tensor]
    files: dict[str, str] = field(default_factory=dict)  # file name -> sha256

    @property
    def digest(self) -> str:
        """sha256 over the files' names and digests (in name order): one id for the folder's content."""
        text = "".join(f"{name}:{sha}\n" for name, sha in sorted(self.files.items()))
        return hashlib.sha256(text.encode()).hexdigest()

    def shapes(self) -> dict[str, list[int]]:
        return {key: list(t.shape) for key, t in sorted(self.tensors.items())}


def read_folder(source: str | Path) -> TokenizerFolder:
    """``config.json`` and ``model.safetensors`` of the folder at ``source`` (a path or ``s3://`` URI)."""
    uri = str(source).rstrip("/")
    store = open_store(uri)
    for name in (CONFIG, WEIGHTS):
        if not store.exists(name):
            raise TokenizerFolderError(f"{uri}: no {name} (an ml-4m tokenizer folder holds {CONFIG} and {WEIGHTS})")
    raw_config = store.get_bytes(CONFIG)
    try:
        config = json.loads(raw_config)
    except json.JSONDecodeError as exc:
        raise TokenizerFolderError(f"{uri}/{CONFIG}: not JSON ({exc})") from None
    if not isinstance(config, dict):
        raise TokenizerFolderError(f"{uri}/{CONFIG}: not a JSON object")
    if isinstance(config.get("config"), dict):  # a hub mixin that kept the constructor's `config` argument
        config = {**config["config"], **{k: v for k, v in config.items() if k != "config"}}
    files = {CONFIG: hashlib.sha256(raw_config).hexdigest()}
    with tempfile.TemporaryDirectory(prefix="fourm-ml4m-tok-") as tmp:
        local = Path(tmp) / WEIGHTS
        store.get_file(WEIGHTS, local)
        files[WEIGHTS] = _sha256_file(local)
        try:
            with safe_open(str(local), framework="pt") as f:
                tensors = {key: f.get_tensor(key) for key in f.keys()}
        except (SafetensorError, OSError) as exc:
            raise TokenizerFolderError(f"{uri}/{WEIGHTS}: not a safetensors file ({exc})") from None
    return TokenizerFolder(uri, config, tensors, files)


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _aliases(state: dict[str, torch.Tensor]) -> dict[str, list[str]]:
    """For each key, the other keys of ``state`` that are the same tensor (diffusers' ``Downsample2D`` registers its
    convolution as ``conv`` and ``Conv2d_0``; a safetensors save stores such a tensor once, under one name)."""
    by_tensor: dict[tuple[int, int, tuple[int, ...]], list[str]] = {}
    for key, tensor in state.items():
        if tensor.device.type == "meta":
            continue
        by_tensor.setdefault((tensor.data_ptr(), tensor.dtype.itemsize, tuple(tensor.shape)), []).append(key)
    return {key: [other for other in group if other != key] for group in by_tensor.values() for key in group}


def load_into(module: torch.nn.Module, folder: TokenizerFolder, ignore: Iterable[str] = ()) -> list[str]:
    """Copy ``folder``'s tensors into ``module``'s state, as leniently as ml-4m's ``from_pretrained`` (huggingface_hub
    with ``strict=False``) but never silently: a tensor the folder holds and the module does not use is reported (one
    warning naming the folder and the keys) and ignored, except those starting with a prefix in ``ignore`` (an
    encoder-only load skips the decoder's), which are skipped without a word; a tensor the module needs that the
    folder lacks (and holds under no alias of the same tensor), or one of another shape, fails naming the folder and
    the keys. Returns the keys ignored."""
    ignore = tuple(ignore)
    state = module.state_dict()
    aliases = _aliases(state)
    problems = []
    for key, target in state.items():
        if key not in folder.tensors:
            if not any(other in folder.tensors for other in aliases.get(key, ())):
                problems.append(f"missing key {key!r} (shape {list(target.shape)})")
        elif tuple(folder.tensors[key].shape) != tuple(target.shape):
            problems.append(f"key {key!r} has shape {list(folder.tensors[key].shape)}, the config makes "
                            f"{list(target.shape)}")
    if problems:
        shown = "; ".join(problems[:8]) + (f"; and {len(problems) - 8} more" if len(problems) > 8 else "")
        raise TokenizerFolderError(f"{folder.uri}: {shown}")
    unused = sorted(key for key in set(folder.tensors) - set(state) if not key.startswith(ignore))
    if unused:
        shown = ", ".join(repr(key) for key in unused[:8]) + (f" and {len(unused) - 8} more" if len(unused) > 8 else "")
        log.warning("%s: %d tensor(s) the model its config builds does not use, ignored (as ml-4m's non-strict load "
                    "ignores them): %s", folder.uri, len(unused), shown)
    with torch.no_grad():
        for key, target in state.items():
            source = key if key in folder.tensors else next(o for o in aliases[key] if o in folder.tensors)
            target.copy_(folder.tensors[source].to(target.dtype))
    return unused
