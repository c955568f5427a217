"""Dataset statistics, the Markdown report, the preview grid and the modality visualisers, on hand-made samples."""

from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

from fourm_kfp.data.dataset_report import (
    GRID_GAP,
    GRID_HEADER,
    DatasetStats,
    grid_cell,
    render_histograms,
    render_preview_grid,
    report_markdown,
)
from fourm_kfp.data.label_formats import metadata_readings, metadata_text
from fourm_kfp.data.modalities import CLASS_NAMES
from fourm_kfp.data.modality_visuals import (
    SEMSEG_PALETTE,
    absent_tile,
    class_color,
    get_font,
    visualize,
    wrap_text,
)

N = 16


def _semseg() -> np.ndarray:
    """Half background (128 px), a quarter sphere (64 px), a quarter cube (64 px)."""
    classes = np.zeros((N, N), np.uint8)
    classes[N // 2 :, : N // 2] = 2
    classes[N // 2 :, N // 2 :] = 3
    return classes


def _depth() -> np.ndarray:
    """Top half invalid (0), bottom half from 1 m to 4 m."""
    depth = np.zeros((N, N), np.float32)
    depth[N // 2 :] = np.linspace(1.0, 4.0, N, dtype=np.float32)[None, :]
    return depth


def _full_sample() -> dict:
    rgb = np.zeros((N, N, 3), np.uint8)
    rgb[..., 1] = 200
    normal = np.zeros((N, N, 3), np.float32)
    normal[N // 2 :] = (0.0, 0.0, 1.0)
    return {
        "rgb": rgb,
        "depth": _depth(),
        "normal": normal,
        "semseg": _semseg(),
        "edge": np.eye(N, dtype=np.uint8),
        "det": "v0=0 v1=0 v2=500 v3=500 sphere v0=500 v1=500 v2=999 v3=999 cube v0=100 v1=100 v2=200 v3=200 sphere",
        "caption": "a red sphere",
    }


@pytest.fixture
def stats() -> DatasetStats:
    stats = DatasetStats()
    stats.add("train", _full_sample())
    stats.add("train", {"rgb": np.zeros((N, N, 3), np.uint8), "semseg": np.ones((N, N), np.uint8),
                        "det": "", "caption": "two cubes"})
    stats.add("val", {"rgb": np.zeros((N, N, 3), np.uint8), "caption": "a b c"})
    stats.add_skipped({"unreadable": 1})
    stats.add_skipped({"unreadable": 2, "too_small": 1})
    return stats


def test_counts_per_split_and_modality_include_absent_ones(stats):
    report = stats.to_dict()
    assert report["splits"]["train"] == {
        "samples": 2,
        "modalities": {"rgb": 2, "depth": 1, "normal": 1, "semseg": 2, "edge": 1, "det": 2, "caption": 2},
    }
    assert report["splits"]["val"] == {
        "samples": 1,
        "modalities": {"rgb": 1, "depth": 0, "normal": 0, "semseg": 0, "edge": 0, "det": 0, "caption": 1},
    }
    assert report["skipped"] == {"too_small": 1, "unreadable": 3}


def test_class_histograms_match_hand_counts(stats):
    classes = stats.to_dict()["classes"]
    # 512 semseg pixels: 128 background, 256 ground, 64 sphere, 64 cube.
    assert classes["semseg_pixel_fraction"] == {
        "background": 0.25, "ground": 0.5, "sphere": 0.125, "cube": 0.125, "cylinder": 0.0, "cone": 0.0,
    }
    assert classes["det_objects"] == {"cube": 1, "sphere": 2}


def test_caption_length_and_boxes_per_sample_histograms(stats):
    report = stats.to_dict()
    assert report["caption_length"] == {"histogram": {"2": 1, "3": 2}, "count": 3, "mean": round(8 / 3, 4),
                                        "min": 2, "max": 3}
    assert report["det_boxes_per_sample"]["histogram"] == {"0": 1, "3": 1}
    assert report["det_boxes_per_sample"]["mean"] == 1.5


def test_report_is_json_serialisable(stats):
    report = stats.to_dict()
    assert json.loads(json.dumps(report)) == report
    empty = DatasetStats().to_dict()
    assert json.loads(json.dumps(empty)) == empty
    assert empty["caption_length"]["mean"] is None and empty["classes"]["semseg_pixel_fraction"] == {}


def test_markdown_contains_the_counts(stats):
    text = report_markdown({"source": "synthetic", "shards": {"train": {"shards": 1}, "val": {"shards": 1}},
                            **stats.to_dict()})
    assert "| split | samples | shards | rgb | depth | normal | semseg | edge | det | caption |" in text
    assert "| train | 2 | 1 | 2 | 1 | 1 | 2 | 1 | 2 | 2 |" in text
    assert "| val | 1 | 1 | 1 | 0 | 0 | 0 | 0 | 0 | 1 |" in text
    assert "| **total** | 3 | 2 | 3 | 1 | 1 | 2 | 1 | 2 | 3 |" in text
    assert "Skipped: 4 (too_small: 1, unreadable: 3)." in text
    assert "| ground | 50.0% | 0 |" in text and "| sphere | 12.5% | 2 |" in text
    assert "Skipped: none." in report_markdown(DatasetStats().to_dict())


def test_preview_grid_layout_palette_depth_and_absent_tiles():
    tile = 32
    samples = [_full_sample(), {"rgb": np.zeros((N, N, 3), np.uint8)}]
    modalities = ["semseg", "depth", "caption"]
    grid = np.asarray(render_preview_grid(samples, modalities, tile))
    assert grid.shape == (GRID_HEADER + 2 * (tile + GRID_GAP), GRID_GAP + 3 * (tile + GRID_GAP), 3)

    x, y = grid_cell(0, 0, tile)  # semseg: bottom-left quarter is sphere, top half background
    assert tuple(grid[y + 3 * tile // 4, x + tile // 4]) == class_color("sphere") == tuple(SEMSEG_PALETTE[2])
    assert tuple(grid[y + tile // 4, x + tile // 4]) == tuple(SEMSEG_PALETTE[0])
    x, y = grid_cell(0, 1, tile)  # depth: invalid top half black, valid bottom half coloured
    assert not grid[y + 2 : y + tile // 2 - 2, x : x + tile].any()
    assert grid[y + tile // 2 + 2 : y + tile, x : x + tile].max(axis=-1).min() > 0
    for col in (0, 1, 2):  # the second sample has none of these
        x, y = grid_cell(1, col, tile)
        np.testing.assert_array_equal(grid[y : y + tile, x : x + tile], absent_tile(tile))


def test_palette_is_distinct_per_known_class():
    assert len({class_color(i) for i in range(len(CLASS_NAMES))}) == len(CLASS_NAMES)
    assert class_color("cube") == class_color(CLASS_NAMES.index("cube"))


@pytest.mark.parametrize("modality", ["rgb", "depth", "normal", "semseg", "edge", "det", "caption"])
def test_every_modality_gives_a_square_uint8_tile(modality):
    sample = _full_sample()
    tile = visualize(modality, sample[modality], 40, sample)
    assert tile.shape == (40, 40, 3) and tile.dtype == np.uint8


def test_normals_edges_and_boxes():
    sample = _full_sample()
    normal = visualize("normal", sample["normal"], N)
    assert tuple(normal[N - 1, 0]) == (128, 128, 255) and not normal[0].any()
    edge = visualize("edge", sample["edge"], N)
    assert tuple(edge[3, 3]) == (255, 255, 255) and tuple(edge[3, 4]) == (0, 0, 0)
    size = 64  # the cube box spans the bottom-right quarter; its outline has the cube colour
    over_rgb = visualize("det", sample["det"], size, sample)
    over_grey = visualize("det", sample["det"], size)
    assert tuple(over_rgb[size - 1, size * 3 // 4]) == class_color("cube") == tuple(over_grey[size - 1, size * 3 // 4])
    assert tuple(over_rgb[size // 8, size - 4]) == (0, 200, 0)  # outside every box and label
    assert tuple(over_grey[size // 8, size - 4]) == (128, 128, 128)


def test_caption_tile_wraps_and_truncates():
    text = "a very long caption " * 30
    tile = visualize("caption", text, 96)
    assert (tile < 100).any()  # there is ink
    font = get_font(11)
    assert all(font.getlength(line) <= 80 for line in wrap_text("a red sphere left of a blue cube", font, 80))


def test_metadata_reads_as_fields_in_their_units_not_bins():
    """The metadata tile shows what a person reads: a shard's text (bins) as the raw values each bin holds, a
    labeler's raw numbers as they are; never a bin id as if it were pixels."""
    raw = {"original_width": 430, "original_height": 640, "caption_n_words": 4, "brightness": 131.7, "entropy": 7.63}
    assert metadata_readings(raw) == ["original width 430 px", "original height 640 px", "caption 4 words",
                                      "brightness 131.7 of 255", "entropy 7.63 bits"]
    text = metadata_text(raw)
    assert text.startswith("v1=0 v0=13 ")  # the bin a shard holds: 430 // 32
    assert metadata_readings(text) == ["original width 416 to 447 px", "original height 640 to 671 px",
                                       "caption 4 words", "brightness 130 to 135 of 255", "entropy 7.55 to 7.76 bits"]
    assert metadata_readings({"bins": {"original_width": 999, "brightness": 49}}) == [
        "original width >=31968 px", "brightness >=255 of 255"]  # the last bins hold what was clipped
    assert visualize("metadata", text, 96).shape == (96, 96, 3)


def test_unknown_modality_is_a_clear_error():
    with pytest.raises(KeyError, match="known: rgb, depth"):
        visualize("thermal", np.zeros((N, N)), 32)
    with pytest.raises(KeyError, match="thermal"):
        render_preview_grid([{"thermal": np.zeros((N, N))}], ["thermal"], 32)


def test_histograms_image(stats):
    image = render_histograms(stats.to_dict())
    assert isinstance(image, Image.Image) and image.width > 0
    assert render_histograms(DatasetStats().to_dict()) is None


def test_row_labels_add_a_left_margin_and_keep_tiles_intact():
    from fourm_kfp.data.dataset_report import ROW_LABEL_WIDTH

    sample = {"semseg": np.full((16, 16), 2, np.uint8)}
    plain = np.asarray(render_preview_grid([sample, sample], ["semseg"], tile=32))
    labelled = np.asarray(render_preview_grid([sample, sample], ["semseg"], tile=32, row_labels=["in", "out"]))
    assert labelled.shape[1] == plain.shape[1] + ROW_LABEL_WIDTH and labelled.shape[0] == plain.shape[0]
    assert np.array_equal(labelled[GRID_HEADER:, ROW_LABEL_WIDTH:], plain[GRID_HEADER:])
    assert (labelled[GRID_HEADER:, :ROW_LABEL_WIDTH] != labelled[0, 0]).any()  # the labels were drawn
