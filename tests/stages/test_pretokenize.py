"""The pretokenize stage: byte-identical reruns into fresh stores (local and S3), decode worker processes giving the
bytes of the reader thread, a corrupt member named in a clear error with no process left behind, a killed worker
redoing only the shards its ledger does not hold committed, the collect step naming a shard no worker committed,
the reconstruction check reading train-tokenizers' manifest (not its report), fan-out parts equal to one worker,
and real data with only rgb and captions."""

from __future__ import annotations

import io
import json
import multiprocessing
import shutil
import tarfile
from pathlib import Path

import numpy as np
import pytest

from fourm_kfp.config.loader import load_config
from fourm_kfp.contract import run_stage, run_stage_part
from fourm_kfp.contract.context import PARTS_DIR, part_key
from fourm_kfp.contract.manifest import MANIFEST_NAME, commit_manifest
from fourm_kfp.contract.shard_jobs import IncompleteShardsError, Shard, parts_stats_key
from fourm_kfp.data.pretokenized import INDEX_FILE, decode_member
from fourm_kfp.data.shard_stream import iter_split
from fourm_kfp.data.shard_writer import keys_key, shard_key
from fourm_kfp.data.ustar import TarSpool
from fourm_kfp.stages import get_stage
from fourm_kfp.storage import open_store
from fourm_kfp.tokenizers import shard_crops
from fourm_kfp.tokenizers.metrics import METRICS
from fourm_kfp.stages.pretokenize import PretokenizeCheckError
from fourm_kfp.tokenizers.shard_crops import CropError

SPEC = get_stage("pretokenize")
OVERRIDES = ["prepare_data.samples_per_shard=6"]  # smoke: 16 train samples -> 3 shards, 8 val -> 2


@pytest.fixture(scope="module")
def upstream(tmp_path_factory):
    """Committed prepare-data and train-tokenizers outputs (smoke)."""
    store = open_store(str(tmp_path_factory.mktemp("upstream")), create=True)
    config = load_config("smoke", overrides=OVERRIDES)
    data = run_stage(get_stage("prepare-data"), config, store)
    tokenizers = run_stage(get_stage("train-tokenizers"), config, store)
    return config, {"prepare-data": data.output_uri, "train-tokenizers": tokenizers.output_uri}


def _token_files(output_uri: str) -> dict[str, str]:
    manifest = json.loads(open_store(output_uri).get_bytes(MANIFEST_NAME))
    return {f["key"]: f["sha256"] for f in manifest["files"] if "/shard-" in f["key"]}


def test_pretokenized_shards_hold_every_modality_and_crop(upstream, tmp_path):
    config, inputs = upstream
    outcome = run_stage(SPEC, config, open_store(str(tmp_path)), input_uris=inputs)
    out = open_store(outcome.output_uri)
    index = json.loads(out.get_bytes(INDEX_FILE))
    assert index["n_crops"] == 2 and index["splits"] == {"train": 16, "val": 8}
    assert index["modalities"]["tok_rgb"] == {"vocab_size": 32, "grid": [8, 8], "dtype": "uint8"}
    names = ["tok_rgb", "tok_depth", "rgb", "caption", "det", "crop"]
    samples = list(iter_split(out, "val", names, decode=decode_member))
    assert len(samples) == 8
    key, sample = samples[0]
    assert sample["tok_rgb"].shape == (2, 8, 8) and sample["tok_rgb"].dtype == np.uint8
    assert sample["rgb"].shape == (2, 64, 64, 3) and isinstance(sample["caption"], str)
    assert len(sample["det"]) == 2 and sample["crop"][0] == {"x0": 0, "y0": 0, "width": 64, "height": 64,
                                                               "flip": False}
    assert outcome.metrics["check.rgb.deviation"] <= config.pretokenize.check_tolerance
    assert "| rgb | 64 | " in out.get_text("reports/pretokenize_report.md")  # 8x8 tokens per crop


def test_reruns_into_fresh_stores_are_byte_identical(upstream, any_store_uri, tmp_path):
    config, inputs = upstream
    first = run_stage(SPEC, config, open_store(any_store_uri, create=True), input_uris=inputs)
    second = run_stage(SPEC, config, open_store(str(tmp_path / "again"), create=True), input_uris=inputs)
    assert first.output_uri.rsplit("/", 1)[1] == second.output_uri.rsplit("/", 1)[1]  # same address
    files = _token_files(first.output_uri)
    assert len(files) > 20 and files == _token_files(second.output_uri)


