"""The scores of the label stage's modalities (canny_edge, color_palette, metadata): each metric on hand-made cases
(perfect, a known mistake, malformed generated text), each trivial baseline fitted on training values and beaten by
the truth, and the three families plugged into the task machinery from their table entries as the others are
(task, primary metric, baseline, report)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pytest

from fourm_kfp.config.fourm_config import EVALUATION_TASKS
from fourm_kfp.config.loader import available_presets, load_config
from fourm_kfp.data.label_formats import metadata_text
from fourm_kfp.evaluation.label_metrics import (
    MAX_DELTA_E,
    best_frequency_map,
    dilate,
    edge_stats,
    median_metadata,
    medoid_palette,
    metadata_stats,
    palette_stats,
    srgb_to_lab,
)
from fourm_kfp.evaluation.report import report_markdown, task_grid
from fourm_kfp.evaluation.scene_loading import runnable_tasks
from fourm_kfp.evaluation.scene_stats_reader import read_scene_stats
from fourm_kfp.evaluation.targets import SCORERS, scorer, task_primary
from fourm_kfp.evaluation.tasks import Baselines, Scenes, run_task
from fourm_kfp.model.generation import Generated, SamplingArgs

BLACK, WHITE = "v1=1 v0=0 v0=0 v0=0", "v1=1 v0=255 v0=255 v0=255"
WHITE_AND_BLACK = "v1=2 v0=255 v0=255 v0=255 v0=0 v0=0 v0=0"


def column(size: int, *cols: int) -> np.ndarray:
    """A ``size``×``size`` 0/1 map with vertical edges at ``cols``."""
    m = np.zeros((size, size), np.uint8)
    m[:, list(cols)] = 1
    return m


def rows_map(size: int, *rows: int) -> np.ndarray:
    m = np.zeros((size, size), np.uint8)
    m[list(rows)] = 1
    return m


def edge_metrics(pred, true) -> dict[str, float]:
    return edge_stats(np.stack(pred), np.stack(true)).whole()


# -- edges ------------------------------------------------------------------------------------------------------------

def test_dilate_grows_by_one_pixel_in_every_direction():
    point = np.zeros((5, 5), bool)
    point[0, 0] = True
    grown = dilate(point)
    assert grown[:2, :2].all() and grown.sum() == 4  # the corner's 3×3 neighbourhood, cut by the border


def test_edges_perfect_shifted_and_far():
    line = column(5, 2)
    perfect = edge_metrics([line], [line])
    assert perfect == {"edge_f1_1px": 1.0, "precision_1px": 1.0, "recall_1px": 1.0, "edge_f1_exact": 1.0,
                       "pixel_err": 0.0}
    shifted = edge_metrics([column(5, 3)], [line])  # one pixel off: found within the tolerance, not exactly
    assert shifted["edge_f1_1px"] == 1.0 and shifted["edge_f1_exact"] == 0.0
    assert math.isclose(shifted["pixel_err"], 10 / 25)
    assert edge_metrics([column(5, 4)], [line])["edge_f1_1px"] == 0.0  # two pixels off


def test_edges_partial_by_hand():
    true = column(5, 1)
    pred = np.zeros((5, 5), np.uint8)
    pred[:2, 1] = 1  # 2 true edge pixels
    pred[:3, 4] = 1  # 3 pixels 3 columns away
    m = edge_metrics([pred], [true])
    # precision: 2 of 5 predicted pixels near a true one; recall: rows 0-2 of the true column lie within 1 pixel of
    # a prediction (row 2 of row 1's), 3 of 5; F1 = 2 * 0.4 * 0.6 / 1.0
    assert math.isclose(m["precision_1px"], 0.4) and math.isclose(m["recall_1px"], 0.6)
    assert math.isclose(m["edge_f1_1px"], 0.48)
    assert math.isclose(m["edge_f1_exact"], 2 * 2 / (5 + 5))
    assert math.isclose(m["pixel_err"], (3 + 3) / 25)  # 3 true pixels missed, 3 false ones


def test_edges_empty_sides_and_pooling():
    empty, line = np.zeros((4, 4), np.uint8), column(4, 0)
    assert edge_metrics([empty], [empty])["edge_f1_1px"] == 1.0  # nothing to find, nothing claimed
    assert edge_metrics([empty], [line])["edge_f1_1px"] == 0.0
    assert edge_metrics([line], [empty])["edge_f1_1px"] == 0.0
    # pooled over the set, not averaged: 4 of 8 predicted pixels near, 4 of 4 true pixels found
    pooled = edge_metrics([line, line], [line, empty])
    assert math.isclose(pooled["precision_1px"], 0.5) and pooled["recall_1px"] == 1.0
    assert math.isclose(pooled["edge_f1_1px"], 2 / 3)
    with pytest.raises(ValueError, match=r"\[N, H, W\]"):
        edge_stats(np.zeros((1, 4, 4)), np.zeros((1, 4, 5)))


def test_edge_baseline_is_the_best_frequency_map_not_the_empty_majority():
    # Four maps, one horizontal edge each at rows 2..5: no pixel is an edge in most of them, so the per-pixel
    # majority map is empty (F1 0). Rows 2-5 (each an edge once): 80 of 128 predicted pixels near, every true one
    # found: F1 2 * 0.625 / 1.625 = 10/13; the all-edge map only 96 of 256 near: 6/11.
    train = [rows_map(8, r) for r in (2, 3, 4, 5)]
    fitted = best_frequency_map(np.stack(train))
    np.testing.assert_array_equal(fitted, rows_map(8, 2, 3, 4, 5))
    assert math.isclose(edge_metrics([fitted] * 4, train)["edge_f1_1px"], 10 / 13)
    assert math.isclose(edge_metrics([np.ones((8, 8), np.uint8)] * 4, train)["edge_f1_1px"], 6 / 11)
    assert edge_metrics([np.zeros((8, 8), np.uint8)] * 4, train)["edge_f1_1px"] == 0.0
    val = [rows_map(8, 1), rows_map(8, 6)]
    assert edge_metrics(val, val)["edge_f1_1px"] > edge_metrics([fitted] * 2, val)["edge_f1_1px"] > 0
    with pytest.raises(ValueError, match="N >= 1"):
        best_frequency_map(np.zeros((0, 4, 4)))


# -- palette ----------------------------------------------------------------------------------------------------------

def test_srgb_to_lab_reference_colours():
    np.testing.assert_allclose(srgb_to_lab([[255, 255, 255], [0, 0, 0]]), [[100, 0, 0], [0, 0, 0]], atol=1e-9)
    np.testing.assert_allclose(srgb_to_lab([255, 0, 0]), [53.2408, 80.0925, 67.2032], atol=1e-3)
    assert math.isclose(MAX_DELTA_E, np.linalg.norm(srgb_to_lab([0, 0, 255]) - srgb_to_lab([0, 255, 0])))


def test_palette_perfect_and_by_hand():
    assert palette_stats([WHITE_AND_BLACK], [WHITE_AND_BLACK]).whole() == {
        "delta_e": 0.0, "delta_e_true_to_generated": 0.0, "delta_e_generated_to_true": 0.0, "well_formed_rate": 1.0}
    # true black; generated white and black: black is there (0), but white is 100 from the truth: (0 + 100) / 2
    extra = palette_stats([WHITE_AND_BLACK], [BLACK]).whole()
    assert math.isclose(extra["delta_e_true_to_generated"], 0.0, abs_tol=1e-9)
    assert math.isclose(extra["delta_e_generated_to_true"], 50.0)
    assert math.isclose(extra["delta_e"], 25.0)
    # the other way round: white is missing (100 to black), the generated black is true
    missing = palette_stats([BLACK], [WHITE_AND_BLACK]).whole()
    assert math.isclose(missing["delta_e_true_to_generated"], 50.0) and math.isclose(missing["delta_e"], 25.0)
    # a mean over the scenes
    assert math.isclose(palette_stats([BLACK, WHITE], [BLACK, BLACK]).whole()["delta_e"], 50.0)


def test_palette_malformed_generations():
    # a trailing word piece: the colour read still counts, but the text is not well formed
    glued = palette_stats([WHITE + " cube"], [BLACK]).whole()
    assert math.isclose(glued["delta_e"], 100.0) and glued["well_formed_rate"] == 0.0
    # a wrong length, a value out of range, nothing readable at all
    assert palette_stats(["v1=3 v0=0 v0=0 v0=0"], [BLACK]).whole()["well_formed_rate"] == 0.0
    for text in ("", "a red cube", "v1=1 v0=300 v0=0 v0=0", "v1=1 v0=0 v0=0"):
        nothing = palette_stats([text], [BLACK]).whole()
        assert nothing["delta_e"] == MAX_DELTA_E and nothing["well_formed_rate"] == 0.0, text
    with pytest.raises(ValueError, match="must hold a colour"):
        palette_stats([BLACK], [""])


def test_palette_baseline_is_the_medoid_of_train():
    train = [BLACK, WHITE, BLACK]
    assert medoid_palette(train) == BLACK  # 100 on average to the others, where white is 200
    val = [BLACK, WHITE]
    baseline = palette_stats([medoid_palette(train)] * 2, val).whole()["delta_e"]
    assert math.isclose(baseline, 50.0) and palette_stats(val, val).whole()["delta_e"] < baseline
    with pytest.raises(ValueError, match="needs training palettes"):
        medoid_palette([])


# -- metadata ---------------------------------------------------------------------------------------------------------

def test_metadata_perfect_and_by_hand():
    text = metadata_text({"original_width": 640, "brightness": 127.5, "entropy": 7.0})
    assert metadata_stats([text], [text]).whole() == {"bin_error": 0.0, "exact_bin_accuracy": 1.0,
                                                      "field_coverage": 1.0, "well_formed_rate": 1.0}
    truth = "v1=0 v0=20 v1=10 v0=20"  # width 20 (of 1000 bins), brightness 20 (of 50)
    wrong = metadata_stats(["v1=0 v0=30 v1=10 v0=25"], [truth]).whole()
    assert math.isclose(wrong["bin_error"], (10 / 1000 + 5 / 50) / 2) and wrong["exact_bin_accuracy"] == 0.0
    # a field left out counts as the largest error (1) and is not exact; a field only the generation gives is not
    # scored
    partial = metadata_stats(["v1=10 v0=20 v1=13 v0=3"], [truth]).whole()
    assert partial["bin_error"] == (0.0 + 1.0) / 2 and partial["exact_bin_accuracy"] == 0.5
    assert partial["field_coverage"] == 0.5 and partial["well_formed_rate"] == 1.0


def test_metadata_malformed_generations():
    truth = "v1=0 v0=20 v1=10 v0=20"
    # junk, an unknown field id, a bin out of brightness's range (0..49), a field cut short: brightness survives
    messy = metadata_stats(["v1=10 v0=24 junk v1=99 v0=3 v1=0 v0=1000 v1=10 v0=50 v1=0"], [truth]).whole()
    assert math.isclose(messy["bin_error"], (4 / 50 + 1.0) / 2) and messy["field_coverage"] == 0.5
    assert messy["well_formed_rate"] == 0.0
    empty = metadata_stats([""], [truth]).whole()  # nothing readable: the worst score, not an undefined one
    assert empty["bin_error"] == 1.0 and empty["field_coverage"] == 0.0 and empty["well_formed_rate"] == 0.0


def test_metadata_baseline_is_each_fields_median_train_bin():
    train = ["v1=0 v0=20 v1=10 v0=10", "v1=0 v0=22 v1=10 v0=40", "v1=10 v0=20"]
    # width: [20, 22] -> the lower median 20; brightness: [10, 40, 20] -> 20
    assert median_metadata(train) == "v1=0 v0=20 v1=10 v0=20"
    val = ["v1=0 v0=20 v1=10 v0=20", "v1=0 v0=20 v1=10 v0=30"]
    baseline = metadata_stats([median_metadata(train)] * 2, val).whole()["bin_error"]
    assert math.isclose(baseline, (10 / 50) / 4) and metadata_stats(val, val).whole()["bin_error"] < baseline
    with pytest.raises(ValueError, match="gives a field"):
        median_metadata(["junk"])


# -- the families in the task machinery -------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Spec:
    kind: str
    pixel_input: bool = False


class _Engine:
    """Stands in for a trained model: token ``[t]`` of a modality decodes to ``values[modality][t]``, and the model
    "generates" the tokens ``generated[modality]``, so what is scored is known exactly."""

    specs = {"rgb": _Spec("image"), "canny_edge": _Spec("image"), "color_palette": _Spec("sequence"),
             "metadata": _Spec("sequence")}

    def __init__(self, values, generated):
        self.values, self.generated = values, generated

    def token_inputs(self, modality, tokens, values=None):
        return [{modality: t} for t in tokens]

    def generate_tokens(self, inputs, target, sampling, seed, batch_size):
        return [Generated(np.array([t]), np.zeros(1)) for t in self.generated[target]]

    def detokenize(self, modality, tokens):
        return [self.values[modality][int(np.asarray(t).reshape(-1)[0])] for t in tokens]


# modality: (family, the two val truths, the model's generation for the second, train values,
#            primary metric, higher is better, the model's and the baseline's primary score)
CASES = {
    # train: the edge at column 1 three times, at column 4 once: the column-1 map scores F1 0.75 on them (all
    # edges 2/3); on val it finds scene 0 only (F1 0.5). The model is one column off on scene 1: 1.0 within 1 px.
    "canny_edge": ("edges", [column(6, 1), column(6, 4)], column(6, 3), [column(6, 1)] * 3 + [column(6, 4)],
                   "edge_f1_1px", True, 1.0, 0.5),
    # the medoid black is 100 from scene 1's white (0.5 * 100 over the scenes); the model adds black to white
    "color_palette": ("palette", [BLACK, WHITE], WHITE_AND_BLACK, [BLACK, WHITE, BLACK], "delta_e", False,
                      12.5, 50.0),
    # the median brightness 20 is 10 of 50 bins off scene 1's (over 4 shared fields); the model 5 of 50
    "metadata": ("metadata", ["v1=0 v0=20 v1=10 v0=20", "v1=0 v0=20 v1=10 v0=30"], "v1=0 v0=20 v1=10 v0=25",
                 ["v1=0 v0=20 v1=10 v0=10", "v1=0 v0=20 v1=10 v0=20", "v1=10 v0=40"], "bin_error", False,
                 0.025, 0.05),
}


@pytest.mark.parametrize("modality", list(CASES))
def test_each_label_modality_is_a_task_scored_by_its_family(modality):
    family, truth, wrong, train, primary, higher, model_score, baseline_score = CASES[modality]
    task = f"rgb-to-{modality}"
    assert task in EVALUATION_TASKS and scorer(modality) is SCORERS[family]
    assert task_primary(task) == (primary, higher)

    baselines = Baselines.fit({modality: train})
    rgb = [np.zeros((6, 6, 3), np.uint8)] * 2
    scenes = Scenes(["a", "b"], {"rgb": rgb, modality: truth},
                    {"rgb": [np.zeros(4, np.int64)] * 2, modality: [np.array([0]), np.array([1])]})
    engine = _Engine({modality: [*truth, wrong]}, {modality: [0, 2]})  # scene a right, scene b the mistake
    result = run_task(engine, scenes, task, baselines, SamplingArgs(temperature=0.0), 0, 2, 2)
    assert (result.primary, result.higher_is_better) == (primary, higher)
    assert math.isclose(result.metrics[primary], model_score, abs_tol=1e-9)
    assert math.isclose(result.baseline[primary], baseline_score, abs_tol=1e-9)
    best = 1.0 if higher else 0.0  # the ceiling: the truth's own tokens decode to the truth
    assert math.isclose(result.ceiling[primary], best, abs_tol=1e-9)
    assert result.difference > 0 and result.interval.resamples > 0  # better than the baseline, bootstrapped

    arrow = "↑" if higher else "↓"
    report = {"model_uri": "models/m", "step": 1, "num_samples": 2, "sampling": {}, "masked": {},
              "tasks": [result.to_dict()], "tasks_beating_baseline": int(result.beats_baseline)}
    assert f"| {task} | {primary} {arrow} |" in report_markdown(report)
    assert task_grid(result.examples).startswith(b"\x89PNG")  # generated, ceiling and truth drawn


@pytest.mark.parametrize("modality", list(CASES))
def test_label_scene_stats_survive_json(modality):
    family, truth, wrong, *_ = CASES[modality]
    stats = SCORERS[family].stats([truth[0], wrong], truth, [0.0, 0.0])
    assert stats.kind == family
    assert read_scene_stats(stats.to_json()).whole() == stats.whole()


def test_photos_run_the_label_tasks_and_synthetic_presets_their_six():
    photos = Scenes(["a"], {m: [None] for m in ("rgb", "caption", "canny_edge", "color_palette", "metadata")}, {})
    run, skipped = runnable_tasks(EVALUATION_TASKS, photos, list(photos.truth))
    assert run == ["rgb-to-caption", "rgb-to-canny_edge", "rgb-to-color_palette", "rgb-to-metadata"]
    assert "rgb-to-depth (no depth)" in skipped and "caption-to-rgb (no semseg)" in skipped

    six = ("rgb-to-depth", "rgb-to-normal", "rgb-to-semseg", "rgb-to-det", "rgb-to-caption", "caption-to-rgb")
    scenes = Scenes(["a"], {m: [None] for m in ("rgb", "depth", "normal", "semseg", "edge", "det", "caption")}, {})
    configs = {p: load_config(p) for p in available_presets()}
    synthetic = {p: c for p, c in configs.items() if c.prepare_data.source == "synthetic"}
    assert len(synthetic) >= 7  # smoke, demo, proof, gpu-demo, 4m-b/l/xl
    for preset, config in synthetic.items():
        tasks = config.evaluate.tasks
        assert tasks == six, preset
        assert runnable_tasks(tasks, scenes, list(scenes.truth)) == (list(six), []), preset
