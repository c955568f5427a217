"""One record per modality: every record of the table is complete (each field set, each name it holds resolving in
its family table on its own floor), and every consumer reaches every modality of the table through it: the shard
codec, the data gate, crops, the visualiser, the image tokenizer's codec and metrics, train-tokenizers' defaults,
the dataset settings, the evaluation's scorer and tasks, and ml-4m's domains (for a record that has one).

A modality ml-4m lacks is its record (``ml4m=None``) and its teacher alone: a scratch copy of the package with a
SigLIP-like feature map added to the table passes these tests as a newcomer's change would."""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from fourm_kfp.config.fourm_config import EVALUATION_TASKS, ImageTokenizerConfig, TrainTokenizersConfig
from fourm_kfp.data.crops import CROP_RULES, Crop, apply_crop
from fourm_kfp.data.label_checks import CHECKS, CheckSettings, check_value
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
from fourm_kfp.data.vocabularies import SETTINGS, DatasetMeta
from fourm_kfp.evaluation.targets import SCORERS, scorer, task_primary
from fourm_kfp.labelers.base import LabelBatch, LabelerSetup
from fourm_kfp.labelers.registry import build_labeler
from fourm_kfp.model.ml4m import DOMAINS
from fourm_kfp.tokenizers.metrics import ERROR_FAMILIES, METRICS
from fourm_kfp.tokenizers.modality_codecs import CODECS, get_codec
from tests.labeler_plugins import FeatureMapLabeler

SIZE = 32


def _sample(name: str) -> tuple[object, dict]:
    """A value of ``name`` and its dataset settings: the synthetic scene's, or what a labeler making it gives for
    the scene's rgb (a built-in named after its modality; the test teacher for a feature map)."""
    sample = synthetic_sample(0, 3, SIZE)
    if name in sample:
        return sample[name], {}
    if MODALITIES[name].grid_sized:
        labeler = FeatureMapLabeler(LabelerSetup(params={"modality": name, "grid": 4, "channels": 6}))
    else:
        labeler = build_labeler(name)  # canny_edge, color_palette, metadata
    assert labeler.modality == name
    batch = LabelBatch(("k",), (sample["rgb"],), (sample["caption"],), ((640, 480),))
    return labeler.label(batch)[0], labeler.modality_settings


@pytest.mark.parametrize("name", list(MODALITIES))
def test_every_record_is_complete(name):
    m = MODALITIES[name]
    assert m.name == name and m.ext and m.metric and callable(m.encode) and callable(m.decode)
    assert (m.kind, m.tokenizer) in (("image", "vqvae"), ("sequence", "wordpiece"))
    assert m.visual in VISUALIZERS and m.crop in CROP_RULES
    assert m.check in CHECKS if m.kind == "sequence" else not m.check or m.check in CHECKS
    assert not m.scoring or m.scoring in SCORERS
    # ml-4m's domain, where it has one (None: a model holding the modality is not exported to ml-4m)
    assert m.ml4m is None or m.ml4m.vocab_size > 0 and (m.ml4m.max_length > 0) == (m.kind == "sequence")
    fields = {f.name for f in dataclasses.fields(ImageTokenizerConfig)}
    if m.kind == "image":
        assert m.codec in CODECS and m.errors in ERROR_FAMILIES
        assert set(m.tokenizer_defaults) <= fields
        assert m.grid_sized == (m.channels == 0) and (not m.grid_sized or {"channels", "grid"} <= set(m.settings))
    else:
        assert not (m.codec or m.errors or m.tokenizer_defaults or m.grid_sized) and m.channels == 0
    assert not m.camera_image or (m.kind == "image" and m.channels == 3)  # read as RGB
    assert not m.discrete or m.crop == "nearest"  # ids and flags are never blended


def test_each_consumer_reaches_every_modality_of_the_table():
    assert set(SETTINGS) == {n for n, m in MODALITIES.items() if m.settings}
    assert set(DOMAINS) == {n for n, m in MODALITIES.items() if m.ml4m is not None}
    assert len({d.name for d in DOMAINS.values()}) == len(DOMAINS)
    assert set(METRICS) == set(IMAGE_MODALITIES)
    defaults = TrainTokenizersConfig()
    assert set(defaults.image_modalities) == set(IMAGE_MODALITIES)
    assert set(defaults.text_modalities) == set(SEQUENCE_MODALITIES) and defaults.text_modalities[0] == "caption"
    assert {task for task in EVALUATION_TASKS if task.startswith("rgb-to-")} == {
        f"rgb-to-{n}" for n, m in MODALITIES.items() if m.scoring}
    # every family of each table is some record's (nothing orphaned)
    for table, field in ((CHECKS, "check"), (VISUALIZERS, "visual"), (CROP_RULES, "crop"), (CODECS, "codec"),
                         (ERROR_FAMILIES, "errors")):
        assert set(table) == {getattr(m, field) for m in MODALITIES.values()} - {""}, field


