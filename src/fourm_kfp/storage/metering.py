"""What this process asked of S3: requests by kind and bytes up and down, counted on the wire.

Every S3 request of the process goes through the connection pool of :mod:`.client`, which counts it here: one count
per HTTP request sent (a retried call counts each attempt, a listing each page, a multipart upload each part), its
body's bytes as ``bytes_up`` and the response's ``Content-Length`` as ``bytes_down``. The kinds follow the S3 API:

=====================  ==========================================================
``list``               ListObjects (one page of up to 1,000 keys)
``get``                GetObject, whole or a byte range
``stat``               HeadObject
``put``                PutObject (one request, small objects)
``multipart_start``    CreateMultipartUpload
``multipart_part``     UploadPart
``multipart_complete`` CompleteMultipartUpload
``multipart_abort``    AbortMultipartUpload
``delete``             DeleteObject
``delete_batch``       DeleteObjects (up to 1,000 keys a request)
``bucket``             HeadBucket, CreateBucket and other bucket calls
=====================  ==========================================================

Read it with :func:`snapshot` (totals since the process started) and :func:`since` (what happened after an earlier
snapshot): the stage runner records each stage's own counts in its manifest (``storage``) and its MLflow run.
Counts are per process: a stage's worker processes that talk to S3 themselves (the train-tokenizers pool) count in
their own process, not in the stage's.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from urllib.parse import parse_qs, urlsplit

_LOCK = threading.Lock()


@dataclass
class Usage:
    """S3 requests by kind and bytes moved."""

    requests: dict[str, int] = field(default_factory=dict)
    bytes_up: int = 0
    bytes_down: int = 0

    @property
    def total_requests(self) -> int:
        return sum(self.requests.values())

    def minus(self, earlier: "Usage") -> "Usage":
        kinds = set(self.requests) | set(earlier.requests)
        requests = {k: self.requests.get(k, 0) - earlier.requests.get(k, 0) for k in sorted(kinds)}
        return Usage({k: n for k, n in requests.items() if n}, self.bytes_up - earlier.bytes_up,
                     self.bytes_down - earlier.bytes_down)

    def plus(self, other: "Usage") -> "Usage":
        kinds = sorted(set(self.requests) | set(other.requests))
        return Usage({k: self.requests.get(k, 0) + other.requests.get(k, 0) for k in kinds},
                     self.bytes_up + other.bytes_up, self.bytes_down + other.bytes_down)

    def to_dict(self) -> dict:
        return {"requests": dict(sorted(self.requests.items())), "requests_total": self.total_requests,
                "bytes_up": self.bytes_up, "bytes_down": self.bytes_down}

    @classmethod
    def from_dict(cls, data: dict | None) -> "Usage":
        data = data or {}
        return cls(dict(data.get("requests", {})), int(data.get("bytes_up", 0)), int(data.get("bytes_down", 0)))


_TOTAL = Usage()


def request_kind(method: str, url: str) -> str:
    """The S3 operation an HTTP request is (see the module docstring's table)."""
    parts = urlsplit(url)
    query = parse_qs(parts.query, keep_blank_values=True)
    path = parts.path.strip("/")
    has_object = "/" in path  # path-style addressing: /<bucket>/<key>
    method = method.upper()
    if method == "GET":
        return "get" if has_object else ("list" if "list-type" in query or "prefix" in query else "bucket")
    if method == "HEAD":
        return "stat" if has_object else "bucket"
    if method == "PUT":
        if not has_object:
            return "bucket"
        return "multipart_part" if "partNumber" in query else "put"
    if method == "POST":
        if "delete" in query:
            return "delete_batch"
        if "uploads" in query:
            return "multipart_start"
        return "multipart_complete" if "uploadId" in query else "post"
    if method == "DELETE":
        return "multipart_abort" if "uploadId" in query else ("delete" if has_object else "bucket")
    return method.lower()


def record(method: str, url: str, body_bytes: int, response_bytes: int) -> None:
    """Count one request (called by the S3 client's connection pool)."""
    kind = request_kind(method, url)
    with _LOCK:
        _TOTAL.requests[kind] = _TOTAL.requests.get(kind, 0) + 1
        _TOTAL.bytes_up += body_bytes
        _TOTAL.bytes_down += response_bytes


def snapshot() -> Usage:
    """This process's S3 usage so far."""
    with _LOCK:
        return Usage(dict(_TOTAL.requests), _TOTAL.bytes_up, _TOTAL.bytes_down)


def since(earlier: Usage) -> Usage:
    """What this process asked of S3 after ``earlier`` (a :func:`snapshot`)."""
    return snapshot().minus(earlier)


def body_length(body) -> int:
    """The byte length of a request body as urllib3 takes it (bytes, str, a file-like object or nothing)."""
    if body is None:
        return 0
    if isinstance(body, (bytes, bytearray, memoryview)):
        return len(body)
    if isinstance(body, str):
        return len(body.encode("utf-8"))
    try:
        return len(body)
    except TypeError:
        return 0
