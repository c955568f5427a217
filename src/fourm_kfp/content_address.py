"""Content-addressed stage outputs: ``<store>/<stage>/<hash>``.

The hash covers the stage's name and code version, the *versioned* fields of the config sections the stage
declares it depends on, and the digests of its inputs' manifests. Same inputs and same config give the same
prefix, so a committed output is found and reused; changing a versioned field (or any upstream output) gives a
new prefix, while unversioned fields (worker counts, logging) leave it alone.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Mapping, Sequence

from fourm_kfp.config.fourm_config import FourMConfig
from fourm_kfp.config.schema import to_dict, versioned_dict

HASH_LENGTH = 16


def canonical_json(value: Any) -> bytes:
    """Stable JSON bytes (sorted keys, no whitespace variation) for hashing."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str).encode("utf-8")


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _lookup(config: FourMConfig, dotted: str) -> Any:
    node: Any = config
    for part in dotted.split("."):
        node = getattr(node, part)
    return node


def config_view(config: FourMConfig, keys: Sequence[str], versioned_only: bool) -> dict[str, Any]:
    """``{dotted key: value}`` for the config sections/fields a stage depends on."""
    convert = versioned_dict if versioned_only else to_dict
    return {key: convert(_lookup(config, key)) for key in keys}


def output_hash(stage: str, code_version: int, config: FourMConfig, config_keys: Sequence[str],
                input_digests: Mapping[str, str]) -> str:
    """The content address of a stage's output (first ``HASH_LENGTH`` hex digits of a SHA-256)."""
    identity = {
        "stage": stage,
        "code_version": code_version,
        "config": config_view(config, config_keys, versioned_only=True),
        "inputs": dict(sorted(input_digests.items())),
    }
    return sha256_hex(canonical_json(identity))[:HASH_LENGTH]