@pytest.mark.parametrize("name", list(MODALITIES))
def test_every_modality_is_fully_described(name):
    modality = MODALITIES[name]
    value, settings = _sample(name)
    stored = modality.decode(modality.encode(value))
    assert stored is not None and (modality.kind == "image" or isinstance(stored, str) and stored)
    if modality.kind == "sequence":  # read from a shard, written again (a stage re-encoding it), read: the same text
        assert modality.decode(modality.encode(stored)) == stored
    assert check_value(name, value, CheckSettings(SIZE, modality_settings=settings)) is None
    full = apply_crop({name: value}, Crop(0, 0, SIZE, SIZE), SIZE)[name]
    # the full view: a map as it was; a text as it was, or (det) its boxes through the crop's pixels
    assert np.array_equal(full, value) if modality.kind == "image" else type(full) is type(value)
    tile = visualize(name, value, SIZE)
    assert tile.shape == (SIZE, SIZE, 3) and tile.dtype == np.uint8
    assert modality.ml4m is None or DOMAINS[name].kind == modality.kind
    if modality.kind == "image":
        array = np.asarray(value)
        meta = DatasetMeta.from_json({"modality_settings": {name: settings}} if settings else {}, "test")
        assert array.shape == modality.shape(SIZE, meta.settings(name))
        codec = get_codec(name, get_codec(name).settings_for(meta, name))
        assert codec.to_input(array[None], codec.fit(array[None])).shape[1] == codec.in_channels
        assert METRICS[name].primary == modality.metric
        assert METRICS[name].errors(array[None], array[None])[modality.metric] == pytest.approx(0.0, abs=0.05)
        assert TrainTokenizersConfig().image_config(name).patch_size >= 1
        assert source_modality(token_name(name)) == name and member_ext(token_name(name)) == "npy"
    else:
        assert member_ext(name) in ("txt", "json")
        assert visualize(name, stored, SIZE).shape == (SIZE, SIZE, 3)  # as read from a shard, and as generated
    if modality.scoring:
        family = scorer(name)
        truth = [stored]
        assert task_primary(f"rgb-to-{name}")[0] == family.primary
        assert family.primary in family.stats(truth, truth, [0.0]).whole()
        assert family.baseline(truth * 2) is not None


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


REPO = Path(__file__).resolve().parents[2]
#: the end of the modality table in ``data/modalities.py``: where a newcomer adds a record
TABLE_END = "\n    )\n}\n\nIMAGE_MODALITIES"


def test_a_modality_ml4m_lacks_is_its_record_and_its_teacher_alone(tmp_path):
    """A SigLIP-like second feature map (``feature_map("siglip")``: no ml-4m domain) added to the table of a scratch
    copy of the package, with the test's feature-map teacher (:class:`FeatureMapLabeler`) making its values: every
    test of this module that takes it passes there (the record is complete, each consumer reaches it, its teacher's
    values are coded, checked, cropped, drawn, tokenized and scored), with no made-up ml-4m domain."""
    package = tmp_path / "src" / "fourm_kfp"
    shutil.copytree(REPO / "src" / "fourm_kfp", package, ignore=shutil.ignore_patterns("__pycache__"))
    table = package / "data" / "modalities.py"
    source = table.read_text()
    assert source.count(TABLE_END) == 1, f"the modality table's end moved: update TABLE_END in {__file__}"
    table.write_text(source.replace(TABLE_END, '\n        feature_map("siglip"),' + TABLE_END))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path / "src"), str(REPO)])}
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rA", "-o", "addopts=", "-p", "no:kmock", "-p",
                          "no:cacheprovider", f"{__file__}::test_every_record_is_complete",
                          f"{__file__}::test_each_consumer_reaches_every_modality_of_the_table",
                          f"{__file__}::test_every_modality_is_fully_described", "-k",
                          "siglip or consumer"], cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    passed = {line.split()[1] for line in run.stdout.splitlines() if line.startswith("PASSED ")}
    assert {f"{Path(__file__).relative_to(REPO)}::{test}" for test in (
        "test_every_record_is_complete[siglip]", "test_each_consumer_reaches_every_modality_of_the_table",
        "test_every_modality_is_fully_described[siglip]")} <= passed, run.stdout[-4000:]
