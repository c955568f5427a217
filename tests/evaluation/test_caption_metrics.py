"""Caption metrics (object, shape and colour micro F1, word F1, the primary metric) on hand-made cases whose answers
are worked out in the comments, and on real synthetic scenes."""

from __future__ import annotations

import pytest

from fourm_kfp.data.synthetic_scenes import synthetic_sample
from fourm_kfp.evaluation import caption_metrics as tm

#: Rendered once: 20 small scenes (1 to 4 objects each) for the checks against real data.
SAMPLES = [synthetic_sample(0, index, 32) for index in range(20)]


def test_caption_metrics_on_real_captions():
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
