"""The storage module against local disk and a real S3 server (rclone serve s3)."""

from __future__ import annotations

import os
import time

import pytest

from fourm_kfp import storage
from fourm_kfp.distributed import free_port
from fourm_kfp.storage import StorageError, open_store


def test_put_get_list_delete(any_store_uri, tmp_path):
    store = open_store(any_store_uri, create=True)
    store.put_bytes("a/one.bin", b"1" * 10)
    store.put_text("a/b/two.txt", "two")
    src = tmp_path / "three"
    src.write_bytes(b"3" * 1000)
    store.put_file("c/three", src)

    assert store.list() == ["a/b/two.txt", "a/one.bin", "c/three"]
    assert store.list("a") == ["a/b/two.txt", "a/one.bin"]
    assert store.child("a").list() == ["b/two.txt", "one.bin"]
    assert store.exists("a/one.bin") and not store.exists("a/nothing")
    assert store.size("c/three") == 1000
    assert store.get_text("a/b/two.txt") == "two"
    with store.open_read("c/three") as fh:
        assert fh.read() == b"3" * 1000
    store.get_file("a/one.bin", tmp_path / "out" / "one")
    assert (tmp_path / "out" / "one").read_bytes() == b"1" * 10
    assert store.child("a", "b").uri == store.uri_of("a/b")

    assert store.delete_prefix("a") == 2
    assert store.list() == ["c/three"]


def test_missing_object_error_names_the_uri(any_store_uri):
    store = open_store(any_store_uri, create=True)
    with pytest.raises(StorageError, match="nothing.bin"):
        store.get_bytes("nothing.bin")


def test_local_writes_are_atomic(tmp_path):
    store = open_store(str(tmp_path))
    store.put_bytes("x", b"old")

    class Boom(Exception):
        pass

    def failing_write(fh):
        fh.write(b"half")
        raise Boom

    with pytest.raises(Boom):
        store._atomic_write("x", failing_write)
    assert store.get_bytes("x") == b"old"
    assert store.list() == ["x"]  # no temp file left behind


def test_transient_errors_are_retried_then_reported(monkeypatch):
    monkeypatch.setattr(time, "sleep", lambda s: None)
    calls = []

    def flaky():
        calls.append(1)
        if len(calls) < 3:
            raise ConnectionResetError("reset by peer")
        return "ok"

    assert storage.with_retries(flaky, "get s3://b/k", retries=5) == "ok"
    assert len(calls) == 3

    def always_down():
        raise ConnectionRefusedError("refused")

    with pytest.raises(StorageError, match=r"get s3://b/k: still failing after 3 attempts"):
        storage.with_retries(always_down, "get s3://b/k", retries=2)

    def permanent():
        raise PermissionError("denied")

    calls.clear()
    with pytest.raises(StorageError, match="denied"):
        storage.with_retries(lambda: calls.append(1) or permanent(), "put s3://b/k")
    assert len(calls) == 1  # not retried


def test_without_a_setting_a_dead_endpoint_is_given_up_after_60_seconds(monkeypatch):
    """The default deadline (FOURM_STORAGE_DEADLINE_S unset), on a clock that the retries' sleeps advance: calls
    go on until the next wait would pass 60 s after the first failure, and the error says the deadline."""
    monkeypatch.delenv("FOURM_STORAGE_DEADLINE_S", raising=False)
    clock = [1000.0]
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(time, "sleep", lambda seconds: clock.__setitem__(0, clock[0] + seconds))
    calls = []

    def dead():
        calls.append(clock[0])
        raise ConnectionRefusedError("refused")

    with pytest.raises(StorageError, match=r"FOURM_STORAGE_DEADLINE_S=60\)") as err:
        storage.with_retries(dead, "get s3://b/k")
    given_up = calls[-1] - calls[0]
    assert 40 <= given_up <= 60, f"gave up {given_up:.0f}s after the first failure"  # waits of at most 15 s
    assert f"still failing after {len(calls)} attempts, {given_up:.0f}s after the first failure" in str(err.value)


