"""Box IoU, AP50 and the lenient det parser on hand-made cases whose answers are worked out in the comments, and on
real synthetic scenes."""

from __future__ import annotations

import pytest

from fourm_kfp.data.modalities import parse_det
from fourm_kfp.data.synthetic_scenes import synthetic_sample
from fourm_kfp.evaluation import detection_metrics as tm

#: Rendered once: 20 small scenes (1 to 4 objects each) for the checks against real data.
SAMPLES = [synthetic_sample(0, index, 32) for index in range(20)]

A = (0.0, 0.0, 10.0, 10.0)
FAR = (50.0, 50.0, 60.0, 60.0)


def test_box_iou():
    assert tm.box_iou(A, A) == 1.0 and tm.box_iou(A, FAR) == 0.0
    assert tm.box_iou(A, (0.0, 0.0, 10.0, 5.0)) == 0.5  # inside A, half its area
    assert tm.box_iou(A, (5.0, 0.0, 15.0, 10.0)) == pytest.approx(50 / 150)  # half overlap: 50 / (100 + 100 - 50)
    assert tm.box_iou(A, (10.0, 0.0, 20.0, 10.0)) == 0.0  # touching edges
    assert tm.box_iou((1.0, 1.0, 1.0, 1.0), (1.0, 1.0, 1.0, 1.0)) == 0.0  # empty union


def test_ap50_iou_boundary_and_ranking():
    truth = [[(A, "cube")]]
    assert tm.box_ap50([[((0.0, 0.0, 10.0, 5.0), "cube", 0.9)]], truth)["ap50"] == 1.0  # IoU exactly 0.5 matches
    assert tm.box_ap50([[((0.0, 0.0, 10.0, 4.99), "cube", 0.9)]], truth)["ap50"] == 0.0  # IoU 0.499 does not
    # One TP and one FP. TP first: precision 1 at recall 1 -> AP 1. FP first: the TP comes at precision 1/2 -> 0.5.
    assert tm.box_ap50([[(A, "cube", 0.9), (FAR, "cube", 0.1)]], truth)["ap50"] == pytest.approx(1.0)
    assert tm.box_ap50([[(A, "cube", 0.1), (FAR, "cube", 0.9)]], truth)["ap50"] == pytest.approx(0.5)
    assert tm.box_ap50([[(A, "cone", 0.9)]], truth) == {"ap50": 0.0, "ap50_cube": 0.0}  # wrong class
    assert tm.box_ap50([[]], truth)["ap50"] == 0.0
    # Two true boxes, the same one predicted twice: the duplicate is a FP; recall stops at 1/2 with precision 1.
    two = [[(A, "cube"), (FAR, "cube")]]
    assert tm.box_ap50([[(A, "cube", 0.9), (A, "cube", 0.8)]], two)["ap50"] == pytest.approx(0.5)
    assert tm.box_ap50([[]], [[]]) == {"ap50": 0.0}  # no ground truth at all
    with pytest.raises(ValueError, match="images"):
        tm.box_ap50([[], []], truth)


def test_ap50_over_images_and_classes():
    b, s = (20.0, 20.0, 30.0, 30.0), (0.0, 40.0, 10.0, 50.0)
    truth = [[(A, "cube")], [(b, "cube"), (s, "sphere")]]
    predictions = [
        [(b, "cube", 0.7), (A, "cube", 0.6)],  # b is a true box of the other image only: a FP here
        [(b, "cube", 0.8), (s, "sphere", 0.5), (FAR, "cylinder", 0.9)],  # no cylinder in the truth
    ]
    # cube in score order: TP (0.8), FP (0.7), TP (0.6) -> precision 1, 1/2, 2/3 at recall 1/2, 1/2, 1;
    # AP = 1/2 * 1 + 1/2 * 2/3 = 5/6. sphere: AP 1. mAP over the classes with ground truth: (5/6 + 1) / 2.
    out = tm.box_ap50(predictions, truth)
    assert out == pytest.approx({"ap50": 11 / 12, "ap50_cube": 5 / 6, "ap50_sphere": 1.0})
    # The envelope: TP, FP, FP, TP at recall 1/2, 1/2, 1/2, 1 -> precision 1, 1/2, 1/3, 1/2: AP = 1/2 + 1/2 * 1/2.
    ranked = [[(A, "cube", 0.9), (FAR, "cube", 0.8), (FAR, "cube", 0.7), (b, "cube", 0.6)]]
    assert tm.box_ap50(ranked, [[(A, "cube"), (b, "cube")]])["ap50"] == pytest.approx(0.75)


def test_parse_generated_det_is_tolerant():
    text = ("v0=10 v1=20 v2=5 v3=40 cube "  # x corners swapped: sorted
            "v0=1 v1=2 cone "  # truncated group
            "v0=1 v1=2 v2=3 v3=1000 sphere "  # coordinate out of range
            "v0=1 v1=2 v2=3 v3=4 dragon "  # unknown class
            "v0=1 v1=2 v2=3 v3=4 ground "  # a class, but not an object class
            "v0 = 3  v1=4\nv2=5 v3=6 Sphere")  # odd spacing and case: accepted
    assert tm.parse_generated_det(text) == [((5.0, 20.0, 10.0, 40.0), "cube"), ((3.0, 4.0, 5.0, 6.0), "sphere")]
    assert tm.parse_generated_det("") == [] and tm.parse_generated_det("garbage [UNK] v0=") == []
    assert tm.parse_generated_det("v0=1 v1=2 v2=3 v3=4 cubes") == []  # not a whole class name
    for sample in SAMPLES:  # on real det texts it agrees with the strict parser
        expected = [(tuple(float(c) for c in box), name) for box, name in parse_det(sample["det"])]
        assert tm.parse_generated_det(sample["det"]) == expected
