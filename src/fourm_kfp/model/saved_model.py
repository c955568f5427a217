"""The trained model as a self-describing artifact: ``model/model.safetensors`` + ``model/model.json``.

Snapshots taken during training (``train.snapshot_every``) are weights alone, ``snapshots/step-NNNNNNNN.safetensors``
beside the model: the same architecture and card, so :func:`load_model` reads one by its step (the evaluate stage
scores them for its scores-against-steps figure).

``model.json`` holds the model's arguments (sizes and every modality's spec), the modality table rows it was
trained on, the URIs of the tokenizers and of the pretokenized data it needs, the text tokenizer's special ids and
text conventions, and the training step. :func:`load_model` rebuilds the model from the output URI alone (local or S3), so the
evaluate stage and users need nothing else. No pickles: safetensors and JSON only.
"""

from __future__ import annotations

import dataclasses
import json
import re
import tempfile
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from fourm_kfp.batch import ModalitySpec
from fourm_kfp.data.modalities import get_modality
from fourm_kfp.storage import Store, open_store, output_ref, resolve_uri

FORMAT = "fourm-kfp-model/1"
WEIGHTS = "model/model.safetensors"
#: The model card of a pretrain output: its format, modalities, step and where its tokenizers and data are.
MODEL_CARD = "model/model.json"
SNAPSHOTS = "snapshots"
_SNAPSHOT = re.compile(r"^step-(\d{8})\.safetensors$")


def snapshot_key(step: int) -> str:
    return f"{SNAPSHOTS}/step-{step:08d}.safetensors"


def weights_key(snapshot: int | None = None) -> str:
    """Where the final weights (``None``) or the snapshot at step ``snapshot`` are in a pretrain output."""
    return WEIGHTS if snapshot is None else snapshot_key(snapshot)


def snapshot_steps(output: Store) -> list[int]:
    """The steps of the weight snapshots in a pretrain output, in order."""
    return sorted(int(m.group(1)) for key in output.child(SNAPSHOTS).list() if (m := _SNAPSHOT.match(key)))


def args_to_dict(args: Any) -> dict[str, Any]:
    return json.loads(json.dumps(dataclasses.asdict(args)))


def args_from_dict(data: dict[str, Any]):
    from fourm_kfp.model.fourm import FourMArgs

    specs = tuple(ModalitySpec(**{**m, "grid": tuple(m["grid"])}) for m in data["modalities"])
    return FourMArgs(**{**data, "modalities": specs})


def export_model(state: dict[str, torch.Tensor], args: Any, output: Store, *, tokenizers_uri: str,
                 pretokenized_uri: str, text_special_ids: dict[str, int], step: int,
                 text_conventions: str = "fourm-kfp") -> dict[str, Any]:
    """Write the model's weights and card under ``output``; returns the card. The card names the tokenizers and
    the pretokenized data by their place beside ``output`` (:func:`~fourm_kfp.storage.output_ref`), so its bytes do not
    depend on where the store is; :func:`load_model` gives them back as URIs."""
    card = {
        "format": FORMAT,
        "args": args_to_dict(args),
        "modalities": {m.name: {"kind": m.kind, "tokenizer": get_modality(m.name).tokenizer,
                                "metric": get_modality(m.name).metric} for m in args.modalities},
        "tokenizers_uri": output_ref(tokenizers_uri),
        "pretokenized_uri": output_ref(pretokenized_uri),
        "text_special_ids": text_special_ids,
        "text_conventions": text_conventions,  # how its texts were masked (tokenizers.text_tokenizer.text_sentinels)
        "step": step,
        "parameters": int(sum(t.numel() for t in state.values())),
    }
    put_weights(output, WEIGHTS, state)
    output.put_bytes(MODEL_CARD, json.dumps(card, indent=2, sort_keys=True).encode())
    return card


def put_weights(store: Store, key: str, state: dict[str, torch.Tensor]) -> None:
    """``state`` as a safetensors file at ``key`` (the same bytes for the same tensors)."""
    with tempfile.TemporaryDirectory(prefix="fourm-export-") as tmp:
        path = Path(tmp) / "weights.safetensors"
        save_file(state, str(path), metadata={"format": FORMAT})  # one entry: more would be written in hash order
        store.put_file(key, path)


def load_model(uri: str | Store, device: str | torch.device = "cpu",
               snapshot: int | None = None) -> tuple[nn.Module, dict[str, Any]]:
    """``(model in eval mode on device, card)`` from a pretrain output URI; the card's ``tokenizers_uri`` and
    ``pretokenized_uri`` resolved to URIs. ``snapshot``: the weights of the snapshot at that step instead of the
    final ones (the card's ``step`` says which)."""
    from fourm_kfp.contract.manifest import require_manifest
    from fourm_kfp.model.fourm import FourM

    store = open_store(uri) if isinstance(uri, str) else uri
    require_manifest(store, "model")
    card = json.loads(store.get_bytes(MODEL_CARD))
    if card.get("format") != FORMAT:
        raise ValueError(f"{store.uri_of(MODEL_CARD)}: format {card.get('format')!r}, expected {FORMAT!r}")
    for key in ("tokenizers_uri", "pretokenized_uri"):
        card[key] = resolve_uri(store.uri, card[key])
    model = FourM(args_from_dict(card["args"]))
    if snapshot is not None:
        if not store.exists(snapshot_key(snapshot)):
            raise ValueError(f"{store.uri}: no weight snapshot at step {snapshot}; it has "
                             f"{snapshot_steps(store) or 'none'} (train.snapshot_every)")
        card["step"] = snapshot
    model.load_state_dict(read_weights(store, weights_key(snapshot)), strict=True)
    return model.to(device).eval(), card


def read_weights(store: Store, key: str) -> dict[str, torch.Tensor]:
    """The tensors of the safetensors file at ``key`` (on the CPU)."""
    with tempfile.TemporaryDirectory(prefix="fourm-model-") as tmp:
        store.get_file(key, Path(tmp) / "weights.safetensors")
        return load_file(str(Path(tmp) / "weights.safetensors"))
