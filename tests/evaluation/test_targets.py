"""Scoring comes from the modality table: each task's primary metric and direction, the margin rule, the text
targets' baseline, and a new modality (a toy ``lidar`` depth map) that gets its task, metrics and baseline from its
one table entry; and how caption-to-rgb's score, ceiling and baseline are made."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pytest

from fourm_kfp.config.fourm_config import EVALUATION_TASKS, evaluation_tasks
from fourm_kfp.data import modalities
from fourm_kfp.data.modalities import CLASS_NAMES, MODALITIES, OBJECT_CLASSES, Modality, decode_depth, encode_depth
from fourm_kfp.evaluation.targets import better, most_common, scorer, task_primary
from fourm_kfp.evaluation.tasks import Baselines, Scenes, run_task
from fourm_kfp.model.generation import Generated, SamplingArgs
from fourm_kfp.tokenizers.metrics import mean_depth

# -- the primary metric -----------------------------------------------------------------------------------------

def test_every_evaluation_task_has_a_primary_metric():
    primaries = {task: task_primary(task) for task in EVALUATION_TASKS}
    assert primaries["rgb-to-depth"] == ("abs_rel", False) and primaries["rgb-to-semseg"] == ("miou", True)
    assert primaries["caption-to-rgb"] == ("shape_presence_f1", True)
    assert all(isinstance(higher, bool) for _, higher in primaries.values())


def test_better_lower_is_better():
    assert better("rgb-to-depth", 0.1, 0.2) and not better("rgb-to-depth", 0.2, 0.1)
    assert not better("rgb-to-depth", 0.2, 0.2)  # a tie is not better
    assert better("rgb-to-normal", 0.5, 1.0, margin=0.5)  # 0.5 <= 1.0 * (1 - 0.5): exactly the margin
    assert not better("rgb-to-normal", 0.51, 1.0, margin=0.5)
    assert not better("rgb-to-depth", 0.0, 0.0)  # a perfect reference cannot be beaten


def test_better_higher_is_better():
    assert better("rgb-to-semseg", 0.5, 0.4) and not better("rgb-to-semseg", 0.4, 0.5)
    assert better("rgb-to-det", 1.25, 1.0, margin=0.25)  # exactly 25% better
    assert not better("rgb-to-det", 1.2, 1.0, margin=0.25)
    # Against 0 a relative margin is 0: any strict improvement wins, a tie never does.
    assert better("rgb-to-caption", 0.1, 0.0) and not better("rgb-to-caption", 0.0, 0.0)
    assert better("caption-to-rgb", 0.01, 0.0, margin=0.2) and not better("caption-to-rgb", 0.0, 0.0, margin=0.2)


def test_better_direction_override():
    # word_f1 (chosen by caption_primary) is higher-is-better whatever the task's registered primary
    assert better("rgb-to-caption", 0.6, 0.5, higher=True)
    assert not better("rgb-to-caption", 0.6, 0.5, higher=False)
    assert better("rgb-to-semseg", 0.4, 0.5, higher=False)


def test_better_never_for_missing_values():
    assert not better("rgb-to-semseg", math.nan, 0.1) and not better("rgb-to-semseg", 0.5, math.nan)
    with pytest.raises(ValueError, match="<source>-to-<target>"):
        better("rgb->depth", 0.1, 0.2)


def test_most_common():
    assert most_common(["a", "b", "b", "a", "c"]) == "a"  # tie: the first seen
    assert most_common(["x", "y", "y"]) == "y"
    assert most_common([frozenset({"cube"}), frozenset(), frozenset({"cube"})]) == {"cube"}
    with pytest.raises(ValueError):
        most_common([])


# -- a new modality is one table entry ------------------------------------------------------------------------------

LIDAR = Modality("lidar", "image", "png", encode_depth, decode_depth, 1, "vqvae", "abs_rel", scoring="depth")


@dataclass(frozen=True)
class _Spec:
    kind: str
    pixel_input: bool = False


class _Engine:
    """Stands in for a trained model: "generates" lidar tokens and decodes token ``t`` to a flat depth of
    ``t + 1`` metres, so what is scored is known exactly."""

    specs = {"rgb": _Spec("image"), "lidar": _Spec("image")}

    def token_inputs(self, modality, tokens, values=None):
        return [{modality: t} for t in tokens]

    def generate_tokens(self, inputs, target, sampling, seed, batch_size):
        return [Generated(np.full((2, 2), 1), np.zeros((2, 2))) for _ in inputs]

    def detokenize(self, modality, tokens):
        return [np.full((4, 4), float(np.asarray(t).reshape(-1)[0]) + 1, np.float32) for t in tokens]


def test_a_new_modality_is_scored_from_its_table_entry(monkeypatch):
    monkeypatch.setitem(modalities.MODALITIES, "lidar", LIDAR)
    assert "rgb-to-lidar" in evaluation_tasks(MODALITIES) and "rgb-to-lidar" not in EVALUATION_TASKS
    assert task_primary("rgb-to-lidar") == ("abs_rel", False) and scorer("lidar") is scorer("depth")

    train = [np.full((4, 4), d, np.float32) for d in (1.0, 3.0)]
    baselines = Baselines.fit({"lidar": train})
    np.testing.assert_allclose(baselines.predictions["lidar"], mean_depth(np.stack(train)))  # 2 m everywhere

    truth = [np.full((4, 4), 2.0, np.float32), np.full((4, 4), 4.0, np.float32)]
    scenes = Scenes(["a", "b"], {"rgb": [None, None], "lidar": truth},
                    {"rgb": [np.zeros(4, np.int64)] * 2, "lidar": [np.full(4, 1), np.full(4, 3)]})
    result = run_task(_Engine(), scenes, "rgb-to-lidar", baselines, SamplingArgs(temperature=0.0), 0, 2, 1)
    # generated: 2 m everywhere (token 1); abs_rel = mean(|2-2|/2, |2-4|/4) over equal pixel counts = 0.25
    assert result.primary == "abs_rel" and not result.higher_is_better
    assert math.isclose(result.metrics["abs_rel"], 0.25, rel_tol=1e-6)
    assert math.isclose(result.ceiling["abs_rel"], 0.0, abs_tol=1e-6)  # tokens 1 and 3 decode to the truth
    assert math.isclose(result.baseline["abs_rel"], 0.25, rel_tol=1e-6)  # the baseline predicts 2 m as well
    assert result.examples[0]["generated"][0] == "lidar"


def test_a_modality_without_scoring_is_no_task_target():
    assert "rgb-to-edge" not in EVALUATION_TASKS and "rgb-to-rgb" not in EVALUATION_TASKS
    with pytest.raises(ValueError, match="no scoring"):
        scorer("edge")


class _Painter:
    """Stands in for a trained model on caption-to-rgb: it "paints" rgb token 0 whatever the caption, and reads an
    image back as the shape whose index is the image's first rgb token, everywhere."""

    specs = {"caption": _Spec("sequence"), "rgb": _Spec("image"), "semseg": _Spec("image")}
    first_shape = CLASS_NAMES.index(OBJECT_CLASSES[0])

    def token_inputs(self, modality, tokens, values=None):
        return [{modality: np.asarray(t).reshape(-1)} for t in tokens]

    def generate_tokens(self, inputs, target, sampling, seed, batch_size):
        if target == "rgb":
            return [Generated(np.zeros((2, 2), np.int64), np.zeros((2, 2))) for _ in inputs]
        return [Generated(np.full((2, 2), self.first_shape + int(x["rgb"][0])), np.zeros((2, 2))) for x in inputs]

    def detokenize(self, modality, tokens):
        return [np.asarray(t).reshape(2, 2) for t in tokens]  # semseg: the class ids; rgb: any array