def test_server_errors_without_an_s3_body_are_retried(monkeypatch):
    """minio raises ``InvalidResponseError`` for a status whose body is not ``application/xml``: rclone's 500
    InternalError sent as ``text/xml`` (seen once on a rank's checkpoint PUT in the pod-contract test), a proxy's
    503 page."""
    from minio.error import InvalidResponseError

    monkeypatch.setattr(time, "sleep", lambda s: None)
    internal = InvalidResponseError(500, "text/xml; charset=utf-8", "<Error><Code>InternalError</Code></Error>")
    assert storage.is_transient(internal)
    assert storage.is_transient(InvalidResponseError(503, "text/html", "<html>busy</html>"))
    assert storage.is_transient(InvalidResponseError(429, "text/plain", "slow down"))
    assert not storage.is_transient(InvalidResponseError(403, "text/html", "<html>forbidden</html>"))
    calls = []

    def flaky():
        calls.append(1)
        if len(calls) < 2:
            raise internal
        return "ok"

    assert storage.with_retries(flaky, "put s3://b/k", retries=5) == "ok" and len(calls) == 2

    def forbidden():
        calls.append(1)
        raise InvalidResponseError(403, "text/html", "forbidden")

    calls.clear()
    with pytest.raises(StorageError, match="forbidden"):
        storage.with_retries(forbidden, "get s3://b/k")
    assert len(calls) == 1  # not retried


def test_s3_needs_endpoint_and_credentials(monkeypatch):
    storage._CLIENTS.clear()
    for var in ("AWS_ENDPOINT_URL", "MLFLOW_S3_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(StorageError, match="no S3 endpoint"):
        open_store("s3://bucket/x")
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:1")
    with pytest.raises(StorageError, match="AWS_ACCESS_KEY_ID"):
        open_store("s3://bucket/x")
    storage._CLIENTS.clear()


def test_s3_objects_land_in_the_bucket(s3_uri, s3_env):
    store = open_store(s3_uri)
    store.put_bytes("k/v.txt", b"hello")
    bucket, prefix = s3_uri.removeprefix("s3://").split("/", 1)
    assert (s3_env.data_dir / bucket / prefix / "k" / "v.txt").read_bytes() == b"hello"


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_gets_s3_connections_of_its_own(s3_uri):
    """A DataLoader worker is a fork: sharing the parent's pooled keep-alive sockets, parent and child read each
    other's responses (a shard that is "not a tar", without an error). The child gets a fresh pool."""
    store = open_store(s3_uri)
    store.put_bytes("k", b"payload")
    assert store.get_bytes("k") == b"payload"  # leaves a keep-alive connection in the pool
    pool = store.client._http
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report and leave without running pytest's exit handlers
        try:
            ok = store.client._http is not pool and open_store(s3_uri).get_bytes("k") == b"payload"
            os.write(write_end, b"1" if ok else b"0")
        finally:
            os._exit(0)
    os.close(write_end)
    answer = os.read(read_end, 1)
    os.close(read_end)
    os.waitpid(pid, 0)
    assert answer == b"1"
    assert store.client._http is pool and store.get_bytes("k") == b"payload"  # the parent keeps its own


def test_write_survives_an_endpoint_that_comes_up_late(tmp_path, monkeypatch, caplog):
    """A real outage: the S3 server is down when the write starts and up a moment later."""
    import threading
    import time

    from fourm_kfp.testing import serve_s3

    port, ready, stop = free_port(), threading.Event(), threading.Event()

    def late_server():
        time.sleep(1.5)
        with serve_s3(tmp_path, "late-key", "late-secret", port=port):
            ready.set()
            stop.wait(60)

    thread = threading.Thread(target=late_server, daemon=True)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "late-key")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "late-secret")
    storage._CLIENTS.clear()
    store = storage.S3Store("s3://late/x", storage.s3_client(f"http://127.0.0.1:{port}"), retries=6, backoff_s=0.3)
    thread.start()
    try:
        start = time.monotonic()
        store.ensure_bucket()
        store.put_bytes("obj", b"made it")
        # The server process starts 1.5 s in; `ready` is set only once serve_s3 has seen the port open, which can
        # be a poll interval after the client got through, so the outage is shown by the time and the retries.
        assert time.monotonic() - start >= 1.0
        assert any("retrying" in r.getMessage() for r in caplog.records), "the write never met the outage"
        assert ready.wait(15)
        assert (tmp_path / "late" / "x" / "obj").read_bytes() == b"made it"
    finally:
        stop.set()
        thread.join(15)
        storage._CLIENTS.clear()


class _SilentServer:
    """A loopback socket that accepts connections and never answers (a hung endpoint); stopped on exit."""

    def __init__(self):
        import socket
        import threading

        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.clients, self.stop = [], threading.Event()
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self):
        self.sock.settimeout(0.2)
        while not self.stop.is_set():
            try:
                self.clients.append(self.sock.accept()[0])
            except OSError:
                continue

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()
        for c in self.clients:
            c.close()
        self.sock.close()


