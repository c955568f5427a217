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

PINNED = {
    "smoke": "prepare-data=53d8e8684f4b515c train-tokenizers=87b4cd2e185fec3e pretokenize=2cfc1fbe162fab8c "
             "pretrain=5e202fcf9ca59050 evaluate=25810aa9c7b26db2",
    "demo": "prepare-data=637a8db053111717 train-tokenizers=1c5ba483ebb78792 pretokenize=dc15c7549159258d "
            "pretrain=700bce37505d7c38 evaluate=cbfb1e0271232fc4",
    "proof": "prepare-data=98bc662d91d3c376 train-tokenizers=247ec718e79413fa pretokenize=9e777a16c07ecef2 "
             "pretrain=ab33e95b8183c240 evaluate=173f6be42846f3cb",
    "gpu-demo": "prepare-data=8df64aee0e6e7ab9 train-tokenizers=63198f135b466e1d pretokenize=eb63fb470ffaae8a "
                "pretrain=a5f6360a93b144a2 evaluate=d75aa8c130ef3158",
    # 4m-b moved on 2026-11-27: semseg at ml-4m's 4096 codes (train-tokenizers and what reads it)
    "4m-b": "prepare-data=7e156ae2738c8051 train-tokenizers=6a4fff9bfeb7498a pretokenize=221379faa05287ca "
            "pretrain=1fcc512622a2857d evaluate=f63f320425331746",
    "finetune-4m": "prepare-data=884f8e8099963042 train-tokenizers=14ec6bb7bf22b4cc pretokenize=c9bd3d16d73f8a4e "
                   "pretrain=145586b7905b436a evaluate=7845fc58037186cb",
    "4m-l": "prepare-data=7e156ae2738c8051 train-tokenizers=f84d55700cf75f3e pretokenize=39409cbb3d795fb6 "
            "pretrain=93d16bedc0194dbf evaluate=c5debadfe8259cbc",
    "4m-xl": "prepare-data=7e156ae2738c8051 train-tokenizers=f84d55700cf75f3e pretokenize=39409cbb3d795fb6 "
             "pretrain=f3896dbeef1043cd evaluate=90194667a8d785f2",
}


def _addresses(config) -> str:
    memo: dict[str, str] = {}
    return " ".join(f"{s.name}={stage_address(s, config, memo)}" for s in PIPELINE if s.is_enabled(config))


@pytest.mark.parametrize("preset", sorted(PINNED))
def test_synthetic_presets_keep_their_addresses(preset):
    assert _addresses(load_config(preset)) == PINNED[preset]


def test_every_synthetic_preset_is_pinned():
    synthetic = {p for p in available_presets() if load_config(p).prepare_data.source == "synthetic"}
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
