"""fourm_model's image labels at the photo's size: a class map (semseg) and a binary map (edges) are resized nearest,
so every pixel keeps one of the ids the model generated and a border between two classes makes no id between them;
a continuous map (depth) is resized bilinearly. The model is a stand-in engine that returns fixed maps at its own
size, so the test sees the labeler's resizing alone; PIL's own resampling is the reference."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from fourm_kfp.labelers import fourm_model
from fourm_kfp.labelers.base import LabelBatch, LabelerSetup

MODEL_SIZE, PHOTO_SIZE = 16, 24  # a 1.5x resize: each output pixel falls between two of the model's


class _Engine:
    """What FourMModelLabeler reads of AnyToAny: the generated value of each modality at the model's size."""

    image_size = MODEL_SIZE
    modalities = ["rgb", "semseg", "edge", "depth"]
    vocabularies = {"semseg": tuple(f"class{i}" for i in range(10))}

    def __init__(self, maps: dict[str, np.ndarray]) -> None:
        self.maps = maps

    def generate(self, inputs, targets, sampling, batch_size):
        assert all(x["rgb"].shape == (MODEL_SIZE, MODEL_SIZE, 3) for x in inputs)  # the photo at the model's size
        return [{t: self.maps[t] for t in targets} for _ in inputs]


def _class_map() -> np.ndarray:
    """Classes 2 and 7 in vertical stripes and a block of 9: borders where linear interpolation would make 3..6."""
    ids = np.where((np.arange(MODEL_SIZE) // 3) % 2 == 0, 2, 7).astype(np.uint8)
    value = np.tile(ids, (MODEL_SIZE, 1))
    value[4:9, 5:12] = 9
    return value


MAPS = {"semseg": _class_map(), "edge": (_class_map() == 9).astype(np.uint8),
        "depth": np.linspace(1.0, 5.0, MODEL_SIZE * MODEL_SIZE, dtype=np.float32).reshape(MODEL_SIZE, MODEL_SIZE)}


@pytest.fixture
def labeler_of(monkeypatch):
    monkeypatch.setattr(fourm_model, "_engine", lambda uri, device: _Engine(MAPS))

    def build(modality: str) -> fourm_model.FourMModelLabeler:
        return fourm_model.FourMModelLabeler(LabelerSetup({"modality": modality}, "stand-in", "digest"))

    return build


def _photos() -> LabelBatch:
    rng = np.random.default_rng(0)
    return LabelBatch(("a", "b"), tuple(rng.integers(0, 255, (PHOTO_SIZE, PHOTO_SIZE, 3), dtype=np.uint8)
                                        for _ in range(2)))


def _pil(value: np.ndarray, resample: int) -> np.ndarray:
    mode = "F" if value.dtype == np.float32 else None
    return np.asarray(Image.fromarray(value, mode=mode).resize((PHOTO_SIZE, PHOTO_SIZE), resample))


@pytest.mark.parametrize("modality", ["semseg", "edge"])
def test_a_class_or_binary_map_is_resized_nearest_and_keeps_only_generated_ids(labeler_of, modality):
    labels = labeler_of(modality).label(_photos())
    generated = set(np.unique(MAPS[modality]).tolist())
    for label in labels:
        assert label.shape == (PHOTO_SIZE, PHOTO_SIZE) and label.dtype == MAPS[modality].dtype
        assert set(np.unique(label).tolist()) == generated  # no id between two neighbours, none lost
        np.testing.assert_array_equal(label, _pil(MAPS[modality], Image.NEAREST))


def test_a_continuous_map_is_resized_bilinearly(labeler_of):
    labels = labeler_of("depth").label(_photos())
    for label in labels:
        assert label.shape == (PHOTO_SIZE, PHOTO_SIZE) and label.dtype == np.float32
        np.testing.assert_allclose(label, _pil(MAPS["depth"], Image.BILINEAR), rtol=1e-6)
        assert len(np.unique(label)) > len(np.unique(MAPS["depth"]))  # values between the model's pixels
