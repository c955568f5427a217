"""The paired bootstrap on hand-made cases: a clear win, the lucky-scene AP that is not one, lower-is-better metrics,
determinism; and the resampled set-level metrics (AP, mIoU, micro F1, depth, normals) equal the plain metric on the
explicitly duplicated scenes."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fourm_kfp.data.modalities import parse_det
from fourm_kfp.data.synthetic_scenes import synthetic_sample
from fourm_kfp.evaluation import paired_bootstrap as pb
from fourm_kfp.evaluation.caption_metrics import caption_metrics, caption_stats
from fourm_kfp.evaluation.dense_metrics import (depth_metrics, depth_stats, normal_metrics, normal_stats, semseg_miou,
                                                semseg_stats)
from fourm_kfp.evaluation.detection_metrics import box_ap50, box_stats
from fourm_kfp.evaluation.scene_stats import SceneStats
from fourm_kfp.evaluation.scene_stats_reader import read_scene_stats
from fourm_kfp.evaluation.shape_presence import caption_shapes, shape_set_f1, shape_set_stats
from fourm_kfp.evaluation.targets import better
from fourm_kfp.evaluation.tasks import TaskResult

SAMPLES = [synthetic_sample(1, index, 32) for index in range(24)]
CUBE, FAR = (0.0, 0.0, 10.0, 10.0), (50.0, 50.0, 60.0, 60.0)


def _result(task: str, primary: str, higher: bool, model: SceneStats, baseline: SceneStats) -> TaskResult:
    keys = [f"scene-{i}" for i in range(len(model))]
    return TaskResult.scored(task, primary, higher, keys, model, model, baseline, [])


# -- the claims ---------------------------------------------------------------------------------------------------

def test_a_clear_win_excludes_zero():
    truth = [caption_shapes(s["caption"]) for s in SAMPLES]
    model = shape_set_stats(truth, truth)  # every scene right: F1 1
    baseline = shape_set_stats([frozenset({"cube"})] * len(truth), truth)
    result = _result("caption-to-rgb", "shape_presence_f1", True, model, baseline)
    assert result.metrics["shape_presence_f1"] == 1.0 and result.baseline["shape_presence_f1"] < 0.6
    assert result.difference == pytest.approx(1.0 - result.baseline["shape_presence_f1"])
    assert 0 < result.interval.low < result.difference < result.interval.high
    assert result.beats_baseline and result.interval.resamples == pb.BOOTSTRAP_RESAMPLES
    out = result.to_dict()
    assert out["beats_baseline"] and out["interval_low"] == result.interval.low
    assert out["scene_scores"]["model"] == {f"scene-{i}": 1.0 for i in range(len(truth))}
    # One scene's score is the metric of that scene alone.
    assert out["scene_scores"]["baseline"]["scene-3"] == shape_set_f1([frozenset({"cube"})], [truth[3]])[
        "shape_presence_f1"]


def test_one_lucky_scene_is_not_a_win():
    """The demo's failure: AP 0.001 against 0.000 because one scene among 30 has a hit ranked last."""
    truth = [[(CUBE, "cube")] for _ in range(30)]
    model = [[(FAR, "cube", 0.9)] for _ in range(30)]  # 29 misses with high scores ...
    model[7] = [(CUBE, "cube", 0.1)]  # ... and one hit, ranked last: precision 1/30 at recall 1/30
    baseline = [[(FAR, "cube", 0.5)] for _ in range(30)]
    model_stats, baseline_stats = box_stats(model, truth), box_stats(baseline, truth)
    assert model_stats.whole()["ap50"] == pytest.approx(1 / 900) and baseline_stats.whole()["ap50"] == 0.0
    assert better("rgb-to-det", 1 / 900, 0.0)  # the point rule calls it a win
    result = _result("rgb-to-det", "ap50", True, model_stats, baseline_stats)
    # A third of the resamples never draw scene 7 (0.97^30): the interval reaches down to 0.
    assert result.difference == pytest.approx(1 / 900) and result.interval.low == 0.0 < result.interval.high
    assert not result.beats_baseline and result.gain_over_baseline == math.inf
    assert result.to_dict()["scene_scores"]["model"]["scene-7"] == 1.0  # the lucky scene alone is perfect


def test_lower_is_better():
    rng = np.random.default_rng(3)
    true = rng.uniform(1.0, 10.0, size=(20, 4, 4))
    good = depth_stats(true * rng.uniform(1.0, 1.1, size=true.shape), true)  # abs_rel about 0.05
    bad = depth_stats(true * rng.uniform(1.3, 1.7, size=true.shape), true)  # about 0.5
    interval = pb.paired(good.statistic("abs_rel"), bad.statistic("abs_rel"), 20, higher_is_better=False)
    assert interval.difference == pytest.approx(bad.whole()["abs_rel"] - good.whole()["abs_rel"])
    assert interval.difference > 0.3 and interval.clears(0.0) and interval.paired
    reverse = pb.paired(bad.statistic("abs_rel"), good.statistic("abs_rel"), 20, higher_is_better=False)
    assert reverse.high < 0 and not reverse.clears(0.0)
    assert (reverse.low, reverse.high) == pytest.approx((-interval.high, -interval.low))
    result = _result("rgb-to-depth", "abs_rel", False, good, bad)
    assert result.beats_baseline and result.gain_over_baseline > 0.8


