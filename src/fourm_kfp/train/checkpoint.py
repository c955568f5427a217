"""Checkpoints in the output store: ``torch.distributed.checkpoint`` staged locally, uploaded, marker last.

Layout under a run's output: ``checkpoints/step-NNNNNNNN/`` holds DCP's files (``.metadata`` and one
``__<rank>_<i>.distcp`` per writing rank), ``ranks/rank-RRRR.json`` (each rank's loader state and RNG states),
``train_state.json`` (step and counters) and ``_COMPLETE``, written last by rank 0 once every rank has uploaded.
A checkpoint without ``_COMPLETE`` (a job killed while saving) is never read and is overwritten when its step is
saved again.

DCP handles DDP and FSDP2 state (``get_state_dict``/``set_state_dict``) and reshards on load, so a job can resume
on another world size. Ranks share no file system.

* **Save.** Each rank stages its own files in a private temporary folder (``dcp.save``: the state serialised, the
  only part a training step waits for) and uploads them through :mod:`fourm_kfp.storage`. With
  ``upload_in_background`` the upload runs on a thread while training goes on: each rank uploads its DCP files,
  then its ``ranks/rank-RRRR.json`` last (this rank's files are in); rank 0's thread waits until every rank's JSON
  is there, then writes ``train_state.json`` and ``_COMPLETE``, and prunes. The next save (and :meth:`wait`, which
  the trainer calls before its stage commits) first waits for the last upload, so at most one is in flight.
* **Load.** Each rank reads ``.metadata``, then only the byte ranges of the checkpoint files that its own load plan
  names (``_store_reader``): under FSDP its shard of the state, about ``1/world`` of the checkpoint; under DDP
  the whole (replicated) state, which every rank needs.

Retention keeps the newest ``keep_last`` complete checkpoints plus every step that is a multiple of ``keep_every``.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import re
import shutil
import tempfile
import threading
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
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

    def __init__(self, store: Store, keep_last: int = 2, keep_every: int = 0, upload_in_background: bool = False,
                 upload_timeout_s: float = 6 * 3600):
        self.store = store
        self.keep_last, self.keep_every = keep_last, keep_every
        self.upload_in_background, self.upload_timeout_s = upload_in_background, upload_timeout_s
        self._upload: threading.Thread | None = None
        self._upload_error: BaseException | None = None
        #: seconds the last save held the caller (the staging, plus waiting for the save before it)
        self.last_stall_s = 0.0

    def latest(self) -> Checkpoint | None:
        return find_checkpoint(self.store)

    def save(self, step: int, app_state: dict[str, Any], rank_state: dict[str, Any],
             train_state: dict[str, Any]) -> Checkpoint:
        """Collective: every rank calls it. ``app_state`` is the DCP state dict (model, optimizer);
        ``rank_state`` this rank's loader state (RNG states are added); ``train_state`` rank 0's counters. With
        ``upload_in_background`` it returns once the state is staged; the checkpoint is complete (``_COMPLETE``)
        when every rank's upload is done."""
        import torch.distributed.checkpoint as dcp

        started = time.perf_counter()
        self.wait()
        target = self.store.child(step_dir(step))
        if distributed.is_primary():
            target.delete_prefix()  # a half-written earlier attempt at this step
        distributed.barrier()
        rank, world = distributed.rank(), distributed.world_size()
        staging = Path(tempfile.mkdtemp(prefix=f"fourm-ckpt-r{rank}-"))
        try:
            with _single_process_is_meant():
                dcp.save(app_state, storage_writer=_reproducible_writer(str(staging)))
            rank_json = json.dumps({**rank_state, "rng": rng_state()}, sort_keys=True).encode()
            finish = (json.dumps({"step": step, **train_state}, sort_keys=True).encode()
                      if distributed.is_primary() else None)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        upload = _Upload(self, target, staging, rank, world, rank_json, finish, step)
        if self.upload_in_background:
            self._upload = threading.Thread(target=self._run_upload, args=(upload,), daemon=True,
                                            name=f"checkpoint-upload-{step}")
            self._upload.start()
        else:
            upload.run()
            distributed.barrier()
        self.last_stall_s = time.perf_counter() - started
        return Checkpoint(step, target)

    def _run_upload(self, upload: "_Upload") -> None:
        try:
            upload.run()
        except BaseException as exc:  # re-raised on the training thread by the next save or wait()
            self._upload_error = exc

    def wait(self) -> None:
        """Wait for this rank's upload in flight (rank 0: until the checkpoint is complete); re-raise its error."""
        if self._upload is not None:
            self._upload.join()
            self._upload = None
        if self._upload_error is not None:
            error, self._upload_error = self._upload_error, None
            raise error

    def _prune(self) -> None:
        found = complete_checkpoints(self.store)
        recent = {c.step for c in found[-self.keep_last:]}
        for ckpt in found:
            if ckpt.step not in recent and not (self.keep_every and ckpt.step % self.keep_every == 0):
                ckpt.store.delete_prefix()
                log.info("checkpoint: pruned step %d", ckpt.step)


