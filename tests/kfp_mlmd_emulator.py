"""What the KFP backend records in ML Metadata when a step's container ends, which is what the UI reads: the run
graph's artifact nodes, the Artifacts tab and the lineage explorer list the MLMD artifacts of the run's context, with
their type, URI and custom properties, and the events that tie each to the execution that output it.

Each rule is read from kubeflow/pipelines' source, identical at the tags 2.15.0, 2.16.0 and 2.17.0 unless said:

- ``backend/src/v2/component/launcher_v2.go``, ``uploadOutputArtifacts``: for each output artifact of the executor
  input, the executor output's artifact of that name is merged into it (``mergeRuntimeArtifacts``: a non-empty URI
  replaces the assigned one; metadata fields are added, later wins). An artifact whose URI has a scheme the launcher
  recognises (``LocalPathForURI``: ``gs://``, ``minio://``, ``s3://``; ``oci://`` is never uploaded) is uploaded to
  the pipeline root's bucket under ``KeyFromURI`` (``v2/objectstore/config.go``), which fails the step when the URI
  is not under the pipeline root's prefixed bucket ("URI %q does not have expected bucket prefix %q"); a URI of any
  other scheme is recorded without upload. A missing local file is only a warning.
- ``v2/metadata/client.go``, ``RecordArtifact``: the artifact's type is its schema title; its custom properties are
  its metadata fields (``v2/metadata/converter.go``, ``toMLMDArtifact`` and ``StructValueToMLMDValue``: a string stays
  a string, a number becomes a double, a bool an int, a list ``{"list": [...]}``, a struct ``{"struct": {...}}``,
  and a null fails: "unknown/unsupported value type"), with ``display_name`` defaulting to the output's name and
  ``store_session_info`` added; its state is LIVE.
- ``PublishExecution``: one OUTPUT event per recorded artifact, its path the output's name (``eventPath``).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

#: The schemes ``LocalPathForURI`` maps to a local path, so the launcher uploads the artifact.
UPLOADED_SCHEMES = ("gs://", "minio://", "s3://")


class LauncherError(RuntimeError):
    """Where the launcher fails the step (the backend's message)."""


@dataclass
class Artifact:
    id: int
    type: str
    uri: str
    custom_properties: dict[str, Any]
    state: str = "LIVE"


@dataclass
class Event:
    artifact_id: int
    execution: str
    type: str
    path: str


@dataclass
class MetadataStore:
    """The MLMD artifacts and events of one run, as the launchers record them."""

    pipeline_root: str  # e.g. minio://mlpipeline/v2/artifacts
    artifacts: list[Artifact] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    _ids: Any = field(default_factory=lambda: itertools.count(1))

    def publish_outputs(self, execution: str, outputs: dict[str, dict], executor_output: dict) -> list[Artifact]:
        """Record the output artifacts of a step whose container ended. ``outputs``: the executor input's output
        artifacts by name (``{"type": schema title, "uri": the URI KFP assigned}``); ``executor_output``: the
        executor's ``executor_output.json`` as a dict."""
        recorded = []
        for name, assigned in outputs.items():
            uri, metadata = assigned["uri"], {}
            written = (executor_output.get("artifacts", {}).get(name, {}).get("artifacts") or [None])[0]
            if written:
                uri = written.get("uri") or uri
                metadata.update(written.get("metadata") or {})
            if uri.startswith(UPLOADED_SCHEMES) and not uri.startswith(self.pipeline_root):
                raise LauncherError(f'failed to upload output artifact "{name}": URI "{uri}" does not have expected '
                                    f'bucket prefix "{self.pipeline_root}"')
            props = {key: _mlmd_value(value, key) for key, value in metadata.items()}
            props.setdefault("display_name", name)
            props.setdefault("store_session_info", "{}")
            artifact = Artifact(next(self._ids), assigned["type"], uri, props)
            self.artifacts.append(artifact)
            self.events.append(Event(artifact.id, execution, "OUTPUT", name))
            recorded.append(artifact)
        return recorded

    def outputs_of(self, execution: str) -> dict[str, Artifact]:
        """The artifacts ``execution`` output, by the output's name, as the lineage explorer finds them."""
        by_id = {a.id: a for a in self.artifacts}
        return {e.path: by_id[e.artifact_id] for e in self.events if e.execution == execution and e.type == "OUTPUT"}


def _mlmd_value(value: Any, key: str) -> Any:
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return {"list": value}
    if isinstance(value, dict):
        return {"struct": value}
    raise LauncherError(f"unable to produce MLMD artifact: metadata {key!r}: unknown/unsupported value type "
                        f"{type(value).__name__}")
