"""Depth, normal and semseg metrics on hand-made cases whose answers are worked out in the comments, and on real
synthetic scenes."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fourm_kfp.data.modalities import decode_normal, encode_normal
from fourm_kfp.data.synthetic_scenes import synthetic_sample
from fourm_kfp.evaluation import dense_metrics as tm

#: Rendered once: 20 small scenes (1 to 4 objects each) for the checks against real data.
SAMPLES = [synthetic_sample(0, index, 32) for index in range(20)]


def test_depth_metrics():
    true = np.array([[[1.0, 2.0], [4.0, 0.0]], [[np.nan, 0.0], [0.0, np.inf]]])  # 0 (sky), nan, inf: ignored
    assert tm.depth_metrics(true.copy(), true) == {"abs_rel": 0.0, "rmse": 0.0, "delta1": 1.0}
    doubled = tm.depth_metrics(2 * true, true)  # |2t - t| / t = 1 on every pixel; ratio 2 >= 1.25
    assert doubled["abs_rel"] == pytest.approx(1.0) and doubled["delta1"] == 0.0
    assert doubled["rmse"] == pytest.approx(math.sqrt((1 + 4 + 16) / 3))
    # ratios 1.2 (< 1.25: in), 1.25 (not strictly below: out), 1 (in); abs_rel (0.2 + 0.25 + 0) / 3
    near = tm.depth_metrics(np.array([[[1.2, 2.5], [4.0, 9.0]], [[1.0, 1.0], [1.0, 1.0]]]), true)
    assert near["delta1"] == pytest.approx(2 / 3) and near["abs_rel"] == pytest.approx(0.45 / 3)


def test_depth_metrics_clamps_prediction_and_handles_no_valid_pixel():
    true = np.ones((1, 1, 2))
    out = tm.depth_metrics(np.array([[[0.0, np.nan]]]), true)  # both become 1e-3: abs_rel 0.999, ratio 1000
    assert out["abs_rel"] == pytest.approx(1 - tm.MIN_DEPTH_M) and out["delta1"] == 0.0
    assert all(math.isnan(v) for v in tm.depth_metrics(np.ones((1, 2, 2)), np.zeros((1, 2, 2))).values())


def test_normal_metrics():
    up, side = np.array([0.0, 0.0, 1.0]), np.array([1.0, 0.0, 0.0])
    true = np.stack([up, up, up, np.zeros(3)]).reshape(1, 2, 2, 3)  # last pixel: sky (ignored)
    pred = np.stack([5 * up, side, (up + side) / 2, side]).reshape(1, 2, 2, 3)  # 0°, 90°, 45° (length ignored)
    out = tm.normal_metrics(pred, true)
    assert out["mean_angle_deg"] == pytest.approx(45.0) and out["within_11_25"] == pytest.approx(1 / 3)
    only_second = np.array([[[False, True], [False, False]]])
    assert tm.normal_metrics(pred, true, valid=only_second)["mean_angle_deg"] == pytest.approx(90.0)
    assert tm.normal_metrics(np.zeros_like(pred), true)["mean_angle_deg"] == pytest.approx(90.0)  # no prediction


def test_normal_metrics_on_stored_normals():
    true = np.stack([s["normal"] for s in SAMPLES[:4]])
    stored = np.stack([decode_normal(encode_normal(n)) for n in true])  # 8-bit PNG round trip, sky stays zero
    out = tm.normal_metrics(stored, true)
    assert out["mean_angle_deg"] < 1.0 and out["within_11_25"] == 1.0


def test_semseg_miou_accumulates_one_confusion_matrix():
    true = np.array([[[1, 1], [2, 2]]])
    pred = np.array([[[1, 2], [2, 2]]])
    # class 1: inter 1, union 2 -> 1/2; class 2: inter 2, union 3 -> 2/3; the other classes are in neither
    out = tm.semseg_miou(pred, true)
    assert out["miou"] == pytest.approx((1 / 2 + 2 / 3) / 2) and out["pixel_accuracy"] == 0.75
    # Two 1x2 images: (true 1 1, pred 1 1) and (true 2 2, pred 1 2). Summed confusion: 1->1: 2, 2->1: 1, 2->2: 1.
    # IoU 1 = 2 / (2 + 3 - 2) = 2/3, IoU 2 = 1 / (2 + 1 - 1) = 1/2: mIoU 7/12 (not the per-image mean 0.625).
    out = tm.semseg_miou(np.array([[[1, 1]], [[1, 2]]]), np.array([[[1, 1]], [[2, 2]]]))
    assert out["miou"] == pytest.approx(7 / 12) and out["pixel_accuracy"] == 0.75
    # A class only predicted counts with IoU 0: class 1 -> 1/2, class 3 -> 0.
    assert tm.semseg_miou(np.array([[[1, 3]]]), np.array([[[1, 1]]]))["miou"] == pytest.approx(0.25)
    with pytest.raises(ValueError, match="class ids"):
        tm.semseg_miou(np.array([[[6]]]), np.array([[[1]]]))
