"""Addresses move only on purpose: every preset's stage addresses are pinned here, so a change that moves one (a
new stage, a new config default, a refactor of the addressing) fails until the pin is updated on purpose, with a
``code_version`` bump or a note saying why.

The label stage joined the pipeline off by default: a preset without labelers has exactly the addresses it had
before the stage existed (the pins below were taken before it was added)."""

from __future__ import annotations

import pytest

from fourm_kfp.config.loader import available_presets, load_config
from fourm_kfp.contract.addressing import stage_address
from fourm_kfp.stages import PIPELINE

# 2026-12-02: pretrain code_version 10 (checkpoints hold the metric history) moved every pretrain and evaluate
# 2026-11-28: evaluate code_version 7 (the report states its decode budget) moved every evaluate address
PINNED = {
    "smoke": "prepare-data=53d8e8684f4b515c train-tokenizers=87b4cd2e185fec3e pretokenize=2cfc1fbe162fab8c "
             "pretrain=1b9f43becfd82fac evaluate=1b70b26b926bbbcf",
    "demo": "prepare-data=637a8db053111717 train-tokenizers=1c5ba483ebb78792 pretokenize=dc15c7549159258d "
            "pretrain=3e3949c99c825c3f evaluate=7631d7873ad46fab",
    "proof": "prepare-data=98bc662d91d3c376 train-tokenizers=247ec718e79413fa pretokenize=9e777a16c07ecef2 "
             "pretrain=47d84f0a47b39c57 evaluate=304dfcc40cc011c6",
    "gpu-demo": "prepare-data=8df64aee0e6e7ab9 train-tokenizers=63198f135b466e1d pretokenize=eb63fb470ffaae8a "
                "pretrain=5a5cc066627eaad4 evaluate=d90f71d70c769252",
    # 2026-11-27: pretrain code_version 9 moved every pretrain and evaluate; 4m-b's train-tokenizers (and what reads
    # it) moved with semseg at ml-4m's 4096 codes
    "4m-b": "prepare-data=7e156ae2738c8051 train-tokenizers=6a4fff9bfeb7498a pretokenize=221379faa05287ca "
            "pretrain=01b7b1bcea40584f evaluate=5c1a3af22f8dc2e8",
    "4m-l": "prepare-data=7e156ae2738c8051 train-tokenizers=f84d55700cf75f3e pretokenize=39409cbb3d795fb6 "
            "pretrain=17ad7db07e12b293 evaluate=e1a9c2246fc4e274",
    "4m-xl": "prepare-data=7e156ae2738c8051 train-tokenizers=f84d55700cf75f3e pretokenize=39409cbb3d795fb6 "
             "pretrain=80696bbc6d14766d evaluate=b406778ecaae35af",
}


def _addresses(config) -> str:
    memo: dict[str, str] = {}
    return " ".join(f"{s.name}={stage_address(s, config, memo)}" for s in PIPELINE if s.is_enabled(config))


@pytest.mark.parametrize("preset", sorted(PINNED))
def test_synthetic_presets_keep_their_addresses(preset):
    assert _addresses(load_config(preset)) == PINNED[preset]


def _self_contained(config) -> bool:
    """Synthetic data and nothing read from outside (an ml-4m model or tokenizer file has its own digest)."""
    return (config.prepare_data.source == "synthetic" and not config.train.init_from
            and not config.train_tokenizers.text_tokenizer_from)


def test_every_synthetic_preset_is_pinned():
    synthetic = {p for p in available_presets() if _self_contained(load_config(p))}
    assert synthetic == set(PINNED)


def test_labelers_move_the_label_stage_and_what_reads_the_dataset_only():
    plain = load_config("smoke")
    labelled = load_config("smoke", overrides=["label.labelers=[{name: canny_edge}]",
                                               "data.modalities=[rgb, depth, normal, semseg, edge, det, caption, "
                                               "canny_edge]"])
    other = load_config("smoke", overrides=["label.labelers=[{name: canny_edge, params: {low: 50}}]",
                                            "data.modalities=[rgb, depth, normal, semseg, edge, det, caption, "
                                            "canny_edge]"])
    memo_a, memo_b, memo_c = {}, {}, {}
    for spec in PIPELINE:
        if not spec.is_enabled(plain):
            assert spec.name == "label" and spec.is_enabled(labelled)
            assert stage_address(spec, labelled, memo_b) != stage_address(spec, other, memo_c)
            continue
        a, b = stage_address(spec, plain, memo_a), stage_address(spec, labelled, memo_b)
        stage_address(spec, other, memo_c)
        assert (a == b) == (spec.name == "prepare-data"), spec.name  # all but prepare-data read the labels


#: The presets that read files from outside the package, pinned with what each stage reads of them (its fingerprint:
#: a teacher's or an ml-4m model's weights, a tokenizer file) replaced by a stand-in, so that the pin holds what
#: their configs decide (a default that moves, a task list that grows) on a machine without those files. photos
#: reads the photographs scikit-image ships in its wheel (the locked version): its own address covers their listing.
STAND_INS = {
    "photos": (),
    "photos-4m21": ("fourm_kfp.stages.label.labelers_fingerprint",),
    "finetune-4m": ("fourm_kfp.stages.train_tokenizers.source_fingerprint",
                    "fourm_kfp.stages.pretrain.init_fingerprint"),
}
# 2026-12-02: pinned (issue 67) with the addresses these presets had before the pin (computed on 05d4a76)
PINNED_WITH_STAND_INS = {
    "photos": "prepare-data=16e5679e96be1c5d label=45ac9b66db76562d train-tokenizers=055662c8f40aca10 "
              "pretokenize=4d42a7a5c6159262 pretrain=c4f1f32b2c2e0cc4 evaluate=442b155f8997ddf6",
    "photos-4m21": "prepare-data=140c25cdac28592e label=015c5fb26bad1fa7 train-tokenizers=f94a6ac5b214e237 "
                   "pretokenize=14c0932e5102ac18 pretrain=9df7ce9e1c098ba9 evaluate=6d29ba34458f0b41",
    "finetune-4m": "prepare-data=884f8e8099963042 train-tokenizers=fa7f4043c20aa5f8 pretokenize=9e9ce6f4911a334e "
                   "pretrain=3e94389087155950 evaluate=079fa614585f73ff",
}


@pytest.mark.parametrize("preset", sorted(PINNED_WITH_STAND_INS))
def test_presets_that_read_outside_files_keep_their_addresses(preset, monkeypatch):
    for fingerprint in STAND_INS[preset]:
        monkeypatch.setattr(fingerprint, lambda config, name=fingerprint: f"stand-in for {name}")
    assert _addresses(load_config(preset)) == PINNED_WITH_STAND_INS[preset]


def test_every_shipped_preset_is_pinned():
    assert set(available_presets()) == set(PINNED) | set(PINNED_WITH_STAND_INS)
    assert set(STAND_INS) == set(PINNED_WITH_STAND_INS)
