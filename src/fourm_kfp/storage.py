"""Storage that speaks URIs: local paths and ``s3://bucket/prefix`` behind one small interface.

Every large artifact (shards, tokenizers, checkpoints) goes through a :class:`Store`. A store is rooted at a URI and
addresses objects by ``/``-separated keys below it; :meth:`Store.child` narrows the root. A ``pkg://<package>/<folder>``
URI is a folder inside an installed Python package (sample data), and a :class:`LayeredStore` reads several stores as
one (a dataset made of several stages' outputs). Writes are atomic per
object (a temp file plus ``os.replace`` locally; a single PUT on S3), so a reader never sees half an object.

S3 goes through the ``minio`` client. The endpoint comes from ``open_store(..., s3_endpoint=...)`` or the
``AWS_ENDPOINT_URL`` environment variable; credentials only from ``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY``
(a Kubernetes Secret fills them in the cluster) and are never logged or put in configs.

Failures surface fast and clearly: there is one retry layer (ours; the client's own urllib3 retries are off),
connections and reads time out after ``FOURM_STORAGE_CONNECT_TIMEOUT_S`` / ``FOURM_STORAGE_READ_TIMEOUT_S``
(5 s / 30 s), and transient errors (refused or reset connections, timeouts, 5xx, throttling) are retried with
exponential backoff until a total deadline, ``FOURM_STORAGE_DEADLINE_S`` (60 s), after which a
:class:`StorageError` names the endpoint, the operation and the object.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import posixpath
import random
import shutil
import tempfile
import time
import weakref
from pathlib import Path
from typing import BinaryIO, Callable, Iterator, TypeVar
from urllib.parse import urlparse

from fourm_kfp.errors import UserError

log = logging.getLogger(__name__)
T = TypeVar("T")

#: S3 error codes worth retrying (the server is busy or briefly unavailable).
TRANSIENT_S3_CODES = frozenset({"InternalError", "ServiceUnavailable", "SlowDown", "RequestTimeout", "Throttling"})


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

    def list_sizes(self, prefix: str = "") -> list[tuple[str, int]]:
        """``(key, size in bytes)`` of every object below ``prefix``, sorted by key."""
        return [(key, self.size(key)) for key in self.list(prefix)]

    def delete_prefix(self, prefix: str = "") -> int:
        """Delete every object below ``prefix``; returns how many were deleted."""
        raise NotImplementedError

    def get_text(self, key: str) -> str:
        return self.get_bytes(key).decode("utf-8")

    def put_text(self, key: str, text: str) -> None:
        self.put_bytes(key, text.encode("utf-8"))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.uri!r})"


class LocalStore(Store):
    """A folder on the local file system."""

    def __init__(self, root: str | os.PathLike):
        self.root = Path(root).expanduser().resolve()
        self.uri = str(self.root)

    def child(self, *parts: str) -> "LocalStore":
        return LocalStore(self.root.joinpath(*[p.strip("/") for p in parts if p.strip("/")]))

    def _path(self, key: str) -> Path:
        return self.root / key if key else self.root

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def size(self, key: str) -> int:
        try:
            return self._path(key).stat().st_size
        except FileNotFoundError:
            raise StorageError(f"no such object: {self.uri_of(key)}") from None

    def version(self, key: str) -> str:
        try:
            stat = self._path(key).stat()
        except FileNotFoundError:
            raise StorageError(f"no such object: {self.uri_of(key)}") from None
        return f"{stat.st_size}-{stat.st_mtime_ns}"

    def get_bytes(self, key: str) -> bytes:
        try:
            return self._path(key).read_bytes()
        except FileNotFoundError:
            raise StorageError(f"no such object: {self.uri_of(key)}") from None

    def _atomic_write(self, key: str, write: Callable[[BinaryIO], None]) -> None:
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as fh:
                write(fh)
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise

    def put_bytes(self, key: str, data: bytes) -> None:
        self._atomic_write(key, lambda fh: fh.write(data))

    def put_file(self, key: str, path: str | os.PathLike) -> None:
        def copy(fh: BinaryIO) -> None:
            with open(path, "rb") as src:
                shutil.copyfileobj(src, fh, 1 << 20)

        self._atomic_write(key, copy)

    def get_file(self, key: str, path: str | os.PathLike) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        try:
            shutil.copyfile(self._path(key), path)
        except FileNotFoundError:
            raise StorageError(f"no such object: {self.uri_of(key)}") from None

    @contextlib.contextmanager
    def open_read(self, key: str) -> Iterator[BinaryIO]:
        try:
            fh = open(self._path(key), "rb")
        except FileNotFoundError:
            raise StorageError(f"no such object: {self.uri_of(key)}") from None
        with fh:
            yield fh

    def list(self, prefix: str = "") -> list[str]:
        base = self._path(prefix.rstrip("/")) if prefix else self.root
        if base.is_file():
            return [prefix]
        if not base.is_dir():
            return []
        keys = []
        for path in base.rglob("*"):
            if path.is_file() and not (path.name.startswith(".") and path.name.endswith(".tmp")):
                keys.append(path.relative_to(self.root).as_posix())
        return sorted(keys)

    def delete_prefix(self, prefix: str = "") -> int:
        keys = self.list(prefix)
        for key in keys:
            self._path(key).unlink(missing_ok=True)
        return len(keys)


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

    def list_etags(self, prefix: str = "") -> list[tuple[str, int, str]]:
        """``(key, size, ETag)`` of every object below ``prefix``, sorted by key, from the listing alone: the ETag
        changes with the bytes (an MD5 of them, or of the parts of a multipart upload), not with the upload time."""
        full = self._key(prefix)
        if full and prefix and not full.endswith("/"):
            full += "/"
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
        full = self._key(prefix)
        if full and prefix and not full.endswith("/"):
            full += "/"
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


class LayeredStore(Store):
    """A read-only union of stores: a key is read from the last layer that has it.

    How a stage reads a dataset made of several outputs (the prepared images, then the label stage's modalities and
    key indexes over them): each key, listing and URI resolves to the layer that holds the object, so a shard reader
    opens the right file wherever it lives."""

    def __init__(self, layers: "list[Store] | tuple[Store, ...]"):
        if not layers:
            raise ValueError("a layered store needs at least one layer")
        self.layers = tuple(layers)
        self.uri = self.layers[-1].uri

    def _holder(self, key: str) -> Store:
        for layer in reversed(self.layers):
            if layer.exists(key):
                return layer
        return self.layers[-1]

    def child(self, *parts: str) -> "LayeredStore":
        return LayeredStore([layer.child(*parts) for layer in self.layers])

    def uri_of(self, key: str = "") -> str:
        return self._holder(key).uri_of(key) if key else self.uri

    def exists(self, key: str) -> bool:
        return any(layer.exists(key) for layer in self.layers)

    def size(self, key: str) -> int:
        return self._holder(key).size(key)

    def get_bytes(self, key: str) -> bytes:
        return self._holder(key).get_bytes(key)

    def version(self, key: str) -> str:
        return self._holder(key).version(key)

    def get_file(self, key: str, path: str | os.PathLike) -> None:
        self._holder(key).get_file(key, path)

    def open_read(self, key: str) -> contextlib.AbstractContextManager[BinaryIO]:
        return self._holder(key).open_read(key)

    def list(self, prefix: str = "") -> list[str]:
        return sorted({key for layer in self.layers for key in layer.list(prefix)})

    def _read_only(self, *_: object) -> None:
        raise StorageError(f"{self!r} is read-only: a stage writes into its own output, not into its inputs")

    put_bytes = put_file = delete_prefix = _read_only  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"LayeredStore({', '.join(layer.uri for layer in self.layers)})"


def is_transient(exc: BaseException) -> bool:
    """Whether an error from the S3 client is worth retrying."""
    from minio.error import InvalidResponseError, S3Error, ServerError
    from urllib3.exceptions import HTTPError as Urllib3Error

    if isinstance(exc, ServerError):
        return True
    if isinstance(exc, InvalidResponseError):
        # a status without a body minio parses: a proxy's 502/503 page, or an S3 error sent as text/xml (rclone
        # answered a rank's checkpoint PUT so once, with 500 InternalError); 5xx and throttling are worth retrying
        status = getattr(exc, "_code", None)
        return isinstance(status, int) and (status >= 500 or status == 429)
    if isinstance(exc, S3Error):
        return exc.code in TRANSIENT_S3_CODES
    return isinstance(exc, (Urllib3Error, ConnectionError, TimeoutError))


def _env_seconds(name: str, default: float) -> float:
    value = os.environ.get(name, "")
    try:
        return float(value) if value else default
    except ValueError:
        raise StorageError(f"{name}={value!r} is not a number of seconds") from None


def with_retries(fn: Callable[[], T], what: str, retries: int = 1000, backoff_s: float = 0.5,
                 deadline_s: float | None = None) -> T:
    """Call ``fn``; on a transient error wait ``backoff_s * 2**attempt`` (jittered, at most 10 s) and try again,
    until ``deadline_s`` (default ``FOURM_STORAGE_DEADLINE_S``, 60 s) has passed."""
    deadline_s = _env_seconds("FOURM_STORAGE_DEADLINE_S", 60.0) if deadline_s is None else deadline_s
    start = time.monotonic()
    for attempt in range(retries + 1):
        try:
            return fn()
        except Exception as exc:
            if not is_transient(exc):
                raise StorageError(f"{what}: {type(exc).__name__}: {exc}") from exc
            elapsed = time.monotonic() - start
            delay = min(backoff_s * (2**attempt), 10.0) * (0.5 + random.random())
            if attempt == retries or elapsed + delay > deadline_s:
                raise StorageError(
                    f"{what}: still failing after {attempt + 1} attempts in {elapsed:.0f}s "
                    f"({type(exc).__name__}: {_short(exc)}); is the endpoint up and is --s3-endpoint / "
                    f"AWS_ENDPOINT_URL right? (deadline FOURM_STORAGE_DEADLINE_S={deadline_s:g})") from exc
            log.warning("%s: %s, retrying in %.1fs", what, type(exc).__name__, delay)
            time.sleep(delay)
    raise AssertionError("unreachable")


def _short(exc: BaseException) -> str:
    text = str(exc)
    return text if len(text) <= 200 else text[:197] + "..."


def _http_client():
    """urllib3 pool for minio: short timeouts, no retries of its own (``with_retries`` is the one layer)."""
    import certifi
    import urllib3

    timeout = urllib3.Timeout(connect=_env_seconds("FOURM_STORAGE_CONNECT_TIMEOUT_S", 5.0),
                              read=_env_seconds("FOURM_STORAGE_READ_TIMEOUT_S", 30.0))
    return urllib3.PoolManager(timeout=timeout, retries=urllib3.Retry(total=0, redirect=0, raise_on_status=False),
                               maxsize=16, cert_reqs="CERT_REQUIRED", ca_certs=os.environ.get("SSL_CERT_FILE")
                               or certifi.where())


def s3_client(endpoint: str | None = None):
    """A minio client for ``endpoint`` (or ``AWS_ENDPOINT_URL``) with credentials from the environment."""
    from minio import Minio

    endpoint = endpoint or os.environ.get("AWS_ENDPOINT_URL") or os.environ.get("MLFLOW_S3_ENDPOINT_URL")
    if not endpoint:
        raise StorageError("s3:// URI given but no S3 endpoint: pass --s3-endpoint or set AWS_ENDPOINT_URL")
    parsed = urlparse(endpoint if "://" in endpoint else f"http://{endpoint}")
    access_key = os.environ.get("AWS_ACCESS_KEY_ID")
    secret_key = os.environ.get("AWS_SECRET_ACCESS_KEY")
    if not access_key or not secret_key:
        raise StorageError("S3 credentials missing: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY")
    # An explicit region avoids a GetBucketLocation call, which some S3 servers answer in a form minio can't parse.
    client = Minio(
        parsed.netloc,
        access_key=access_key,
        secret_key=secret_key,
        secure=parsed.scheme == "https",
        region=os.environ.get("AWS_DEFAULT_REGION") or os.environ.get("AWS_REGION") or "us-east-1",
        http_client=_http_client(),
    )
    _LIVE_CLIENTS.add(client)
    return client


#: Every minio client of this process, so that a forked child can give each a connection pool of its own.
_LIVE_CLIENTS: "weakref.WeakSet" = weakref.WeakSet()


def _own_pools_after_fork() -> None:
    """In a forked child (a DataLoader worker): a fresh connection pool for every S3 client. The pooled keep-alive
    connections are sockets shared with the parent; a child sending requests on them reads the parent's responses
    and the parent the child's (wrong bytes without an error, e.g. a shard that is "not a tar"). The inherited
    sockets are left alone: closing them here would not close them for the parent, and is not needed."""
    for client in list(_LIVE_CLIENTS):
        if hasattr(client, "_http"):
            client._http = _http_client()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_own_pools_after_fork)


_CLIENTS: dict[str, object] = {}


def open_store(uri: str, s3_endpoint: str | None = None, create: bool = False) -> Store:
    """The store rooted at ``uri``: ``s3://bucket/prefix``, ``file:///path`` or a plain path.

    One minio client is shared per endpoint within a process. ``create=True`` makes the bucket if needed.
    """
    if is_s3_uri(uri):
        endpoint = s3_endpoint or os.environ.get("AWS_ENDPOINT_URL") or os.environ.get("MLFLOW_S3_ENDPOINT_URL") or ""
        if endpoint not in _CLIENTS:
            _CLIENTS[endpoint] = s3_client(endpoint or None)
        store = S3Store(uri, _CLIENTS[endpoint])
        if create:
            store.ensure_bucket()
        return store
    if uri.startswith("file://"):
        uri = urlparse(uri).path
    if uri.startswith(PACKAGE_SCHEME):
        return LocalStore(package_folder(uri))
    return LocalStore(uri)


#: ``pkg://<package>/<folder>``: a folder of files inside an installed Python package (read-only data a package
#: ships, such as the sample photos of the ``photos`` preset).
PACKAGE_SCHEME = "pkg://"


def file_store(uri: str) -> tuple["Store", str]:
    """``(store of the folder, key)`` of the file at ``uri`` (a local path, relative or absolute, or ``s3://``)."""
    parent, _, name = uri.rstrip("/").rpartition("/")
    return open_store(parent or ("/" if uri.startswith("/") else ".")), name


def package_folder(uri: str) -> str:
    """The local path of a ``pkg://<package>/<folder>`` URI; a clear error when the package is not installed or has
    no such folder."""
    import importlib.resources

    package, _, folder = uri[len(PACKAGE_SCHEME):].partition("/")
    try:
        root = importlib.resources.files(package)
    except ModuleNotFoundError:
        raise StorageError(f"{uri}: the Python package {package!r} is not installed") from None
    path = Path(str(root)) / folder
    if not path.is_dir():
        raise StorageError(f"{uri}: the package {package!r} has no folder {folder!r} (at {path})")
    return str(path)
