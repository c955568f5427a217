"""The store interface and the URI helpers: what every backend implements and how stores name each other.

A store is rooted at a URI and addresses objects by ``/``-separated keys below it; :meth:`Store.child` narrows the
root. Writes are atomic per object, so a reader never sees half an object.
"""

from __future__ import annotations

import contextlib
import os
import posixpath
from typing import BinaryIO

from fourm_kfp.errors import UserError


class StorageError(UserError, RuntimeError):
    """A storage operation failed for good (after retries); the message names the URI."""


def is_s3_uri(uri: str) -> bool:
    return uri.startswith("s3://")


def join_uri(base: str, *parts: str) -> str:
    """Join URI path parts with ``/`` (no normalisation of ``..``)."""
    out = base.rstrip("/")
    for part in parts:
        part = part.strip("/")
        if part:
            out = f"{out}/{part}"
    return out


def _split_uri(uri: str) -> tuple[str, str]:
    """``(scheme and bucket, absolute path)``: ``s3://b/x/y`` → ``("s3://b", "/x/y")``; a local path → ``("", abs)``."""
    if is_s3_uri(uri):
        bucket, _, key = uri[len("s3://"):].partition("/")
        return f"s3://{bucket}", "/" + key.strip("/")
    return "", os.path.abspath(uri)


def output_ref(uri: str) -> str:
    """How a stage output names another one (an input) in its payload: ``../../<stage>/<address>``, the other's
    place beside it in a store laid out as ``<root>/<stage>/<address>``. The string is the same wherever the store
    is, and when ``fourm-kfp verify`` recomputes the output in a scratch store (the manifest keeps the full URIs).
    :func:`resolve_uri` ``(output_uri, ref)`` turns it back into a URI."""
    return "../../" + "/".join(uri.rstrip("/").rsplit("/", 2)[-2:])


def resolve_uri(base: str, ref: str) -> str:
    """``ref`` (:func:`output_ref`, or any relative path) as seen from ``base``; an absolute ``ref`` as it is."""
    if is_s3_uri(ref) or ref.startswith("/") or "://" in ref:
        return ref
    root, path = _split_uri(base)
    return root + posixpath.normpath(posixpath.join(path, ref))


def sibling_output_uri(output_uri: str, stage: str, address: str) -> str:
    """The URI of output ``<stage>/<address>`` beside ``output_uri`` in a store laid out as
    ``<root>/<stage>/<address>`` (:func:`output_ref`'s layout)."""
    return resolve_uri(output_uri, output_ref(f"{stage}/{address}"))


class Store:
    """Objects under a root URI. Keys are relative, ``/``-separated; ``""`` is the root itself."""

    uri: str

    def child(self, *parts: str) -> "Store":
        raise NotImplementedError

    def uri_of(self, key: str = "") -> str:
        return join_uri(self.uri, key)

    def exists(self, key: str) -> bool:
        raise NotImplementedError

    def size(self, key: str) -> int:
        raise NotImplementedError

    def get_bytes(self, key: str) -> bytes:
        raise NotImplementedError

    def get_range(self, key: str, offset: int, length: int) -> bytes:
        """``length`` bytes of one object from ``offset`` (fewer at its end)."""
        raise NotImplementedError

    def version(self, key: str) -> str:
        """A token that changes whenever the object may have new bytes (its size and modification time, or its
        ETag): what a local cache of the object is checked against."""
        raise NotImplementedError

    def put_bytes(self, key: str, data: bytes) -> None:
        raise NotImplementedError

    def put_file(self, key: str, path: str | os.PathLike) -> None:
        raise NotImplementedError

    def get_file(self, key: str, path: str | os.PathLike) -> None:
        raise NotImplementedError

    def open_read(self, key: str) -> contextlib.AbstractContextManager[BinaryIO]:
        """A streaming, file-like reader of one object (use as a context manager)."""
        raise NotImplementedError

    def list(self, prefix: str = "") -> list[str]:
        """All keys below ``prefix`` (recursive), sorted, relative to this store's root."""
        raise NotImplementedError

    def list_folders(self, prefix: str = "") -> list[str]:
        """The names of the folders directly below ``prefix`` (those holding at least one object), sorted: one
        listing page on S3 however many objects they hold."""
        raise NotImplementedError

    def list_sizes(self, prefix: str = "") -> list[tuple[str, int]]:
        """``(key, size in bytes)`` of every object below ``prefix``, sorted by key."""
        return [(key, self.size(key)) for key in self.list(prefix)]

    def delete(self, key: str) -> None:
        """Delete one object (nothing when there is none)."""
        raise NotImplementedError

    def delete_prefix(self, prefix: str = "") -> int:
        """Delete every object below ``prefix``; returns how many were deleted."""
        raise NotImplementedError

    def get_text(self, key: str) -> str:
        return self.get_bytes(key).decode("utf-8")

    def put_text(self, key: str, text: str) -> None:
        self.put_bytes(key, text.encode("utf-8"))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.uri!r})"
