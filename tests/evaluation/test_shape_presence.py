"""Caption-to-rgb's shape presence F1 and its best-constant-set baseline on hand-made cases whose answers are worked
out in the comments, and on real synthetic scenes."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from fourm_kfp.data.scene_captions import parse_caption
from fourm_kfp.data.synthetic_scenes import synthetic_sample
from fourm_kfp.evaluation import shape_presence as tm
from fourm_kfp.evaluation.targets import most_common

#: Rendered once: 20 small scenes (1 to 4 objects each) for the checks against real data.
SAMPLES = [synthetic_sample(0, index, 32) for index in range(20)]


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
        named = {shape for _, _, shape in parse_caption(sample["caption"])}
        assert named <= tm.shapes_in_semseg(sample["semseg"])


def test_best_constant_set_is_the_best_of_all_sets():
    # Every scene names "cube": {cube} scores 2*4/(1*4 + 5) = 0.889, {cube, cone} 2*5/(2*4 + 5) = 0.769.
    assert tm.best_constant_set([frozenset({"cube"})] * 3 + [frozenset({"cube", "cone"})]) == {"cube"}
    # Two of four shapes a scene: all four (recall 1, precision 1/2) beat the most common pair.
    pairs = [frozenset(p) for p in (("cube", "cone"), ("sphere", "cylinder"), ("cube", "sphere"), ("cone", "cylinder"),
                                    ("cube", "cone"))]
    assert tm.best_constant_set(pairs) == {"cube", "cone", "sphere", "cylinder"}
    assert most_common(pairs) == {"cube", "cone"}
    assert tm.best_constant_set([]) == frozenset() == tm.best_constant_set([frozenset()])
    # Against every subset of the shapes, on the captions of real scenes
    true = [tm.caption_shapes(s["caption"]) for s in SAMPLES]
    shapes = sorted(set().union(*true))
    f1 = lambda chosen: tm.shape_set_f1([chosen] * len(true), true)["shape_presence_f1"]
    subsets = [frozenset(c) for k in range(1, len(shapes) + 1) for c in itertools.combinations(shapes, k)]
    assert f1(tm.best_constant_set(true)) == pytest.approx(max(f1(s) for s in subsets))
