"""prepare-data fanned out over its output shards: the same payload, byte for byte, at any width; a killed worker
redoes only its missing shards; real sources keep each image's original size; the bad fraction is the whole
source's."""

from __future__ import annotations

import io
import json
import logging
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from fourm_kfp.config.loader import load_config
from fourm_kfp.contract import run_stage, run_stage_part
from fourm_kfp.contract.manifest import MANIFEST_NAME, payload_files
from fourm_kfp.contract.shard_jobs import IncompleteShardsError
from fourm_kfp.data.ingest import TooManyBadSamplesError
from fourm_kfp.data.shard_stream import available_modalities, iter_source_info, shard_indices
from fourm_kfp.stages import get_stage
from fourm_kfp.storage import open_store
from tests.photos import make_tar, write_photo_folder

SPEC = get_stage("prepare-data")
ONLY = "[rgb,caption]"


def _real_config(source: str, uri: Path, *overrides: str):
    return load_config("smoke", overrides=[
        f"prepare_data.source={source}", f"prepare_data.source_uri={uri}", "prepare_data.val_fraction=0.3",
        f"data.modalities={ONLY}", f"data.input_modalities={ONLY}", f"data.target_modalities={ONLY}", *overrides])


def _run(config, root: Path, parts: int = 1, order: tuple[int, ...] = ()) -> str:
    """The stage at width ``parts``: the workers in ``order`` (as separate steps would), then the collect step."""
    store = open_store(str(root), create=True)
    for part in order:
        run_stage_part(SPEC, config, store, part, parts)
    return run_stage(SPEC, config, store, parts=parts).output_uri


def _manifest(uri: str) -> dict:
    return json.loads(open_store(uri).get_bytes(MANIFEST_NAME))


def _same_payload(a: str, b: str) -> None:
    first, second = _manifest(a), _manifest(b)
    assert payload_files(first) == payload_files(second)  # every file, by its sha256
    assert first["payload_digest"] == second["payload_digest"]
    assert first["counts"] == second["counts"]


def test_synthetic_smoke_is_the_same_payload_at_width_1_and_3(tmp_path):
    config = load_config("smoke", overrides=["prepare_data.samples_per_shard=5"])
    one = _run(config, tmp_path / "one")
    three = _run(config, tmp_path / "three", 3, order=(2, 0, 1))
    _same_payload(one, three)
    out = open_store(three)
    assert shard_indices(out, "train") == [0, 1, 2, 3] and shard_indices(out, "val") == [0, 1]
    written = [json.loads(out.get_bytes(f"_parts/part-{p:04d}-of-0003.json"))["counts"]["shards"] for p in range(3)]
    assert written == [[["train", 0], ["train", 3]], [["train", 1], ["val", 0]], [["train", 2], ["val", 1]]]
    assert _manifest(three)["metrics"]["parts"] == 3
    # synthetic data has no source facts: the reader gives {} for every key
    assert list(iter_source_info(out, "val", 1)) == [(f"{i:08d}", {}) for i in range(21, 24)]
    assert not any("/_source/" in key for key in payload_files(_manifest(three)))


def test_image_folder_is_the_same_payload_at_width_1_and_3_with_the_original_sizes(tmp_path):
    folder = write_photo_folder(tmp_path / "photos", good=14, bad=2)
    config = _real_config("image_folder", folder, "prepare_data.samples_per_shard=3",
                          "prepare_data.max_bad_fraction=0.2")
    one = _run(config, tmp_path / "one")
    three = _run(config, tmp_path / "three", 3, order=(1, 2, 0))
    _same_payload(one, three)

    out, counts = open_store(three), _manifest(three)["counts"]
    assert counts["skipped"]["total"] == 2 and counts["skipped"]["by_reason"] == {"unreadable": 2}
    splits = counts["splits"]
    assert splits["train"]["samples"] + splits["val"]["samples"] == 14
    assert splits["train"]["shards"] >= 3 and splits["val"]["shards"] >= 1
    assert available_modalities(out, "train") == ["caption", "rgb"]  # the _source tars are no modality
    for split in ("train", "val"):
        for index in shard_indices(out, split):
            keys = out.get_text(f"{split}/_keys/shard-{index:06d}.txt").split()
            info = list(iter_source_info(out, split, index))
            assert [key for key, _ in info] == keys  # aligned with the key index
            # write_photo_folder's photos are 60 wide and 40 high before the centre crop to 64x64
            assert all(facts == {"original_width": 60, "original_height": 40} for _, facts in info)
    report = json.loads(out.get_bytes("reports/dataset_report.json"))
    assert report["skipped"] == {"unreadable": 2} and report["shards"] == splits


