"""Stage manifests: the ``_MANIFEST.json`` that commits a stage's output.

A stage writes its objects first and its manifest last. An output prefix without a manifest is incomplete (a
stage was killed or failed midway): it is never read, and the next run clears it and starts over. The manifest
records what was made from what: the inputs with their manifest digests, the resolved config, the code version
(package version and git commit when known), counts, every file with its byte size and SHA-256, and timings.

The **payload** is every file but the stage's run records (``StageSpec.run_records``: what the run did outside its
output, such as the model gate's registry decision) and the manifest itself. It is a function of the config and
the inputs alone: two runs of a stage at one address commit the same payload, byte for byte
(``payload_digest``), unless the manifest says ``"deterministic": false`` and why (``nondeterminism``).
Wall-clock measures, run ids and where the store is live in the manifest (``timings``, ``metrics``,
``mlflow_run_id``, ``output_uri``, and ``storage``: the S3 requests by kind and the bytes up and down that making
the output took, its fan-out workers' included, :mod:`fourm_kfp.storage.metering`), never in the payload. :func:`payload_differences` compares two manifests.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from fourm_kfp import __version__
from fourm_kfp.errors import UserError
from fourm_kfp.storage import Store, StorageError

MANIFEST_NAME = "_MANIFEST.json"


class IncompleteOutputError(UserError, RuntimeError):
    """An input URI has no manifest: its stage never finished, so it must not be read."""


@dataclass
class FileRecord:
    key: str
    bytes: int
    sha256: str


class RecordingStore(Store):
    """A store that remembers every object written through it (for the manifest's file list)."""

    def __init__(self, inner: Store, records: dict[str, FileRecord] | None = None, prefix: str = ""):
        self.inner = inner
        self.uri = inner.uri
        self.records = records if records is not None else {}
        self._prefix = prefix

    def _record(self, key: str, data: bytes | None = None, path: str | os.PathLike | None = None) -> None:
        digest, size = hashlib.sha256(), 0
        if data is not None:
            digest.update(data)
            size = len(data)
        else:
            with open(path, "rb") as fh:
                for chunk in iter(lambda: fh.read(1 << 20), b""):
                    digest.update(chunk)
                    size += len(chunk)
        full = f"{self._prefix}{key}"
        self.records[full] = FileRecord(full, size, digest.hexdigest())

    def record_existing(self, key: str) -> None:
        """Record an object already in the store (written by an earlier, interrupted run), streaming its bytes."""
        sha, size = stored_sha256(self.inner, key)
        full = f"{self._prefix}{key}"
        self.records[full] = FileRecord(full, size, sha)

    def child(self, *parts: str) -> "RecordingStore":
        sub = "/".join(p.strip("/") for p in parts if p.strip("/"))
        return RecordingStore(self.inner.child(*parts), self.records, f"{self._prefix}{sub}/")

    def put_bytes(self, key: str, data: bytes) -> None:
        self.inner.put_bytes(key, data)
        self._record(key, data=data)

    def put_file(self, key: str, path: str | os.PathLike) -> None:
        self.inner.put_file(key, path)
        self._record(key, path=path)

    def exists(self, key: str) -> bool:
        return self.inner.exists(key)

    def size(self, key: str) -> int:
        return self.inner.size(key)

    def get_bytes(self, key: str) -> bytes:
        return self.inner.get_bytes(key)

    def get_file(self, key: str, path: str | os.PathLike) -> None:
        self.inner.get_file(key, path)

    def get_range(self, key: str, offset: int, length: int) -> bytes:
        return self.inner.get_range(key, offset, length)

    def open_read(self, key: str) -> contextlib.AbstractContextManager[BinaryIO]:
        return self.inner.open_read(key)

    def list(self, prefix: str = "") -> list[str]:
        return self.inner.list(prefix)

    def list_folders(self, prefix: str = "") -> list[str]:
        return self.inner.list_folders(prefix)

    def delete(self, key: str) -> None:
        self.inner.delete(key)

    def delete_prefix(self, prefix: str = "") -> int:
        return self.inner.delete_prefix(prefix)


def stored_sha256(store: Store, key: str) -> tuple[str, int]:
    """``(SHA-256 hex, size)`` of an object in ``store``, streamed."""
    digest, size = hashlib.sha256(), 0
    with store.open_read(key) as stream:
        for chunk in iter(lambda: stream.read(1 << 20), b""):
            digest.update(chunk)
            size += len(chunk)
    return digest.hexdigest(), size


def git_commit() -> str | None:
    """The commit of the source checkout this package runs from, if it is one (else the image's build arg)."""
    env = os.environ.get("FOURM_GIT_COMMIT")
    if env:
        return env
    here = Path(__file__).resolve().parent
    try:
        out = subprocess.run(["git", "-C", str(here), "rev-parse", "HEAD"], capture_output=True, text=True,
                             timeout=5, check=True)
        dirty = subprocess.run(["git", "-C", str(here), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=5).stdout.strip()
        return out.stdout.strip() + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return None


def code_version() -> dict[str, Any]:
    return {"package_version": __version__, "git_commit": git_commit()}


def manifest_bytes(manifest: dict[str, Any]) -> bytes:
    return json.dumps(manifest, indent=2, sort_keys=True).encode("utf-8")


def manifest_digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def read_manifest(store: Store) -> tuple[dict[str, Any], str] | None:
    """``(manifest, digest)`` of the committed output at ``store``, or ``None`` if it is not committed."""
    if not store.exists(MANIFEST_NAME):
        return None
    data = store.get_bytes(MANIFEST_NAME)
    try:
        return json.loads(data), manifest_digest(data)
    except json.JSONDecodeError as exc:
        raise StorageError(f"{store.uri_of(MANIFEST_NAME)}: corrupt manifest: {exc}") from None


def require_manifest(store: Store, what: str) -> tuple[dict[str, Any], str]:
    """Like :func:`read_manifest` but an uncommitted output is an error naming ``what`` and the URI."""
    found = read_manifest(store)
    if found is None:
        raise IncompleteOutputError(
            f"{what}: {store.uri} has no {MANIFEST_NAME}; its stage did not finish, so it cannot be used as input")
    return found


def payload_files(manifest: dict[str, Any]) -> dict[str, str]:
    """``{key: sha256}`` of a manifest's payload (its files less its run records)."""
    records = set(manifest.get("run_records", ()))
    return {f["key"]: f["sha256"] for f in manifest["files"] if f["key"] not in records}


def payload_digest(files: dict[str, str]) -> str:
    """One digest of a payload: the SHA-256 of its sorted ``key sha256`` lines."""
    lines = "".join(f"{key} {sha}\n" for key, sha in sorted(files.items()))
    return "sha256:" + hashlib.sha256(lines.encode()).hexdigest()


def payload_differences(expected: dict[str, Any], actual: dict[str, Any]) -> list[tuple[str, str]]:
    """``(key, how)`` for every payload file that differs between two manifests, sorted by key; ``how`` is
    ``differs``, ``missing`` (only in ``expected``) or ``extra`` (only in ``actual``). Empty: same bytes."""
    a, b = payload_files(expected), payload_files(actual)
    out = []
    for key in sorted(a.keys() | b.keys()):
        if key not in b:
            out.append((key, "missing"))
        elif key not in a:
            out.append((key, "extra"))
        elif a[key] != b[key]:
            out.append((key, "differs"))
    return out


def commit_manifest(store: Store, manifest: dict[str, Any]) -> str:
    """Write the manifest (the very last write of a stage); returns its digest."""
    data = manifest_bytes(manifest)
    store.put_bytes(MANIFEST_NAME, data)
    return manifest_digest(data)
