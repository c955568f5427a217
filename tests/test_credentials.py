"""S3 credentials through the standard chain (:mod:`fourm_kfp.storage.credentials`), against the real S3 server of
the tests (``rclone serve s3``, which refuses a wrong key): the environment, a ``~/.aws/credentials`` profile, a web
identity token exchanged at a loopback STS, and a machine with none (a fast error naming what was tried, with no
connection to the instance metadata service). ``tests/conftest.py`` empties the chain for every test (no profile
file, no token, IMDS disabled); each test here sets what it needs."""

from __future__ import annotations

import threading
import time
import uuid
from datetime import datetime, timedelta, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

import pytest

from fourm_kfp import storage
from fourm_kfp.pipeline_runs.doctor_checks import OK, SKIPPED, DoctorRequest
from fourm_kfp.pipeline_runs.doctor_services import check_s3
from fourm_kfp.storage import StorageError, credential_chain

CHAIN_VARS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_SHARED_CREDENTIALS_FILE",
              "AWS_PROFILE", "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_ROLE_ARN", "AWS_ENDPOINT_URL_STS")


@pytest.fixture
def no_credentials(tmp_path, monkeypatch, s3_server):
    """The S3 server's endpoint and an empty home: nothing in the chain yet."""
    for var in CHAIN_VARS:
        monkeypatch.delenv(var, raising=False)
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_server.endpoint)
    storage._CLIENTS.clear()
    yield home
    storage._CLIENTS.clear()


def write_profiles(home, profiles: dict[str, tuple[str, str]]) -> None:
    (home / ".aws").mkdir()
    (home / ".aws" / "credentials").write_text("".join(
        f"[{name}]\naws_access_key_id = {key}\naws_secret_access_key = {secret}\n\n"
        for name, (key, secret) in profiles.items()))


def round_trip(s3_server) -> bytes:
    """Create a bucket, write an object with a fresh client of the chain, and read it back from the server's disk."""
    bucket = f"cred-{uuid.uuid4().hex[:10]}"
    store = storage.S3Store(f"s3://{bucket}/x", storage.s3_client(), retries=0)
    store.ensure_bucket()
    store.put_bytes("obj", b"written")
    return (s3_server.data_dir / bucket / "x" / "obj").read_bytes()


def test_environment_keys_come_first(no_credentials, s3_server, monkeypatch):
    write_profiles(no_credentials, {"default": ("wrong-key", "wrong-secret")})
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", s3_server.access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3_server.secret_key)
    assert credential_chain()[1].startswith("environment")
    assert round_trip(s3_server) == b"written"


def test_half_of_the_environment_keys_is_an_error(no_credentials, monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "only-the-id")
    with pytest.raises(StorageError, match="AWS_SECRET_ACCESS_KEY is not"):
        credential_chain()


def test_the_aws_profile_is_used_and_a_wrong_key_is_refused(no_credentials, s3_server, monkeypatch):
    write_profiles(no_credentials, {"default": ("wrong-key", "wrong-secret"),
                                    "fourm": (s3_server.access_key, s3_server.secret_key)})
    monkeypatch.setenv("AWS_PROFILE", "fourm")
    assert credential_chain()[1] == "profile [fourm] of ~/.aws/credentials"
    assert round_trip(s3_server) == b"written"

    monkeypatch.delenv("AWS_PROFILE")  # the default profile, whose key the server does not know
    storage._CLIENTS.clear()
    assert credential_chain()[1] == "profile [default] of ~/.aws/credentials"
    with pytest.raises(StorageError) as refused:
        round_trip(s3_server)
    assert "wrong-secret" not in str(refused.value)


def test_a_shared_credentials_file_elsewhere(no_credentials, s3_server, tmp_path, monkeypatch):
    elsewhere = tmp_path / "creds.ini"
    elsewhere.write_text(f"[default]\naws_access_key_id = {s3_server.access_key}\n"
                         f"aws_secret_access_key = {s3_server.secret_key}\n")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(elsewhere))
    assert credential_chain()[1] == f"profile [default] of {elsewhere}"
    assert round_trip(s3_server) == b"written"


def test_none_found_names_each_link_fast_and_never_reaches_imds(no_credentials, monkeypatch):
    import urllib3.util.connection

    dialled = []

    def no_network(address, *args, **kwargs):
        dialled.append(address[0])
        raise OSError(f"test: no connection to {address[0]}")

    monkeypatch.setattr(urllib3.util.connection, "create_connection", no_network)
    start = time.monotonic()
    with pytest.raises(StorageError) as disabled:
        credential_chain()
    assert time.monotonic() - start < 2 and dialled == []
    message = str(disabled.value)
    assert "environment ($AWS_ACCESS_KEY_ID, $AWS_SECRET_ACCESS_KEY): not set" in message
    assert "profile [default] of ~/.aws/credentials" in message
    assert "instance role (IMDS): $AWS_EC2_METADATA_DISABLED is set" in message

    # Without the switch the last link asks IMDS, once, and gives up at once when it cannot connect.
    monkeypatch.delenv("AWS_EC2_METADATA_DISABLED")
    with pytest.raises(StorageError, match=r"instance role \(IMDS\): unreachable"):
        credential_chain()
    assert dialled == ["169.254.169.254"]


