"""The token loader on real pretokenized smoke shards: exact resume, distinct ranks, a weighted mixture, S3, the
out-of-step shard error, a forward/backward pass of the model on what it yields, and the fast ``.npy`` decode."""

from __future__ import annotations

import dataclasses
import io
import itertools

import numpy as np
import pytest
import torch

from fourm_kfp.config.loader import load_config
from fourm_kfp.contract import run_stage
from fourm_kfp.data.pretokenized import decode_npy, encode_member
from fourm_kfp.data.shard_stream import ShardMismatchError
from fourm_kfp.data.shard_writer import shard_key
from fourm_kfp.masking import token_loader
from fourm_kfp.masking.token_loader import DatasetRef, TokenLoader, validation_batches
from fourm_kfp.model.fourm import FourM
from fourm_kfp.stages import get_stage
from fourm_kfp.storage import open_store
from fourm_kfp.train.build import TrainingInputs, loader_args, masking_args, modality_specs, model_args


@pytest.fixture(scope="module")
def pretokenized(tmp_path_factory):
    store = open_store(str(tmp_path_factory.mktemp("loader")), create=True)
    config = load_config("smoke", overrides=["prepare_data.samples_per_shard=6"])
    uris = {name: run_stage(get_stage(name), config, store).output_uri
            for name in ("prepare-data", "train-tokenizers", "pretokenize")}
    return config, store, uris


def _args(config, uris, batch=4, workers=0, rank=0, pretokenized_uri=None):
    inputs = TrainingInputs.read(pretokenized_uri or uris["pretokenize"], uris["train-tokenizers"])
    specs = modality_specs(config, inputs)
    largs = loader_args(config, inputs, masking_args(config, specs, inputs), batch, rank, 2, torch.device("cpu"))
    return dataclasses.replace(largs, num_workers=workers), specs


def _keys(batches):
    return [tuple(b.keys) for b in batches]


@pytest.mark.parametrize("workers", [0, 2])
def test_a_restored_loader_gives_the_same_next_batches(pretokenized, workers):
    config, _, uris = pretokenized
    args, _ = _args(config, uris, workers=workers)
    loader = TokenLoader(args)
    stream = loader.batches()
    consumed = [next(stream) for _ in range(5)]
    state = loader.state_dict()
    expected = [next(stream) for _ in range(4)]
    restored = TokenLoader(args)
    restored.load_state_dict(state)
    again = list(itertools.islice(restored.batches(), 4))
    assert _keys(again) == _keys(expected) and len(consumed) == 5
    for a, b in zip(again, expected):
        assert torch.equal(a.enc_tokens, b.enc_tokens) and torch.equal(a.dec_targets, b.dec_targets)


def test_text_ids_are_the_tokenizers_whether_remembered_or_not(pretokenized, monkeypatch):
    config, _, uris = pretokenized
    args, _ = _args(config, uris)
    monkeypatch.setattr(token_loader, "TEXT_CACHE_SIZE", 2)  # the cache fills and drops texts on the way
    encoder = token_loader._SampleEncoder(args)
    texts = ["a small red cube", "a large blue sphere left of a small red cube", "a small red cube", "cube",
             "a small red cube", "a large blue sphere left of a small red cube"]
    for text in texts:
        tokens, _ = encoder.tokens({"caption": text}, 0)
        expected = encoder.tokenizer.encode(text).ids[: encoder.max_len["caption"]]
        assert list(tokens["caption"]) == expected and expected


def test_ranks_draw_different_samples(pretokenized):
    config, _, uris = pretokenized
    first = list(itertools.islice(TokenLoader(_args(config, uris, rank=0)[0]).batches(), 4))
    second = list(itertools.islice(TokenLoader(_args(config, uris, rank=1)[0]).batches(), 4))
    assert _keys(first) != _keys(second)


def test_a_weighted_mixture_samples_both_datasets(pretokenized):
    config, store, uris = pretokenized
    other = run_stage(get_stage("pretokenize"), load_config("smoke", overrides=[
        "prepare_data.samples_per_shard=6", "pretokenize.seed=1"]), store).output_uri
    args, _ = _args(config, uris)
    args = dataclasses.replace(args, datasets=(DatasetRef(uris["pretokenize"], 1.0), DatasetRef(other, 3.0)))
    loader = TokenLoader(args)
    list(itertools.islice(loader.batches(), 40))
    counts = loader.samples_per_dataset
    assert set(counts) == {0, 1} and counts[1] > counts[0]
    metrics = loader.metrics()  # over both ranks of the args (world size 2); 16 train samples per dataset
    assert metrics["data/1/seen"] == 2 * counts[1] and metrics["data/1/epoch"] == 2 * counts[1] / 16


