"""Shared fixtures: a real S3 server (``rclone serve s3``) started for the session and S3 environment helpers, and
two fresh smoke runs of the whole pipeline: one on local disk that every test reads and none changes, and one on the
S3 server that the determinism test compares with it and the S3 end-to-end test then reruns; and how ``make test``
(``pytest -n logical --dist loadgroup --no-loadscope-reorder``) deals the tests out to its pytest-xdist workers.

Each xdist worker is its own session: a session or module fixture is computed once per worker that runs a test
needing it. So the workers get whole units (:func:`_worker_unit`): a module (its module fixtures computed once),
split by the parameters of its module-scoped fixtures (each parameter's fixture is its own work), and one unit for
the tests of the second smoke run, which also keeps their order: the S3 end-to-end test reruns the pipeline on that
run's store (``--force`` rewrites a stage, a rerun registers a new model version) after the determinism test has
read it. The read-only run is made once for all the workers (:func:`fresh_smoke_run`). The units holding slow tests
go first, so that no long unit starts last.

Each worker, and every process its tests start, computes on its share of the CPUs (:func:`pytest_configure`): two
workers of two torch threads each on two cores spent 8 times longer on a small tokenizer's training step than one
thread each (24 s against 3 s for 150 steps, 2026-12-02, 2-core EPYC), the threads of one spinning while the other's
held the core."""

from __future__ import annotations

import json
import os
import shutil
import uuid
from pathlib import Path

import pytest
import torch

from fourm_kfp import storage
from fourm_kfp.allocator import reuse_freed_memory
from fourm_kfp.testing import LocalS3, serve_s3
from tests.smoke_runs import SECOND_RUN_WIDTHS, run_smoke
from tests.worker_sharing import made_once

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


#: the work unit of every test that uses the session's second smoke run (see the module docstring)
SECOND_SMOKE_UNIT = "second-smoke-run"
#: in each xdist worker's base temp folder's parent (the controller's), the units that worker collected
UNITS_FILE = "xdist-units-{worker}.json"


def _worker_unit(item: pytest.Item) -> str:
    """The work unit of ``item``: :data:`SECOND_SMOKE_UNIT`, else its module and the indices of the parameters of
    its module- or session-scoped fixtures (``tests/test_learning.py:scene_model#0``)."""
    if "second_smoke_run" in item.fixturenames:
        return SECOND_SMOKE_UNIT
    module = item.nodeid.split("::")[0]
    callspec = getattr(item, "callspec", None)
    if callspec is None:
        return module
    fixtures = item._fixtureinfo.name2fixturedefs
    wide = [f"{name}#{callspec.indices[name]}" for name in sorted(callspec.params)
            if name in fixtures and fixtures[name][-1].scope in ("module", "package", "session")]
    return f"{module}:{','.join(wide)}" if wide else module


def pytest_configure(config: pytest.Config) -> None:
    """The test process keeps the memory it frees for reuse, as every stage's process does
    (:func:`fourm_kfp.allocator.reuse_freed_memory`): the learning tests' 2000-step trainings otherwise faulted in
    their fresh tensors' pages at every step (450,000 faults and 1.0 s of system time in 200 steps, against 85,000 and
    0.17 s). In an xdist worker: torch's intra-op threads, and ``OMP_NUM_THREADS`` for the processes its tests start (a
    pipeline's steps, torchrun's ranks), set to the worker's share of the CPUs, at least one; a test that sets its own
    keeps it. A run without ``-n`` keeps torch's default (every CPU)."""
    reuse_freed_memory()
    if not hasattr(config, "workerinput"):
        return
    threads = max(1, len(os.sched_getaffinity(0)) // int(config.workerinput["workercount"]))
    os.environ["OMP_NUM_THREADS"] = str(threads)
    torch.set_num_threads(threads)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """In an xdist worker: the units holding a ``slow`` or ``learning`` test first, each keeping its tests' order, and
    every test's unit written down for the controller's scheduler (:func:`pytest_xdist_make_scheduler`). The second
    smoke run's unit comes first of all and the units reading the shared fresh run next, so that the first two
    workers make the two runs at the same time. Every worker computes the same order, as xdist requires; a run
    without ``-n`` is left as collected."""
    if not hasattr(config, "workerinput"):
        return
    units = {item: _worker_unit(item) for item in items}
    slow = {units[item] for item in items if item.get_closest_marker("slow") or item.get_closest_marker("learning")}
    fresh = {units[item] for item in items if "fresh_smoke_run" in item.fixturenames} - {SECOND_SMOKE_UNIT}

    def rank(item: pytest.Item) -> int:
        unit = units[item]
        return 0 if unit == SECOND_SMOKE_UNIT else 1 if unit in fresh else 2 if unit in slow else 3

    items.sort(key=rank)
    written = Path(config.option.basetemp).parent / UNITS_FILE.format(worker=config.workerinput["workerid"])
    written.with_suffix(".part").write_text(json.dumps({item.nodeid: units[item] for item in items}))
    written.with_suffix(".part").replace(written)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """``--dist loadgroup``: xdist's scope scheduling over this suite's units (:func:`_worker_unit`), which xdist's
    own ``xdist_group`` marks cannot carry under pytest 9 (xdist 3.8 renames the node id through ``item._nodeid``,
    which pytest 9 no longer reads). Units are dealt out in collection order (``--no-loadscope-reorder``)."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    basetemp = config._tmp_path_factory.getbasetemp()

    class UnitScheduling(LoadScopeScheduling):
        units: dict[str, str] | None = None

        def _split_scope(self, nodeid: str) -> str:
            if self.units is None:  # the workers have all collected (and written their units) before this
                written = sorted(basetemp.glob(UNITS_FILE.format(worker="*")))
                self.units = json.loads(written[0].read_text()) if written else {}
            return self.units.get(nodeid, nodeid.split("::")[0])

    return UnitScheduling(config, log)


@pytest.fixture(scope="session", autouse=True)
def _run_cache_folder(tmp_path_factory, worker_id) -> None:
    """``XDG_CACHE_HOME`` of this test run, for every test and every process a test starts: one folder for all the
    xdist workers, so the migrated empty MLflow store (:mod:`fourm_kfp.contract.sqlite_tracking`) is built once per
    run, and nothing lands in the developer's own cache folder."""
    base = tmp_path_factory.getbasetemp()
    os.environ["XDG_CACHE_HOME"] = str((base if worker_id == "master" else base.parent) / "xdg-cache")


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory) -> LocalS3:
    """A real S3 endpoint on loopback, backed by a temp folder; stopped at the end of the session."""
    with serve_s3(tmp_path_factory.mktemp("s3-data"), S3_KEY, S3_SECRET) as server:
        yield server


