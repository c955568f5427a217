"""Class vocabularies as data: a dataset's ``dataset_meta.json`` read through its layers (the defaults without one),
the label stage's file merged over the layer below, semseg ids above 255 stored exactly (16-bit PNG) while smaller
ones keep today's 8-bit bytes, and the visualiser's colours for any id."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
from PIL import Image

from fourm_kfp.data.crops import Crop, apply_crop
from fourm_kfp.data.dataset_report import DatasetStats
from fourm_kfp.data.modalities import CLASS_NAMES, OBJECT_CLASSES, decode_semseg, encode_semseg
from fourm_kfp.data.modality_visuals import class_color, class_palette, visualize
from fourm_kfp.data.shard_stream import iter_split
from fourm_kfp.data.shard_writer import ShardWriter
from fourm_kfp.data.vocabularies import META_FILE, DatasetMeta, DatasetMetaError, read_dataset_meta
from fourm_kfp.labelers.base import Labeler, LabelerSetup
from fourm_kfp.stages.label import dataset_meta
from fourm_kfp.storage import LayeredStore, open_store

CLASSES_300 = [f"class{i:03d}" for i in range(300)]


def _store(path):
    return open_store(str(path), create=True)


def _ids_300(size: int = 24) -> np.ndarray:
    """A map holding every id 0..299 (and a few twice)."""
    return (np.arange(size * size) % 300).reshape(size, size).astype(np.uint16)


def test_a_dataset_without_vocabularies_reads_the_six_defaults(tmp_path):
    meta = read_dataset_meta(_store(tmp_path / "prepared"))
    assert not meta
    assert meta.vocabulary("semseg") == CLASS_NAMES and len(CLASS_NAMES) == 6
    assert meta.vocabulary("det") == OBJECT_CLASSES
    assert meta.all_vocabularies == {"semseg": CLASS_NAMES, "det": OBJECT_CLASSES}
    assert meta.custom_vocabularies == {} and meta.setting("depth", "relative") is False
    assert meta.vocabulary("rgb") is None
    assert meta.text_class_names == CLASS_NAMES  # what the text tokenizer kept whole before vocabularies existed


def test_a_300_class_vocabulary_round_trips_through_the_layers_and_a_shard(tmp_path):
    lower, upper = _store(tmp_path / "prepared"), _store(tmp_path / "labelled")
    lower.put_bytes(META_FILE, json.dumps({"vocabularies": {"det": ["person", "car"]}}).encode())
    labelled = DatasetMeta.from_json({"vocabularies": {"semseg": CLASSES_300}}, "test")
    upper.put_bytes(META_FILE, read_dataset_meta(lower).merged(labelled).to_json())
    ids = _ids_300()
    writer = ShardWriter(upper, "train", ("semseg",), samples_per_shard=8)
    writer.write("a", {"semseg": encode_semseg(ids)})
    writer.write("b", {"semseg": encode_semseg(ids[::-1] % 200)})
    writer.close()

    dataset = LayeredStore([lower, upper])
    meta = read_dataset_meta(dataset)
    assert meta.vocabulary("semseg") == tuple(CLASSES_300) and meta.vocabulary("det") == ("person", "car")
    assert meta.custom_vocabularies == {"det": ["person", "car"], "semseg": CLASSES_300}
    samples = dict(iter_split(dataset, "train", ["semseg"]))
    assert samples["a"]["semseg"].dtype == np.uint16 and np.array_equal(samples["a"]["semseg"], ids)
    assert int(samples["a"]["semseg"].max()) == 299
    assert samples["b"]["semseg"].dtype == np.uint8 and np.array_equal(samples["b"]["semseg"], ids[::-1] % 200)


def test_ids_up_to_255_keep_the_8_bit_png_and_larger_ones_take_16_bits():
    small = (np.arange(64 * 64) % 256).reshape(64, 64).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(small, mode="L").save(buf, format="PNG", compress_level=1)  # what encode_semseg always wrote
    assert encode_semseg(small) == buf.getvalue() == encode_semseg(small.astype(np.int64))
    with Image.open(io.BytesIO(encode_semseg(_ids_300()))) as image:
        assert image.mode == "I;16"
    big = np.array([[0, 65535], [300, 256]], np.int64)
    assert np.array_equal(decode_semseg(encode_semseg(big)), big)
    for bad in (np.array([[0, 65536]]), np.array([[-1, 2]])):
        with pytest.raises(ValueError, match="semseg"):
            encode_semseg(bad)


def test_crops_and_the_dataset_report_keep_ids_above_255():
    ids = _ids_300(20)
    cropped = apply_crop({"semseg": ids}, Crop(0, 0, 20, 20, flip=True), 20)["semseg"]
    assert cropped.dtype == np.uint16 and np.array_equal(cropped, ids[:, ::-1])
    stats = DatasetStats(CLASSES_300)
    stats.add("train", {"semseg": ids})
    merged = DatasetStats(CLASSES_300)
    merged.merge(stats.state())
    fractions = merged.to_dict()["classes"]["semseg_pixel_fraction"]
    assert len(fractions) == 300 and fractions["class299"] == pytest.approx(1 / 400)


@pytest.mark.parametrize("doc, message", [
    ({"vocabularies": {"semseg": ["a", "b", "a"]}}, "semseg vocabulary names \\['a'\\] more than once"),
    ({"vocabularies": {"lidar": ["a"]}}, "a vocabulary for 'lidar', which is no modality"),
    ({"vocabularies": {"semseg": [f"c{i}" for i in range(65537)]}}, "semseg vocabulary has 65537 classes"),
    ({"vocabularies": {"det": ["traffic light"]}}, "det names are single words"),
    ({"vocabularies": {"semseg": []}}, "semseg vocabulary must be a non-empty list"),
    ({"modality_settings": {"depth": {"metric": True}}}, "unknown depth setting 'metric'"),
    ({"modality_settings": {"depth": {"relative": "yes"}}}, "depth setting 'relative' must be a bool"),
    ({"modality_settings": {"semseg": {"relative": True}}}, "settings for 'semseg', which takes none"),
    ({"classes": {}}, "expected a JSON object with the sections"),
])
def test_a_bad_file_fails_naming_the_file_and_the_modality(tmp_path, doc, message):
    store = _store(tmp_path / "labelled")
    store.put_bytes(META_FILE, json.dumps(doc).encode())
    with pytest.raises(DatasetMetaError, match=message) as error:
        read_dataset_meta(store)
    assert str(error.value).startswith(store.uri_of(META_FILE))


def test_a_file_that_is_no_json_is_named(tmp_path):
    store = _store(tmp_path / "labelled")
    store.put_bytes(META_FILE, b"{semseg: [")
    with pytest.raises(DatasetMetaError, match="not JSON") as error:
        read_dataset_meta(store)
    assert store.uri_of(META_FILE) in str(error.value)


class _Semseg300(Labeler):
    name, modality = "semseg300", "semseg"

    @property
    def classes(self):
        return tuple(CLASSES_300)


class _RelativeDepth(Labeler):
    name, modality, relative_depth = "relative", "depth", True


class _Edges(Labeler):
    name, modality = "edges", "canny_edge"


def test_the_label_stage_merges_its_labelers_over_the_layer_below(tmp_path):
    lower = _store(tmp_path / "prepared")
    assert not dataset_meta(lower, [_Edges(LabelerSetup())])  # nothing to record: the stage writes no file
    lower.put_bytes(META_FILE, json.dumps({"vocabularies": {"det": ["person"], "semseg": ["x", "y"]}}).encode())
    meta = dataset_meta(lower, [_Semseg300(LabelerSetup()), _RelativeDepth(LabelerSetup()), _Edges(LabelerSetup())])
    assert meta.vocabularies == {"det": ("person",), "semseg": tuple(CLASSES_300)}  # the labeler's semseg wins
    assert meta.setting("depth", "relative") is True
    written = json.loads(meta.to_json())
    assert written == {"vocabularies": {"det": ["person"], "semseg": CLASSES_300},
                       "modality_settings": {"depth": {"relative": True}}}
    assert DatasetMeta.from_json(written, "again") == meta


def test_a_labeler_with_relative_depth_of_another_modality_is_named(tmp_path):
    class _RelativeEdges(_Edges):
        relative_depth = True

    with pytest.raises(DatasetMetaError, match="edges -> canny_edge.*settings for 'canny_edge'"):
        dataset_meta(_store(tmp_path / "prepared"), [_RelativeEdges(LabelerSetup())])


def test_the_visualiser_draws_any_id_with_distinct_colours():
    six = [(48, 48, 56), (150, 120, 90), (230, 25, 75), (0, 130, 200), (60, 180, 75), (255, 190, 30)]
    assert [class_color(i) for i in range(6)] == six  # the synthetic classes keep their colours
    assert [class_color(name) for name in CLASS_NAMES] == six
    colours = [class_color(i) for i in range(300)]
    assert len(set(colours)) == 300
    assert [tuple(c) for c in class_palette(300)] == colours
    assert class_color("person") == class_color("person") != class_color("persons")  # derived from the name
    ids = np.array([[0, 299], [256, 5]], np.uint16)
    tile = visualize("semseg", ids, 2)
    assert [tuple(tile[r, c]) for r in range(2) for c in range(2)] == [colours[0], colours[299], colours[256],
                                                                       colours[5]]
