"""Helpers shared by the pretrain tests (``tests/train``, ``tests/cluster``): committed smoke upstream outputs and
a pretrain output's loss trajectory."""

from __future__ import annotations

import json

from fourm_kfp.config.loader import load_config
from fourm_kfp.contract import run_stage
from fourm_kfp.stages import get_stage
from fourm_kfp.storage import Store, open_store


def smoke_upstream(store: Store) -> dict[str, str]:
    """Commit the smoke prepare-data, train-tokenizers and pretokenize outputs under ``store``; returns pretrain's
    input URIs (``{"pretokenize": uri, "train-tokenizers": uri}``)."""
    config = load_config("smoke")
    outcomes = {name: run_stage(get_stage(name), config, store).output_uri
                for name in ("prepare-data", "train-tokenizers", "pretokenize")}
    return {name: outcomes[name] for name in ("pretokenize", "train-tokenizers")}


def input_args(input_uris: dict[str, str]) -> list[str]:
    """``--input name=uri`` arguments of ``fourm-kfp stage``."""
    return [arg for name, uri in sorted(input_uris.items()) for arg in ("--input", f"{name}={uri}")]


def losses(output_uri: str) -> dict[int, float]:
    """``{step: train loss}`` from a pretrain output's ``metrics.jsonl``."""
    lines = open_store(output_uri).get_text("metrics.jsonl").splitlines()
    return {int(r["step"]): r["loss"] for r in map(json.loads, lines) if "loss" in r}
