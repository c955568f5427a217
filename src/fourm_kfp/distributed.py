"""``torch.distributed`` with torchrun semantics: join the process group the environment describes.

torchrun, a PyTorchJob and torchx all set ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT``; with
``WORLD_SIZE > 1`` :func:`init_from_env` joins the group (NCCL on GPUs, gloo on CPU). Stages ask
:func:`is_primary` before writing shared outputs. Nothing here imports torch unless a group is in use, so CPU-only
stages stay light.

In a process of a multi-rank run every log line carries ``[rank N]`` (:func:`label_log_lines`): the ranks of a pod
write to one log, and a warning or a traceback has to say which rank it came from. Every rank keeps its INFO lines
(rather than rank 0 alone): the training's own lines come from rank 0 anyway, and what the other ranks say at INFO
(a resume, a checkpoint read) is what one compares across ranks when one of them hangs or diverges.
"""

from __future__ import annotations

import logging
import os
import socket
import sys


def init_from_env() -> bool:
    """Join the process group if the environment describes one; returns whether this is a distributed run."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return False
    import torch
    import torch.distributed as dist

    if not dist.is_initialized():
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        if backend == "nccl":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group(backend)
    label_log_lines(dist.get_rank())
    return True


def label_log_lines(rank_number: int) -> None:
    """Prefix every log record this process makes with ``[rank N] `` (once, however often called). A record
    factory rather than a handler's formatter: it survives a later ``logging.basicConfig(force=True)``."""
    previous = logging.getLogRecordFactory()
    if getattr(previous, "fourm_rank", None) is not None:
        return
    prefix = f"[rank {rank_number}] "

    def labelled(*args, **kwargs) -> logging.LogRecord:
        record = previous(*args, **kwargs)
        record.msg = prefix + str(record.msg)
        return record

    labelled.fourm_rank = rank_number
    logging.setLogRecordFactory(labelled)


def _dist():
    if "torch.distributed" not in sys.modules:
        return None
    import torch.distributed as dist

    return dist if dist.is_available() and dist.is_initialized() else None


def rank() -> int:
    dist = _dist()
    return dist.get_rank() if dist else 0


def world_size() -> int:
    dist = _dist()
    return dist.get_world_size() if dist else 1


def is_primary() -> bool:
    return rank() == 0


def barrier() -> None:
    dist = _dist()
    if dist:
        dist.barrier()


def free_port() -> int:
    """A TCP port free on this machine now, for a server about to bind it (a c10d rendezvous store, a local S3
    endpoint); another process may take it in between, so bind it soon."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
