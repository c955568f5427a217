"""A value made once for all the pytest-xdist workers of a run, where a session fixture is made once per worker.

The first worker to ask makes it under a lock in the run's shared temp folder (the controller's, every worker's
parent) and saves it there; the others wait on the lock and load what it saved. Without xdist it is simply made."""

from __future__ import annotations

from pathlib import Path
from typing import Callable, TypeVar

import pytest
from filelock import FileLock

T = TypeVar("T")


def made_once(tmp_path_factory: pytest.TempPathFactory, worker_id: str, name: str, make: Callable[[Path], T],
              save: Callable[[T, Path], None], load: Callable[[Path], T]) -> T:
    """``make(folder)`` in this run's shared ``name`` folder, or, where another worker made it, ``load(file)`` of
    what that worker's ``save(value, file)`` wrote; ``worker_id`` is xdist's fixture ("master" without xdist)."""
    if worker_id == "master":
        return make(tmp_path_factory.mktemp(name))
    shared = tmp_path_factory.getbasetemp().parent
    saved, partial = shared / f"{name}.saved", shared / f"{name}.part"
    with FileLock(shared / f"{name}.lock"):
        if not saved.is_file():
            value = make(shared / name)
            save(value, partial)
            partial.replace(saved)  # a worker that failed to make it leaves nothing for the next to read
            return value
    return load(saved)
