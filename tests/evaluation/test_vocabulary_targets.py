"""The evaluation over the model's class vocabularies: semseg mIoU and its majority baseline over 300 classes (with
statistics that keep only the confusion cells the scenes have), det AP over a vocabulary's names; without a
vocabulary, the synthetic scenes' six classes and four shapes."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pytest

from fourm_kfp.evaluation import dense_metrics
from fourm_kfp.evaluation.any_to_any import class_legend
from fourm_kfp.evaluation.detection_metrics import parse_generated_det
from fourm_kfp.evaluation.scene_stats_reader import read_scene_stats
from fourm_kfp.evaluation.tasks import Baselines, Scenes, run_task
from fourm_kfp.evaluation.targets import scorer
from fourm_kfp.model.generation import Generated, SamplingArgs

VOCABULARIES = {"semseg": [f"class{i}" for i in range(300)], "det": ["person", "Traffic_Light"]}


@dataclass(frozen=True)
class _Spec:
    kind: str
    pixel_input: bool = False


class _Engine:
    """Stands in for a trained model on rgb-to-semseg: generates token 299, and decodes token ``t`` to a map of
    class ``t`` everywhere."""

    specs = {"rgb": _Spec("image"), "semseg": _Spec("image")}

    def token_inputs(self, modality, tokens, values=None):
        return [{modality: t} for t in tokens]

    def generate_tokens(self, inputs, target, sampling, seed, batch_size):
        return [Generated(np.full((2, 2), 299), np.zeros((2, 2))) for _ in inputs]

    def detokenize(self, modality, tokens):
        return [np.full((4, 4), int(np.asarray(t).reshape(-1)[0]), np.uint16) for t in tokens]


def test_semseg_is_scored_and_its_baseline_fitted_over_a_300_class_vocabulary():
    train = [np.full((4, 4), 257, np.uint16)] * 2 + [np.full((4, 4), 299, np.uint16)]
    baselines = Baselines.fit({"semseg": train}, VOCABULARIES)
    assert baselines.predictions["semseg"].tolist() == np.full((4, 4), 257).tolist()  # the majority class
    half = np.full((4, 4), 299, np.uint16)
    half[:2] = 257
    scenes = Scenes(["a", "b"], {"rgb": [None, None], "semseg": [np.full((4, 4), 299, np.uint16), half]},
                    {"rgb": [np.zeros(4, np.int64)] * 2, "semseg": [np.full(4, 299), np.full(4, 257)]})
    result = run_task(_Engine(), scenes, "rgb-to-semseg", baselines, SamplingArgs(temperature=0.0), 0, 2, 1)
    assert result.primary == "miou" and result.higher_is_better
    # generated 299 everywhere: IoU(299) = 24 / 32, IoU(257) = 0 (in the truth only)
    assert math.isclose(result.metrics["miou"], 0.375) and math.isclose(result.metrics["pixel_accuracy"], 0.75)
    # the baseline's 257 everywhere: IoU(257) = 8 / 32, IoU(299) = 0
    assert math.isclose(result.baseline["miou"], 0.125) and math.isclose(result.baseline["pixel_accuracy"], 0.25)
    # the confusion cells some scene has, not 300 x 300 of them
    assert result.model_stats.columns == ("257,299", "299,299")


def test_without_the_vocabulary_ids_past_the_six_classes_are_refused():
    train = [np.full((4, 4), 257, np.uint16)]
    with pytest.raises(ValueError, match="outside 0..5"):
        Baselines.fit({"semseg": train})
    with pytest.raises(ValueError, match="outside 0..5"):
        scorer("semseg").stats(train, train, [0.0])
    assert scorer("semseg", VOCABULARIES).stats(train, train, [0.0]).whole()["miou"] == 1.0


def test_det_is_scored_over_the_vocabulary_names():
    truth = ["v0=100 v1=100 v2=400 v3=400 person v0=500 v1=500 v2=900 v3=900 Traffic_Light"]
    generated = ["v0=100 v1=100 v2=400 v3=400 person v0=500 v1=500 v2=900 v3=900 traffic_light v0=1 v1=1 v2=9 "
                 "v3=9 cube"]  # lower-cased as the text tokenizer gives it; a cube is no class of this vocabulary
    assert [name for _, name in parse_generated_det(generated[0], VOCABULARIES["det"])] == ["person",
                                                                                            "Traffic_Light"]
    metrics = scorer("det", VOCABULARIES).stats(generated, truth, [0.0]).whole()
    assert metrics == {"ap50": 1.0, "ap50_person": 1.0, "ap50_Traffic_Light": 1.0}
    assert scorer("det").stats(generated, truth, [0.0]).whole() == {"ap50": 0.0}  # the synthetic shapes only


def test_a_large_vocabulary_keeps_the_cells_the_scenes_have_with_the_same_metrics(monkeypatch):
    rng = np.random.default_rng(0)
    true = rng.integers(240, 300, (4, 8, 8))
    pred = np.where(rng.random(true.shape) < 0.6, true, rng.integers(0, 300, true.shape))
    sparse = dense_metrics.semseg_stats(pred, true, 300)
    monkeypatch.setattr(dense_metrics, "DENSE_CONFUSION_CLASSES", 300)
    dense = dense_metrics.semseg_stats(pred, true, 300)
    assert len(dense.columns) == 300 * 300 and len(sparse.columns) < 4 * 64
    counts = rng.integers(0, 3, (50, 4))
    for name, values in dense.metrics(counts).items():
        np.testing.assert_allclose(sparse.metrics(counts)[name], values, rtol=1e-12)  # summed in another order
    assert read_scene_stats(sparse.to_json()).whole() == sparse.whole()  # read back as a champion's
    six = dense_metrics.semseg_stats(np.zeros((1, 2, 2), int), np.zeros((1, 2, 2), int))
    assert six.columns == tuple(f"{t},{p}" for t in range(6) for p in range(6))  # every cell, as saved before


def test_generate_names_the_classes_of_a_map_from_the_vocabulary():
    ids = np.array([[0, 299], [299, 301]], np.uint16)
    assert class_legend(ids, VOCABULARIES["semseg"]) == {"0": "class0", "299": "class299", "301": "class_301"}
