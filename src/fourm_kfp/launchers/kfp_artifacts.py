"""Each stage's committed output as a typed KFP artifact, so that the run's Artifacts tab and lineage graph list the
dataset, labels, tokenizers, pretokenized dataset, model and evaluation, each with where its bytes are.

A stage's step declares one output artifact of its kind (``dsl.Dataset``, ``dsl.Model`` or ``dsl.Artifact``: the
components say which) and fills it here: its **metadata** holds the output's store URI, content address, manifest
digest, the preset, the stage's status in this run and the store URIs it read (:func:`output_record`); the file at
its path holds the same record as JSON, so downloading the artifact from the UI says where the output lives. The
backend's launcher merges that metadata into the artifact it records in ML Metadata (custom properties, which the UI
shows: ``mergeRuntimeArtifacts`` and ``RecordArtifact``, ``backend/src/v2/component/launcher_v2.go`` and
``v2/metadata/client.go``, kubeflow/pipelines 2.15.0 to 2.17.0).

Why the artifact's own URI stays the one KFP assigns (under the pipeline root) rather than the store URI: the
launcher uploads every output artifact it recognises by its URI's scheme, and refuses an ``s3://`` URI outside the
pipeline root's bucket and prefix ("URI ... does not have expected bucket prefix": ``uploadOutputArtifacts``,
``bucketConfig.KeyFromURI``, ``v2/objectstore/config.go``, at 2.15.0, 2.16.0 and 2.17.0), which would fail the step
whenever the store is not the pipeline root. ``dsl.importer`` on the URI would keep it, but the 2.15 backend
copies an importer's metadata literally (its ``{{$.inputs.parameters[...]}}`` placeholders are never resolved:
``ImportSpecToMLMDArtifact``, ``v2/component/importer_launcher.go``), so the address and digest, known only at run
time, could not go with it.

The steps downstream still take the store URIs as parameters, not these artifacts: KFP's cache key holds each input
artifact's identity (``GenerateCacheKey``, ``v2/cacheutils/cache.go``), and a fan-out stage's collect step, never
cached, records a new artifact every run, so a consumer taking it would never again be a cache hit. Caching and
per-stage reruns stay keyed by the content-addressed URIs; the record's ``inputs`` names what each output was made
from.
"""

from __future__ import annotations

import json
from typing import Any

from fourm_kfp.contract import StageOutcome
from fourm_kfp.contract.addressing import address_in


def output_record(outcome: StageOutcome, preset: str, input_uris: dict[str, str] | None = None) -> dict[str, Any]:
    """What the artifact of ``outcome``'s output says: its stage and status in this run (``ran``, ``skipped``:
    reused), its store URI and content address (the URI's last part), its manifest digest, the preset, and the
    store URIs of the outputs it was made from, by stage."""
    return {"stage": outcome.name, "status": outcome.status, "store_uri": outcome.output_uri,
            "address": address_in(outcome.output_uri), "digest": outcome.manifest_digest,
            "preset": preset, "inputs": dict(sorted((input_uris or {}).items()))}


def off_record(stage: str, preset: str) -> dict[str, Any]:
    """The artifact of a stage that is off under this config (the label stage with no labelers): no output."""
    return {"stage": stage, "status": "off", "store_uri": "", "address": "", "digest": "", "preset": preset,
            "inputs": {}}


def fill_output_artifact(artifact, record: dict[str, Any]) -> None:
    """Put ``record`` in a KFP output artifact (``dsl.Output[...]``): as its metadata, which the backend records in
    ML Metadata, and as the JSON file at its path, which the backend uploads under the pipeline root."""
    artifact.metadata.update(record)
    with open(artifact.path, "w") as fh:
        json.dump(record, fh, indent=2, sort_keys=True)
        fh.write("\n")