def _part_metrics(output_uri: str) -> dict[str, float]:
    return json.loads(open_store(output_uri).get_bytes(part_key(0, 1)))["metrics"]


def test_decode_workers_write_the_bytes_of_the_reader_thread(upstream, tmp_path, monkeypatch):
    _, inputs = upstream
    # batches of 5 crops: with 3-sample chunks (6 crops) in the workers, batches straddle chunks
    config = lambda workers: load_config("smoke", overrides=OVERRIDES + [  # noqa: E731
        f"pretokenize.decode_workers={workers}", "pretokenize.batch_size=5"])
    inline = run_stage(SPEC, config(0), open_store(str(tmp_path / "inline"), create=True), input_uris=inputs)
    monkeypatch.setattr(shard_crops, "CHUNK_PIXELS", 3 * 2 * 64 * 64)
    pooled = run_stage(SPEC, config(2), open_store(str(tmp_path / "pooled"), create=True), input_uris=inputs)
    assert _part_metrics(inline.output_uri)["decode_workers"] == 0
    assert _part_metrics(pooled.output_uri)["decode_workers"] == 2
    files = _token_files(inline.output_uri)
    assert len(files) > 20 and files == _token_files(pooled.output_uri)


def _corrupt_member(store, key: str, member: str, spool: Path) -> None:
    """Rewrite the tar at ``key`` with ``member``'s bytes replaced by garbage (a well-formed tar, a bad PNG)."""
    new = TarSpool(str(spool))
    with tarfile.open(fileobj=io.BytesIO(store.get_bytes(key))) as tar:
        for info in tar.getmembers():
            new.add(info.name, b"not a png" if info.name == member else tar.extractfile(info).read())
    new.close()
    store.put_file(key, str(spool))


def test_a_corrupt_member_in_a_worker_names_the_shard_and_leaves_no_process(upstream, tmp_path):
    config, inputs = upstream
    config = load_config("smoke", overrides=OVERRIDES + ["pretokenize.decode_workers=2"])
    data_dir = tmp_path / "data"
    shutil.copytree(inputs["prepare-data"], data_dir)
    data = open_store(str(data_dir))
    key = data.get_text(keys_key("train", 1)).split()[2]
    _corrupt_member(data, shard_key("train", "depth", 1), f"{key}.png", tmp_path / "spool.tar")
    root = open_store(str(tmp_path / "out"), create=True)
    with pytest.raises(CropError, match=rf"train/depth/shard-000001\.tar: member {key}\.png .*cannot be decoded"):
        run_stage_part(SPEC, config, root, 0, 1, input_uris={**inputs, "prepare-data": str(data_dir)})
    assert multiprocessing.active_children() == []  # the decode pool was shut down
    out = open_store(root.uri_of(SPEC.name)).list()
    committed = {k for k in out if "/_keys/" in k}
    assert any(k.endswith("train/_keys/shard-000000.txt") for k in committed)  # kept for a rerun
    assert not any(k.endswith("train/_keys/shard-000001.txt") for k in committed)


def _payload_shards(out) -> dict[str, bytes]:
    """The output's shard files (the statistics records under ``_parts/`` are not the payload's)."""
    return {k: out.get_bytes(k) for k in out.list() if "/shard-" in k and not k.startswith(f"{PARTS_DIR}/")}


@pytest.mark.parametrize("lost", ["key index", "statistics record"])
def test_a_killed_worker_redoes_only_the_shard_its_ledger_lacks(upstream, tmp_path, lost):
    config, inputs = upstream
    root = open_store(str(tmp_path), create=True)
    out_uri = run_stage_part(SPEC, config, root, 0, 1, input_uris=inputs)
    out = open_store(out_uri)
    complete = _payload_shards(out)
    assert out.exists(parts_stats_key(Shard("train", 2)))  # each shard's record, beside the part records
    # the worker "dies" while committing train shard 2: its record or its key index (written last) never lands
    out.delete_prefix(keys_key("train", 2) if lost == "key index" else parts_stats_key(Shard("train", 2)))
    out.delete_prefix(part_key(0, 1))
    outcome = run_stage(SPEC, config, root, input_uris=inputs)
    record = json.loads(out.get_bytes(part_key(0, 1)))
    assert record["metrics"]["shards_done"] == 1 and record["metrics"]["shards_skipped"] == 4
    assert record["metrics"]["encoded_images"] == 4 * 2 * 5  # train shard 2: 4 samples x 2 crops x 5 modalities
    assert _payload_shards(out) == complete
    assert _token_files(outcome.output_uri).keys() == complete.keys()  # skipped shards still in the manifest


