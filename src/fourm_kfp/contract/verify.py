"""Check a committed stage output: recompute it into a scratch store and compare the two, file by file.

A content address promises that whoever finds ``<stage>/<address>/`` committed may use it as the output of that
config and those inputs. :func:`verify_stage` checks the promise for a store someone inherited:

1. every committed payload file is read back and hashed: bytes that no longer match the manifest are ``corrupt``;
2. the stage runs again, from the same committed upstream outputs, into ``<scratch>/<stage>/<address>`` (lineage
   off: nothing is registered or logged), and each payload file is compared with the committed one: ``differs``,
   ``missing`` (committed but not recomputed) or ``extra`` (recomputed but not committed).

Run records (``StageSpec.run_records``) and the manifest itself are not payload and are not compared. When the
committed manifest says ``"deterministic": false`` (say, trained on CUDA), differences are expected and reported
as such.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field
from typing import Any

from fourm_kfp.config.fourm_config import FourMConfig
from fourm_kfp.contract.manifest import payload_differences, payload_files, require_manifest, stored_sha256
from fourm_kfp.contract.runner import open_inputs, output_store, run_stage
from fourm_kfp.contract.spec import StageSpec
from fourm_kfp.storage import Store

log = logging.getLogger(__name__)


@dataclass
class VerifyResult:
    """What :func:`verify_stage` found; ``matches`` is the verdict."""

    stage: str
    committed_uri: str
    recomputed_uri: str
    files: int  # payload files committed
    differences: list[tuple[str, str]] = field(default_factory=list)  # (key, corrupt|differs|missing|extra)
    inputs_changed: list[str] = field(default_factory=list)  # upstream outputs recommitted since
    deterministic: bool = True  # what the committed manifest claims
    nondeterminism: list[str] = field(default_factory=list)
    payload_digest: str = ""
    recomputed_payload_digest: str = ""

    @property
    def matches(self) -> bool:
        return not self.differences

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "matches": self.matches}


def corrupt_files(store: Store, manifest: dict[str, Any]) -> list[str]:
    """Payload files whose bytes in ``store`` are missing or no longer hash to the manifest's SHA-256."""
    return [key for key, sha in sorted(payload_files(manifest).items())
            if not store.exists(key) or stored_sha256(store, key)[0] != sha]


def verify_stage(spec: StageSpec, config: FourMConfig, store_root: Store, scratch_root: Store) -> VerifyResult:
    """Verify ``spec``'s committed output under ``store_root`` (see the module docstring); the recomputed output
    is left at ``scratch_root`` for the caller to inspect or delete."""
    committed = output_store(spec, config, store_root)
    manifest, _ = require_manifest(committed, f"verify {spec.name}")
    inputs = open_inputs(spec, config, store_root)
    recorded = {i["name"]: i["manifest_digest"] for i in manifest.get("inputs", [])}
    changed = sorted(name for name, item in inputs.items() if recorded.get(name) not in (None, item.digest))
    if changed:
        log.warning("verify %s: the committed upstream outputs %s are not the ones it was made from", spec.name,
                    changed)
    log.info("verify %s: checking %s, recomputing into %s", spec.name, committed.uri, scratch_root.uri)
    differences = [(key, "corrupt") for key in corrupt_files(committed, manifest)]
    outcome = run_stage(spec, config, scratch_root, force=True, input_uris={n: i.uri for n, i in inputs.items()},
                        tracking_uri=None)
    recomputed, _ = require_manifest(output_store(spec, config, scratch_root), f"recomputed {spec.name}")
    corrupt = {key for key, _ in differences}
    differences += [d for d in payload_differences(manifest, recomputed) if d[0] not in corrupt]
    return VerifyResult(spec.name, committed.uri, outcome.output_uri, len(payload_files(manifest)),
                        sorted(differences), changed, bool(manifest.get("deterministic", True)),
                        list(manifest.get("nondeterminism", [])), manifest.get("payload_digest", ""),
                        recomputed.get("payload_digest", ""))
