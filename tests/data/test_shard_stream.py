"""Streaming aligned shards back, from local disk and S3: keys join across modalities (absent stays absent, never
dropped), out-of-step shards are refused naming both files, memory does not grow with the dataset, and the lean
tar reader reads what ``tarfile`` reads and names a damaged shard."""

from __future__ import annotations

import io
import tarfile

import numpy as np
import pytest

from fourm_kfp.data.shard_stream import (MissingModalityError, ShardMismatchError, available_modalities,
                                         iter_joined_shard, iter_split, iter_texts, shard_indices)
from fourm_kfp.data.shard_writer import ShardWriter, encode_sample, keys_key, shard_key
from fourm_kfp.data.ustar import ShardReadError, read_members
from fourm_kfp.storage import open_store

MODALITIES = ("rgb", "semseg", "caption")


def _write(store, count=7, per_shard=3, caption_every=2, split="train"):
    writer = ShardWriter(store, split, MODALITIES, per_shard)
    for i in range(count):
        sample = {"rgb": np.full((4, 4, 3), i % 256, np.uint8), "semseg": np.full((4, 4), i % 6, np.uint8)}
        if i % caption_every == 0:
            sample["caption"] = f"scene {i}"
        writer.write(f"k{i:05d}", encode_sample(sample, MODALITIES))
    writer.close()


def test_round_trip_with_absent_modalities(any_store_uri):
    store = open_store(any_store_uri, create=True)
    _write(store)
    assert shard_indices(store, "train") == [0, 1, 2]
    samples = list(iter_split(store, "train", list(MODALITIES)))
    assert [k for k, _ in samples] == [f"k{i:05d}" for i in range(7)]
    for i, (_, sample) in enumerate(samples):
        assert np.array_equal(sample["rgb"], np.full((4, 4, 3), i, np.uint8))
        assert ("caption" in sample) == (i % 2 == 0)
    assert available_modalities(store, "train") == ["caption", "rgb", "semseg"]
    assert list(iter_texts(store, "train", ["caption"])) == ["scene 0", "scene 2", "scene 4", "scene 6"]
    assert len(list(iter_split(store, "train", ["rgb"], limit=4))) == 4
    raw = next(iter_split(store, "train", ["rgb"], decode=None))[1]["rgb"]
    assert raw[:4] == b"\x89PNG"


def test_keys_only_in_the_shorter_modality_are_kept(tmp_path):
    """Only the caption has sample 1: it still comes out, without rgb."""
    store = open_store(str(tmp_path))
    writer = ShardWriter(store, "train", MODALITIES, 10)
    writer.write("a", encode_sample({"rgb": np.zeros((4, 4, 3), np.uint8), "caption": "x"}, MODALITIES))
    writer.write("b", encode_sample({"caption": "only text"}, MODALITIES))
    writer.write("c", encode_sample({"rgb": np.ones((4, 4, 3), np.uint8)}, MODALITIES))
    writer.close()
    samples = dict(iter_joined_shard(store, "train", 0, ["rgb", "caption"]))
    assert list(samples) == ["a", "b", "c"]
    assert set(samples["b"]) == {"caption"} and set(samples["c"]) == {"rgb"}


def test_out_of_step_shard_names_both_files(tmp_path):
    store = open_store(str(tmp_path))
    _write(store, count=6, per_shard=3)
    other = open_store(str(tmp_path / "other"))
    _write(other, count=6, per_shard=3)
    # a foreign shard: shard 1's semseg tar copied over shard 0's
    store.put_bytes(shard_key("train", "semseg", 0), other.get_bytes(shard_key("train", "semseg", 1)))
    with pytest.raises(ShardMismatchError) as err:
        list(iter_joined_shard(store, "train", 0, ["rgb", "semseg"]))
    message = str(err.value)
    assert "train/semseg/shard-000000.tar" in message and keys_key("train", 0) in message and "k00003" in message


def test_missing_modality_names_the_place(tmp_path):
    store = open_store(str(tmp_path))
    _write(store)
    with pytest.raises(MissingModalityError, match=r"no shards of modalities \['depth'\] at .*train"):
        list(iter_split(store, "train", ["rgb", "depth"]))


class _Counted:
    """A decoded value that counts how many of its kind are alive."""

    alive = 0
    peak = 0

    def __init__(self) -> None:
        _Counted.alive += 1
        _Counted.peak = max(_Counted.peak, _Counted.alive)

    def __del__(self) -> None:
        _Counted.alive -= 1


@pytest.mark.parametrize("count", [60, 240])
def test_samples_held_do_not_grow_with_the_dataset(tmp_path, count):
    store = open_store(str(tmp_path))
    _write(store, count=count, per_shard=20)
    _Counted.alive = _Counted.peak = 0
    seen = 0
    for _, sample in iter_split(store, "train", ["rgb", "semseg"], decode=lambda m, b: _Counted(),
                                shuffle_buffer=16, seed=1):
        seen += 1
        del sample
    assert seen == count
    assert _Counted.peak <= 2 * 16 + 4  # the buffer (two modalities a sample) plus the samples in flight


def _tar_bytes(members, fmt=tarfile.USTAR_FORMAT) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=fmt) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def test_tar_members_read_what_tarfile_reads():
    members = [("k00000.npy", b"x" * 512), ("k00001.txt", b""), ("k00002.json", bytes(range(256)) * 3),
               ("a" * 60 + "/" + "n" * 90 + ".npy", b"a long name through the ustar prefix")]
    data = _tar_bytes(members)
    expected = [(m.name, tarfile.open(fileobj=io.BytesIO(data)).extractfile(m).read())
                for m in tarfile.open(fileobj=io.BytesIO(data)).getmembers()]
    assert list(read_members(io.BytesIO(data), "t.tar")) == expected == members
    assert list(read_members(io.BytesIO(_tar_bytes([])), "empty.tar")) == []


@pytest.mark.parametrize("damage,message", [
    (lambda d: d[:100] + b"Z" + d[101:], "bad checksum"),
    (lambda d: d[:700], "ends inside a member"),
    (lambda d: d[:300], "ends inside a member header"),
    (lambda d: b"not a tar at all".ljust(512, b"!") + d[512:], "not a tar"),
])
def test_a_damaged_tar_is_an_error_naming_the_shard(damage, message):
    data = damage(_tar_bytes([("k00000.npy", b"y" * 1000)]))
    with pytest.raises(ShardReadError, match=message) as error:
        list(read_members(io.BytesIO(data), "s3://bucket/train/tok_rgb/shard-000000.tar"))
    assert "shard-000000.tar" in str(error.value)


def test_a_pax_tar_is_refused_as_foreign():
    data = _tar_bytes([("é" * 120 + ".npy", b"z")], fmt=tarfile.PAX_FORMAT)
    with pytest.raises(ShardReadError, match="foreign shard"):
        list(read_members(io.BytesIO(data), "x.tar"))