@dataclass
class _Upload:
    """One rank's part of one checkpoint's upload: its staged files, its rank JSON last; on rank 0 (``finish``:
    the train state) then, once every rank's JSON is in, the train state and the marker, and the pruning."""

    manager: CheckpointManager
    target: Store
    staging: Path
    rank: int
    world: int
    rank_json: bytes
    finish: bytes | None
    step: int

    def run(self) -> None:
        started = time.perf_counter()
        try:
            files = sorted(p for p in self.staging.iterdir() if p.is_file())
            with ThreadPoolExecutor(4) as pool:  # a rank's files: its shard of the state and, on rank 0, .metadata
                list(pool.map(lambda path: self.target.put_file(path.name, path), files))
            self.target.put_bytes(rank_key(self.rank), self.rank_json)
            sent = sum(p.stat().st_size for p in files) + len(self.rank_json)
        finally:
            shutil.rmtree(self.staging, ignore_errors=True)
        log.info("checkpoint: rank %d uploaded %d bytes of step %d in %.2fs", self.rank, sent, self.step,
                 time.perf_counter() - started)
        if self.finish is None:
            return
        self._wait_for_every_rank()
        self.target.put_bytes(TRAIN_STATE, self.finish)
        self.target.put_bytes(MARKER, b"")
        self.manager._prune()
        log.info("checkpoint: step %d saved to %s", self.step, self.target.uri)

    def _wait_for_every_rank(self) -> None:
        expected = {rank_key(r) for r in range(self.world)}
        deadline = time.monotonic() + self.manager.upload_timeout_s
        delay = 0.05
        while not expected <= set(self.target.list("ranks")):
            if time.monotonic() > deadline:
                missing = sorted(expected - set(self.target.list("ranks")))
                raise TimeoutError(f"checkpoint step {self.step}: ranks {missing} did not finish uploading to "
                                   f"{self.target.uri} within {self.manager.upload_timeout_s:g}s")
            time.sleep(delay)
            delay = min(delay * 2, 2.0)


def rank_key(rank: int) -> str:
    """A rank's own state in a checkpoint, written after its DCP files."""
    return f"ranks/rank-{rank:04d}.json"


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


def _store_reader(store: Store, staging: str | os.PathLike):
    """A :class:`StoreReader` (built here: ``torch.distributed.checkpoint`` takes 0.7 s to import, which a process
    that never loads a checkpoint, such as a pretokenize or evaluate step, should not pay)."""
    from torch.distributed.checkpoint import FileSystemReader

    class StoreReader(FileSystemReader):
        """DCP's file reader over a checkpoint in a store: ``.metadata`` is fetched whole, then only the byte ranges
        this rank's load plan reads (adjacent ranges merged, a few in parallel), written at their offsets into sparse
        local files that DCP's own reader then reads. ``bytes_read`` counts what came from the store."""

        def __init__(self, store: Store, staging: str | os.PathLike):
            super().__init__(staging)
            self.store, self.staging = store, Path(staging)
            self.bytes_read = 0

        def read_metadata(self, *args: Any, **kwargs: Any):
            name = Path(self._get_metadata_path(kwargs.get("rank"))).name
            if not (self.staging / name).exists():
                self.store.get_file(name, self.staging / name)
                self.bytes_read += (self.staging / name).stat().st_size
            return super().read_metadata(*args, **kwargs)

        def read_data(self, plan, planner):
            ranges: dict[str, list[tuple[int, int]]] = {}
            for item in plan.items:
                info = self.storage_data[item.storage_index]
                ranges.setdefault(info.relative_path, []).append((info.offset, info.offset + info.length))
            work = [(path, start, end) for path, spans in sorted(ranges.items()) for start, end in _merged(spans)]
            for path in ranges:
                (self.staging / path).touch()

            def fetch(span: tuple[str, int, int]) -> int:
                path, start, end = span
                data = self.store.get_range(path, start, end - start)
                if len(data) != end - start:
                    raise OSError(f"{self.store.uri_of(path)}: bytes {start}-{end} returned {len(data)} bytes")
                fd = os.open(self.staging / path, os.O_WRONLY)
                try:
                    os.pwrite(fd, data, start)
                finally:
                    os.close(fd)
                return len(data)

            with ThreadPoolExecutor(4) as pool:
                self.bytes_read += sum(pool.map(fetch, work))
            return super().read_data(plan, planner)

    return StoreReader(store, staging)


def _merged(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for start, end in sorted(spans):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


def load_checkpoint(ckpt: Checkpoint, app_state: dict[str, Any],
                    stats: dict[str, int] | None = None) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """Load ``ckpt`` into ``app_state`` in place (collective). Returns (train state, this rank's saved state or
    ``None`` when the checkpoint was written by fewer ranks: then the caller re-derives it). ``stats`` gets
    ``bytes_read``: what this rank read from the store, its rank state included."""
    import torch.distributed.checkpoint as dcp

    rank = distributed.rank()
    with tempfile.TemporaryDirectory(prefix=f"fourm-ckpt-load-r{rank}-") as tmp:
        reader = _store_reader(ckpt.store, tmp)
        with _single_process_is_meant():
            dcp.load(app_state, storage_reader=reader)
    train_state_bytes = ckpt.store.get_bytes(TRAIN_STATE)
    key = rank_key(rank)
    rank_bytes = ckpt.store.get_bytes(key) if ckpt.store.exists(key) else None
    if stats is not None:
        stats["bytes_read"] = reader.bytes_read + len(train_state_bytes) + len(rank_bytes or b"")
    log.info("checkpoint: rank %d read %d bytes of step %d", rank, reader.bytes_read, ckpt.step)
    return json.loads(train_state_bytes), json.loads(rank_bytes) if rank_bytes is not None else None