def test_a_killed_worker_redoes_only_its_missing_shard(tmp_path):
    folder = write_photo_folder(tmp_path / "photos", good=14, bad=2)
    config = _real_config("image_folder", folder, "prepare_data.samples_per_shard=3",
                          "prepare_data.max_bad_fraction=0.2")
    clean = _run(config, tmp_path / "clean")

    store = open_store(str(tmp_path / "killed"), create=True)
    out_uri = run_stage_part(SPEC, config, store, 0, 2)
    out = open_store(out_uri)
    first = json.loads(out.get_bytes("_parts/part-0000-of-0002.json"))["counts"]["shards"]
    split, index = first[1]
    # killed mid-shard: no part record, the shard's key index not yet written, one of its tars half uploaded
    out.delete_prefix("_parts/part-0000-of-0002.json")
    out.delete_prefix(f"{split}/_keys/shard-{index:06d}.txt")
    out.put_bytes(f"{split}/rgb/shard-{index:06d}.tar", b"half a tar")

    resumed = run_stage(SPEC, config, store, parts=2).output_uri
    _same_payload(clean, resumed)
    redone = json.loads(out.get_bytes("_parts/part-0000-of-0002.json"))["counts"]
    assert redone["shards"] == [[split, index]] and redone["jobs_skipped"] == len(first) - 1


def test_collect_names_a_shard_no_worker_committed(tmp_path):
    config = load_config("smoke", overrides=["prepare_data.samples_per_shard=5"])
    store = open_store(str(tmp_path), create=True)
    out = open_store(run_stage_part(SPEC, config, store, 0, 2))
    run_stage_part(SPEC, config, store, 1, 2)
    out.delete_prefix("train/_keys/shard-000003.txt")
    with pytest.raises(IncompleteShardsError, match="train shard 3 is not committed"):
        run_stage(SPEC, config, store, parts=2)
    assert not out.exists(MANIFEST_NAME)


def test_max_bad_fraction_is_over_the_whole_source(tmp_path):
    # one bad file in 21: a shard of 2 holding it is half bad, the source is under 5% bad, and the stage passes
    folder = write_photo_folder(tmp_path / "few", good=20, bad=1)
    config = _real_config("image_folder", folder, "prepare_data.samples_per_shard=2",
                          "prepare_data.max_bad_fraction=0.05")
    assert _manifest(_run(config, tmp_path / "few-store", 3, order=(0, 1, 2)))["counts"]["skipped"]["total"] == 1

    folder = write_photo_folder(tmp_path / "many", good=8, bad=2)
    config = _real_config("image_folder", folder, "prepare_data.samples_per_shard=2",
                          "prepare_data.max_bad_fraction=0.1")
    store = open_store(str(tmp_path / "many-store"), create=True)
    for part in range(3):
        run_stage_part(SPEC, config, store, part, 3)
    with pytest.raises(TooManyBadSamplesError) as err:
        run_stage(SPEC, config, store, parts=3)
    assert f"prepare-data source {folder}" in str(err.value) and "2 of 10 samples" in str(err.value)
    assert "broken0.jpg" in str(err.value)
    assert not [k for k in store.list() if k.endswith(MANIFEST_NAME)]


def _jpeg(seed: int, size: tuple[int, int] = (48, 36)) -> bytes:
    buf = io.BytesIO()
    pixels = np.random.default_rng(seed).integers(0, 255, (size[1], size[0], 3), dtype=np.uint8)
    Image.fromarray(pixels).save(buf, format="JPEG")
    return buf.getvalue()


def test_webdataset_tar_t_is_shard_t_at_any_width(tmp_path, caplog):
    folder = tmp_path / "wds"
    folder.mkdir()
    (folder / "00000.tar").write_bytes(make_tar([
        *[(f"{i:04d}.{ext}", data) for i in range(6) for ext, data in (("jpg", _jpeg(i)), ("txt", b"a cat"))],
        ("0006.jpg", b"not a jpeg")]))
    (folder / "00001.tar").write_bytes(make_tar([("0100.jpg", _jpeg(100, (30, 50))), ("0003.jpg", _jpeg(3))]))
    good = make_tar([("0200.jpg", _jpeg(200)), ("0201.jpg", _jpeg(201))])
    (folder / "00002.tar").write_bytes(good[:len(good) // 2])  # cut short
    config = _real_config("webdataset", folder, "prepare_data.max_bad_fraction=0.5")
    one = _run(config, tmp_path / "one")
    with caplog.at_level(logging.WARNING, logger="fourm_kfp.stages.prepare_data"):
        three = _run(config, tmp_path / "three", 3, order=(2, 1, 0))
    _same_payload(one, three)

    out = open_store(three)
    assert shard_indices(out, "train") == [0, 1, 2] and shard_indices(out, "val") == [0, 1, 2]
    keys = {i: [key for split in ("train", "val") for key in out.get_text(f"{split}/_keys/shard-{i:06d}.txt").split()]
            for i in range(3)}
    assert sorted(keys[0]) == [f"{i:04d}" for i in range(6)] and sorted(keys[1]) == ["0003", "0100"]
    sizes = dict(info for split in ("train", "val") for i in range(3) for info in iter_source_info(out, split, i))
    assert sizes["0100"] == {"original_width": 30, "original_height": 50}
    assert _manifest(three)["counts"]["skipped"]["by_reason"] == {"corrupt_tar": 1, "unreadable": 1}
    assert "key '0003' is in" in caplog.text  # in tars 0 and 1: kept in both, with a warning
