"""Aligned crops: the same window in every modality, flips mirror normals' x and boxes, boxes clip and drop,
and the draws are reproducible per sample key."""

from __future__ import annotations

import numpy as np
import pytest

from fourm_kfp.data.crops import Crop, apply_crop, crop_det, draw_crops
from fourm_kfp.data.modalities import format_det, parse_det
from fourm_kfp.data.pretokenized import token_dtype

SIZE = 32


def _sample() -> dict:
    """Every modality paints the same picture: a class-2 block at rows 4..11, columns 20..29; elsewhere class 1."""
    semseg = np.ones((SIZE, SIZE), np.uint8)
    semseg[4:12, 20:30] = 2
    rgb = np.stack([semseg * 100, np.zeros_like(semseg), np.zeros_like(semseg)], -1).astype(np.uint8)
    depth = semseg.astype(np.float32)
    normal = np.zeros((SIZE, SIZE, 3), np.float32)
    normal[..., 0] = np.where(semseg == 2, 1.0, 0.0)
    normal[..., 2] = np.where(semseg == 2, 0.0, 1.0)
    edge = (semseg == 2).astype(np.uint8)
    det = format_det([(20, 4, 30, 12)], ["sphere"], SIZE, SIZE)
    return {"rgb": rgb, "depth": depth, "normal": normal, "semseg": semseg, "edge": edge, "det": det,
            "caption": "a sphere"}


@pytest.mark.parametrize("crop", [Crop(0, 0, SIZE, SIZE), Crop(8, 2, 20, 16), Crop(8, 2, 20, 16, flip=True),
                                  Crop(16, 0, 16, 16, flip=True)])
def test_every_modality_sees_the_same_window(crop):
    out = apply_crop(_sample(), crop, SIZE)
    block = out["semseg"] == 2
    assert np.array_equal(out["depth"] == 2.0, block) and np.array_equal(out["edge"] == 1, block)
    assert np.array_equal(np.abs(out["normal"][..., 0]) == 1.0, block)
    assert (np.abs(out["rgb"][..., 0].astype(int) - out["semseg"].astype(int) * 100) <= 100).all()
    assert np.mean(np.abs(out["rgb"][..., 0].astype(int) - out["semseg"].astype(int) * 100) < 20) > 0.85
    if block.any():
        assert set(np.unique(out["normal"][..., 0][block])) == {-1.0 if crop.flip else 1.0}
        [(box, name)] = parse_det(out["det"])
        rows, cols = np.nonzero(block)
        pixels = np.array(box) * SIZE / 1000
        assert name == "sphere"
        assert abs(pixels[0] - cols.min()) <= 1.5 and abs(pixels[2] - (cols.max() + 1)) <= 1.5
        assert abs(pixels[1] - rows.min()) <= 1.5 and abs(pixels[3] - (rows.max() + 1)) <= 1.5
    assert out["caption"] == "a sphere"


def test_boxes_mostly_outside_the_crop_are_dropped():
    det = format_det([(20, 4, 30, 12), (0, 20, 10, 30)], ["sphere", "cube"], SIZE, SIZE)
    assert [n for _, n in parse_det(crop_det(det, Crop(0, 16, 16, 16), SIZE))] == ["cube"]
    assert [n for _, n in parse_det(crop_det(det, Crop(0, 0, 22, 14), SIZE))] == []  # sphere only 20% visible


def test_crops_are_reproducible_per_key_and_crop_zero_is_the_full_view():
    args = dict(seed=3, n_crops=5, image_size=64, scale=(0.3, 1.0), ratio=(0.75, 1.33), flip_probability=0.5)
    a, b = draw_crops("k1", **args), draw_crops("k1", **args)
    assert a == b and a[0] == Crop(0, 0, 64, 64) and len(a) == 5
    assert draw_crops("k2", **args) != a
    for crop in a:
        assert 0 <= crop.x0 and crop.x0 + crop.width <= 64 and 0 <= crop.y0 and crop.y0 + crop.height <= 64


@pytest.mark.parametrize("vocab, dtype", [(2, np.uint8), (256, np.uint8), (257, np.uint16), (65536, np.uint16),
                                          (65537, np.uint32)])
def test_token_dtype_is_the_smallest_that_holds_the_vocabulary(vocab, dtype):
    assert token_dtype(vocab) == np.dtype(dtype)
