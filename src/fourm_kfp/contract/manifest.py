"""Stage manifests: the ``_MANIFEST.json`` that commits a stage's output.

A stage writes its objects first and its manifest last. An output prefix without a manifest is incomplete (a
stage was killed or failed midway): it is never read, and the next run clears it and starts over. The manifest
records what was made from what: the inputs with their manifest digests, the resolved config, the code version
(package version and git commit when known), counts, every file with its byte size and SHA-256, and timings.
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
        digest, size = hashlib.sha256(), 0
        with self.inner.open_read(key) as stream:
            for chunk in iter(lambda: stream.read(1 << 20), b""):
                digest.update(chunk)
                size += len(chunk)
        full = f"{self._prefix}{key}"
        self.records[full] = FileRecord(full, size, digest.hexdigest())

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

    def open_read(self, key: str) -> contextlib.AbstractContextManager[BinaryIO]:
        return self.inner.open_read(key)

    def list(self, prefix: str = "") -> list[str]:
        return self.inner.list(prefix)

    def delete_prefix(self, prefix: str = "") -> int:
        return self.inner.delete_prefix(prefix)


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


def commit_manifest(store: Store, manifest: dict[str, Any]) -> str:
    """Write the manifest (the very last write of a stage); returns its digest."""
    data = manifest_bytes(manifest)
    store.put_bytes(MANIFEST_NAME, data)
    return manifest_digest(data)
