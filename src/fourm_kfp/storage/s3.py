"""``s3://bucket/prefix`` as a store, through the minio client (:mod:`.client`), every call retried by
:func:`.retries.with_retries`. An object appears whole or not at all (a single PUT, or a multipart upload that the
server assembles only on its completion), so a reader never sees half an object.

Objects larger than ``FOURM_STORAGE_PART_MB`` (64 MiB) move in parts of that size, ``FOURM_STORAGE_TRANSFER_THREADS``
(4) at a time: uploads as an S3 multipart upload, downloads as ranged GETs into a temporary file that is renamed when
every part is in. Each part is retried on its own, so a failure late in a long transfer costs one part again. A prefix
is deleted with DeleteObjects, ``FOURM_STORAGE_DELETE_BATCH`` (1,000) keys a request.
"""

from __future__ import annotations

import contextlib
import io
import os
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import BinaryIO, Callable, Iterator, TypeVar
from urllib.parse import urlparse

from fourm_kfp.storage.base import Store, StorageError, join_uri
from fourm_kfp.storage.retries import env_seconds, with_retries

T = TypeVar("T")
#: Keys a DeleteObjects request takes at most (the S3 API's limit).
MAX_DELETE_BATCH = 1000


def delete_batch() -> int:
    """Keys per DeleteObjects request (``FOURM_STORAGE_DELETE_BATCH``, 1,000: the S3 API's limit); lower it for a
    server too slow to delete a full batch within the read timeout."""
    batch = int(env_seconds("FOURM_STORAGE_DELETE_BATCH", MAX_DELETE_BATCH))
    if not 1 <= batch <= MAX_DELETE_BATCH:
        raise StorageError(f"FOURM_STORAGE_DELETE_BATCH={batch}: 1 to {MAX_DELETE_BATCH}")
    return batch


def part_bytes() -> int:
    """The part size of large transfers (``FOURM_STORAGE_PART_MB``, 64 MiB; S3 allows 5 MiB to 5 GiB)."""
    megabytes = env_seconds("FOURM_STORAGE_PART_MB", 64.0)  # a plain number, parsed like the deadlines
    if not 5 <= megabytes <= 5 * 1024:
        raise StorageError(f"FOURM_STORAGE_PART_MB={megabytes:g}: S3 parts are 5 to 5120 MiB")
    return int(megabytes * (1 << 20))


def transfer_threads() -> int:
    """Parts of one large transfer in flight at once (``FOURM_STORAGE_TRANSFER_THREADS``, 4)."""
    threads = int(env_seconds("FOURM_STORAGE_TRANSFER_THREADS", 4))
    if threads < 1:
        raise StorageError(f"FOURM_STORAGE_TRANSFER_THREADS={threads}: at least 1")
    return threads


