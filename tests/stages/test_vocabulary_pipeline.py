"""A teacher's 300-class semseg and relative depth, from the label stage through train-tokenizers: the dataset's
``dataset_meta.json``, a semseg tokenizer of 300 channels and a standardising depth tokenizer saved with their codec
settings, the bundle recording the vocabulary, and the text tokenizer keeping the class names whole."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from fourm_kfp.config.loader import load_config
from fourm_kfp.contract import run_stage
from fourm_kfp.data.vocabularies import META_FILE
from fourm_kfp.labelers.base import LabelBatch, Labeler, check_labels
from fourm_kfp.stages import get_stage
from fourm_kfp.storage import open_store
from fourm_kfp.tokenizers.bundle import INDEX_FILE, load_tokenizers
from tests.labeler_plugins import expose_entry_points
from tests.photos import write_photo_folder

CLASSES = [f"thing{i}" for i in range(300)]
MODALITIES = "[rgb, caption, semseg, depth]"


class Semseg300Labeler(Labeler):
    """Class ids 0..299 from the colours (a stand-in for a teacher with a large vocabulary)."""

    name, modality = "semseg300", "semseg"

    @property
    def classes(self) -> tuple[str, ...]:
        return tuple(CLASSES)

    def label(self, batch: LabelBatch) -> list[Any]:
        return check_labels(self, batch, [((image[..., 0].astype(np.uint16) + image[..., 1]) % 300).astype(np.uint16)
                                          for image in batch.images])


class RelativeDepthLabeler(Labeler):
    """A relative depth of unknown scale (positive, as a teacher gives it) from the grey level."""

    name, modality, relative_depth = "relative_depth", "depth", True

    def label(self, batch: LabelBatch) -> list[Any]:
        return check_labels(self, batch, [(3.0 + image.mean(axis=-1) / 8.0).astype(np.float32)
                                          for image in batch.images])


@pytest.fixture
def teachers(tmp_path, monkeypatch):
    module = "tests.stages.test_vocabulary_pipeline"
    expose_entry_points(tmp_path / "site", monkeypatch, "vocabulary-teachers", "1",
                        {"semseg300": f"{module}:Semseg300Labeler", "relative_depth": f"{module}:RelativeDepthLabeler"})


def test_a_300_class_vocabulary_and_relative_depth_reach_the_tokenizers(tmp_path, teachers):
    photos = write_photo_folder(tmp_path / "photos", good=8)
    config = load_config("smoke", overrides=[
        "prepare_data.source=image_folder", f"prepare_data.source_uri={photos}", "prepare_data.val_fraction=0.3",
        f"data.modalities={MODALITIES}", f"data.input_modalities={MODALITIES}", f"data.target_modalities={MODALITIES}",
        "label.labelers=[{name: semseg300}, {name: relative_depth}]",
        "train_tokenizers.image_modalities=[semseg, depth]", "train_tokenizers.text_modalities=[caption]"])
    store = open_store(str(tmp_path / "run"), create=True)
    run_stage(get_stage("prepare-data"), config, store)
    labelled = open_store(run_stage(get_stage("label"), config, store).output_uri)
    assert json.loads(labelled.get_bytes(META_FILE)) == {"vocabularies": {"semseg": CLASSES},
                                                         "modality_settings": {"depth": {"relative": True}}}

    tokenizers = open_store(run_stage(get_stage("train-tokenizers"), config, store).output_uri)
    assert json.loads(tokenizers.get_bytes(INDEX_FILE))["vocabularies"] == {"semseg": CLASSES}
    semseg = json.loads(tokenizers.get_bytes("image/semseg/config.json"))["config"]
    assert semseg["codec_settings"] == {"classes": 300} and semseg["in_channels"] == semseg["out_channels"] == 300
    depth = json.loads(tokenizers.get_bytes("image/depth/config.json"))["config"]
    assert depth["codec_settings"] == {"relative": True} and depth["norm_stats"] == {}

    bundle = load_tokenizers(tokenizers)
    assert bundle.vocabularies["semseg"] == tuple(CLASSES) and len(bundle.vocabularies["det"]) == 4  # default det
    maps = np.stack([np.arange(64 * 64).reshape(64, 64) % 300] * 2).astype(np.uint16)
    decoded = bundle.image["semseg"].decode(bundle.image["semseg"].encode(maps))
    assert decoded.dtype == np.uint16 and decoded.max() < 300
    assert bundle.image["depth"].codec.relative
    assert all(bundle.text.token_to_id(name) is not None for name in ("thing0", "thing299"))
