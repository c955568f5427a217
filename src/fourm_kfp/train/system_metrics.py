"""MLflow's system metrics (CPU, memory, disk, network, GPU) of every node of a training run, in the stage's run.

Switched by MLflow's own setting, ``MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING=true`` (off by default, as in MLflow),
with MLflow's ``MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL`` (seconds, default 10) and
``MLFLOW_SYSTEM_METRICS_SAMPLES_BEFORE_LOGGING``. The first rank of each node (``LOCAL_RANK`` 0) runs MLflow's
``SystemMetricsMonitor`` on the stage's run, which only rank 0 opened: its id is broadcast to the group. A multi-rank
run names each node (``system/node_<n>/cpu_utilization_percentage``); a single process logs MLflow's plain names
(``system/cpu_utilization_percentage``). MLflow's monitors need ``psutil`` (and ``nvidia-ml-py`` for GPUs).
"""

from __future__ import annotations

import contextlib
import logging
import os
from typing import Iterator

from fourm_kfp import distributed

log = logging.getLogger(__name__)


def enabled() -> bool:
    """MLflow's switch, ``MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING`` (read from the environment; default off)."""
    from mlflow.environment_variables import MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING

    return bool(MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING.get())


def node_index() -> int:
    """This process's node: torchrun's ``GROUP_RANK``, else ``RANK // LOCAL_WORLD_SIZE``."""
    if os.environ.get("GROUP_RANK"):
        return int(os.environ["GROUP_RANK"])
    return distributed.rank() // max(int(os.environ.get("LOCAL_WORLD_SIZE", "1")), 1)


@contextlib.contextmanager
def node_system_metrics(tracking_uri: str | None, run_id: str | None) -> Iterator[None]:
    """Log this node's system metrics to ``run_id`` (known on rank 0; ``None`` elsewhere) while the body runs.
    Called by every rank of the group alike (the broadcast of the run id is collective)."""
    if not enabled():
        yield
        return
    if distributed.world_size() > 1:
        import torch.distributed as dist

        shared = [(tracking_uri, run_id)]
        dist.broadcast_object_list(shared, src=0)
        tracking_uri, run_id = shared[0]
    monitor = None
    if run_id and int(os.environ.get("LOCAL_RANK", "0")) == 0:
        try:
            from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

            monitor = SystemMetricsMonitor(run_id, tracking_uri=tracking_uri, node_id=(
                f"node_{node_index()}" if distributed.world_size() > 1 else None))
        except ImportError as error:  # a missing monitor package must not stop the training
            log.warning("MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING is on but MLflow's system metrics need %s: "
                        "pip install psutil (and nvidia-ml-py for GPUs); no system metrics", error.name)
        else:
            monitor.start()
    try:
        yield
    finally:
        if monitor is not None:
            monitor.finish()
