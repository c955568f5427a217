"""The built-in labelers (canny_edge, color_palette, metadata) keep the labeler contract, their labels follow the
image, and 4M-21's palette and metadata text formats round-trip and read generated text tolerantly."""

from __future__ import annotations

import zlib

import numpy as np
import pytest

from fourm_kfp.data.label_formats import (
    METADATA_FIELDS,
    decode_metadata,
    decode_palette,
    encode_metadata,
    encode_palette,
    metadata_text,
    palette_text,
    parse_metadata_text,
    parse_palette_text,
)
from fourm_kfp.data.modalities import decode_edge, encode_edge
from fourm_kfp.labelers.base import LabelBatch, LabelerError, label_one_by_one
from fourm_kfp.labelers.registry import BUILTINS, build_labeler

BUILT_IN = ["canny_edge", "color_palette", "metadata"]
VERSIONS = {"canny_edge": "1", "color_palette": "2", "metadata": "1"}  # color_palette 2: k-means on a histogram
SIZE = 24


def flat(level: int = 128) -> np.ndarray:
    return np.full((SIZE, SIZE, 3), level, np.uint8)


def stripes(width: int = 6) -> np.ndarray:
    """Vertical black and white stripes, ``width`` px each."""
    columns = (np.arange(SIZE) // width % 2 * 255).astype(np.uint8)
    return np.repeat(np.broadcast_to(columns[None, :, None], (SIZE, SIZE, 1)), 3, axis=2).copy()


def two_colours(first=(200, 30, 30), second=(20, 40, 220)) -> np.ndarray:
    """A quarter of the columns ``first``, the rest ``second``."""
    image = np.empty((SIZE, SIZE, 3), np.uint8)
    image[:, : SIZE // 4], image[:, SIZE // 4:] = first, second
    return image


def mixed_batch() -> LabelBatch:
    noise = np.random.default_rng(7).integers(0, 256, (SIZE, SIZE, 3), dtype=np.uint8)
    return LabelBatch(("flat", "stripes", "two", "noise"), (flat(), stripes(), two_colours(), noise),
                      ("A grey wall.", None, "A red door. A blue sky!", "noise"), ((640, 480), None, None, (33, 2000)))


def same(a, b) -> bool:
    """Equal labels: arrays by value (and dtype), anything else by ``==``."""
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a.dtype == b.dtype and np.array_equal(a, b)
    return a == b


# ------------------------------------------------------------------------------------------------------- contract


def test_every_builtin_in_the_registry_but_the_teacher_networks_is_tested_here():
    from tests.teacher_models import TEACHER_LABELERS  # tested in test_teachers.py

    assert set(BUILTINS) - {"fourm_model"} - set(TEACHER_LABELERS) == set(BUILT_IN)


@pytest.mark.parametrize("name", BUILT_IN)
def test_builtins_are_deterministic_and_a_batch_equals_its_images_one_by_one(name):
    batch = mixed_batch()
    first = build_labeler(name).label(batch)
    again = build_labeler(name).label(batch)
    alone = label_one_by_one(build_labeler(name), batch)
    assert len(first) == len(batch)
    assert all(same(a, b) for a, b in zip(first, again, strict=True))
    assert all(same(a, b) for a, b in zip(first, alone, strict=True))
    assert not same(first[0], first[1])  # the labels depend on the image


@pytest.mark.parametrize("name", BUILT_IN)
def test_builtins_need_no_weights_and_say_what_they_produce(name):
    labeler = build_labeler(name)
    assert labeler.name == labeler.modality == name
    assert not labeler.needs_weights and labeler.version == VERSIONS[name]
    assert labeler.identity() == {"name": name, "version": VERSIONS[name], "modality": name,
                                  "params": dict(sorted(type(labeler).defaults.items())), "weights": None}


@pytest.mark.parametrize("name", BUILT_IN)
def test_unknown_params_are_an_error_naming_the_labeler(name):
    with pytest.raises(LabelerError, match=rf"labeler '{name}'.*unknown params \['colour'\]"):
        build_labeler(name, {"colour": 3})


@pytest.mark.parametrize(("name", "params", "message"), [
    ("canny_edge", {"low": 300}, r"'low' \(300\) must not exceed 'high' \(200\)"),
    ("canny_edge", {"blur": -1}, r"'blur' must be a number >= 0"),
    ("color_palette", {"max_pixels": 0}, r"'max_pixels' must be an integer >= 1"),
    ("color_palette", {"seed": 1.5}, r"'seed' must be an integer >= 0"),
    ("color_palette", {"bits": 9}, r"'bits' must be an integer in 1\.\.8"),
    ("metadata", {"decimals": "4"}, r"'decimals' must be an integer"),
])
def test_bad_param_values_are_an_error_naming_the_labeler(name, params, message):
    with pytest.raises(LabelerError, match=rf"labeler '{name}'.*{message}"):
        build_labeler(name, params)


def test_a_builtin_is_built_from_its_config_params_through_the_registry():
    labeler = build_labeler("canny_edge", {"low": 50})
    assert labeler.params == {"low": 50, "high": 200, "blur": 0.0}
    assert labeler.identity()["params"] == {"blur": 0.0, "high": 200, "low": 50}
    assert labeler.identity() != build_labeler("canny_edge").identity()
    assert labeler.label(LabelBatch(("s",), (stripes(),)))[0].any()


# ------------------------------------------------------------------------------------------------------ canny_edge


def test_canny_fires_on_stripes_and_not_on_flat_grey():
    flat_edges, stripe_edges = build_labeler("canny_edge").label(LabelBatch(("f", "s"), (flat(), stripes(6))))
    assert flat_edges.shape == (SIZE, SIZE) and flat_edges.dtype == np.uint8
    assert set(np.unique(stripe_edges)) == {0, 1} and not flat_edges.any()
    columns = stripe_edges.any(axis=0)
    assert all(columns[b - 1] or columns[b] for b in (6, 12, 18))  # at each stripe boundary
    assert not columns[2:4].any() and not columns[8:10].any()  # not inside a stripe
    assert np.array_equal(decode_edge(encode_edge(stripe_edges)), stripe_edges)  # the edge modality's shard form


def test_canny_thresholds_and_blur_change_the_edges():
    soft = np.repeat(np.linspace(0, 255, SIZE).astype(np.uint8)[None, :, None], 3, axis=2).repeat(SIZE, axis=0)
    batch = LabelBatch(("ramp", "stripes"), (soft, stripes(3)))
    strict = build_labeler("canny_edge", {"low": 5000, "high": 10000}).label(batch)
    assert not strict[1].any()
    sharp, blurred = (build_labeler("canny_edge", {"blur": b}).label(batch)[1] for b in (0, 3.0))
    assert not np.array_equal(sharp, blurred)


# --------------------------------------------------------------------------------------------------- color_palette


def test_palette_holds_one_palette_of_each_length_1_to_7():
    value = build_labeler("color_palette").label(LabelBatch(("n",), mixed_batch().images[3:]))[0]
    assert isinstance(value, list) and len(value) == 1 and list(value[0]) == [str(k) for k in range(1, 8)]
    for k, colours in value[0].items():
        assert len(colours) == int(k)
        assert all(len(c) == 3 and all(type(x) is int and 0 <= x <= 255 for x in c) for c in colours)
    assert len({tuple(c) for c in value[0]["7"]}) == 7  # noise has more than 7 colours: 7 different ones


def test_palette_of_a_two_colour_image_finds_the_two_colours_largest_first():
    red, blue = (200, 30, 30), (20, 40, 220)
    palettes = build_labeler("color_palette").label(LabelBatch(("t",), (two_colours(red, blue),)))[0][0]
    assert palettes["2"] == [list(blue), list(red)]
    assert palettes["4"] == [list(blue), list(red), list(blue), list(blue)]  # the dominant colour fills the rest
    assert palettes["1"] == [[round(0.25 * r + 0.75 * b) for r, b in zip(red, blue, strict=True)]]  # their mean


def test_palette_of_three_noisy_blobs_finds_their_colours():
    rng = np.random.default_rng(3)
    centres = np.array([[230, 40, 40], [40, 200, 60], [30, 50, 210]])
    image = centres[np.arange(SIZE * SIZE) % 3].reshape(SIZE, SIZE, 3) + rng.integers(-8, 9, (SIZE, SIZE, 3))
    palette = build_labeler("color_palette").label(LabelBatch(("b",), (image.astype(np.uint8),)))[0][0]["3"]
    found = np.array(sorted(palette))
    assert np.abs(found - np.array(sorted(centres.tolist()))).max() <= 3


def test_palette_seed_pixel_draw_and_bins_are_params():
    image = mixed_batch().images[3]
    batch = LabelBatch(("n",), (image,))
    default = build_labeler("color_palette").label(batch)[0]
    assert build_labeler("color_palette", {"max_pixels": 50}).label(batch)[0] != default
    drawn = build_labeler("color_palette", {"max_pixels": 200}).label(batch)[0]
    assert build_labeler("color_palette", {"max_pixels": 200, "seed": 1}).label(batch)[0] != drawn  # another draw
    assert build_labeler("color_palette", {"seed": 1}).label(batch)[0] == default  # all 576 pixels: no draw
    assert build_labeler("color_palette", {"bits": 3}).label(batch)[0] != default
    # noise: ~550 bins at 5 bits, still over 100 at 4 and 3; at 2 bits there are only 64
    assert build_labeler("color_palette", {"max_bins": 100}).label(batch)[0] \
        == build_labeler("color_palette", {"bits": 2}).label(batch)[0] != default


def blocks(colours, size: int = 96, noise: int = 0, seed: int = 0) -> np.ndarray:
    """Vertical blocks of ``colours``, block ``i`` ``i + 1`` parts wide (unequal areas), plus uniform noise in
    ``-noise..noise`` per channel."""
    parts = np.repeat(np.arange(len(colours)), np.arange(1, len(colours) + 1))
    columns = parts[np.arange(size) * len(parts) // size]
    image = np.asarray(colours)[columns][None].repeat(size, axis=0)
    image = image + np.random.default_rng(seed).integers(-noise, noise + 1, image.shape)
    return np.clip(image, 0, 255).astype(np.uint8)


def distinct_colours(k: int, seed: int, apart: float = 80.0) -> np.ndarray:
    """``k`` random colours at least ``apart`` from one another (and 10 from the ends of 0..255)."""
    rng = np.random.default_rng(seed)
    colours = []
    while len(colours) < k:
        colour = rng.integers(10, 246, 3)
        if all(np.linalg.norm(colour - c) >= apart for c in colours):
            colours.append(colour)
    return np.array(colours)


@pytest.mark.parametrize("k", range(1, 8))
@pytest.mark.parametrize("noise", [0, 6])
def test_palette_of_k_flat_colour_blocks_recovers_the_k_colours(k, noise):
    """k blocks of flat colour (96 px: the pixels are drawn), exactly or with noise (then there are more bins than
    k and the k-means finds them): the length-k palette is those colours, within 3 per channel, largest block
    first; shorter palettes are colours of the image's range."""
    for seed in range(3):
        colours = distinct_colours(k, seed=10 * k + seed)
        palettes = build_labeler("color_palette").label(LabelBatch(("b",), (blocks(colours, noise=noise),)))[0][0]
        found = np.array(palettes[str(k)])
        assert np.abs(found - colours[::-1]).max() <= (0 if noise == 0 else 3), (colours.tolist(), found.tolist())
        for length in range(1, k):
            assert np.all((found.min(0) - 3 <= np.array(palettes[str(length)]))
                          & (np.array(palettes[str(length)]) <= found.max(0) + 3))


def test_palette_lengths_clustered_at_once_are_each_what_it_gives_alone():
    """The all-lengths Lloyd: each length's centres and weights equal, bit for bit, those of that length run alone
    (a length that stopped changing stays at its fixed point while the others go on)."""
    from fourm_kfp.labelers.color_palette import _greedy_seeds, _histogram, _kmeans_all_lengths

    pixels = np.random.default_rng(5).normal(128, 50, (3000, 3)).clip(0, 255).astype(np.uint8)
    colours, weights = _histogram(pixels, 5)
    seeds = _greedy_seeds(colours, weights, 7)
    assert len({tuple(s) for s in seeds}) == 7
    centres, sizes = _kmeans_all_lengths(colours, weights, seeds, 30)
    for k in range(1, 8):
        alone, alone_sizes = _kmeans_all_lengths(colours, weights, seeds[:k], 30)
        assert np.array_equal(alone[k - 1, :k], centres[k - 1, :k])
        assert np.array_equal(alone_sizes[k - 1, :k], sizes[k - 1, :k])


def test_palette_histogram_bins_are_the_mean_colours_of_their_pixels():
    from fourm_kfp.labelers.color_palette import _histogram

    pixels = np.array([[0, 0, 0], [7, 7, 7], [8, 0, 0], [200, 100, 50], [0, 0, 0]], np.uint8)
    colours, weights = _histogram(pixels, 5)
    assert colours.tolist() == [[7 / 3, 7 / 3, 7 / 3], [8, 0, 0], [200, 100, 50]] and weights.tolist() == [3, 1, 1]
    exact, counts = _histogram(pixels, 8)  # 8 bits: every distinct colour its own bin
    assert exact.tolist() == [[0, 0, 0], [7, 7, 7], [8, 0, 0], [200, 100, 50]] and counts.tolist() == [2, 1, 1, 1]


# -------------------------------------------------------------------------------------------------------- metadata


def test_metadata_of_flat_stripes_and_pure_red():
    red = np.zeros((SIZE, SIZE, 3), np.uint8)
    red[..., 0] = 255
    dark, bright, lines, pure = build_labeler("metadata").label(LabelBatch(
        ("d", "b", "s", "r"), (flat(40), flat(200), stripes(6), red)))
    assert set(dark) <= set(METADATA_FIELDS) and all(isinstance(v, (int, float)) for v in dark.values())
    assert bright["brightness"] == 200 > dark["brightness"] == 40
    assert dark["contrast"] == dark["entropy"] == dark["saturation"] == dark["colorfulness"] == 0
    assert lines["brightness"] == lines["contrast"] == 127.5 and lines["entropy"] == 1.0  # two grey levels, half each
    assert pure["saturation"] == 255 and lines["saturation"] == 0
    assert pure["colorfulness"] == pytest.approx(0.3 * np.hypot(255, 127.5), abs=1e-4)


def test_metadata_takes_original_size_and_caption_counts_from_the_batch():
    values = build_labeler("metadata").label(mixed_batch())
    assert (values[0]["original_width"], values[0]["original_height"]) == (640, 480)
    assert (values[1]["original_width"], values[1]["original_height"]) == (SIZE, SIZE)  # unknown: the image's own
    assert {k: values[2][k] for k in ("caption_n_chars", "caption_n_words", "caption_n_sentences")} == {
        "caption_n_chars": 23, "caption_n_words": 6, "caption_n_sentences": 2}
    assert not any(k.startswith("caption_") for k in values[1])  # no caption: no caption fields
    assert list(values[2]) == [k for k in METADATA_FIELDS if k in values[2]]


def test_metadata_floats_are_rounded_to_the_decimals_param():
    noise = mixed_batch().images[3:]
    coarse = build_labeler("metadata", {"decimals": 1}).label(LabelBatch(("n",), noise))[0]
    assert all(round(coarse[k], 1) == coarse[k] for k in ("brightness", "contrast", "entropy"))
    assert coarse != build_labeler("metadata").label(LabelBatch(("n",), noise))[0]


# --------------------------------------------------------------------------------------------------- text formats


def test_palette_json_decodes_to_the_text_of_a_length_picked_from_its_bytes():
    palettes = build_labeler("color_palette").label(mixed_batch())
    lengths = set()
    for value in palettes:
        data = encode_palette(value)
        k = 1 + zlib.crc32(data) % 7
        text = decode_palette(data)
        assert text == palette_text(value, k) and text.split()[0] == f"v1={k}" and len(text.split()) == 1 + 3 * k
        assert parse_palette_text(text) == [tuple(c) for c in value[0][str(k)]]
        assert decode_palette(encode_palette(text)) == text == decode_palette(data)  # text: a one-length palette
        lengths.add(k)
    more = [[{str(k): [[i, k, 0]] * k for k in range(1, 8)}] for i in range(12)]
    lengths |= {int(decode_palette(encode_palette(v)).split()[0][3:]) for v in more}
    assert len(lengths) >= 3  # the length varies over samples


def test_palette_text_reader_skips_malformed_generated_text():
    text = "v1=3 v0=10 v0=20 v0=30 v0=40 v0=5o0 v0=60 v0=70 v0=80 v0=90 v0=300 v0=1 v0=2 v0=3 v0=4"
    assert parse_palette_text(text) == [(10, 20, 30), (60, 70, 80), (1, 2, 3)]
    assert parse_palette_text("v0=1 v0=2 v1=3 v0=3 blue") == [] == parse_palette_text("")


@pytest.mark.parametrize(("value", "message"), [
    ({"1": [[1, 2, 3]]}, "a list holding one dict"),
    ([{"2": [[1, 2, 3]]}], "palette 2 needs 2 colours"),
    ([{"1": [[1, 2, 256]]}], r"outside 0\.\.255"),
    ([{"1": [[1.5, 2, 3]]}], "expected an integer"),
    ([{"8": [[1, 2, 3]] * 8}], r"lengths are 1\.\.7"),
    ([{}], "holds no palette"),
    ("v1=2 v0=1 v0=2 v0=3", "text must be"),
])
def test_palette_encoder_rejects_malformed_values_naming_the_modality(value, message):
    with pytest.raises(ValueError, match=f"modality 'color_palette'.*{message}"):
        encode_palette(value)


def test_metadata_text_quantises_as_4m_in_the_order_of_the_field_ids():
    raw = {"entropy": 12.0, "brightness": 127.5, "contrast": 63.5, "colorfulness": -3.0, "saturation": 255,
           "caption_n_chars": 1500, "original_height": 5000 * 32, "original_width": 640}
    text = metadata_text(raw)
    assert text == "v1=0 v0=20 v1=1 v0=999 v1=2 v0=999 v1=9 v0=0 v1=10 v0=24 v1=11 v0=24 v1=12 v0=49 v1=13 v0=49"
    assert decode_metadata(encode_metadata(raw)) == text
    assert parse_metadata_text(text) == {"original_width": 20, "original_height": 999, "caption_n_chars": 999,
                                         "colorfulness": 0, "brightness": 24, "contrast": 24, "saturation": 49,
                                         "entropy": 49}
    assert [METADATA_FIELDS[k][0] for k in ("original_width", "caption_n_sentences", "colorfulness", "entropy")] == [
        0, 4, 9, 13]  # 4M's ids


def test_metadata_text_is_stored_as_bins_and_decodes_to_itself():
    labels = build_labeler("metadata").label(mixed_batch())
    for value in labels:
        text = decode_metadata(encode_metadata(value))
        assert encode_metadata(text).startswith(b'{"bins":')
        assert decode_metadata(encode_metadata(text)) == text
        assert parse_metadata_text(text) == {k: METADATA_FIELDS[k][1].bin(v, k) for k, v in value.items()}


def test_metadata_text_reader_skips_malformed_generated_text():
    text = "v1=10 v0=25 v1=99 v0=3 v1=11 v0=50 v1=13 v0=7x v1=0 v0=20 v1=0 v0=21 v0=5 v1=12"
    assert parse_metadata_text(text) == {"brightness": 25, "original_width": 20}
    assert parse_metadata_text("sunny v1= v0=1") == {} == parse_metadata_text("")


@pytest.mark.parametrize(("value", "message"), [
    ({"n_humans": 2}, "unknown field 'n_humans'"),
    ({}, "non-empty dict"),
    ({"brightness": float("nan")}, "field 'brightness': expected a finite number"),
    ({"original_width": 3.5}, "field 'original_width': expected an integer"),
    ("v1=10 v0=50", "text must be"),
    ("v1=10 v0=5 v1=10 v0=6", "text must be"),
])
def test_metadata_encoder_rejects_malformed_values_naming_the_modality(value, message):
    with pytest.raises(ValueError, match=f"modality 'metadata'.*{message}"):
        encode_metadata(value)


def test_stored_metadata_bins_out_of_range_are_an_error():
    with pytest.raises(ValueError,
                       match=r"modality 'metadata': stored bin of field 'brightness' is 50, outside 0\.\.49"):
        decode_metadata(b'{"bins":{"brightness":50}}')


def test_color_palette_distances_are_those_of_the_plain_formula_bit_for_bit():
    """The palette labeler's fast distances (channel by channel, no [n, k, 3] temporary) equal
    ``((p - c) ** 2).sum(axis=-1)`` exactly, so the k-means, and the labels, are what the plain formula gives."""
    from fourm_kfp.labelers.color_palette import _squared_distances

    rng = np.random.default_rng(0)
    points, centres = rng.uniform(0, 255, (500, 3)), rng.uniform(0, 255, (7, 3))
    plain = ((points[:, None, :] - centres[None]) ** 2).sum(axis=2)
    assert np.array_equal(_squared_distances(points.T, centres.T), plain)
