"""Metrics of generated captions over a whole evaluation set (numpy only, independent of the model).

==============  ===========================================================================  =======================
task            metrics                                                                      primary
==============  ===========================================================================  =======================
rgb-to-caption  ``count_accuracy``, ``object_f1``, ``shape_f1``, ``colour_f1``, ``word_f1``  ``object_f1`` ↑ [*]
==============  ===========================================================================  =======================

Captions are parsed into ``(size, colour, shape)`` objects with the synthetic scenes' caption grammar
(:func:`fourm_kfp.data.scene_captions.parse_caption`); the F1 scores count multisets and are micro-averaged over the
set (:mod:`.micro_f1`). ``word_f1`` compares the words themselves. [*] On real captions (outside the synthetic
vocabulary) :func:`caption_primary` picks ``word_f1`` instead.
"""

from __future__ import annotations

import re
import unicodedata
from typing import Callable, Hashable, Mapping, Sequence

import numpy as np

from fourm_kfp.data.scene_captions import EMPTY_SCENE, CaptionObject, parse_caption
from fourm_kfp.evaluation.micro_f1 import f1_finish, multiset_counts
from fourm_kfp.evaluation.scene_stats import SummedStats, ratio


def caption_words(text: str) -> list[str]:
    """The words of a caption: lower-cased, accents stripped, punctuation dropped (as the text tokenizer sees it)."""
    text = "".join(c for c in unicodedata.normalize("NFKD", text.lower()) if not unicodedata.combining(c))
    return re.findall(r"\w+", text)


_CAPTION_KEYS: dict[str, Callable[[CaptionObject], Hashable]] = {
    "object_f1": lambda o: (o[1], o[2]), "shape_f1": lambda o: o[2], "colour_f1": lambda o: o[1]}


def caption_finish(t: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Columns ``count_correct`` and ``scenes`` (caption object counts), and ``<name>.matched/predicted/actual``.

    The count columns may be absent: before evaluate's code_version 5 shape presence wrote this kind too (plain F1,
    no precision and recall), and a champion's saved scene statistics can be that old."""
    out = {"count_accuracy": ratio(t["count_correct"], t["scenes"])} if "scenes" in t else {}
    return {**out, **f1_finish(t)}


def caption_stats(pred_texts: Sequence[str], true_texts: Sequence[str]) -> SummedStats:
    """Object count accuracy; micro F1 of the (colour, shape) pairs, shapes and colours the captions name; and
    ``word_f1``, the micro F1 of their words (the score for captions outside the synthetic vocabulary)."""
    rows = []
    for pred, true in zip(pred_texts, true_texts, strict=True):
        p, t = parse_caption(pred), parse_caption(true)
        row = [float(len(p) == len(t)), 1.0]
        for key in _CAPTION_KEYS.values():
            row += multiset_counts([key(o) for o in p], [key(o) for o in t])
        rows.append(row + list(multiset_counts(caption_words(pred), caption_words(true))))
    columns = ["count_correct", "scenes"] + [f"{name}.{part}" for name in [*_CAPTION_KEYS, "word_f1"]
                                             for part in ("matched", "predicted", "actual")]
    return SummedStats("f1", columns, np.array(rows, dtype=np.float64).reshape(-1, len(columns)), caption_finish)


def caption_metrics(pred_texts: Sequence[str], true_texts: Sequence[str]) -> dict[str, float]:
    """The whole set's :func:`caption_stats`."""
    return caption_stats(pred_texts, true_texts).whole()


def caption_primary(true_texts: Sequence[str]) -> str:
    """``object_f1`` when every true caption is a synthetic-scene one (names objects, or is the empty scene's
    sentence), else ``word_f1`` (real captions); both are higher-is-better."""
    empty = caption_words(EMPTY_SCENE)
    synthetic = all(parse_caption(t) or caption_words(t) == empty for t in true_texts)
    return "object_f1" if true_texts and synthetic else "word_f1"
