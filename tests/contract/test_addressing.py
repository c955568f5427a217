"""Content addresses follow from the config alone: the same in every fresh store, and a versioned field moves its
stage and every stage below it, never the ones above."""

from __future__ import annotations

import pytest

from fourm_kfp.config.loader import load_config
from fourm_kfp.contract.addressing import stage_address
from fourm_kfp.contract.planning import plan_stages
from fourm_kfp.stages import PIPELINE, get_stage
from fourm_kfp.storage import open_store


def _addresses(overrides=()):
    config = load_config("smoke", overrides=list(overrides))
    memo: dict[str, str] = {}
    return {spec.name: stage_address(spec, config, memo) for spec in PIPELINE}


def _below(name: str) -> set[str]:
    """``name`` and every stage that reads it, directly or not."""
    out = {name}
    for spec in PIPELINE:
        if any(up.name in out for up in spec.upstream):
            out.add(spec.name)
    return out


def test_two_fresh_stores_plan_identical_addresses(tmp_path):
    config = load_config("smoke")
    first = plan_stages(PIPELINE, config, open_store(str(tmp_path / "a")))
    second = plan_stages(PIPELINE, config, open_store(str(tmp_path / "b")))
    assert [p.address for p in first] == [p.address for p in second]
    assert all(len(p.address) == 16 and not p.committed for p in first if not p.off)
    assert [p.name for p in first if p.off] == ["label"]  # smoke asks for no labelers
    assert len({p.address for p in first}) == len(PIPELINE)


@pytest.mark.parametrize("override, stage", [
    ("prepare_data.num_train=17", "prepare-data"),
    ("prepare_data.seed=1", "prepare-data"),
    ("data.image_size=32", "prepare-data"),
    ("train_tokenizers.text_vocab_size=300", "train-tokenizers"),
    ("train_tokenizers.image.codebook_size=64", "train-tokenizers"),
])
def test_versioned_field_moves_its_stage_and_everything_below(override, stage):
    base, changed = _addresses(), _addresses([override])
    moved = {name for name in base if base[name] != changed[name]}
    assert moved == _below(stage) | ({"train-tokenizers"} if override.startswith("data.image_size") else set())
    assert stage in moved


def test_unversioned_fields_and_unrelated_sections_move_nothing():
    base = _addresses()
    for override in ("prepare_data.workers=3", "prepare_data.preview_samples=2",
                     "train_tokenizers.recon_samples=2", "train.log_every=7"):
        assert _addresses([override]) == base, override


def test_code_version_moves_the_stage_and_below():
    import dataclasses

    config = load_config("smoke")
    spec = get_stage("prepare-data")
    bumped = dataclasses.replace(spec, code_version=spec.code_version + 1)
    downstream = dataclasses.replace(get_stage("train-tokenizers"), upstream=(bumped,))
    assert stage_address(bumped, config) != stage_address(spec, config)
    assert stage_address(downstream, config) != stage_address(get_stage("train-tokenizers"), config)
