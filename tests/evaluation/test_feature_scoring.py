"""``rgb-to-clip`` and ``rgb-to-dinov2``: a generated feature map is scored by the cosine of its feature vectors to
the teacher's (mean over the cells, higher is better) beside the mean training map, and its per-scene statistics read
back from their JSON as the model gate reads a champion's."""

from __future__ import annotations

import numpy as np
import pytest

from fourm_kfp.config.fourm_config import EVALUATION_TASKS
from fourm_kfp.evaluation.dense_metrics import feature_stats
from fourm_kfp.evaluation.scene_stats_reader import read_scene_stats
from fourm_kfp.evaluation.targets import SCORERS, scorer, task_primary


def _maps(n: int, seed: int = 0) -> list[np.ndarray]:
    return list(np.random.default_rng(seed).normal(size=(n, 3, 3, 5)).astype(np.float32))


@pytest.mark.parametrize("name", ["clip", "dinov2"])
def test_feature_maps_are_tasks_scored_by_cosine(name):
    assert f"rgb-to-{name}" in EVALUATION_TASKS
    assert task_primary(f"rgb-to-{name}") == ("cosine", True) and scorer(name) is SCORERS["features"]


def test_identical_maps_score_one_opposite_minus_one_and_the_mse_is_per_value():
    truth = _maps(3)
    family = scorer("clip")
    same = family.stats(truth, truth, [0.0] * 3).whole()
    assert same["cosine"] == pytest.approx(1.0) and same["mse"] == pytest.approx(0.0)
    opposite = family.stats([-t for t in truth], truth, [0.0] * 3).whole()
    assert opposite["cosine"] == pytest.approx(-1.0)
    assert opposite["mse"] == pytest.approx(np.mean([(2 * t) ** 2 for t in truth]))
    scaled = family.stats([3 * t for t in truth], truth, [0.0] * 3).whole()
    assert scaled["cosine"] == pytest.approx(1.0) and scaled["mse"] > 0  # cosine ignores the scale
    zero = family.stats([np.zeros_like(t) for t in truth], truth, [0.0] * 3).whole()
    assert zero["cosine"] == 0.0  # a zero vector has no direction: it scores 0, not NaN


def test_the_baseline_is_the_mean_training_map_and_scores_between():
    train, truth = _maps(8, seed=1), _maps(4, seed=2)
    family = scorer("dinov2")
    baseline = family.baseline(train)
    np.testing.assert_allclose(baseline, np.mean(np.asarray(train, np.float64), axis=0), rtol=1e-6, atol=1e-7)
    assert baseline.shape == (3, 3, 5) and baseline.dtype == np.float32
    score = family.stats([baseline] * 4, truth, [0.0] * 4).whole()["cosine"]
    assert -1.0 < score < 1.0


def test_per_scene_statistics_read_back_and_weight_scenes():
    truth, predicted = _maps(3), _maps(3, seed=5)
    stats = feature_stats(np.stack(predicted), np.stack(truth))
    again = read_scene_stats(stats.to_json())
    assert again.whole() == pytest.approx(stats.whole())
    per_scene = stats.per_scene("cosine")
    assert np.mean(per_scene) == pytest.approx(stats.whole()["cosine"])  # every scene has as many cells
    with pytest.raises(ValueError, match="predicted maps"):
        feature_stats(np.stack(predicted)[:, :2], np.stack(truth))
