"""Task metrics on hand-made cases whose answers are worked out in the comments, and on real synthetic scenes."""

from __future__ import annotations

import itertools
import math
from collections import Counter

import numpy as np
import pytest

from fourm_kfp.data.modalities import decode_normal, encode_normal, parse_det
from fourm_kfp.data.synthetic_scenes import COLORS, SIZES, synthetic_sample
from fourm_kfp.evaluation import task_metrics as tm

#: Rendered once: 20 small scenes (1 to 4 objects each) for the checks against real data.
SAMPLES = [synthetic_sample(0, index, 32) for index in range(20)]


# -- depth, normal, semseg --------------------------------------------------------------------------------------

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


# -- detection --------------------------------------------------------------------------------------------------

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


# -- captions ---------------------------------------------------------------------------------------------------

def test_parse_caption():
    assert tm.parse_caption("an empty scene") == []
    assert tm.parse_caption("a small red sphere left of a large blue cube") == [("small", "red", "sphere"),
                                                                                  ("large", "blue", "cube")]
    assert tm.parse_caption("A Small  Red Sphere") == [("small", "red", "sphere")]
    assert tm.parse_caption("a small red and a huge blue sphere") == []  # incomplete / unknown words


def test_parse_caption_on_real_captions():
    # A caption names every visible object once, and det boxes exactly the visible objects.
    counts = []
    for sample in SAMPLES:
        objects, boxes = tm.parse_caption(sample["caption"]), parse_det(sample["det"])
        assert Counter(o[2] for o in objects) == Counter(name for _, name in boxes)
        assert all(size in SIZES and colour in COLORS for size, colour, _ in objects)
        assert (sample["caption"] == "an empty scene") == (not objects)
        counts.append(len(objects))
    assert max(counts) >= 3  # the "..., ... and ..." phrasing is covered
    truth = [s["caption"] for s in SAMPLES]
    assert tm.caption_metrics(truth, truth) == {"count_accuracy": 1.0, "object_f1": 1.0, "shape_f1": 1.0,
                                                "colour_f1": 1.0, "word_f1": 1.0}
    assert tm.caption_primary(truth) == "object_f1"


def test_caption_metrics_micro_f1_on_multisets():
    pred = ["a small green sphere left of a small red cube", "a small red sphere behind a large red sphere",
            "an empty scene"]
    true = ["a small red sphere left of a large green cube", "a medium red sphere", "a large blue cone"]
    # counts 2/2 (ok), 2/1, 0/1 -> count_accuracy 1/3. (matched, predicted, true) per caption:
    # (colour, shape): {green sphere, red cube} vs {red sphere, green cube} (0, 2, 2); {red sphere x2} vs
    #   {red sphere} (1, 2, 1); {} vs {blue cone} (0, 0, 1) -> (1, 4, 4): F1 = 2 * 1 / 8
    # shape: (2, 2, 2), (1, 2, 1), (0, 0, 1) -> (3, 4, 4): F1 = 6 / 8; colour: (2, 2, 2), (1, 2, 1), (0, 0, 1) -> 6 / 8
    out = tm.caption_metrics(pred, true)
    del out["word_f1"]
    assert out == pytest.approx({"count_accuracy": 1 / 3, "object_f1": 0.25, "shape_f1": 0.75, "colour_f1": 0.75})
    assert tm.caption_metrics(["an empty scene"], ["an empty scene"])["object_f1"] == 1.0  # nothing to find
    with pytest.raises(ValueError):
        tm.caption_metrics(["a small red cube"], [])


def test_word_f1_and_caption_primary_for_real_captions():
    # words: {a, photo, of, a, dog} vs {a, photo, of, two, dogs}: matched a, photo, of (3 of 5 and 5) -> 6 / 10;
    # second pair: identical once case, accents and punctuation are dropped -> (3, 3, 3). Micro: 2 * 6 / 16.
    pred, true = ["a photo of a dog", "Café, au LAIT!"], ["A photo of two dogs.", "cafe au lait"]
    assert tm.caption_words(true[0]) == ["a", "photo", "of", "two", "dogs"]
    assert tm.caption_metrics(pred, true)["word_f1"] == pytest.approx(12 / 16)
    assert tm.caption_primary(true) == "word_f1"
    assert tm.caption_primary(["an empty scene", "a small red cube"]) == "object_f1"
    assert tm.caption_primary(["a small red cube", "a photo of a cube"]) == "word_f1"  # one real caption
    assert tm.caption_primary([]) == "word_f1"


