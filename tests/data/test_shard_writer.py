"""Aligned per-modality shards: same key order in every modality, absent modalities absent, stable bytes."""

from __future__ import annotations

import io
import tarfile

import numpy as np

from fourm_kfp.data.modalities import MODALITIES
from fourm_kfp.data.shard_writer import ShardWriter, encode_sample
from fourm_kfp.data.ustar import TarSpool
from fourm_kfp.storage import open_store


def _members(store, key):
    with tarfile.open(fileobj=io.BytesIO(store.get_bytes(key))) as tar:
        return [m.name for m in tar.getmembers()]


def _sample(i, with_caption):
    sample = {"rgb": np.full((8, 8, 3), i, np.uint8), "depth": np.full((8, 8), 1.0 + i, np.float32)}
    if with_caption:
        sample["caption"] = f"caption {i}"
    return sample


def test_shards_are_aligned_and_absent_modalities_stay_absent(any_store_uri):
    store = open_store(any_store_uri, create=True)
    modalities = ("rgb", "depth", "caption", "semseg")
    writer = ShardWriter(store, "train", modalities, samples_per_shard=3)
    captioned = {1, 2, 5, 6}  # shard 0 and 1 have some captions, shard 2 (key 6) too
    for i in range(7):
        writer.write(f"{i:04d}", encode_sample(_sample(i, i in captioned), modalities))
    summary = writer.close()

    assert summary == {"samples": 7, "shards": 3, "modalities": {"caption": 4, "depth": 7, "rgb": 7}}
    assert store.list() == ([f"train/_keys/shard-{i:06d}.txt" for i in range(3)]
                            + [f"train/{m}/shard-{i:06d}.tar" for m in ("caption", "depth", "rgb") for i in range(3)])
    assert store.get_text("train/_keys/shard-000002.txt") == "0006\n"  # the key index: the shard's keys in order
    assert _members(store, "train/rgb/shard-000000.tar") == ["0000.png", "0001.png", "0002.png"]
    assert _members(store, "train/depth/shard-000001.tar") == ["0003.png", "0004.png", "0005.png"]
    assert _members(store, "train/caption/shard-000001.tar") == ["0005.txt"]
    assert _members(store, "train/caption/shard-000002.tar") == ["0006.txt"]

    data = store.get_bytes("train/depth/shard-000002.tar")
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        depth = MODALITIES["depth"].decode(tar.extractfile("0006.png").read())
    assert np.allclose(depth, 7.0)


def test_modality_first_seen_late_is_backfilled_with_empty_shards(tmp_path):
    store = open_store(str(tmp_path))
    writer = ShardWriter(store, "val", ("rgb", "caption"), samples_per_shard=2)
    for i in range(5):
        writer.write(f"{i}", encode_sample(_sample(i, i == 4), ("rgb", "caption")))
    writer.close()
    assert [_members(store, f"val/caption/shard-{i:06d}.tar") for i in range(3)] == [[], [], ["4.txt"]]


def test_same_samples_give_identical_shard_bytes(tmp_path):
    digests = []
    for run in range(2):
        store = open_store(str(tmp_path / str(run)))
        writer = ShardWriter(store, "train", ("rgb",), samples_per_shard=4)
        for i in range(4):
            writer.write(f"{i}", encode_sample(_sample(i, False), ("rgb",)))
        writer.close()
        digests.append(store.get_bytes("train/rgb/shard-000000.tar"))
    assert digests[0] == digests[1]


def test_the_tar_spool_writes_the_bytes_tarfile_writes(tmp_path):
    """Names short, of exactly 100 bytes, longer (tarfile splits them), non-ASCII; sizes around a block; an empty
    tar; archives ending on either side of a record boundary."""
    rng = np.random.default_rng(0)
    names = ["0001.png", "k" * 96 + ".npy", "d" * 60 + "/" + "k" * 60 + ".json", "caf\u00e9.txt"]
    cases = [[], [(n, rng.bytes(size)) for n in names for size in (0, 1, 511, 512, 513)],
             [("a.npy", rng.bytes(9 * 512))], [("a.npy", rng.bytes(17 * 512))]]
    for i, members in enumerate(cases):
        spool = TarSpool(str(tmp_path / f"{i}.tar"))
        reference = io.BytesIO()
        with tarfile.open(fileobj=reference, mode="w", format=tarfile.USTAR_FORMAT) as tar:
            for name, data in members:
                spool.add(name, data)
                info = tarfile.TarInfo(name)
                info.size, info.mtime, info.mode, info.uname, info.gname = len(data), 0, 0o644, "", ""
                tar.addfile(info, io.BytesIO(data))
        spool.close()
        assert (tmp_path / f"{i}.tar").read_bytes() == reference.getvalue()


def test_modality_codecs_round_trip():
    rng = np.random.default_rng(0)
    normal = rng.normal(size=(6, 6, 3)).astype(np.float32)
    normal /= np.linalg.norm(normal, axis=-1, keepdims=True)
    normal[0, 0] = 0
    values = {
        "rgb": rng.integers(0, 256, (6, 6, 3), dtype=np.uint8),
        "depth": np.where(rng.random((6, 6)) < 0.2, 0, rng.uniform(0.5, 60, (6, 6))).astype(np.float32),
        "normal": normal,
        "semseg": rng.integers(0, 6, (6, 6), dtype=np.uint8),
        "edge": rng.integers(0, 2, (6, 6), dtype=np.uint8),
        "caption": "a small red sphere left of a large blue cube",
        "det": "v0=1 v1=2 v2=3 v3=4 cube",
    }
    for name, value in values.items():
        decoded = MODALITIES[name].decode(MODALITIES[name].encode(value))
        if name == "depth":
            assert np.abs(decoded - value).max() <= 0.0005 and np.array_equal(decoded == 0, value == 0)
        elif name == "normal":
            assert np.array_equal(np.any(decoded != 0, -1), np.any(value != 0, -1))
            assert np.abs(decoded - value).max() < 0.02
        elif isinstance(value, str):
            assert decoded == value
        else:
            assert np.array_equal(decoded, value), name
