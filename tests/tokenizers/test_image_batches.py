"""A VQ-VAE's training batches and their position: a stream given the position after any number of batches draws
the very batches the uninterrupted stream draws next, across epoch ends, whether an epoch's remainder is dropped or
a split smaller than a batch fills it from the next epoch."""

from __future__ import annotations

import numpy as np
import pytest

from fourm_kfp.data.shard_writer import ShardWriter, encode_sample
from fourm_kfp.storage import open_store
from fourm_kfp.tokenizers.image_batches import ImageBatches

MODALITIES = ("semseg",)


def _dataset(tmp_path, samples: int):
    """``samples`` class maps in shards of 3, sample ``i`` filled with ``i`` (so a batch shows which it holds)."""
    store = open_store(str(tmp_path / "data"), create=True)
    writer = ShardWriter(store, "train", MODALITIES, 3)
    for i in range(samples):
        writer.write(f"k{i:05d}", encode_sample({"semseg": np.full((4, 4), i, np.uint8)}, MODALITIES))
    writer.close()
    return store


def _ids(batch: dict[str, np.ndarray]) -> list[int]:
    return [int(a[0, 0]) for a in batch["semseg"]]


@pytest.mark.parametrize("samples, batch_size", [(7, 3), (2, 3)], ids=["remainder dropped", "split under a batch"])
def test_a_stream_restored_at_any_position_continues_as_the_uninterrupted_one(tmp_path, samples, batch_size):
    data = _dataset(tmp_path, samples)
    stream = ImageBatches(data, "semseg", batch_size, seed=5)
    drawn, positions = [], []
    for _ in range(8):
        drawn.append(_ids(next(stream)))
        positions.append(stream.state_dict())
    assert all(len(ids) == batch_size for ids in drawn)
    epochs = [p["epoch"] for p in positions]
    assert epochs == sorted(epochs) and epochs[-1] >= 2  # several epochs, each shuffled its own way
    if samples > batch_size:  # each epoch's two batches hold six different samples; the seventh waits for none
        assert all(len(set(drawn[i] + drawn[i + 1])) == 6 for i in range(0, 8, 2))
    for k, position in enumerate(positions[:-1]):
        restored = ImageBatches(data, "semseg", batch_size, seed=5)
        restored.load_state_dict(position)
        assert [_ids(next(restored)) for _ in range(8 - k - 1)] == drawn[k + 1:], f"restored after batch {k + 1}"


def test_a_position_is_set_before_the_first_batch_only(tmp_path):
    stream = ImageBatches(_dataset(tmp_path, 4), "semseg", 2, seed=0)
    next(stream)
    with pytest.raises(RuntimeError, match="'semseg' batch stream's position can only be set before its first"):
        stream.load_state_dict({"epoch": 0, "taken": 2})
