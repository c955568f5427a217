"""Tokenizer tests run their tiny models on one thread (exact comparisons across runs and ranks, no thread
start-up cost on 16-px images). A fixture rather than a module-level call: pytest imports every test module at
collection, so a module-level ``torch.set_num_threads(1)`` would pin the whole session to one thread."""

from __future__ import annotations

import pytest

from tests.torch_threads import torch_threads


@pytest.fixture(autouse=True)
def _one_thread():
    with torch_threads(1):
        yield
