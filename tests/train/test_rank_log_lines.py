"""Log lines of a multi-rank process say which rank wrote them: two real gloo ranks, joined the way a stage joins
its group under torchrun (``RANK``/``WORLD_SIZE``/``MASTER_*`` in the environment), each log ``[rank N]``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from fourm_kfp.distributed import free_port

RANK_PROGRAM = """
import logging
from fourm_kfp import distributed
from fourm_kfp.launchers.stage import setup_logging

setup_logging()
assert distributed.init_from_env()
log = logging.getLogger("fourm_kfp.train")
log.info("joined as %d of %d", distributed.rank(), distributed.world_size())
setup_logging()  # a later reset of the handlers keeps the label
log.warning("still here")
distributed.barrier()
"""


def test_every_log_line_of_a_rank_carries_its_rank():
    world, port = 2, free_port()
    repo = Path(__file__).resolve().parents[2]
    procs = []
    for rank in range(world):
        env = {**os.environ, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world),
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "CUDA_VISIBLE_DEVICES": "",
               "PYTHONPATH": os.pathsep.join([str(repo / "src"), str(repo), os.environ.get("PYTHONPATH", "")])}
        procs.append(subprocess.Popen([sys.executable, "-c", RANK_PROGRAM], env=env, stderr=subprocess.PIPE,
                                      text=True))
    logs = [proc.communicate(timeout=120)[1] for proc in procs]
    assert [proc.returncode for proc in procs] == [0] * world, logs
    for rank, text in enumerate(logs):
        ours = [line for line in text.splitlines() if " fourm_kfp.train: " in line]
        assert [line.split(" fourm_kfp.train: ", 1)[1] for line in ours] == [
            f"[rank {rank}] joined as {rank} of {world}", f"[rank {rank}] still here"], text
