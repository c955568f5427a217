"""Content addresses of stage outputs: ``<store>/<stage>/<address>``, known before anything runs.

A stage's address hashes its name and code version, the *versioned* fields of the config keys it declares, the
fingerprint of any external source it reads, and the **addresses** of its enabled upstream stages (not their
manifests, which hold timings and run ids; a stage that is off is left out, as if the pipeline had no such stage).
So every address follows from the config alone, is the same on every machine and in every fresh store, and changing
a versioned field moves that stage and every stage below it, while unversioned fields (worker counts, logging) move
nothing. Data digests (each file's sha256, the manifest digest) live in the manifest and in MLflow, where lineage
needs them.
"""

from __future__ import annotations

import hashlib
import json
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from fourm_kfp.config.fourm_config import FourMConfig
from fourm_kfp.config.schema import to_dict, versioned_dict

if TYPE_CHECKING:
    from fourm_kfp.contract.spec import StageSpec

HASH_LENGTH = 16


def canonical_json(value: Any) -> bytes:
    """Stable JSON bytes (sorted keys, no whitespace variation) for hashing."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str).encode("utf-8")


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def lookup(config: FourMConfig, dotted: str) -> Any:
    """The config value at a dotted key (``"data.image_size"``)."""
    node: Any = config
    for part in dotted.split("."):
        node = getattr(node, part)
    return node


def config_view(config: FourMConfig, keys: Sequence[str], versioned_only: bool) -> dict[str, Any]:
    """``{dotted key: value}`` for the config sections/fields a stage declares."""
    convert = versioned_dict if versioned_only else to_dict
    return {key: convert(lookup(config, key)) for key in keys}


def address_of(stage: str, code_version: int, config: FourMConfig, config_keys: Sequence[str],
               upstream: Mapping[str, str], source: str | None = None,
               narrowed: Mapping[str, Any] | None = None) -> str:
    """The address (first ``HASH_LENGTH`` hex digits of a SHA-256) of one stage's output; ``narrowed`` replaces
    the values of some of the declared keys (``StageSpec.narrow_config``)."""
    identity = {
        "stage": stage,
        "code_version": code_version,
        "config": {**config_view(config, config_keys, versioned_only=True), **(narrowed or {})},
        "upstream": dict(sorted(upstream.items())),
        "source": source,
    }
    return sha256_hex(canonical_json(identity))[:HASH_LENGTH]


def address_in(output_uri: str) -> str:
    """The content address a stage output's URI ends with (``<store>/<stage>/<address>``)."""
    return output_uri.rstrip("/").rsplit("/", 1)[-1]


def stage_address(spec: "StageSpec", config: FourMConfig, _memo: dict[str, str] | None = None) -> str:
    """The address of ``spec``'s output under ``config``, derived through its upstream specs' addresses."""
    memo = {} if _memo is None else _memo
    if spec.name not in memo:
        upstream = {up.name: stage_address(up, config, memo) for up in spec.active_upstream(config)}
        source = spec.source_fingerprint(config) if spec.source_fingerprint else None
        narrowed = spec.narrow_config(config) if spec.narrow_config else None
        memo[spec.name] = address_of(spec.name, spec.code_version, config, spec.config_keys, upstream, source,
                                     narrowed)
    return memo[spec.name]
