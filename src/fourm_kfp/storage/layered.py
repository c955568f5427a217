"""Several stores read as one (a dataset made of several stages' outputs), read-only."""

from __future__ import annotations

import contextlib
import os
from typing import BinaryIO

from fourm_kfp.storage.base import Store, StorageError


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

    def get_range(self, key: str, offset: int, length: int) -> bytes:
        return self._holder(key).get_range(key, offset, length)

    def version(self, key: str) -> str:
        return self._holder(key).version(key)

    def get_file(self, key: str, path: str | os.PathLike) -> None:
        self._holder(key).get_file(key, path)

    def open_read(self, key: str) -> contextlib.AbstractContextManager[BinaryIO]:
        return self._holder(key).open_read(key)

    def list(self, prefix: str = "") -> list[str]:
        return sorted({key for layer in self.layers for key in layer.list(prefix)})

    def list_folders(self, prefix: str = "") -> list[str]:
        return sorted({name for layer in self.layers for name in layer.list_folders(prefix)})

    def _read_only(self, *_: object) -> None:
        raise StorageError(f"{self!r} is read-only: a stage writes into its own output, not into its inputs")

    put_bytes = put_file = delete = delete_prefix = _read_only  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"LayeredStore({', '.join(layer.uri for layer in self.layers)})"
