"""Shared fixtures: a real S3 server (``rclone serve s3``) started for the session and S3 environment helpers, and
one fresh smoke run of the whole pipeline shared by the end-to-end and determinism tests."""

from __future__ import annotations

import os
import uuid

import pytest

from fourm_kfp import storage
from fourm_kfp.testing import LocalS3, serve_s3
from tests.smoke_runs import run_smoke

S3_KEY, S3_SECRET = "fourm-test-key", "fourm-test-secret"

# The S3 credential chain (fourm_kfp.storage.credentials) of every test and every process a test starts: no
# developer's ~/.aws profile, no web identity token or container credentials from a CI pod, and no instance metadata
# service (botocore's AWS_EC2_METADATA_DISABLED switch), so no test reaches a non-loopback address. A test that
# needs a profile sets AWS_SHARED_CREDENTIALS_FILE or HOME itself.
os.environ["AWS_SHARED_CREDENTIALS_FILE"] = os.devnull
os.environ["AWS_EC2_METADATA_DISABLED"] = "true"
for _var in ("AWS_PROFILE", "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_ROLE_ARN", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
             "AWS_CONTAINER_CREDENTIALS_FULL_URI",
             # and no developer's Hugging Face cache for the teachers (fourm_kfp.labelers.weights.hf_cache_dir)
             "HF_HOME", "HF_HUB_CACHE"):
    os.environ.pop(_var, None)


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory) -> LocalS3:
    """A real S3 endpoint on loopback, backed by a temp folder; stopped at the end of the session."""
    with serve_s3(tmp_path_factory.mktemp("s3-data"), S3_KEY, S3_SECRET) as server:
        yield server


@pytest.fixture(scope="session")
def fresh_smoke_run(tmp_path_factory) -> dict:
    """``fourm-kfp run --preset smoke`` from an empty run folder, once a session: its summary, with ``root``.
    The end-to-end test reruns the pipeline in that folder (reuse, ``--force``, a parameter change: each leaves the
    first run's payloads as they were), the determinism test compares it with a second fresh run and verifies it."""
    return run_smoke(tmp_path_factory.mktemp("fresh-smoke"))


@pytest.fixture
def s3_env(s3_server, monkeypatch) -> LocalS3:
    """The environment a stage gets in the cluster: endpoint and credentials from env vars."""
    for name, value in s3_server.env().items():
        monkeypatch.setenv(name, value)
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


@pytest.fixture
def photo_config(tmp_path):
    """The smoke config over a real-data folder: 12 random photos with caption side files, rgb + caption only."""
    from fourm_kfp.config.loader import load_config
    from tests.photos import write_photo_folder

    photos = write_photo_folder(tmp_path / "photos", good=12)
    only = "[rgb,caption]"
    return load_config("smoke", overrides=[
        "prepare_data.source=image_folder", f"prepare_data.source_uri={photos}", "prepare_data.val_fraction=0.3",
        f"data.modalities={only}", f"data.input_modalities={only}", f"data.target_modalities={only}"])