@pytest.mark.parametrize("endpoint_kind", ["closed port", "never answers"])
def test_an_unreachable_endpoint_fails_within_the_deadline_naming_it(monkeypatch, endpoint_kind):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "fourm-key")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "fourm-secret")
    monkeypatch.setenv("FOURM_STORAGE_DEADLINE_S", "3")
    monkeypatch.setenv("FOURM_STORAGE_CONNECT_TIMEOUT_S", "1")
    monkeypatch.setenv("FOURM_STORAGE_READ_TIMEOUT_S", "1")
    storage._CLIENTS.clear()
    server = _SilentServer() if endpoint_kind == "never answers" else None
    port = server.port if server else free_port()
    endpoint = f"http://127.0.0.1:{port}"
    start = time.monotonic()
    try:
        with pytest.raises(storage.StorageError) as err:
            storage.open_store("s3://bucket/runs", s3_endpoint=endpoint).put_bytes("x.txt", b"hello")
    finally:
        if server:
            server.__exit__(None, None, None)
        storage._CLIENTS.clear()
    seconds = time.monotonic() - start
    message = str(err.value)
    assert f"put s3://bucket/runs/x.txt at S3 endpoint {endpoint}" in message
    assert "FOURM_STORAGE_DEADLINE_S=3" in message and "--s3-endpoint" in message
    assert seconds < 15, f"took {seconds:.1f}s against a 3 s deadline"


