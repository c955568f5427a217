"""``s3://bucket/prefix`` as a store, through the minio client (:mod:`.client`), every call retried by
:func:`.retries.with_retries`. A write is a single PUT, so a reader never sees half an object."""

from __future__ import annotations

import contextlib
import io
import os
from typing import BinaryIO, Callable, Iterator, TypeVar
from urllib.parse import urlparse

from fourm_kfp.storage.base import Store, join_uri
from fourm_kfp.storage.retries import with_retries

T = TypeVar("T")


class S3Store(Store):
    """``s3://bucket/prefix`` through the minio client (any S3 endpoint: MinIO, SeaweedFS, AWS, rclone)."""

    def __init__(self, uri: str, client, retries: int = 1000, backoff_s: float = 0.5):
        parsed = urlparse(uri)
        if parsed.scheme != "s3" or not parsed.netloc:
            raise ValueError(f"not an s3:// URI: {uri!r}")
        self.bucket = parsed.netloc
        self.prefix = parsed.path.strip("/")
        self.uri = join_uri(f"s3://{self.bucket}", self.prefix)
        self.client = client
        self.retries = retries
        self.backoff_s = backoff_s

    def child(self, *parts: str) -> "S3Store":
        return S3Store(join_uri(self.uri, *parts), self.client, self.retries, self.backoff_s)

    def _key(self, key: str) -> str:
        return join_uri(self.prefix, key).lstrip("/")

    def _call(self, what: str, key: str, fn: Callable[[], T]) -> T:
        endpoint = getattr(self.client, "_base_url", None)
        where = f" at S3 endpoint {endpoint._url.scheme}://{endpoint._url.netloc}" if endpoint else ""
        return with_retries(fn, f"{what} {self.uri_of(key)}{where}", self.retries, self.backoff_s)

    def ensure_bucket(self) -> None:
        def make() -> None:
            if not self.client.bucket_exists(self.bucket):
                try:
                    self.client.make_bucket(self.bucket)
                except Exception as exc:  # another writer may have created it meanwhile
                    if not self.client.bucket_exists(self.bucket):
                        raise exc

        self._call("create bucket", "", make)

    def exists(self, key: str) -> bool:
        from minio.error import S3Error

        def stat() -> bool:
            try:
                self.client.stat_object(self.bucket, self._key(key))
                return True
            except S3Error as exc:
                if exc.code in ("NoSuchKey", "NoSuchObject", "ResourceNotFound", "NoSuchBucket"):
                    return False
                raise

        return self._call("stat", key, stat)

    def size(self, key: str) -> int:
        return self._call("stat", key, lambda: self.client.stat_object(self.bucket, self._key(key)).size)

    def version(self, key: str) -> str:
        stat = self._call("stat", key, lambda: self.client.stat_object(self.bucket, self._key(key)))
        return f"{stat.size}-{stat.etag}-{stat.last_modified.isoformat() if stat.last_modified else ''}"

    def _listing_prefix(self, prefix: str) -> str:
        full = self._key(prefix)
        if full and prefix and not full.endswith("/"):
            full += "/"
        return full

    def list_etags(self, prefix: str = "") -> list[tuple[str, int, str]]:
        """``(key, size, ETag)`` of every object below ``prefix``, sorted by key, from the listing alone: the ETag
        changes with the bytes (an MD5 of them, or of the parts of a multipart upload), not with the upload time."""
        full = self._listing_prefix(prefix)
        strip = len(self.prefix) + 1 if self.prefix else 0

        def listing() -> list[tuple[str, int, str]]:
            objects = self.client.list_objects(self.bucket, prefix=full or None, recursive=True)
            return sorted((obj.object_name[strip:], obj.size, (obj.etag or "").strip('"'))
                          for obj in objects if not obj.is_dir)

        return self._call("list", prefix, listing)

    def get_bytes(self, key: str) -> bytes:
        def get() -> bytes:
            response = self.client.get_object(self.bucket, self._key(key))
            try:
                return response.read()
            finally:
                response.close()
                response.release_conn()

        return self._call("get", key, get)

    def put_bytes(self, key: str, data: bytes) -> None:
        self._call("put", key, lambda: self.client.put_object(self.bucket, self._key(key), io.BytesIO(data), len(data)))

    def put_file(self, key: str, path: str | os.PathLike) -> None:
        self._call("put", key, lambda: self.client.fput_object(self.bucket, self._key(key), str(path)))

    def get_file(self, key: str, path: str | os.PathLike) -> None:
        self._call("get", key, lambda: self.client.fget_object(self.bucket, self._key(key), str(path)))

    @contextlib.contextmanager
    def open_read(self, key: str) -> Iterator[BinaryIO]:
        response = self._call("get", key, lambda: self.client.get_object(self.bucket, self._key(key)))
        try:
            yield response
        finally:
            response.close()
            response.release_conn()

    def list(self, prefix: str = "") -> list[str]:
        return [key for key, _ in self.list_sizes(prefix)]

    def list_sizes(self, prefix: str = "") -> list[tuple[str, int]]:
        full = self._listing_prefix(prefix)
        strip = len(self.prefix) + 1 if self.prefix else 0

        def listing() -> list[tuple[str, int]]:
            objects = self.client.list_objects(self.bucket, prefix=full or None, recursive=True)
            return sorted((obj.object_name[strip:], obj.size) for obj in objects if not obj.is_dir)

        return self._call("list", prefix, listing)

    def delete_prefix(self, prefix: str = "") -> int:
        keys = self.list(prefix)
        for key in keys:
            self._call("delete", key, lambda k=key: self.client.remove_object(self.bucket, self._key(k)))
        return len(keys)
