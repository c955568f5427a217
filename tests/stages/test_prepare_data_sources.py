"""A new prepare-data source is one record and its module: a tiny source registered in the table (flat squares, one
grey level a sample, with a caption) is accepted by the config, addressed from its record and prepared like the
shipped ones, at any width."""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Iterator

import numpy as np
import pytest

from fourm_kfp.config.loader import load_config
from fourm_kfp.config.schema import ConfigError
from fourm_kfp.contract import run_stage, run_stage_part
from fourm_kfp.contract.addressing import stage_address
from fourm_kfp.contract.manifest import MANIFEST_NAME, payload_files
from fourm_kfp.data.shard_stream import iter_joined_shard, shard_indices
from fourm_kfp.data.shard_writer import encode_sample
from fourm_kfp.data.source_record import EncodedSample, Source, SourceJob, SourcePlan, chunks
from fourm_kfp.data.sources import SOURCES
from fourm_kfp.stages import get_stage
from fourm_kfp.storage import open_store

SPEC = get_stage("prepare-data")


def _plan(config: Any) -> SourcePlan:
    """``num_train`` train squares, then ``num_val`` val squares, in shards of ``samples_per_shard``."""
    cfg = config.prepare_data
    jobs = []
    for split, first, count in (("train", 0, cfg.num_train), ("val", cfg.num_train, cfg.num_val)):
        jobs += [SourceJob(((split, i),), chunk, len(chunk))
                 for i, chunk in enumerate(chunks(range(first, first + count), cfg.samples_per_shard))]
    return SourcePlan(jobs)


def _items(config: Any, plan: SourcePlan, jobs: list[SourceJob]) -> Iterator[tuple[int, EncodedSample]]:
    side, kept = config.data.image_size, config.data.modalities
    for pos, job in enumerate(jobs):
        split = job.shards[0][0]
        for i in job.inputs:
            made = {"rgb": np.full((side, side, 3), 10 * i, np.uint8), "caption": f"a flat square of grey {10 * i}"}
            sample = {m: v for m, v in made.items() if m in kept}
            yield pos, EncodedSample(split, f"flat{i:04d}", sample, encode_sample(sample, kept))


FLAT = Source(name="flat", description="flat grey squares", modalities=("rgb", "caption"), plan=_plan,
              items=_items, unit="squares")
ONLY = "[rgb, caption]"


@pytest.fixture
def flat(monkeypatch) -> Source:
    monkeypatch.setitem(SOURCES, FLAT.name, FLAT)
    return FLAT


def _config(*overrides: str):
    return load_config("smoke", overrides=["prepare_data.source=flat", "prepare_data.num_train=7",
                                           "prepare_data.num_val=3", "prepare_data.samples_per_shard=4",
                                           f"data.modalities={ONLY}", f"data.input_modalities={ONLY}",
                                           f"data.target_modalities={ONLY}", *overrides])


def test_a_registered_source_is_prepared_like_a_shipped_one_at_any_width(tmp_path, flat):
    config = _config()
    one = run_stage(SPEC, config, open_store(str(tmp_path / "one"), create=True))
    store = open_store(str(tmp_path / "two"), create=True)
    for part in (1, 0):
        run_stage_part(SPEC, config, store, part, 2)
    two = run_stage(SPEC, config, store, parts=2)
    first, second = (json.loads(open_store(o.output_uri).get_bytes(MANIFEST_NAME)) for o in (one, two))
    assert one.output_uri.rsplit("/", 1)[-1] == two.output_uri.rsplit("/", 1)[-1]
    assert payload_files(first) == payload_files(second) and first["counts"] == second["counts"]

    out = open_store(two.output_uri)
    assert shard_indices(out, "train") == [0, 1] and shard_indices(out, "val") == [0]
    samples = dict(iter_joined_shard(out, "val", 0, config.data.modalities))
    assert list(samples) == ["flat0007", "flat0008", "flat0009"]
    assert samples["flat0008"]["caption"] == "a flat square of grey 80"
    assert (samples["flat0008"]["rgb"] == 80).all()
    report = json.loads(out.get_bytes("reports/dataset_report.json"))
    assert report["source"] == "flat" and report["shards"]["train"]["samples"] == 7
    assert "reports/preview.png" in payload_files(second)
    assert first["sources"] == []  # made from the config alone: no lineage source


def test_its_address_covers_what_its_record_says_it_writes(flat, monkeypatch):
    plain = _config()
    labelled = _config("data.modalities=[rgb, caption, canny_edge]")
    assert stage_address(SPEC, plain, {}) == stage_address(SPEC, labelled, {})  # a later stage writes canny_edge
    assert stage_address(SPEC, plain, {}) != stage_address(SPEC, _config("prepare_data.num_val=4"), {})
    assert stage_address(SPEC, plain, {}) != stage_address(SPEC, load_config("smoke", overrides=[
        f"data.modalities={ONLY}", f"data.input_modalities={ONLY}", f"data.target_modalities={ONLY}"]), {})
    # a record that says it writes canny_edge too: the two configs are two datasets, on two addresses
    monkeypatch.setitem(SOURCES, "flat", dataclasses.replace(FLAT, modalities=("rgb", "caption", "canny_edge")))
    assert stage_address(SPEC, plain, {}) != stage_address(SPEC, labelled, {})


def test_an_unregistered_source_is_refused_by_the_config():
    with pytest.raises(ConfigError, match=r"prepare_data\.source: 'flat' is not one of"):
        _config()