@pytest.fixture(scope="session")
def fresh_smoke_run(tmp_path_factory, worker_id) -> dict:
    """``fourm-kfp run --preset smoke`` from an empty run folder, once for all the xdist workers
    (:func:`~tests.worker_sharing.made_once`): its summary, with ``root``. No test changes its payloads: the
    determinism test compares it with a second fresh run and verifies it, others read its model, its MLflow records
    and its KFP outputs."""
    return made_once(tmp_path_factory, worker_id, "fresh-smoke", run_smoke,
                     save=lambda summary, path: path.write_text(json.dumps(summary)),
                     load=lambda path: json.loads(path.read_text()))


@pytest.fixture(scope="session")
def second_smoke_run(tmp_path_factory, s3_server) -> dict:
    """Another ``fourm-kfp run --preset smoke`` from an empty run folder, with its outputs on the S3 server (a new
    bucket) and two workers for each fan-out stage (:data:`tests.smoke_runs.SECOND_RUN_WIDTHS`, which move no
    address), in this worker (its tests are one unit): its summary, with ``root``, ``store`` and ``endpoint``. The
    determinism test compares it with :func:`fresh_smoke_run`, then the S3 end-to-end test reruns the pipeline on it
    (reuse, ``--force``, a parameter change: each leaves the first run's payloads as they were)."""
    store = f"s3://second-{uuid.uuid4().hex[:12]}/runs"
    summary = run_smoke(tmp_path_factory.mktemp("second-smoke"), "--store", store, "--s3-endpoint", s3_server.endpoint,
                        *SECOND_RUN_WIDTHS, env={**os.environ, **s3_server.env()})
    return {**summary, "store": store, "endpoint": s3_server.endpoint}


@pytest.fixture(scope="session")
def migrated_tracking_db(tmp_path_factory, worker_id) -> Path:
    """An empty MLflow SQLite store with every schema migration applied, made once for all the xdist workers: a new
    store runs MLflow's migrations one by one (6 s on a loaded 2-core machine), a copy of this one opens in 0.1 s."""
    from mlflow.tracking import MlflowClient

    def make(folder: Path) -> Path:
        folder.mkdir(parents=True, exist_ok=True)
        MlflowClient(f"sqlite:///{folder / 'mlflow.db'}").search_experiments()
        return folder / "mlflow.db"

    return made_once(tmp_path_factory, worker_id, "mlflow-store", make,
                     save=lambda made, path: shutil.copyfile(made, path), load=lambda path: path)


@pytest.fixture
def tracking(tmp_path, migrated_tracking_db) -> str:
    """A new, empty MLflow SQLite tracking store of this test's own (a copy of :func:`migrated_tracking_db`)."""
    shutil.copyfile(migrated_tracking_db, tmp_path / "mlflow.db")
    return f"sqlite:///{tmp_path / 'mlflow.db'}"


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
