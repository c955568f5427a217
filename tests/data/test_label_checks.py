"""The data gate's value checks, one bad value each: every check in ``data/label_checks.py`` is the only thing that
stops its value (a test here fails when its check is taken out), and a good value of each modality passes."""

from __future__ import annotations

import re

import numpy as np
import pytest

from fourm_kfp.data.label_checks import CheckSettings, check_value

SIZE = 8
SETTINGS = CheckSettings(image_size=SIZE)


def _depth(value: float = 5.0) -> np.ndarray:
    return np.full((SIZE, SIZE), value, np.float32)


def _normals() -> np.ndarray:
    normals = np.zeros((SIZE, SIZE, 3), np.float32)
    normals[..., 2] = 1.0
    return normals


GOOD = {
    "depth": _depth(),
    "normal": _normals(),
    "semseg": np.ones((SIZE, SIZE), np.int64),
    "edge": np.eye(SIZE, dtype=np.uint8),
    "canny_edge": np.eye(SIZE, dtype=np.uint8),
    "color_palette": [{"1": [[10, 20, 30]], "2": [[0, 0, 0], [255, 255, 255]]}],
    "det": "v0=10 v1=20 v2=500 v3=600 chair v0=0 v1=0 v2=999 v3=999 table",
    "caption": "a chair beside a table",
    "metadata": {"brightness": 120.0},
}


def _with(array: np.ndarray, index, value) -> np.ndarray:
    array = array.copy()
    array[index] = value
    return array


BAD = [
    ("depth", _depth()[:4], "shape"),
    ("depth", _with(_depth(), (0, 0), np.nan), "non-finite depth values"),
    ("depth", _with(_depth(), (0, 0), np.inf), "non-finite depth values"),
    ("depth", _with(_depth(), (0, 0), -1.0), r"depth outside \[0, 1000.0\] m"),
    ("depth", _with(_depth(), (0, 0), 5000.0), r"depth outside \[0, 1000.0\] m"),
    ("depth", _depth(0.0), "of the depth pixels are invalid"),
    ("normal", _with(_normals(), (0, 0, 0), np.nan), "non-finite normal vectors"),
    ("normal", np.zeros((SIZE, SIZE, 3), np.float32), "of the normals are zero"),
    ("normal", _normals() * 1.5, "not unit vectors"),
    ("semseg", np.ones((SIZE, SIZE), np.float32), "expected integers"),
    ("semseg", _with(np.ones((SIZE, SIZE), np.int64), (0, 0), 70000), "a 16-bit PNG"),
    ("semseg", _with(np.ones((SIZE, SIZE), np.int64), (0, 0), -1), "outside 0..65535"),
    ("edge", _with(np.eye(SIZE, dtype=np.uint8), (0, 1), 255), "binary map"),
    ("canny_edge", _with(np.eye(SIZE, dtype=np.uint8), (0, 1), 2), "binary map"),
    ("color_palette", {"1": [[1, 2, 3]]}, "not 4M's palette JSON"),
    ("color_palette", [{"8": [[0, 0, 0]] * 8}], "outside 1..7"),
    ("color_palette", [{"2": [[0, 0, 0]]}], r"has shape \(1, 3\), expected \(2, 3\)"),
    ("color_palette", [{"1": [[0, 0, 300]]}], "channels outside 0..255"),
    ("det", "v0=10 v1=20 v2=500 v3=1200 chair", r"outside the image \(0..999\)"),
    ("det", "v0=500 v1=20 v2=10 v3=600 chair", "xmin > xmax"),
    ("det", "v0=10 v1=600 v2=500 v3=20 chair", "ymin > ymax"),
    ("det", "v0=10 v1=20 v2=500 chair v3=600", "is not v0=<bin>"),
    ("det", "v0=10 v1=20 v2=500 v3=600", "not whole boxes"),
    ("det", "v0=10 v1=20 v2=500 v3=600 v0=3", "where the class name belongs"),
    ("det", "", "an empty text"),
    ("det", 42, "expected the det text"),
    ("caption", "   ", "an empty text"),
    ("caption", 42, "an empty text"),
    ("metadata", {}, "an empty value"),
]


@pytest.mark.parametrize("modality", sorted(GOOD))
def test_a_good_value_of_each_modality_passes(modality):
    assert check_value(modality, GOOD[modality], SETTINGS) is None