def _copy_to_s3(local_uri, s3_uri):
    remote = open_store(s3_uri, create=True).child("pretokenized")
    source = open_store(local_uri)
    for key in source.list():
        remote.put_bytes(key, source.get_bytes(key))
    return remote


def test_loader_reads_from_s3_and_feeds_the_model(pretokenized, s3_uri):
    config, _, uris = pretokenized
    remote = _copy_to_s3(uris["pretokenize"], s3_uri)
    args, specs = _args(config, uris, pretokenized_uri=remote.uri)
    batch = next(TokenLoader(args).batches())
    model = FourM(model_args(config, specs))
    out = model(batch)
    out.loss.backward()
    assert torch.isfinite(out.loss) and set(out.modality_losses) <= {s.name for s in specs}
    assert all(p.grad is not None for p in model.parameters())
    val = validation_batches(args, 2)
    assert len(val) == 2 and _keys(val) == _keys(validation_batches(args, 2))  # fixed, deterministic


def test_an_out_of_step_shard_is_an_error_naming_both_files(pretokenized, tmp_path):
    config, _, uris = pretokenized
    source = open_store(uris["pretokenize"])
    copy = open_store(str(tmp_path / "copy"))
    for key in source.list():
        copy.put_bytes(key, source.get_bytes(key))
    copy.put_bytes(shard_key("train", "tok_depth", 0), source.get_bytes(shard_key("train", "tok_depth", 1)))
    args, _ = _args(config, uris, pretokenized_uri=copy.uri)
    with pytest.raises(ShardMismatchError, match="tok_depth/shard-000000.tar.*_keys/shard-000000.txt"):
        list(itertools.islice(TokenLoader(args).batches(), 20))


NPY_ARRAYS = [
    np.arange(4 * 14 * 14, dtype=np.uint16).reshape(4, 14, 14),  # token grids (the fast path)
    np.zeros((2, 8, 8, 3), np.uint8),  # rgb crops
    np.arange(6, dtype=">i4").reshape(2, 3),  # big-endian
    np.array(7, np.int64),  # 0-d
    np.zeros((0, 3), np.float32),  # empty
    np.asfortranarray(np.arange(12.0).reshape(3, 4)),  # Fortran order: np.load's path
    np.array(["text"]),  # unicode: np.load's path
]


@pytest.mark.parametrize("array", NPY_ARRAYS)
def test_npy_members_are_the_bytes_np_save_writes(array):
    expected = io.BytesIO()
    np.save(expected, np.ascontiguousarray(array), allow_pickle=False)
    assert encode_member("tok_rgb", array) == expected.getvalue()


@pytest.mark.parametrize("array", NPY_ARRAYS)
def test_npy_members_decode_as_np_load_does(array):
    data = encode_member("tok_rgb", array)
    decoded = decode_npy(data)
    expected = np.load(io.BytesIO(data), allow_pickle=False)
    assert decoded.dtype == expected.dtype and decoded.shape == expected.shape
    assert np.array_equal(decoded, expected) and decoded.flags.writeable


def test_a_draw_lists_nothing_and_stats_nothing(pretokenized, s3_uri):
    """The train split is listed once when the stream starts; each shard drawn after that costs GETs alone: its key
    index and one tar per modality read."""
    from fourm_kfp.storage import metering

    config, _, uris = pretokenized
    remote = _copy_to_s3(uris["pretokenize"], s3_uri)
    args, _ = _args(config, uris, batch=2, pretokenized_uri=remote.uri)
    loader = TokenLoader(args)
    before = metering.snapshot()
    stream = loader.batches()
    next(stream)
    start_up = metering.since(before)
    assert start_up.requests.get("list", 0) >= 1
    before = metering.snapshot()
    for _ in range(12):
        next(stream)
    draws = loader.positions[0][0]  # shards drawn after the first
    used = metering.since(before)
    assert draws >= 3
    assert used.requests.get("list", 0) == 0 and used.requests.get("stat", 0) == 0, used.requests
    tars = len(token_loader._names_to_read(args.masking)) + 1  # and the crops
    assert 0 < used.requests["get"] <= (draws + 1) * (1 + tars)
