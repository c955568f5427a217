"""MLflow's system metrics in the training stage's run: off unless MLflow's switch is on; on, a training run's
MLflow run holds MLflow's ``system/`` metrics, and in a multi-node group each node's, under its own name (two real
gloo ranks as two nodes, a real SQLite store)."""

from __future__ import annotations

import os
import time

import pytest
from mlflow.tracking import MlflowClient

from fourm_kfp.contract import lineage
from fourm_kfp.train.metrics import TrackerSink
from fourm_kfp.train.system_metrics import node_system_metrics

from tests.train.test_training_metrics import CountingLoader, _trainer

@pytest.fixture
def system_metrics_on(monkeypatch):
    pytest.importorskip("psutil", reason="MLflow's system metrics monitors need psutil")
    monkeypatch.setenv("MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING", "true")
    monkeypatch.setenv("MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL", "0.2")


def _system_metrics(uri: str, run_id: str) -> set[str]:
    return {key for key in MlflowClient(tracking_uri=uri).get_run(run_id).data.metrics if key.startswith("system/")}


def _train_in_a_stage_run(tmp_path) -> tuple[str, str]:
    uri = lineage.default_tracking_uri(tmp_path / "mlflow")
    with lineage.stage_run(uri, None, "pretrain") as tracker:
        _trainer(tmp_path / "out", 4, [TrackerSink(tracker)], CountingLoader(delay_s=0.2)).fit()
    return uri, tracker.run_id


def test_a_training_run_logs_mlflow_system_metrics_when_switched_on(tmp_path, system_metrics_on):
    uri, run_id = _train_in_a_stage_run(tmp_path)
    logged = _system_metrics(uri, run_id)
    assert {"system/cpu_utilization_percentage", "system/system_memory_usage_megabytes"} <= logged, logged


def test_system_metrics_are_off_by_default(tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING", raising=False)
    uri, run_id = _train_in_a_stage_run(tmp_path)
    assert _system_metrics(uri, run_id) == set()


def _node(rank: int, world: int, init_file: str, uri: str, run_file: str) -> None:
    """One rank, alone on its node: rank 0 holds the stage's run, both log their node's system metrics to it."""
    import torch.distributed as dist

    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK="0", LOCAL_WORLD_SIZE="1",
                      MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING="true", MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL="0.2")
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    run_id = open(run_file).read() if rank == 0 else None
    with node_system_metrics(uri if rank == 0 else None, run_id):
        time.sleep(1.5)
    dist.barrier()
    dist.destroy_process_group()


def test_each_node_logs_its_own_system_metrics_into_the_stage_run(tmp_path):
    import torch.multiprocessing as mp

    pytest.importorskip("psutil", reason="MLflow's system metrics monitors need psutil")

    uri = lineage.default_tracking_uri(tmp_path)
    with lineage.stage_run(uri, None, "pretrain") as tracker:
        (tmp_path / "run_id").write_text(tracker.run_id)
        mp.spawn(_node, args=(2, str(tmp_path / "init"), uri, str(tmp_path / "run_id")), nprocs=2)
    logged = _system_metrics(uri, tracker.run_id)
    assert {"system/node_0/cpu_utilization_percentage", "system/node_1/cpu_utilization_percentage"} <= logged, logged
