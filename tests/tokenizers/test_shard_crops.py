"""Decoding and cropping shard chunks: the auto worker count, and chunks cropped in a worker process equal the
reader thread's, with their crops back through shared memory and in order; a worker that dies names the shard."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from fourm_kfp.contract.shard_jobs import Shard
from fourm_kfp.data.crops import apply_crop, draw_crops
from fourm_kfp.data.shard_writer import ShardWriter, encode_sample
from fourm_kfp.storage import open_store
from fourm_kfp.tokenizers.shard_crops import (MAX_AUTO_DECODE_WORKERS, CropSettings, DecodeWorkerError, crop_chunk,
                                              crop_executor, cropped, decode_workers, raw_chunks)

MODALITIES = ("rgb", "depth", "caption", "det")
SETTINGS = CropSettings(3, (0.5, 1.0), (0.75, 1.33), 0.5, 7)
SIZE = 16


@pytest.mark.parametrize("setting,device,cpus,expected", [
    (-1, "cuda", 16, MAX_AUTO_DECODE_WORKERS),  # the device machine: 16 cores, one encoding process
    (-1, "cuda", 64, MAX_AUTO_DECODE_WORKERS),
    (-1, "cuda", 8, 7),  # a pretokenize pod's CPU limit
    (-1, "cuda", 2, 1),
    (-1, "cuda", 1, 1),  # still one worker
    (-1, "cpu", 16, 0),  # CPU encoders keep every core busy: the reader thread decodes
    (0, "cuda", 64, 0),  # the reader thread
    (3, "cpu", 64, 3),
])
def test_auto_decode_workers_are_the_cpus_less_one_beside_a_gpu(setting, device, cpus, expected):
    assert decode_workers(setting, torch.device(device), cpus=cpus) == expected


def _samples():
    rng = np.random.default_rng(0)
    for i in range(7):
        sample = {"rgb": rng.integers(0, 256, (SIZE, SIZE, 3), np.uint8),
                  "caption": f"scene {i}", "det": "v0=100 v1=100 v2=600 v3=700 cube"}
        if i != 3:  # sample 3 lacks depth
            sample["depth"] = rng.uniform(0.5, 20.0, (SIZE, SIZE)).astype(np.float32).round(3)
        yield f"{i:04d}", sample


@pytest.fixture
def shard(tmp_path):
    store = open_store(str(tmp_path), create=True)
    writer = ShardWriter(store, "train", MODALITIES, samples_per_shard=100)
    for key, sample in _samples():
        writer.write(key, encode_sample(sample, MODALITIES))
    writer.close()
    return store


def test_a_worker_crops_as_the_reader_thread_through_shared_memory(shard):
    chunks = list(raw_chunks(shard, Shard("train", 0), MODALITIES, size=3))
    assert [c.keys for c in chunks] == [["0000", "0001", "0002"], ["0003", "0004", "0005"], ["0006"]]
    inline = [crop_chunk(SETTINGS, SIZE, c) for c in chunks]
    pool = crop_executor(1)
    try:
        futures = [pool.submit(crop_chunk, SETTINGS, SIZE, c) for c in chunks]
        pooled = [cropped(f, chunks[0].shard) for f in futures]
    finally:
        pool.shutdown()
    for a, b in zip(inline, pooled):
        assert a.keys == b.keys and a.values == b.values and a.crops == b.crops
        for modality in ("rgb", "depth"):
            assert a.images[modality].rows == b.images[modality].rows
            assert np.array_equal(a.images[modality].crops.numpy(), b.images[modality].crops.numpy())
            assert b.images[modality].crops.is_shared() and not a.images[modality].crops.is_shared()
    assert pooled[1].images["depth"].rows == [1, 2]  # "0003" has no depth
    # the stacked crops are the sample's crops as crops.py cuts them
    key, sample = list(_samples())[4]
    views = [apply_crop(sample, c, SIZE) for c in draw_crops(key, 7, 3, SIZE, (0.5, 1.0), (0.75, 1.33), 0.5)]
    assert np.array_equal(pooled[1].images["rgb"].crops[3:6].numpy(), np.stack([v["rgb"] for v in views]))
    assert pooled[1].values[1]["det"] == [v["det"] for v in views]


def test_a_worker_that_dies_is_named_with_the_shard():
    pool = crop_executor(1)
    try:
        future = pool.submit(os._exit, 1)  # as the OOM killer or a bus error would end it
        with pytest.raises(DecodeWorkerError, match="decode worker died while cropping s3://b/train/_keys/shard-0000"):
            cropped(future, "s3://b/train/_keys/shard-000003.txt")
    finally:
        pool.shutdown()