# -- caption -> image, baselines --------------------------------------------------------------------------------

def test_shapes_in_semseg_and_shape_presence_f1():
    semseg = np.ones((10, 10), np.uint8)  # ground
    semseg[:3, :3] = 3  # cube on 9% of the pixels
    semseg[9, 9] = 2  # one sphere pixel: 1% >= 0.2%
    assert tm.shapes_in_semseg(semseg) == {"cube", "sphere"}
    assert tm.shapes_in_semseg(semseg, min_fraction=0.01) == {"cube", "sphere"}  # the threshold is inclusive
    assert tm.shapes_in_semseg(semseg, min_fraction=0.05) == {"cube"}
    cone = np.full((10, 10), 5, np.uint8)
    captions = ["a small red cube left of a large blue cone", "an empty scene",
                "a large red cone left of a small blue cone"]
    # sets: {cube, sphere} vs {cube, cone} (1, 2, 2); {} vs {} (0, 0, 0); {cone} vs {cone} (1, 1, 1) -> 2 * 2 / 6
    out = tm.shape_presence_f1([semseg, np.ones((10, 10), np.uint8), cone], captions)
    # precision: 2 of the 3 shapes seen were named; recall: 2 of the 3 named were seen
    assert out == pytest.approx({"shape_presence_f1": 2 / 3, "shape_presence_f1.precision": 2 / 3,
                                 "shape_presence_f1.recall": 2 / 3})
    seen_more = tm.shape_presence_f1([semseg], ["a small red cube"])  # {cube, sphere} vs {cube}
    assert seen_more == pytest.approx({"shape_presence_f1": 2 / 3, "shape_presence_f1.precision": 0.5,
                                       "shape_presence_f1.recall": 1.0})


def test_caption_shapes_are_visible_in_true_semseg():
    # At 32 px a captioned object covers >= 4 pixels, above the 0.2% threshold (2.05 pixels): recall is 1.
    for sample in SAMPLES:
        named = {shape for _, _, shape in tm.parse_caption(sample["caption"])}
        assert named <= tm.shapes_in_semseg(sample["semseg"])


def test_best_constant_set_is_the_best_of_all_sets():
    # Every scene names "cube": {cube} scores 2*4/(1*4 + 5) = 0.889, {cube, cone} 2*5/(2*4 + 5) = 0.769.
    assert tm.best_constant_set([frozenset({"cube"})] * 3 + [frozenset({"cube", "cone"})]) == {"cube"}
    # Two of four shapes a scene: all four (recall 1, precision 1/2) beat the most common pair.
    pairs = [frozenset(p) for p in (("cube", "cone"), ("sphere", "cylinder"), ("cube", "sphere"), ("cone", "cylinder"),
                                    ("cube", "cone"))]
    assert tm.best_constant_set(pairs) == {"cube", "cone", "sphere", "cylinder"}
    assert tm.most_common(pairs) == {"cube", "cone"}
    assert tm.best_constant_set([]) == frozenset() == tm.best_constant_set([frozenset()])
    # Against every subset of the shapes, on the captions of real scenes
    true = [tm.caption_shapes(s["caption"]) for s in SAMPLES]
    shapes = sorted(set().union(*true))
    f1 = lambda chosen: tm.shape_set_f1([chosen] * len(true), true)["shape_presence_f1"]
    subsets = [frozenset(c) for k in range(1, len(shapes) + 1) for c in itertools.combinations(shapes, k)]
    assert f1(tm.best_constant_set(true)) == pytest.approx(max(f1(s) for s in subsets))


def test_most_common():
    assert tm.most_common(["a", "b", "b", "a", "c"]) == "a"  # tie: the first seen
    assert tm.most_common(["x", "y", "y"]) == "y"
    assert tm.most_common([frozenset({"cube"}), frozenset(), frozenset({"cube"})]) == {"cube"}
    with pytest.raises(ValueError):
        tm.most_common([])