def test_collect_names_a_shard_no_worker_committed(upstream, tmp_path):
    config, inputs = upstream
    root = open_store(str(tmp_path), create=True)
    out = open_store(run_stage_part(SPEC, config, root, 0, 2, input_uris=inputs))
    run_stage_part(SPEC, config, root, 1, 2, input_uris=inputs)
    out.delete_prefix(keys_key("val", 1))  # the part records stand: the collect step runs no worker again
    with pytest.raises(IncompleteShardsError, match="val shard 1 is not committed"):
        run_stage(SPEC, config, root, input_uris=inputs, parts=2)
    assert not out.exists(MANIFEST_NAME)


def _tokenizers_copy(inputs: dict[str, str], folder: Path, **metrics: float) -> dict[str, str]:
    """The inputs with train-tokenizers' output copied to ``folder``, its reports removed, ``metrics`` recorded in
    its manifest."""
    shutil.copytree(inputs["train-tokenizers"], folder)
    copy = open_store(str(folder))
    copy.delete_prefix("reports/")
    manifest = json.loads(copy.get_bytes(MANIFEST_NAME))
    manifest["metrics"].update(metrics)
    commit_manifest(copy, manifest)
    return {**inputs, "train-tokenizers": str(folder)}


def test_the_check_reads_the_tokenizers_manifest_not_their_report(upstream, tmp_path):
    config, inputs = upstream
    reference = run_stage(SPEC, config, open_store(str(tmp_path / "reference"), create=True), input_uris=inputs)
    copied = _tokenizers_copy(inputs, tmp_path / "tokenizers")
    outcome = run_stage(SPEC, config, open_store(str(tmp_path / "out"), create=True), input_uris=copied)
    assert outcome.metrics["check.rgb.deviation"] == reference.metrics["check.rgb.deviation"]
    assert _token_files(outcome.output_uri) == _token_files(reference.output_uri)


def test_a_tokenizer_error_unlike_the_recorded_one_fails_naming_the_modality(upstream, tmp_path):
    config, inputs = upstream
    measured = json.loads(open_store(inputs["train-tokenizers"]).get_bytes(MANIFEST_NAME))["metrics"]
    primary = METRICS["depth"].primary
    far_off = measured[f"depth.{primary}"] + 10 * measured[f"depth.baseline_{primary}"]
    copied = _tokenizers_copy(inputs, tmp_path / "tokenizers", **{f"depth.{primary}": far_off})
    with pytest.raises(PretokenizeCheckError, match=f"decoded depth tokens give {primary}="):
        run_stage(SPEC, config, open_store(str(tmp_path / "out"), create=True), input_uris=copied)


def test_two_parts_give_what_one_worker_gives(upstream, tmp_path):
    config, inputs = upstream
    one = run_stage(SPEC, config, open_store(str(tmp_path / "one"), create=True), input_uris=inputs)
    two = run_stage(SPEC, config, open_store(str(tmp_path / "two"), create=True), input_uris=inputs, parts=2)
    assert json.loads(open_store(two.output_uri).get_bytes(MANIFEST_NAME))["counts"]["splits"] == {"train": 16,
                                                                                                 "val": 8}
    assert _token_files(one.output_uri) == _token_files(two.output_uri)


def test_real_data_with_rgb_and_captions_pretokenizes_only_rgb(tmp_path, photo_config):
    config = photo_config
    store = open_store(str(tmp_path / "store"), create=True)
    for name in ("prepare-data", "train-tokenizers"):
        run_stage(get_stage(name), config, store)
    outcome = run_stage(SPEC, config, store)
    out = open_store(outcome.output_uri)
    assert sorted({Path(k).parent.name for k in out.list("train") if k.endswith(".tar")}) == [
        "caption", "crop", "rgb", "tok_rgb"]
    assert list(json.loads(out.get_bytes(INDEX_FILE))["modalities"]) == ["tok_rgb"]
