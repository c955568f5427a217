"""A folder on the local file system as a store, and ``pkg://<package>/<folder>`` URIs (a folder inside an
installed Python package). A write is a temp file plus ``os.replace``, so a reader never sees half an object."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import BinaryIO, Callable, Iterator

from fourm_kfp.storage.base import Store, StorageError

#: ``pkg://<package>/<folder>``: a folder of files inside an installed Python package (read-only data a package
#: ships, such as the sample photos of the ``photos`` preset).
PACKAGE_SCHEME = "pkg://"


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

    def get_range(self, key: str, offset: int, length: int) -> bytes:
        try:
            with open(self._path(key), "rb") as fh:
                fh.seek(offset)
                return fh.read(length)
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

    def list_folders(self, prefix: str = "") -> list[str]:
        base = self._path(prefix.rstrip("/")) if prefix else self.root
        if not base.is_dir():
            return []
        return sorted(p.name for p in base.iterdir() if p.is_dir() and any(f.is_file() for f in p.rglob("*")))

    def delete(self, key: str) -> None:
        self._path(key).unlink(missing_ok=True)

    def delete_prefix(self, prefix: str = "") -> int:
        keys = self.list(prefix)
        for key in keys:
            self._path(key).unlink(missing_ok=True)
        return len(keys)


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