def test_caption_to_rgb_ceiling_reads_the_true_image_and_baseline_is_the_best_constant():
    sphere, cube, cylinder, cone = (OBJECT_CLASSES.index(s) for s in ("sphere", "cube", "cylinder", "cone"))
    train = ["a small red cube", "a small red cube", "a small red cone and a large blue sphere",
             "a small red cone and a large blue cylinder", "a small red sphere and a large blue cylinder"]
    # Each shape is named twice in 5 captions (8 in all): the k most named score 4k/(5k + 8), best at k = 4 (0.571),
    # not the most common set, {cube} (0.308)
    baselines = Baselines.fit({"caption": train})
    assert baselines.shapes == set(OBJECT_CLASSES)
    captions = ["a small red sphere and a large blue cube", "a small red cone"]
    scenes = Scenes(["a", "b"], {"caption": captions, "rgb": [None, None]},
                    {"caption": [np.arange(3)] * 2, "rgb": [np.full(4, cube), np.full(4, cone)],
                     # true semseg tokens showing all four shapes: not what the ceiling reads
                     "semseg": [np.array([sphere, cube, cylinder, cone]) + _Painter.first_shape] * 2})
    result = run_task(_Painter(), scenes, "caption-to-rgb", baselines, SamplingArgs(temperature=0.0), 0, 2, 1)
    # generated: a sphere in each image; matched 1 (scene a), predicted 2, named 3: F1 2/5
    assert math.isclose(result.metrics["shape_presence_f1"], 0.4)
    # ceiling: the true images read as {cube} and {cone}: matched 2, predicted 2, named 3: F1 4/5
    assert math.isclose(result.ceiling["shape_presence_f1"], 0.8)
    # baseline: all four shapes in both: matched 3, predicted 8, named 3: F1 6/11
    assert math.isclose(result.baseline["shape_presence_f1"], 6 / 11)
