"""Content addressing: versioned config fields and upstream outputs change the prefix; unversioned ones don't."""

from __future__ import annotations

from fourm_kfp.config.loader import load_config
from fourm_kfp.content_address import output_hash
from fourm_kfp.stages import get_stage

SPEC = get_stage("prepare-data")


def _hash(overrides=(), inputs=None, stage=SPEC.name, version=SPEC.code_version):
    config = load_config("smoke", overrides=list(overrides))
    return output_hash(stage, version, config, SPEC.config_keys, inputs or {})


def test_same_config_same_address():
    assert _hash() == _hash()
    assert len(_hash()) == 16


def test_versioned_fields_change_the_address():
    base = _hash()
    for override in ("prepare_data.num_train=17", "prepare_data.seed=1", "data.image_size=96",
                     "prepare_data.samples_per_shard=4"):
        assert _hash([override]) != base, override


def test_unversioned_fields_and_unrelated_sections_keep_the_address():
    base = _hash()
    for override in ("prepare_data.workers=3", "prepare_data.preview_samples=2", "train.steps=99",
                     "train.optimizer.base_lr=0.5"):
        assert _hash([override]) == base, override


def test_inputs_stage_and_code_version_change_the_address():
    assert _hash(inputs={"x": "sha256:aa"}) != _hash(inputs={"x": "sha256:bb"})
    assert _hash(stage="other") != _hash()
    assert _hash(version=SPEC.code_version + 1) != _hash()
