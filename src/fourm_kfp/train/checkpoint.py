"""Checkpoints in the output store: ``torch.distributed.checkpoint`` staged locally, uploaded, marker last.

Layout under a run's output: ``checkpoints/step-NNNNNNNN/`` holds DCP's files (``.metadata`` and one
``__<rank>_<i>.distcp`` per writing rank), ``ranks/rank-RRRR.json`` (each rank's loader state and RNG states),
``train_state.json`` (step and counters) and ``_COMPLETE``, written last by rank 0 once every rank has uploaded.
A checkpoint without ``_COMPLETE`` (a job killed while saving) is never read and is overwritten when its step is
saved again.

DCP handles DDP and FSDP2 state (``get_state_dict``/``set_state_dict``) and reshards on load, so a job can resume
on another world size. Ranks share no file system: each stages its own files in a private temporary folder and
uploads them through :mod:`fourm_kfp.storage`; on load each rank downloads the checkpoint and DCP reads what it
needs. Retention keeps the newest ``keep_last`` complete checkpoints plus every step that is a multiple of
``keep_every``.
"""

from __future__ import annotations

import base64
import json
import logging
import re
import tempfile
import warnings
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from fourm_kfp import distributed
from fourm_kfp.storage import Store

log = logging.getLogger(__name__)
MARKER = "_COMPLETE"
TRAIN_STATE = "train_state.json"
_STEP_DIR = re.compile(r"^step-(\d{8})$")


def step_dir(step: int) -> str:
    return f"step-{step:08d}"


def rng_state() -> dict[str, str]:
    """This process's RNG states (torch CPU and, when present, CUDA), as text for JSON."""
    states = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states["cuda"] = torch.cuda.get_rng_state()
    return {k: base64.b64encode(v.numpy().tobytes()).decode() for k, v in states.items()}


def set_rng_state(states: dict[str, str]) -> None:
    def tensor(text: str) -> torch.Tensor:
        return torch.frombuffer(bytearray(base64.b64decode(text)), dtype=torch.uint8)

    torch.set_rng_state(tensor(states["cpu"]))
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state(tensor(states["cuda"]))


@dataclass(frozen=True)
class Checkpoint:
    """A complete checkpoint: its step and where it is."""

    step: int
    store: Store

    @property
    def uri(self) -> str:
        return self.store.uri


def complete_checkpoints(store: Store) -> list[Checkpoint]:
    """The complete checkpoints below ``store`` (a run's ``checkpoints/`` prefix), oldest first."""
    steps = set()
    for key in store.list():
        parts = key.split("/")
        if len(parts) == 2 and parts[1] == MARKER and (m := _STEP_DIR.match(parts[0])):
            steps.add(int(m.group(1)))
    return [Checkpoint(s, store.child(step_dir(s))) for s in sorted(steps)]


def find_checkpoint(store: Store) -> Checkpoint | None:
    """``store`` itself if it is a complete checkpoint, else the newest complete one below it (``None``: none)."""
    if store.exists(MARKER):
        m = _STEP_DIR.match(store.uri.rstrip("/").rsplit("/", 1)[-1])
        return Checkpoint(int(m.group(1)) if m else -1, store)
    found = complete_checkpoints(store)
    return found[-1] if found else None


class CheckpointManager:
    """Saves, finds, loads and prunes the checkpoints of one run (every rank holds one)."""

    def __init__(self, store: Store, keep_last: int = 2, keep_every: int = 0):
        self.store = store
        self.keep_last, self.keep_every = keep_last, keep_every

    def latest(self) -> Checkpoint | None:
        return find_checkpoint(self.store)

    def save(self, step: int, app_state: dict[str, Any], rank_state: dict[str, Any],
             train_state: dict[str, Any]) -> Checkpoint:
        """Collective: every rank calls it. ``app_state`` is the DCP state dict (model, optimizer);
        ``rank_state`` this rank's loader state (RNG states are added); ``train_state`` rank 0's counters."""
        import torch.distributed.checkpoint as dcp

        target = self.store.child(step_dir(step))
        if distributed.is_primary():
            target.delete_prefix()  # a half-written earlier attempt at this step
        distributed.barrier()
        rank = distributed.rank()
        with tempfile.TemporaryDirectory(prefix=f"fourm-ckpt-r{rank}-") as tmp:
            with _single_process_is_meant():
                dcp.save(app_state, storage_writer=_reproducible_writer(tmp))
            for path in sorted(Path(tmp).iterdir()):
                if path.is_file():
                    target.put_file(path.name, path)
        target.put_bytes(f"ranks/rank-{rank:04d}.json",
                         json.dumps({**rank_state, "rng": rng_state()}, sort_keys=True).encode())
        distributed.barrier()
        if distributed.is_primary():
            target.put_bytes(TRAIN_STATE, json.dumps({"step": step, **train_state}, sort_keys=True).encode())
            target.put_bytes(MARKER, b"")
            self._prune()
        distributed.barrier()
        log.info("checkpoint: step %d saved to %s", step, target.uri)
        return Checkpoint(step, target)

    def _prune(self) -> None:
        found = complete_checkpoints(self.store)
        recent = {c.step for c in found[-self.keep_last:]}
        for ckpt in found:
            if ckpt.step not in recent and not (self.keep_every and ckpt.step % self.keep_every == 0):
                ckpt.store.delete_prefix()
                log.info("checkpoint: pruned step %d", ckpt.step)


@contextmanager
def _single_process_is_meant():
    """DCP warns on every save and load outside a process group that it assumes one process: here that is what a
    single-process run means, so the warning says nothing (in a group DCP uses the group and does not warn)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized",
                                category=UserWarning)
        yield


def _reproducible_writer(path: str):
    """DCP's file writer without its storage metadata: that records the staging folder and a random save id in
    ``.metadata``, so the same state would be saved as different bytes every time."""
    from torch.distributed.checkpoint import FileSystemWriter

    class ReproducibleWriter(FileSystemWriter):
        def storage_meta(self):
            return None

    return ReproducibleWriter(path)


def load_checkpoint(ckpt: Checkpoint, app_state: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """Load ``ckpt`` into ``app_state`` in place (collective). Returns (train state, this rank's saved state or
    ``None`` when the checkpoint was written by fewer ranks: then the caller re-derives it)."""
    import torch.distributed.checkpoint as dcp

    rank = distributed.rank()
    with tempfile.TemporaryDirectory(prefix=f"fourm-ckpt-load-r{rank}-") as tmp:
        for key in ckpt.store.list():
            if "/" not in key and key not in (MARKER, TRAIN_STATE):
                ckpt.store.get_file(key, Path(tmp) / key)
        with _single_process_is_meant():
            dcp.load(app_state, checkpoint_id=tmp)
    train_state = json.loads(ckpt.store.get_bytes(TRAIN_STATE))
    key = f"ranks/rank-{rank:04d}.json"
    rank_state = json.loads(ckpt.store.get_bytes(key)) if ckpt.store.exists(key) else None
    return train_state, rank_state
