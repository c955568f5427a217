"""The one retry layer of S3 calls (the client's own urllib3 retries are off): transient errors (refused or reset
connections, timeouts, 5xx, throttling) are retried with exponential backoff until a deadline,
``FOURM_STORAGE_DEADLINE_S`` (60 s), after which a :class:`~fourm_kfp.storage.base.StorageError` names the endpoint,
the operation and the object.

The deadline counts from the call's **first failure**, not from its first attempt's start: an upload that ran for
three minutes and then failed with a 503 is retried like one that failed at once, and the deadline bounds how long
a call keeps trying once the server has started failing. Large objects move in parts (:mod:`.s3`), each part a call
of its own, so one failed part costs one part again, never the whole object."""

from __future__ import annotations

import logging
import os
import random
import time
from typing import Callable, TypeVar

from fourm_kfp.storage.base import StorageError

log = logging.getLogger("fourm_kfp.storage")
T = TypeVar("T")

#: S3 error codes worth retrying (the server is busy or briefly unavailable).
TRANSIENT_S3_CODES = frozenset({"InternalError", "ServiceUnavailable", "SlowDown", "RequestTimeout", "Throttling"})


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


def env_seconds(name: str, default: float) -> float:
    """A number of seconds from the environment variable ``name`` (``default`` when it is unset or empty)."""
    value = os.environ.get(name, "")
    try:
        return float(value) if value else default
    except ValueError:
        raise StorageError(f"{name}={value!r} is not a number of seconds") from None


def with_retries(fn: Callable[[], T], what: str, retries: int = 1000, backoff_s: float = 0.5,
                 deadline_s: float | None = None) -> T:
    """Call ``fn``; on a transient error wait ``backoff_s * 2**attempt`` (jittered, at most 10 s) and try again,
    until ``deadline_s`` (default ``FOURM_STORAGE_DEADLINE_S``, 60 s) has passed since the first failure."""
    deadline_s = env_seconds("FOURM_STORAGE_DEADLINE_S", 60.0) if deadline_s is None else deadline_s
    first_failure: float | None = None
    for attempt in range(retries + 1):
        try:
            return fn()
        except Exception as exc:
            if not is_transient(exc):
                raise StorageError(f"{what}: {type(exc).__name__}: {exc}") from exc
            now = time.monotonic()
            first_failure = now if first_failure is None else first_failure
            elapsed = now - first_failure
            delay = min(backoff_s * (2**attempt), 10.0) * (0.5 + random.random())
            if attempt == retries or elapsed + delay > deadline_s:
                raise StorageError(
                    f"{what}: still failing after {attempt + 1} attempts, {elapsed:.0f}s after the first failure "
                    f"({type(exc).__name__}: {_short(exc)}); is the endpoint up and is --s3-endpoint / "
                    f"AWS_ENDPOINT_URL right? (deadline FOURM_STORAGE_DEADLINE_S={deadline_s:g})") from exc
            log.warning("%s: %s, retrying in %.1fs", what, type(exc).__name__, delay)
            time.sleep(delay)
    raise AssertionError("unreachable")


def _short(exc: BaseException) -> str:
    text = str(exc)
    return text if len(text) <= 200 else text[:197] + "..."