class FakeSts(BaseHTTPRequestHandler):
    """AWS STS ``AssumeRoleWithWebIdentity`` on loopback, as documented in the STS API reference
    (https://docs.aws.amazon.com/STS/latest/APIReference/API_AssumeRoleWithWebIdentity.html): ``RoleArn``,
    ``RoleSessionName`` and ``WebIdentityToken`` are required (else 400); a token it did not issue is refused (403);
    the answer is the documented ``AssumeRoleWithWebIdentityResponse`` XML."""

    token = ""
    role_arn = ""
    keys: tuple[str, str] = ("", "")

    def do_POST(self):
        query = {k: v[0] for k, v in parse_qs(urlparse(self.path).query).items()}
        if query.get("Action") != "AssumeRoleWithWebIdentity" or not all(
                query.get(p) for p in ("RoleArn", "RoleSessionName", "WebIdentityToken")):
            return self._answer(400, "<ErrorResponse><Error><Code>MissingParameter</Code></Error></ErrorResponse>")
        if query["WebIdentityToken"] != self.token or query["RoleArn"] != self.role_arn:
            return self._answer(403, "<ErrorResponse><Error><Code>AccessDenied</Code></Error></ErrorResponse>")
        expires = (datetime.now(timezone.utc) + timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
        self._answer(200, '<AssumeRoleWithWebIdentityResponse xmlns="https://sts.amazonaws.com/doc/2011-06-15/">'
                          "<AssumeRoleWithWebIdentityResult><Credentials>"
                          f"<AccessKeyId>{self.keys[0]}</AccessKeyId><SecretAccessKey>{self.keys[1]}</SecretAccessKey>"
                          f"<SessionToken>session-token</SessionToken><Expiration>{expires}</Expiration>"
                          "</Credentials></AssumeRoleWithWebIdentityResult></AssumeRoleWithWebIdentityResponse>")

    def _answer(self, status: int, body: str):
        data = body.encode()
        self.send_response(status)
        self.send_header("Content-Type", "text/xml")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


def test_a_web_identity_token_is_exchanged_for_keys(no_credentials, s3_server, tmp_path, monkeypatch):
    """IRSA: the service account's projected token and role, exchanged at STS ($AWS_ENDPOINT_URL_STS, here a
    loopback one) for the keys the S3 server knows; a token STS refuses is a clear error that does not show it."""
    token_file = tmp_path / "token"
    token_file.write_text("projected-service-account-token")
    handler = type("Sts", (FakeSts,), {"token": "projected-service-account-token",
                                       "role_arn": "arn:aws:iam::123456789012:role/fourm",
                                       "keys": (s3_server.access_key, s3_server.secret_key)})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        monkeypatch.setenv("AWS_WEB_IDENTITY_TOKEN_FILE", str(token_file))
        monkeypatch.setenv("AWS_ROLE_ARN", "arn:aws:iam::123456789012:role/fourm")
        monkeypatch.setenv("AWS_ENDPOINT_URL_STS", f"http://127.0.0.1:{server.server_address[1]}")
        assert credential_chain()[1].startswith("web identity token")
        assert round_trip(s3_server) == b"written"

        token_file.write_text("a-token-sts-never-issued")
        with pytest.raises(StorageError, match=r"web identity token .*403") as refused:
            credential_chain()
        assert "a-token-sts-never-issued" not in str(refused.value)
    finally:
        server.shutdown()
        server.server_close()


def test_doctor_uses_the_chain(no_credentials, s3_server, monkeypatch):
    request = DoctorRequest(parameters={"store_uri": f"s3://doctor-{uuid.uuid4().hex[:8]}/root"})
    # the bucket: made with the server's keys, then the keys leave the environment
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", s3_server.access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3_server.secret_key)
    storage.open_store(request.parameters["store_uri"], create=True)
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    storage._CLIENTS.clear()

    skipped = check_s3(request, {})
    assert skipped.state == SKIPPED and "tried environment" in skipped.detail and "profile [default]" in skipped.detail

    write_profiles(no_credentials, {"default": (s3_server.access_key, s3_server.secret_key)})
    storage._CLIENTS.clear()
    found = check_s3(request, {})
    assert found.state == OK and "credentials: profile [default] of ~/.aws/credentials" in found.detail