def test_fixed_seed_is_deterministic_and_resamples_draw_n_scenes():
    truth = [[(CUBE, "cube")] for _ in range(30)]
    model = [[(CUBE, "cube", 0.9)] if i % 3 else [(FAR, "cube", 0.9)] for i in range(30)]
    baseline = [[(CUBE, "cube", 0.5)] if i % 2 else [] for i in range(30)]
    stats = box_stats(model, truth).statistic("ap50"), box_stats(baseline, truth).statistic("ap50")
    first, again = pb.paired(*stats, 30, True), pb.paired(*stats, 30, True)
    assert first == again
    other = pb.paired(*stats, 30, True, seed=1)
    assert other.difference == first.difference and (other.low, other.high) != (first.low, first.high)
    counts = pb.resample_counts(30, 1000, np.random.default_rng(0))
    assert counts.shape == (1000, 30) and (counts.sum(1) == 30).all()
    assert counts.mean() == pytest.approx(1.0, abs=0.02)  # each scene drawn once per resample on average


def test_unpaired_and_degenerate_intervals():
    a = shape_set_stats([frozenset({"cube"})] * 40, [frozenset({"cube"})] * 40)
    b = shape_set_stats([frozenset()] * 25, [frozenset({"cube"})] * 25)
    interval = pb.unpaired(a.statistic("shape_presence_f1"), 40, b.statistic("shape_presence_f1"), 25, True)
    assert not interval.paired and interval.difference == interval.low == interval.high == 1.0
    assert interval.clears(0.99) and not interval.clears(1.0)  # strictly above what it must clear
    empty = pb.paired(a.statistic("shape_presence_f1"), a.statistic("shape_presence_f1"), 0, True)
    assert math.isnan(empty.low) and not empty.clears(-1.0)
    tie = pb.paired(a.statistic("shape_presence_f1"), a.statistic("shape_presence_f1"), 40, True)
    assert tie.low == tie.high == 0.0 and not tie.clears(0.0)


# -- resampled metrics = metrics on duplicated scenes ------------------------------------------------------------

COUNTS = pb.resample_counts(len(SAMPLES), 6, np.random.default_rng(7))


def _duplicated(items, row):
    """The set in which scene i appears row[i] times (scene order kept, copies adjacent)."""
    return [items[i] for i in np.repeat(np.arange(len(items)), row.astype(int))]


def _check(stats: SceneStats, plain, items_per_arg, names):
    resampled = stats.metrics(COUNTS)
    for r, row in enumerate(COUNTS):
        expected = plain(*[_duplicated(items, row) for items in items_per_arg])
        for name in names(expected):
            assert resampled[name][r] == pytest.approx(expected[name], rel=1e-9, abs=1e-12), (name, r)


def test_weighted_ap_equals_ap_on_duplicated_scenes():
    rng = np.random.default_rng(0)
    truth = [[(tuple(float(c) for c in box), name) for box, name in parse_det(s["det"])] for s in SAMPLES]
    predictions = []
    for boxes in truth:
        scene = [(tuple(c + rng.integers(-3, 4) for c in box), name, float(rng.integers(0, 5)) / 4)  # score ties
                 for box, name in boxes if rng.random() < 0.8]
        scene += [((1.0, 1.0, 6.0, 6.0), str(rng.choice(["cube", "sphere", "cone"])), float(rng.random()))]
        predictions.append(scene)
    stats = box_stats(predictions, truth)
    assert 0.1 < stats.whole()["ap50"] < 0.95  # hits and misses, not a trivial case
    # A class absent from a resample is NaN there, and absent from the duplicated set's dict.
    _check(stats, box_ap50, [predictions, truth], lambda expected: expected)
    assert stats.per_scene("ap50")[0] == box_ap50(predictions[:1], truth[:1])["ap50"]


def test_weighted_miou_and_dense_metrics_equal_duplicated_scenes():
    rng = np.random.default_rng(1)
    semseg = [s["semseg"] for s in SAMPLES]
    noisy = [np.where(rng.random(s.shape) < 0.2, rng.integers(0, 6, s.shape), s).astype(s.dtype) for s in semseg]
    stats = semseg_stats(np.stack(noisy), np.stack(semseg))
    _check(stats, lambda p, t: semseg_miou(np.stack(p), np.stack(t)), [noisy, semseg], lambda e: e)
    depth = [s["depth"] for s in SAMPLES]
    pred = [d * rng.uniform(0.8, 1.2, d.shape) for d in depth]
    _check(depth_stats(np.stack(pred), np.stack(depth)),
           lambda p, t: depth_metrics(np.stack(p), np.stack(t)), [pred, depth], lambda e: e)
    normal = [s["normal"] for s in SAMPLES]
    npred = [n + rng.normal(0, 0.3, n.shape) for n in normal]
    _check(normal_stats(np.stack(npred), np.stack(normal)),
           lambda p, t: normal_metrics(np.stack(p), np.stack(t)), [npred, normal], lambda e: e)


def test_weighted_micro_f1_equals_duplicated_scenes():
    truth = [s["caption"] for s in SAMPLES]
    pred = truth[3:] + truth[:3]  # other scenes' captions: partial matches
    stats = caption_stats(pred, truth)
    assert 0 < stats.whole()["object_f1"] < 1
    _check(stats, caption_metrics, [pred, truth], lambda e: e)
    assert stats.per_scene("word_f1")[5] == caption_metrics(pred[5:6], truth[5:6])["word_f1"]


def test_scene_stats_survive_json():
    truth = [[(CUBE, "cube")], [(FAR, "sphere")], []]
    stats = box_stats([[(CUBE, "cube", 0.3)], [(CUBE, "sphere", 0.9)], [(FAR, "cone", 0.5)]], truth)
    back = read_scene_stats(stats.to_json())
    assert back.whole() == stats.whole() and back.to_json() == stats.to_json()
    caption = caption_stats(["a small red cube"], ["a large red cube"])
    assert read_scene_stats(caption.to_json()).whole() == caption.whole()
