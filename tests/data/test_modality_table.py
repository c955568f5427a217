"""One table of modalities: every modality is fully described, and every per-modality registry follows it."""

from __future__ import annotations

import numpy as np
import pytest

from fourm_kfp.config.fourm_config import TrainTokenizersConfig
from fourm_kfp.data.modalities import (
    COORD_BINS,
    IMAGE_MODALITIES,
    MODALITIES,
    SEQUENCE_MODALITIES,
    format_det,
    parse_det,
)
from fourm_kfp.data.modality_visuals import VISUALIZERS, visualize
from fourm_kfp.data.pretokenized import member_ext, source_modality, token_name
from fourm_kfp.data.synthetic_scenes import synthetic_sample
from fourm_kfp.labelers.base import LabelBatch
from fourm_kfp.labelers.registry import build_labeler
from fourm_kfp.tokenizers.metrics import METRICS
from fourm_kfp.tokenizers.modality_codecs import CODECS


def test_registries_cover_exactly_the_table():
    assert set(VISUALIZERS) == set(MODALITIES)
    vqvae = {m.name for m in MODALITIES.values() if m.tokenizer == "vqvae"}
    assert set(CODECS) == vqvae == set(METRICS) == set(IMAGE_MODALITIES)
    wordpiece = {m.name for m in MODALITIES.values() if m.tokenizer == "wordpiece"}
    assert wordpiece == set(SEQUENCE_MODALITIES) == set(TrainTokenizersConfig().text_modalities)
    assert set(TrainTokenizersConfig().image_modalities) == vqvae


def _value(name: str):
    """A value of ``name``: the synthetic scene's, or what the built-in labeler making it gives for its rgb."""
    sample = synthetic_sample(0, 3, 32)
    if name in sample:
        return sample[name]
    labeler = build_labeler(name)  # canny_edge, color_palette, metadata: each built-in is named after its modality
    assert labeler.modality == name
    return labeler.label(LabelBatch(("k",), (sample["rgb"],), (sample["caption"],), ((640, 480),)))[0]


@pytest.mark.parametrize("name", list(MODALITIES))
def test_every_modality_is_fully_described(name):
    modality = MODALITIES[name]
    assert modality.kind in ("image", "sequence") and modality.metric
    assert not modality.camera_image or (modality.kind == "image" and modality.channels == 3)  # read as RGB
    value = _value(name)
    stored = modality.decode(modality.encode(value))
    assert stored is not None and (modality.kind == "image" or isinstance(stored, str) and stored)
    if modality.kind == "sequence":  # read from a shard, written again (a stage re-encoding it), read: the same text
        assert modality.decode(modality.encode(stored)) == stored
    tile = visualize(name, value, 32)
    assert tile.shape[:2] == (32, 32)
    if modality.kind == "image":
        array = np.asarray(value)
        assert (array.shape[-1] if array.ndim == 3 else 1) == modality.channels
        codec = CODECS[name]
        assert codec.to_input(array[None], codec.fit(array[None])).shape[1] == codec.in_channels
        assert METRICS[name].primary == modality.metric
        assert source_modality(token_name(name)) == name and member_ext(token_name(name)) == "npy"
    else:
        assert modality.channels == 0
        assert visualize(name, stored, 32).shape == (32, 32, 3)  # as read from a shard, and as generated


def test_det_text_round_trips_and_malformed_generated_boxes_are_skipped():
    boxes, names = [(0.0, 8.0, 16.0, 31.0), (16.0, 0.0, 32.0, 16.0)], ["cube", "sphere"]
    text = format_det(boxes, names, 32, 32)
    parsed = parse_det(text)
    assert [name for _, name in parsed] == names
    assert parsed[0][0] == (0, COORD_BINS // 4, COORD_BINS // 2, COORD_BINS * 31 // 32)
    # What an undertrained model generates: a coordinate glued to word pieces, a box cut short, a coordinate
    # out of range, coordinates out of order. Only the well-formed box survives, wherever it sits.
    generated = f"v0=3 v1=4 v2=67iu v3=9 cube v0=1 v1=2 sphere v0=1 v1=2 v2=3 v3={COORD_BINS} cone v1=1 v0=2 v2=3 v3=4 cube {text}"
    assert parse_det(generated) == parsed
    assert parse_det("v0=1 v1=2 v2=3 v3=4") == [] and parse_det("") == []