def test_the_cli_reports_an_unreachable_store_in_one_line(tmp_path):
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = {**os.environ, "AWS_ACCESS_KEY_ID": "k1-key", "AWS_SECRET_ACCESS_KEY": "s1-secret",
           "FOURM_STORAGE_DEADLINE_S": "2", "MLFLOW_TRACKING_URI": "none"}
    cli = str(Path(sys.executable).parent / "fourm-kfp")
    proc = subprocess.run([cli, "stage", "prepare-data", "--root", str(tmp_path), "--store", "s3://fourm-b/x",
                           "--s3-endpoint", f"http://127.0.0.1:{free_port()}"], capture_output=True, text=True,
                          env=env, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("Error: create bucket s3://fourm-b/x at S3 endpoint http://127")


def test_an_output_names_its_inputs_by_their_place_beside_it():
    from fourm_kfp.storage import output_ref, resolve_uri

    for root in ("/data/runs/demo", "s3://bucket/prefix"):
        ref = output_ref(f"{root}/train-tokenizers/2db6f87ffb6749ee/")
        assert ref == "../../train-tokenizers/2db6f87ffb6749ee"  # the same string in every store
        assert resolve_uri(f"{root}/pretrain/f23e7ab42891697a", ref) == f"{root}/train-tokenizers/2db6f87ffb6749ee"
    assert resolve_uri("/any/where", "s3://bucket/x/y") == "s3://bucket/x/y"  # a full URI stays as it is


def test_a_long_attempt_that_fails_is_retried(monkeypatch):
    """The deadline counts from the first failure: an attempt that ran longer than the whole deadline and then
    failed transiently (a 3-minute upload answered 503) is tried again, not given up at once."""
    calls = []

    def slow_then_fine():
        calls.append(time.monotonic())
        if len(calls) == 1:
            time.sleep(0.3)  # longer than the deadline below
            raise ConnectionResetError("reset after a long transfer")
        return "ok"

    assert storage.with_retries(slow_then_fine, "put s3://b/big", backoff_s=0.01, deadline_s=0.2) == "ok"
    assert len(calls) == 2

    failures = []

    def down():
        failures.append(1)
        raise ConnectionRefusedError("refused")

    started = time.monotonic()
    with pytest.raises(StorageError, match="after the first failure"):
        storage.with_retries(down, "get s3://b/k", backoff_s=0.01, deadline_s=0.2)
    assert time.monotonic() - started < 2 and len(failures) > 1  # still bounded once the server keeps failing


def test_large_objects_move_in_parts_and_prefixes_are_deleted_in_batches(s3_uri, tmp_path, monkeypatch):
    """Above FOURM_STORAGE_PART_MB an upload is a multipart upload and a download ranged GETs, each part a request
    of its own (counted by the meter); the bytes come back whole; a prefix goes in DeleteObjects batches."""
    from fourm_kfp.storage import metering

    monkeypatch.setenv("FOURM_STORAGE_PART_MB", "5")
    store = open_store(s3_uri, create=True)
    payload = os.urandom(12 * (1 << 20) + 12345)  # three parts: 5 + 5 + 2 MiB
    source = tmp_path / "big.bin"
    source.write_bytes(payload)

    before = metering.snapshot()
    store.put_file("big/file.bin", source)
    store.put_bytes("big/bytes.bin", payload)
    upload = metering.since(before)
    assert upload.requests.get("multipart_part") == 6 and upload.requests.get("multipart_start") == 2
    assert upload.requests.get("multipart_complete") == 2 and "put" not in upload.requests
    assert upload.bytes_up >= 2 * len(payload)

    before = metering.snapshot()
    store.get_file("big/file.bin", tmp_path / "back" / "file.bin")
    download = metering.since(before)
    assert (tmp_path / "back" / "file.bin").read_bytes() == payload
    assert store.get_bytes("big/bytes.bin") == payload
    assert download.requests == {"get": 3, "stat": 1} and download.bytes_down == len(payload)
    assert not [p for p in (tmp_path / "back").iterdir() if p.name != "file.bin"]  # no partial file left
    assert store.get_range("big/file.bin", 5 * (1 << 20) - 2, 4) == payload[5 * (1 << 20) - 2:5 * (1 << 20) + 2]

    # rclone 1.75 stops answering after about 900 deletions in one folder (one key or a batch a request alike), so
    # the batches are made small here rather than the folder large
    monkeypatch.setenv("FOURM_STORAGE_DELETE_BATCH", "200")
    for i in range(500):
        store.put_bytes(f"many/{i:05d}", b"x")
    before = metering.snapshot()
    assert store.delete_prefix("many") == 500
    assert metering.since(before).requests == {"list": 1, "delete_batch": 3}
    assert store.list("many") == []


def test_a_part_that_fails_is_retried_alone(s3_uri, tmp_path, monkeypatch):
    """One part's transient failure retries that part, not the whole upload: the object still arrives whole."""
    monkeypatch.setenv("FOURM_STORAGE_PART_MB", "5")
    monkeypatch.setattr(time, "sleep", lambda s: None)
    store = open_store(s3_uri, create=True)
    payload = os.urandom(11 * (1 << 20))
    real_upload = store.client._upload_part
    attempts = []

    def flaky_upload(bucket, name, data, headers, upload_id, number):
        attempts.append(number)
        if number == 2 and attempts.count(2) == 1:
            raise ConnectionResetError("reset in the middle of part 2")
        return real_upload(bucket, name, data, headers, upload_id, number)

    monkeypatch.setattr(store.client, "_upload_part", flaky_upload)
    store.put_bytes("flaky.bin", payload)
    assert sorted(attempts) == [1, 2, 2, 3]
    assert store.get_bytes("flaky.bin") == payload


def test_the_meter_counts_requests_by_kind(s3_uri):
    from fourm_kfp.storage import metering

    store = open_store(s3_uri, create=True)
    before = metering.snapshot()
    store.put_bytes("m/a", b"12345")
    assert store.get_bytes("m/a") == b"12345"
    assert store.exists("m/a") and not store.exists("m/none")
    assert store.list("m") == ["m/a"]
    used = metering.since(before)
    assert used.requests == {"put": 1, "get": 1, "stat": 2, "list": 1}
    assert used.bytes_up == 5 and used.bytes_down >= 5
    assert metering.request_kind("DELETE", "http://h/b/k?uploadId=x") == "multipart_abort"
    before = metering.snapshot()
    store.put_bytes("m/six", b"6" * (6 << 20))  # over minio's own 5 MiB parts, under ours: one PUT
    assert metering.since(before).requests == {"put": 1}


def test_delete_removes_one_object(any_store_uri):
    store = open_store(any_store_uri, create=True)
    store.put_bytes("d/a", b"1")
    store.put_bytes("d/b", b"2")
    store.delete("d/a")
    store.delete("d/none")  # nothing there: no error
    assert store.list("d") == ["d/b"]


def test_list_folders_names_the_folders_below_a_prefix(any_store_uri):
    from fourm_kfp.storage import metering

    store = open_store(any_store_uri, create=True)
    for key in ("train/rgb/shard-000000.tar", "train/rgb/shard-000001.tar", "train/_keys/shard-000000.txt",
                "train/depth/deeper/x.bin", "val/rgb/shard-000000.tar", "top.json"):
        store.put_bytes(key, b"x")
    before = metering.snapshot()
    assert store.list_folders("train") == ["_keys", "depth", "rgb"]
    assert store.list_folders() == ["train", "val"] and store.list_folders("nothing") == []
    if any_store_uri.startswith("s3://"):
        assert metering.since(before).requests == {"list": 3}  # one page each, whatever the folders hold