def _part_ranges(size: int, part: int) -> list[tuple[int, int]]:
    """``(offset, length)`` of each part of an object of ``size`` bytes."""
    return [(offset, min(part, size - offset)) for offset in range(0, size, part)]


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
        if len(data) > part_bytes():
            view = memoryview(data)
            self._put_parts(key, len(data), lambda offset, length: bytes(view[offset:offset + length]))
            return
        # part_size: one PUT up to our part size (minio would split from 5 MiB on, with no retry per part)
        self._call("put", key, lambda: self.client.put_object(self.bucket, self._key(key), io.BytesIO(data),
                                                              len(data), part_size=part_bytes()))

    def put_file(self, key: str, path: str | os.PathLike) -> None:
        size = os.path.getsize(path)
        if size > part_bytes():
            def read(offset: int, length: int) -> bytes:
                with open(path, "rb") as fh:
                    fh.seek(offset)
                    return fh.read(length)

            self._put_parts(key, size, read)
            return

        def put() -> None:
            with open(path, "rb") as fh:
                self.client.put_object(self.bucket, self._key(key), fh, size, part_size=part_bytes())

        self._call("put", key, put)

    def _put_parts(self, key: str, size: int, read: Callable[[int, int], bytes]) -> None:
        """A multipart upload: start, the parts in parallel (each retried alone), complete; aborted on failure."""
        from minio.datatypes import Part

        name = self._key(key)
        upload_id = self._call("start multipart upload of", key, lambda: self.client._create_multipart_upload(
            self.bucket, name, {"Content-Type": "application/octet-stream"}))

        def upload(number: int, offset: int, length: int) -> Part:
            data = read(offset, length)
            etag = self._call(f"upload part {number} of", key, lambda: self.client._upload_part(
                self.bucket, name, data, None, upload_id, number))
            return Part(number, etag)

        try:
            ranges = _part_ranges(size, part_bytes())
            with ThreadPoolExecutor(min(transfer_threads(), len(ranges))) as pool:
                parts = list(pool.map(lambda item: upload(item[0] + 1, *item[1]), enumerate(ranges)))
            self._call("complete multipart upload of", key, lambda: self.client._complete_multipart_upload(
                self.bucket, name, upload_id, parts))
        except BaseException:
            with contextlib.suppress(Exception):  # best effort: the server's lifecycle rules clean up otherwise
                self.client._abort_multipart_upload(self.bucket, name, upload_id)
            raise

    def get_file(self, key: str, path: str | os.PathLike) -> None:
        """The object into ``path`` through a temporary file beside it: one GET, or ranged GETs in parallel for an
        object larger than a part."""
        size = self.size(key)
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".part")
        try:
            def fetch(item: tuple[int, tuple[int, int]]) -> None:
                number, (offset, length) = item
                data = self.get_range(key, offset, length)
                if len(data) != length:
                    raise StorageError(f"get {self.uri_of(key)}: bytes {offset}-{offset + length} came back as "
                                       f"{len(data)} bytes (did the object change during the download?)")
                view = memoryview(data)
                while view:
                    written = os.pwrite(fd, view, offset)
                    view, offset = view[written:], offset + written

            ranges = list(enumerate(_part_ranges(size, part_bytes())))
            if len(ranges) > 1:
                with ThreadPoolExecutor(min(transfer_threads(), len(ranges))) as pool:
                    list(pool.map(fetch, ranges))
            else:
                for item in ranges:
                    fetch(item)
            os.close(fd)
            fd = -1
            os.replace(tmp, target)
        except BaseException:
            if fd >= 0:
                os.close(fd)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise

    def _get_range(self, key: str, offset: int, length: int) -> bytes:
        response = self.client.get_object(self.bucket, self._key(key), offset=offset, length=length)
        try:
            return response.read()
        finally:
            response.close()
            response.release_conn()

    def get_range(self, key: str, offset: int, length: int) -> bytes:
        return self._call("get range of", key, lambda: self._get_range(key, offset, length))

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

    def list_folders(self, prefix: str = "") -> list[str]:
        full = self._key(prefix)
        full = f"{full}/" if full and not full.endswith("/") else full

        def listing() -> list[str]:
            objects = self.client.list_objects(self.bucket, prefix=full or None, recursive=False)
            return sorted(obj.object_name[len(full):].rstrip("/") for obj in objects if obj.is_dir)

        return self._call("list", prefix, listing)

    def list_sizes(self, prefix: str = "") -> list[tuple[str, int]]:
        full = self._listing_prefix(prefix)
        strip = len(self.prefix) + 1 if self.prefix else 0

        def listing() -> list[tuple[str, int]]:
            objects = self.client.list_objects(self.bucket, prefix=full or None, recursive=True)
            return sorted((obj.object_name[strip:], obj.size) for obj in objects if not obj.is_dir)

        return self._call("list", prefix, listing)

    def delete(self, key: str) -> None:
        self._call("delete", key, lambda: self.client.remove_object(self.bucket, self._key(key)))

    def delete_prefix(self, prefix: str = "") -> int:
        from minio.deleteobjects import DeleteObject

        keys, size = self.list(prefix), delete_batch()
        for start in range(0, len(keys), size):
            batch = [DeleteObject(self._key(k)) for k in keys[start:start + size]]
            errors = self._call("delete", prefix, lambda b=batch: list(self.client.remove_objects(self.bucket, b)))
            if errors:
                first = errors[0]
                raise StorageError(f"delete {self.uri_of(prefix)}: {len(errors)} of {len(batch)} objects not "
                                   f"deleted, first {first.name}: {first.code} {first.message}")
        return len(keys)
