"""torch's intra-op thread count for one block of a test, put back after it (each xdist worker's own share of the
CPUs is set once, in ``tests/conftest.py``)."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import torch


@contextmanager
def torch_threads(count: int) -> Iterator[None]:
    """Run the block with ``count`` torch threads, then restore the count it had, whether or not the block raised."""
    previous = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(previous)
