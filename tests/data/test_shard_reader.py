"""Reading aligned shards back, from local disk and S3: keys, values and absent modalities survive."""

from __future__ import annotations

import numpy as np
import pytest

from fourm_kfp.data.shard_reader import (MissingModalityError, available_modalities, iter_split,
                                         load_image_modality, load_texts)
from fourm_kfp.data.shard_writer import ShardWriter, encode_sample
from fourm_kfp.storage import open_store

MODALITIES = ("rgb", "semseg", "caption")


def _write(store, count=7, per_shard=3):
    writer = ShardWriter(store, "train", MODALITIES, per_shard)
    for i in range(count):
        sample = {"rgb": np.full((4, 4, 3), i, np.uint8), "semseg": np.full((4, 4), i % 6, np.uint8)}
        if i % 2 == 0:
            sample["caption"] = f"scene {i}"
        writer.write(f"k{i:03d}", encode_sample(sample, MODALITIES))
    writer.close()


def test_round_trip_with_absent_modalities(any_store_uri):
    store = open_store(any_store_uri, create=True)
    _write(store)
    samples = list(iter_split(store, "train", list(MODALITIES)))
    assert [k for k, _ in samples] == [f"k{i:03d}" for i in range(7)]
    for i, (_, sample) in enumerate(samples):
        assert np.array_equal(sample["rgb"], np.full((4, 4, 3), i, np.uint8))
        assert ("caption" in sample) == (i % 2 == 0)
    assert available_modalities(store, "train") == ["caption", "rgb", "semseg"]
    assert load_image_modality(store, "train", "semseg").shape == (7, 4, 4)
    assert load_texts(store, "train", ["caption"]) == ["scene 0", "scene 2", "scene 4", "scene 6"]
    assert len(list(iter_split(store, "train", ["rgb"], limit=4))) == 4
    raw = next(iter_split(store, "train", ["rgb"], decode=False))[1]["rgb"]
    assert raw[:4] == b"\x89PNG"


def test_missing_modality_names_the_place(tmp_path):
    store = open_store(str(tmp_path))
    _write(store)
    with pytest.raises(MissingModalityError, match=r"no shards of modality 'depth' at .*train/depth"):
        list(iter_split(store, "train", ["rgb", "depth"]))
