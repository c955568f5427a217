"""Storage that speaks URIs: local paths and ``s3://bucket/prefix`` behind one small interface.

Every large artifact (shards, tokenizers, checkpoints) goes through a :class:`Store`. A store is rooted at a URI and
addresses objects by ``/``-separated keys below it; :meth:`Store.child` narrows the root. A ``pkg://<package>/<folder>``
URI is a folder inside an installed Python package (sample data), and a :class:`LayeredStore` reads several stores as
one (a dataset made of several stages' outputs). Writes are atomic per object (a temp file plus ``os.replace``
locally; a single PUT on S3), so a reader never sees half an object.

One module per concern; everything is imported from here (``from fourm_kfp.storage import open_store``):

* :mod:`.base`: the :class:`Store` interface, :class:`StorageError` and the URI helpers (:func:`join_uri`,
  :func:`output_ref` / :func:`resolve_uri` / :func:`sibling_output_uri`: how an output names another beside it);
* :mod:`.local`: :class:`LocalStore` and ``pkg://`` folders (:func:`package_folder`);
* :mod:`.s3`: :class:`S3Store`;
* :mod:`.layered`: :class:`LayeredStore`;
* :mod:`.retries`: the one retry layer (:func:`with_retries`, :func:`is_transient`; deadline
  ``FOURM_STORAGE_DEADLINE_S``, 60 s), after which a :class:`StorageError` names the endpoint, the operation and the
  object;
* :mod:`.metering`: every S3 request of the process counted by kind, and the bytes up and down (the runner records
  each stage's in its manifest);
* :mod:`.credentials`: S3 credentials through the standard AWS chain (:func:`credential_chain`: environment,
  ``~/.aws`` profile, web identity token, instance role) with minio's providers;
* :mod:`.client`: the minio client (:func:`s3_client`): endpoint from the environment, credentials from the chain,
  short timeouts, one client per endpoint, fresh connection pools in a forked child;
* here: :func:`open_store` (a URI → its store) and :func:`file_store`.
"""

from __future__ import annotations

from urllib.parse import urlparse

from fourm_kfp.storage.base import (Store, StorageError, is_s3_uri, join_uri, output_ref, resolve_uri,
                                    sibling_output_uri)
from fourm_kfp.storage.client import _CLIENTS, s3_client, shared_client  # noqa: F401 (_CLIENTS: the tests clear it)
from fourm_kfp.storage.credentials import credential_chain
from fourm_kfp.storage.layered import LayeredStore
from fourm_kfp.storage.local import PACKAGE_SCHEME, LocalStore, package_folder
from fourm_kfp.storage.retries import TRANSIENT_S3_CODES, is_transient, with_retries
from fourm_kfp.storage.s3 import S3Store

__all__ = ["PACKAGE_SCHEME", "TRANSIENT_S3_CODES", "LayeredStore", "LocalStore", "S3Store", "Store", "StorageError",
           "credential_chain", "file_store", "is_s3_uri", "is_transient", "join_uri", "open_store", "output_ref", "package_folder",
           "resolve_uri", "s3_client", "shared_client", "sibling_output_uri", "with_retries"]


def open_store(uri: str, s3_endpoint: str | None = None, create: bool = False) -> Store:
    """The store rooted at ``uri``: ``s3://bucket/prefix``, ``file:///path``, ``pkg://<package>/<folder>`` or a
    plain path.

    One minio client is shared per endpoint within a process. ``create=True`` makes the bucket if needed.
    """
    if is_s3_uri(uri):
        store = S3Store(uri, shared_client(s3_endpoint))
        if create:
            store.ensure_bucket()
        return store
    if uri.startswith("file://"):
        uri = urlparse(uri).path
    if uri.startswith(PACKAGE_SCHEME):
        return LocalStore(package_folder(uri))
    return LocalStore(uri)


def file_store(uri: str) -> tuple[Store, str]:
    """``(store of the folder, key)`` of the file at ``uri`` (a local path, relative or absolute, or ``s3://``)."""
    parent, _, name = uri.rstrip("/").rpartition("/")
    return open_store(parent or ("/" if uri.startswith("/") else ".")), name