@pytest.mark.parametrize("modality, value, problem", BAD, ids=[f"{m}-{p[:24]}" for m, _, p in BAD])
def test_each_check_stops_its_bad_value(modality, value, problem):
    found = check_value(modality, value, SETTINGS)
    assert found is not None and re.search(problem, found), found


def test_a_class_outside_the_labeler_s_vocabulary_is_stopped():
    settings = CheckSettings(image_size=SIZE, classes=("background", "chair", "table"))
    assert check_value("semseg", np.full((SIZE, SIZE), 2, np.int64), settings) is None
    found = check_value("semseg", _with(np.full((SIZE, SIZE), 2, np.int64), (0, 0), 3), settings)
    assert found == "class ids 2..3 outside the vocabulary of 3 classes"
    assert check_value("det", "v0=1 v1=2 v2=3 v3=4 chair", settings) is None
    assert "'sofa' is not in the labeler's vocabulary" in check_value("det", "v0=1 v1=2 v2=3 v3=4 sofa", settings)


def test_relative_depth_is_checked_for_finite_values_only():
    settings = CheckSettings(image_size=SIZE, relative_depth=True)
    assert check_value("depth", _depth(-3.0), settings) is None  # standardised per image: negative is fine
    assert check_value("depth", _with(_depth(), (1, 1), np.nan), settings) == "non-finite depth values"


def test_a_generative_teacher_s_det_keeps_only_the_boxes_the_gate_accepts():
    """fourm_model's det label: of generated text, the boxes a scorer reads that are boxes (ordered corners, a known
    class), and nothing when none is: the gate then sees only valid values."""
    from fourm_kfp.data.modalities import well_formed_det

    classes = ("chair", "table")
    generated = ("v0=10 v1=20 v2=500 v3=600 chair v2=67iu v0=500 v1=20 v2=10 v3=600 table "
                 "v0=1 v1=2 v2=3 v3=4 sofa v0=5 v1=6 v2=7 v3=8 table v0=9 v1=9")
    kept = well_formed_det(generated, classes)
    assert kept == "v0=10 v1=20 v2=500 v3=600 chair v0=5 v1=6 v2=7 v3=8 table"
    assert check_value("det", kept, CheckSettings(image_size=SIZE, classes=classes)) is None
    assert check_value("det", generated, CheckSettings(image_size=SIZE, classes=classes)) is not None
    assert well_formed_det("v0=500 v1=20 v2=10 v3=600 chair the", classes) == ""


FEATURES = CheckSettings(image_size=SIZE, modality_settings={"channels": 5, "grid": 3})


def _features() -> np.ndarray:
    return np.random.default_rng(0).normal(size=(3, 3, 5)).astype(np.float32)


@pytest.mark.parametrize("modality", ["clip", "dinov2"])
def test_a_feature_map_is_checked_against_its_labeler_s_grid_and_channels_not_the_image_size(modality):
    assert check_value(modality, _features(), FEATURES) is None  # a 3 x 3 grid where images are 8 px
    assert check_value(modality, _features().astype(np.float16), FEATURES) is None


BAD_FEATURES = [
    (_with(_features(), (0, 0, 0), np.nan), FEATURES, "non-finite feature values"),
    (_with(_features(), (1, 2, 3), -np.inf), FEATURES, "non-finite feature values"),
    (_features()[:, :2], FEATURES, r"shape \(3, 2, 5\), expected \[grid, grid, channels\] = \(3, 3, 5\)"),
    (_features()[..., :4], FEATURES, r"shape \(3, 3, 4\)"),
    (np.zeros((SIZE, SIZE, 5), np.float32), FEATURES, r"expected \[grid, grid, channels\]"),  # the image's size
    (_features().astype(np.int32), FEATURES, "expected floats"),
    (_with(_features(), (0, 0, 0), 1e6), FEATURES, "beyond"),
    (_features(), CheckSettings(image_size=SIZE), "reports no channels and grid"),
    (_features(), CheckSettings(image_size=SIZE, modality_settings={"channels": 5}), "reports no channels"),
]


@pytest.mark.parametrize("value, settings, problem", BAD_FEATURES, ids=[p[:24] for _, _, p in BAD_FEATURES])
def test_each_feature_map_check_stops_its_bad_value(value, settings, problem):
    found = check_value("clip", value, settings)
    assert found is not None and re.search(problem, found), found
