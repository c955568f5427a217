"""Image tokenizers trained side by side in forked worker processes, one CPU's worth of threads each.

In one process on a CPU with several cores, the train-tokenizers stage trains its image tokenizers in parallel
rather than one after the other, the cores split among them: their steps are short (batch 4 at 64 px: ~20 ms), so
two threads on one tokenizer run only 1.4x one thread, while two tokenizers on a thread each run 2x. On a GPU or
under DDP (every rank trains every tokenizer in turn) there is one worker: the calling process
(:func:`tokenizer_workers`).

The workers are *forked*, because what trains a tokenizer (the stage's function, which holds open stores and
trackers) does not pickle: :func:`train_image_tokenizers` puts it in the module global ``_FORKED_TRAINER`` just
before the pool forks, each child inherits it as it is, and the parent clears it when the pool is done. That
global is read only by :func:`_train_in_worker`, in a child; nothing else sets or reads it. A worker sends back
plain arrays (its model's config and weights as numpy), which the parent loads into a fresh :class:`VQVAE`.

The workers take SIGTERM's default action whatever handler the calling process has (:func:`tokenizer_pool`), end on
the pool's close when all went well, and on Linux are killed with the calling process: a stage killed outright
(SIGKILL) leaves no worker training on and writing checkpoints beside the run that resumes it.
"""

from __future__ import annotations

import ctypes
import logging
import multiprocessing
import multiprocessing.pool
import os
import signal
import sys
from typing import Callable

import numpy as np
import torch

from fourm_kfp import distributed
from fourm_kfp.hardware import available_cpus
from fourm_kfp.tokenizers.vqvae import VQVAE, VQVAEConfig

log = logging.getLogger(__name__)

#: Trains one image tokenizer: ``(modality, device) -> (model, metrics, extra)``.
TrainOne = Callable[[str, str], tuple[VQVAE, dict[str, float], dict]]

#: What a forked worker trains with: set in the parent just before the fork, cleared after the pool is done (see the
#: module docstring).
_FORKED_TRAINER: TrainOne | None = None


def tokenizer_workers(modalities: int, cpus: int, device: str) -> int:
    """How many image tokenizers train at once: one per CPU (at most one per modality) in one CPU process; one
    on a GPU or under DDP, where each rank trains every tokenizer in turn."""
    if device != "cpu" or distributed.world_size() > 1:
        return 1
    return max(min(modalities, cpus), 1)


#: prctl's request that the kernel signal this process when its parent dies (linux/prctl.h).
_PR_SET_PDEATHSIG = 1


def _die_with(parent: int) -> None:
    """On Linux, have the kernel SIGKILL this process when ``parent`` (the process that forked it) dies; if it is
    already gone, exit now."""
    if not sys.platform.startswith("linux"):
        return
    if ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL) != 0:
        log.warning("train-tokenizers: prctl(PR_SET_PDEATHSIG) failed (errno %d): worker %d outlives a killed stage",
                    ctypes.get_errno(), os.getpid())
    if os.getppid() != parent:  # the parent died before the request took hold
        os._exit(1)


def _init_worker(threads: int, parent: int) -> None:
    # A forked child inherits the parent's Python signal handlers. Pool.terminate ends its workers with SIGTERM, which
    # a handler that raises an Exception (torchx's LocalScheduler installs one) does not reliably do: a worker still
    # in the pool's result send can catch it as a failed send, go back to the task queue, whose lock the terminating
    # parent holds, and wait there forever (a test session hung so).
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    _die_with(parent)
    torch.set_num_threads(threads)


def tokenizer_pool(workers: int, threads: int) -> multiprocessing.pool.Pool:
    """``workers`` forked processes of ``threads`` threads each, taking SIGTERM's default action and killed with the
    calling process (on Linux)."""
    return multiprocessing.get_context("fork").Pool(workers, initializer=_init_worker,
                                                   initargs=(threads, os.getpid()))


def _train_in_worker(modality: str) -> tuple[VQVAEConfig, dict[str, np.ndarray], dict[str, float], dict]:
    model, metrics, extra = _FORKED_TRAINER(modality, "cpu")
    return model.config, {k: v.numpy() for k, v in model.state_dict().items()}, metrics, extra


def train_image_tokenizers(train_one: TrainOne, modalities: list[str], device: str,
                           cost: Callable[[str], int]) -> dict[str, tuple[VQVAE, dict[str, float], dict]]:
    """``{modality: (model, metrics, extra)}`` of ``train_one``, trained one after the other, or in
    :func:`tokenizer_workers` forked processes with the CPUs split among them (the largest ``cost`` first). Each
    tokenizer's bytes depend on the threads it had, so they are the same for a machine's core count, as every CPU
    result."""
    global _FORKED_TRAINER
    cpus = available_cpus()
    workers = tokenizer_workers(len(modalities), cpus, device)
    if workers == 1:
        return {m: train_one(m, device) for m in modalities}
    costs = {m: cost(m) for m in modalities}
    longest_first = sorted(modalities, key=lambda m: -costs[m])
    threads = cpus // workers
    log.info("train-tokenizers: %d image tokenizers in %d processes of %d thread(s)", len(modalities), workers,
             threads)
    _FORKED_TRAINER = train_one
    try:
        with tokenizer_pool(workers, threads) as pool:
            pending = {m: pool.apply_async(_train_in_worker, (m,)) for m in longest_first}
            done = {m: pending[m].get() for m in longest_first}
            pool.close()  # the workers end on their own; terminate (the with's exit) is for a failure
            pool.join()
    finally:
        _FORKED_TRAINER = None
    trained = {}
    for modality in modalities:
        config, state, metrics, extra = done[modality]
        model = VQVAE(config)
        model.load_state_dict({k: torch.from_numpy(v) for k, v in state.items()})
        trained[modality] = (model.eval(), metrics, extra)
    return trained
