"""Task metrics on hand-made cases whose answers are worked out in the comments."""

from __future__ import annotations

import numpy as np
import pytest

from fourm_kfp.data.modalities import parse_det
from fourm_kfp.data.synthetic_scenes import synthetic_sample
from fourm_kfp.evaluation import task_metrics as tm


def test_depth_metrics():
    true = np.array([[[1.0, 2.0], [4.0, 0.0]]])  # the 0 is sky: ignored
    same = tm.depth_metrics(true.copy(), true)
    assert same == {"abs_rel": 0.0, "rmse": 0.0, "delta1": 1.0}
    doubled = tm.depth_metrics(2 * true, true)  # |2t - t| / t = 1 everywhere; ratio 2 >= 1.25
    assert doubled["abs_rel"] == pytest.approx(1.0) and doubled["delta1"] == 0.0
    assert doubled["rmse"] == pytest.approx(np.sqrt((1 + 4 + 16) / 3))
    near = tm.depth_metrics(np.array([[[1.2, 2.0], [4.0, 9.0]]]), true)  # 1.2/1 < 1.25: all three within
    assert near["delta1"] == 1.0 and near["abs_rel"] == pytest.approx(0.2 / 3)


def test_normal_metrics():
    up, side = np.array([0.0, 0.0, 1.0]), np.array([1.0, 0.0, 0.0])
    true = np.stack([up, up, up, np.zeros(3)]).reshape(1, 2, 2, 3)  # last pixel: sky (ignored)
    pred = np.stack([up * 5, side, (up + side) / 2, side]).reshape(1, 2, 2, 3)  # 0°, 90°, 45° (scale ignored)
    out = tm.normal_metrics(pred, true)
    assert out["mean_angle_deg"] == pytest.approx(45.0) and out["within_11_25"] == pytest.approx(1 / 3)


def test_semseg_miou():
    true = np.array([[[1, 1], [2, 2]]])
    pred = np.array([[[1, 2], [2, 2]]])
    # class 1: inter 1, union 2 -> 0.5; class 2: inter 2, union 3 -> 2/3; other classes absent from both
    out = tm.semseg_miou(pred, true)
    assert out["miou"] == pytest.approx((0.5 + 2 / 3) / 2) and out["pixel_accuracy"] == 0.75


def test_box_iou_and_ap50():
    a = (0.0, 0.0, 10.0, 10.0)
    assert tm.box_iou(a, a) == 1.0 and tm.box_iou(a, (20.0, 20.0, 30.0, 30.0)) == 0.0
    half = (0.0, 0.0, 10.0, 5.0)  # inside a, half its area: IoU exactly 0.5 counts as a match
    assert tm.box_iou(a, half) == 0.5
    truth = [[(a, "cube")]]
    hit, miss = (half, "cube", 0.9), ((50.0, 50.0, 60.0, 60.0), "cube", 0.1)
    assert tm.box_ap50([[hit, miss]], truth)["ap50"] == pytest.approx(1.0)  # the hit ranks first
    assert tm.box_ap50([[(half, "cube", 0.1), (miss[0], "cube", 0.9)]], truth)["ap50"] == pytest.approx(0.5)
    assert tm.box_ap50([[(half, "cone", 0.9)]], truth)["ap50"] == 0.0  # wrong class
    assert tm.box_ap50([[]], truth)["ap50"] == 0.0
    # Two ground-truth boxes, one found: recall stops at 0.5, AP 0.5. A duplicate of the same box is a false hit.
    two = [[(a, "cube"), ((20.0, 20.0, 30.0, 30.0), "cube")]]
    assert tm.box_ap50([[(a, "cube", 0.9), (a, "cube", 0.8)]], two)["ap50"] == pytest.approx(0.5)
    # Classes without ground truth are not averaged.
    assert set(tm.box_ap50([[hit]], truth)) == {"ap50", "ap50_cube"}


def test_parse_generated_det_is_tolerant():
    text = "v0=10 v1=20 v2=5 v3=40 cube v0=1 v1=2 cone v0=1 v1=2 v2=3 v3=1000 sphere v0=1 v1=2 v2=3 v3=4 dragon"
    assert tm.parse_generated_det(text) == [((5.0, 20.0, 10.0, 40.0), "cube")]
    assert tm.parse_generated_det("garbage") == []
    exact = "v0=1 v1=2 v2=30 v3=40 cylinder v0=5 v1=6 v2=7 v3=8 cone"
    assert [(tuple(map(int, b)), n) for b, n in tm.parse_generated_det(exact)] == parse_det(exact)


def test_captions_parse_and_score():
    assert tm.parse_caption("an empty scene") == []
    assert tm.parse_caption("a small red sphere left of a large blue cube") == [("small", "red", "sphere"),
                                                                                  ("large", "blue", "cube")]
    for index in range(20):  # real captions name only visible objects, each with its size, colour and shape
        sample = synthetic_sample(0, index, 64)
        objects = tm.parse_caption(sample["caption"])
        assert all(o[2] in ("sphere", "cube", "cylinder", "cone") for o in objects)
        assert len(objects) == len(parse_det(sample["det"])) or sample["caption"] == "an empty scene"
    out = tm.caption_metrics(["a small red sphere left of a small red cube", "a large blue cone"],
                             ["a small red sphere left of a large green cube", "a large blue cone"])
    # objects (colour, shape): pred {red sphere, red cube} + {blue cone}; true {red sphere, green cube} + {blue cone}
    # matched 2 of 3 predicted and 3 true -> F1 = 2*2/(3+3); shapes all match -> 1; colours: red,red vs red,green
    assert out["count_accuracy"] == 1.0 and out["object_f1"] == pytest.approx(4 / 6)
    assert out["shape_f1"] == 1.0 and out["colour_f1"] == pytest.approx(4 / 6)


def test_shape_presence_and_most_common():
    semseg = np.zeros((10, 10), np.int64)
    semseg[:3, :3] = 3  # cube on 9% of the pixels
    semseg[9, 9] = 2  # one sphere pixel: 1% >= 0.2% threshold
    assert tm.shapes_in_semseg(semseg) == {"cube", "sphere"}
    assert tm.shapes_in_semseg(semseg, min_fraction=0.05) == {"cube"}
    out = tm.shape_presence_f1([semseg], ["a small red cube left of a large blue cone"])
    assert out["shape_presence_f1"] == pytest.approx(2 * 1 / (2 + 2))  # cube matched; sphere, cone not
    assert tm.most_common(["a", "b", "b", "a", "c"]) == "a"  # tie: the first seen


def test_better_respects_direction_and_margin():
    assert tm.better("rgb-to-depth", 0.1, 0.2) and not tm.better("rgb-to-depth", 0.2, 0.1)
    assert tm.better("rgb-to-semseg", 0.5, 0.4) and not tm.better("rgb-to-semseg", 0.42, 0.4, margin=0.1)
    assert tm.better("rgb-to-det", 0.1, 0.0) and not tm.better("rgb-to-det", 0.0, 0.0)
