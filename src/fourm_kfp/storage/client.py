"""The minio client of S3 stores: short timeouts and no retries of its own (:mod:`.retries` is the one layer),
credentials through the standard AWS chain (:mod:`.credentials`), one client per endpoint within a process, and a
fresh connection pool for every client in a forked child.

The endpoint comes from ``open_store(..., s3_endpoint=...)`` or the ``AWS_ENDPOINT_URL`` environment variable;
credentials from ``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY`` (the optional Kubernetes Secret fills them in the
cluster), else the ``~/.aws`` profile, the web identity token (IRSA) or the instance role; they are never logged or
put in configs. Connections and reads time out after
``FOURM_STORAGE_CONNECT_TIMEOUT_S`` / ``FOURM_STORAGE_READ_TIMEOUT_S`` (5 s / 30 s).
"""

from __future__ import annotations

import os
import weakref
from urllib.parse import urlparse

from fourm_kfp.storage import metering
from fourm_kfp.storage.base import StorageError
from fourm_kfp.storage.credentials import credential_chain
from fourm_kfp.storage.retries import env_seconds


def _http_client():
    """urllib3 pool for minio: short timeouts, no retries of its own (``with_retries`` is the one layer), every
    request counted by :mod:`.metering`."""
    import certifi
    import urllib3

    class MeteredPoolManager(urllib3.PoolManager):
        def urlopen(self, method, url, redirect=True, **kw):
            sent = metering.body_length(kw.get("body"))
            try:
                response = super().urlopen(method, url, redirect=redirect, **kw)
            except BaseException:
                metering.record(method, url, sent, 0)  # an attempt that got no answer is a request too
                raise
            length = response.headers.get("Content-Length") if method.upper() != "HEAD" else None
            metering.record(method, url, sent, int(length or 0))
            return response

    timeout = urllib3.Timeout(connect=env_seconds("FOURM_STORAGE_CONNECT_TIMEOUT_S", 5.0),
                              read=env_seconds("FOURM_STORAGE_READ_TIMEOUT_S", 30.0))
    return MeteredPoolManager(timeout=timeout, retries=urllib3.Retry(total=0, redirect=0, raise_on_status=False),
                              maxsize=16, cert_reqs="CERT_REQUIRED", ca_certs=os.environ.get("SSL_CERT_FILE")
                              or certifi.where())


def default_endpoint() -> str:
    """The S3 endpoint of the environment (``AWS_ENDPOINT_URL``, else ``MLFLOW_S3_ENDPOINT_URL``), or ``""``."""
    return os.environ.get("AWS_ENDPOINT_URL") or os.environ.get("MLFLOW_S3_ENDPOINT_URL") or ""


def s3_client(endpoint: str | None = None):
    """A minio client for ``endpoint`` (or ``AWS_ENDPOINT_URL``) with credentials from the standard chain."""
    from minio import Minio

    endpoint = endpoint or default_endpoint()
    if not endpoint:
        raise StorageError("s3:// URI given but no S3 endpoint: pass --s3-endpoint or set AWS_ENDPOINT_URL")
    parsed = urlparse(endpoint if "://" in endpoint else f"http://{endpoint}")
    credentials, _source = credential_chain()
    # An explicit region avoids a GetBucketLocation call, which some S3 servers answer in a form minio can't parse.
    client = Minio(
        parsed.netloc,
        credentials=credentials,
        secure=parsed.scheme == "https",
        region=os.environ.get("AWS_DEFAULT_REGION") or os.environ.get("AWS_REGION") or "us-east-1",
        http_client=_http_client(),
    )
    _LIVE_CLIENTS.add(client)
    return client


#: The client of each endpoint (``""``: the environment's), shared within the process; tests clear it when they
#: change the environment.
_CLIENTS: dict[str, object] = {}


def shared_client(endpoint: str | None = None):
    """The process's one client for ``endpoint`` (or the environment's endpoint), made on first use."""
    endpoint = endpoint or default_endpoint()
    if endpoint not in _CLIENTS:
        _CLIENTS[endpoint] = s3_client(endpoint or None)
    return _CLIENTS[endpoint]


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
