"""Metrics and trivial baselines of the pseudo-labelled targets of 4M-21 (the label stage's ``canny_edge``,
``color_palette`` and ``metadata``), computed over a whole evaluation set from per-scene sums (numpy only,
independent of the model).

=======  ===================================================================  ========================  =============
family   metrics                                                              primary                   baseline
=======  ===================================================================  ========================  =============
edges    ``edge_f1_1px``, ``precision_1px``, ``recall_1px``,                  ``edge_f1_1px`` ↑         best
         ``edge_f1_exact``, ``pixel_err``                                                               frequency map
palette  ``delta_e``, ``delta_e_true_to_generated``,                          ``delta_e`` ↓ (CIELAB)    medoid palette
         ``delta_e_generated_to_true``, ``well_formed_rate``
metadata ``bin_error``, ``exact_bin_accuracy``, ``field_coverage``,            ``bin_error`` ↓           median bins
         ``well_formed_rate``
=======  ===================================================================  ========================  =============

**edges** (0/1 maps ``[H, W]``; any non-zero pixel is an edge). A predicted edge pixel is *near* the truth when a
true edge pixel lies within :data:`EDGE_TOLERANCE_PX` pixel of it (Chebyshev distance: its 3×3 neighbourhood), and
a true edge pixel is near the prediction likewise. ``precision_1px`` = predicted pixels near the truth / predicted
pixels, ``recall_1px`` = true pixels near the prediction / true pixels, summed over the set; ``edge_f1_1px`` their
harmonic mean (the primary: a VQ-VAE's decoding, and a model's, moves a thin Canny edge by a pixel as often as not,
which the exact score counts as two errors). ``edge_f1_exact`` is the same with no tolerance (the micro F1 of the
edge pixels), ``pixel_err`` the share of pixels whose 0/1 differs. An F1 is 1 when neither side has an edge and 0
when only one has. The baseline (:func:`best_frequency_map`) is one map for every scene: the pixels whose training
edge frequency reaches a threshold, the threshold picked to maximise ``edge_f1_1px`` on the training maps. Its
candidates run from the all-edge map to the empty one and include the per-pixel majority map (the tokenizer
report's baseline, :func:`fourm_kfp.tokenizers.metrics.majority_map`), which for sparse edges is empty and scores
an F1 of 0: too easy a bar, where the best threshold is the strongest map that does not look at the image.

**palette** (texts ``v1=<k> v0=<r> v0=<g> v0=<b> ...``, :mod:`fourm_kfp.data.label_formats`). The generated
colours are read tolerantly (:func:`~fourm_kfp.data.label_formats.parse_palette_text`) and compared with the true
colours in CIELAB (sRGB, D65 white), by the CIE76 colour difference ΔE (Euclidean distance in L*a*b*; about 2.3
is a just noticeable difference). Per scene, ``delta_e_true_to_generated`` is the mean over the true colours of the
distance to the nearest generated colour (is every true colour there?), ``delta_e_generated_to_true`` the mean over
the generated colours of the distance to the nearest true colour (is every generated colour true?), and
``delta_e`` their mean (a symmetric chamfer distance, so neither too few nor too many colours pays; the lengths of
the two palettes may differ, as the truth's length is drawn per sample). A generation without a single readable
colour scores :data:`MAX_DELTA_E` in both directions, no better than the worst palette. Each is the mean over the
scenes. ``well_formed_rate`` is the share of generated texts that are exactly a palette text (``v1=<k>`` and ``k``
colours, nothing else: what :func:`~fourm_kfp.data.label_formats.encode_palette` accepts). The baseline
(:func:`medoid_palette`) is the training palette with the smallest mean ``delta_e`` to all training palettes.

**metadata** (texts ``v1=<field id> v0=<bin> ...``). Fields are read tolerantly
(:func:`~fourm_kfp.data.label_formats.parse_metadata_text`). Over the (scene, field) pairs the truth and the
generation both give, the error is ``|generated bin - true bin| / bins`` (``bins``: the field's number of bins,
:data:`~fourm_kfp.data.label_formats.METADATA_FIELDS`: 50 for the image statistics, 1000 for the sizes and caption
counts); a true field the generation leaves out counts as the largest error, 1. ``bin_error`` is the mean error over
the true fields (so a generation with no readable field scores 1, never nothing) and ``exact_bin_accuracy`` the share
of the true fields given with the exact bin; ``field_coverage`` is the share of the true fields the generation gives,
``well_formed_rate``
the share of generated texts that are exactly a metadata text (what
:func:`~fourm_kfp.data.label_formats.encode_metadata` accepts). Fields only the generation gives are not scored.
The baseline (:func:`median_metadata`) gives every field seen in training its lower median training bin (the
constant with the smallest mean absolute bin error on them).

Each ``*_stats`` function returns the per-scene statistics (:class:`~.scene_stats.SummedStats`, kinds ``edges``,
``palette``, ``metadata``) for the paired bootstrap; the scorer families are registered in
:data:`fourm_kfp.evaluation.targets.SCORERS`.
"""

from __future__ import annotations

import itertools
import json
from typing import Callable, Mapping, Sequence

import numpy as np

from fourm_kfp.data.label_formats import (
    METADATA_BINS_KEY,
    METADATA_FIELDS,
    decode_metadata,
    encode_metadata,
    encode_palette,
    parse_metadata_text,
    parse_palette_text,
)
from fourm_kfp.evaluation.scene_stats import SummedStats, ratio

#: A predicted edge pixel counts as found when a true one is at most this many pixels away (Chebyshev), and back.
EDGE_TOLERANCE_PX = 1
#: The most thresholds :func:`best_frequency_map` tries (evenly spread over the distinct edge counts).
MAX_THRESHOLDS = 256
#: The most training palettes :func:`medoid_palette` tries as the medoid (evenly spread over the training set).
MAX_MEDOID_CANDIDATES = 256


def well_formed(encode: Callable[[str], bytes], text: str) -> bool:
    """Whether ``text`` is exactly a text of its modality: its codec's ``encode`` (which checks text strictly)
    takes it."""
    try:
        encode(text)
    except ValueError:
        return False
    return True


def _f1(found_predicted: np.ndarray, predicted: np.ndarray, found_actual: np.ndarray,
        actual: np.ndarray) -> np.ndarray:
    """F1 of precision ``found_predicted / predicted`` and recall ``found_actual / actual`` (summed counts): 1 where
    neither side has anything, 0 where one side has nothing or nothing is found."""
    precision = found_predicted / np.maximum(predicted, 1)
    recall = found_actual / np.maximum(actual, 1)
    total = precision + recall
    f1 = np.divide(2 * precision * recall, total, out=np.zeros(np.shape(total)), where=total > 0)
    return np.where((np.asarray(predicted) == 0) & (np.asarray(actual) == 0), 1.0, f1)


# ---------------------------------------------------------------------------------------------------------- edges


def dilate(maps: np.ndarray, radius: int = EDGE_TOLERANCE_PX) -> np.ndarray:
    """Boolean maps ``[..., H, W]`` grown by ``radius`` pixels (a pixel is set when any pixel of its
    ``(2 radius + 1)²`` neighbourhood is)."""
    maps = np.asarray(maps, dtype=bool)
    if radius <= 0:
        return maps.copy()
    h, w = maps.shape[-2:]
    padded = np.pad(maps, [(0, 0)] * (maps.ndim - 2) + [(radius, radius)] * 2)
    out = np.zeros_like(maps)
    for dy, dx in itertools.product(range(2 * radius + 1), repeat=2):
        out |= padded[..., dy:dy + h, dx:dx + w]
    return out


def edges_finish(t: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The edge metrics of the summed columns (see the module docstring)."""
    return {"edge_f1_1px": _f1(t["predicted_near"], t["predicted"], t["actual_near"], t["actual"]),
            "precision_1px": ratio(t["predicted_near"], t["predicted"]),
            "recall_1px": ratio(t["actual_near"], t["actual"]),
            "edge_f1_exact": _f1(t["matched"], t["predicted"], t["matched"], t["actual"]),
            "pixel_err": ratio(t["wrong"], t["pixels"])}


def edge_stats(pred: np.ndarray, true: np.ndarray) -> SummedStats:
    """0/1 edge maps ``[N, H, W]`` (non-zero = edge): per scene the edge pixel counts of the edge metrics."""
    pred, true = np.asarray(pred) > 0, np.asarray(true) > 0
    if pred.shape != true.shape or pred.ndim != 3:
        raise ValueError(f"edge_stats: expected predicted and true maps of one shape [N, H, W], got {pred.shape} "
                         f"and {true.shape}")
    columns = {"predicted": pred, "actual": true, "predicted_near": pred & dilate(true),
               "actual_near": true & dilate(pred), "matched": pred & true, "wrong": pred != true,
               "pixels": np.ones_like(pred)}
    return SummedStats("edges", columns, np.stack([v.sum((1, 2)) for v in columns.values()], 1), edges_finish)


def best_frequency_map(train: np.ndarray) -> np.ndarray:
    """The baseline edge map (uint8 ``[H, W]``) of training maps ``[N, H, W]``: the pixels that are edges in at
    least ``c`` of them, for the count ``c`` whose map scores the best ``edge_f1_1px`` on them (ties: the smaller
    ``c``; at most :data:`MAX_THRESHOLDS` counts are tried, always the all-edge and the empty map).

    Scoring a map against every training map needs only two per-pixel counts: how many maps have an edge at the
    pixel, and how many have one within the tolerance."""
    train = np.asarray(train) > 0
    if train.ndim != 3 or not len(train):
        raise ValueError(f"best_frequency_map: expected training maps [N, H, W] with N >= 1, got {train.shape}")
    counts = train.sum(0)
    near = dilate(train).sum(0)
    levels = np.unique(np.append(counts, counts.max() + 1))  # counts.max() + 1: the empty map
    if len(levels) > MAX_THRESHOLDS:
        levels = np.unique(levels[np.linspace(0, len(levels) - 1, MAX_THRESHOLDS).round().astype(int)])
    candidates = [counts >= c for c in levels]
    scores = [_f1(near[m].sum(), len(train) * m.sum(), counts[dilate(m)].sum(), counts.sum())
              for m in candidates]
    return candidates[int(np.argmax(scores))].astype(np.uint8)


# -------------------------------------------------------------------------------------------------------- palette

#: sRGB (linear) to CIE XYZ, D65 white (IEC 61966-2-1).
_SRGB_TO_XYZ = np.array([[0.4124564, 0.3575761, 0.1804375],
                         [0.2126729, 0.7151522, 0.0721750],
                         [0.0193339, 0.1191920, 0.9503041]])
_D65_WHITE = _SRGB_TO_XYZ.sum(1)  # the XYZ of sRGB white: L* = 100, a* = b* = 0 exactly


def srgb_to_lab(rgb: np.ndarray) -> np.ndarray:
    """8-bit sRGB colours ``[..., 3]`` (0..255) → CIELAB ``[..., 3]`` (L* 0..100) under the D65 white."""
    c = np.asarray(rgb, dtype=np.float64) / 255.0
    linear = np.where(c <= 0.04045, c / 12.92, ((c + 0.055) / 1.055) ** 2.4)
    xyz = linear @ _SRGB_TO_XYZ.T / _D65_WHITE
    delta = 6 / 29
    f = np.where(xyz > delta**3, np.cbrt(xyz), xyz / (3 * delta**2) + 4 / 29)
    return np.stack([116 * f[..., 1] - 16, 500 * (f[..., 0] - f[..., 1]), 200 * (f[..., 1] - f[..., 2])], -1)


_CORNERS = srgb_to_lab(np.array(list(itertools.product((0, 255), repeat=3))))
#: The largest CIE76 ΔE between two corners of the RGB cube (blue and green, about 258.7): what a generated
#: palette without a readable colour scores.
MAX_DELTA_E = float(np.linalg.norm(_CORNERS[:, None] - _CORNERS[None], axis=-1).max())


def _lab_palette(text: str) -> np.ndarray:
    """The CIELAB colours ``[k, 3]`` of a palette text (``k`` may be 0)."""
    return srgb_to_lab(np.array(parse_palette_text(text), dtype=np.float64).reshape(-1, 3))


def _padded(palettes: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """CIELAB palettes of any lengths as one array ``[n, longest, 3]`` and the mask of their real colours."""
    longest = max(len(p) for p in palettes)
    colours, real = np.zeros((len(palettes), longest, 3)), np.zeros((len(palettes), longest), bool)
    for i, p in enumerate(palettes):
        colours[i, :len(p)], real[i, :len(p)] = p, True
    return colours, real


def _chamfer(generated: np.ndarray, true: np.ndarray, real: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One generated palette ``[k, 3]`` against ``n`` true ones (:func:`_padded`): ``(true → generated,
    generated → true)`` per true palette, the mean distance of each side's colours to the other side's nearest;
    :data:`MAX_DELTA_E` both ways when nothing was generated."""
    if not len(generated):
        return np.full(len(true), MAX_DELTA_E), np.full(len(true), MAX_DELTA_E)
    distance = np.linalg.norm(true[:, :, None] - generated[None, None], axis=-1)  # [n, longest, k]
    to_generated = (distance.min(2) * real).sum(1) / real.sum(1)
    to_true = np.where(real[:, :, None], distance, np.inf).min(1).mean(1)
    return to_generated, to_true


def palette_finish(t: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The palette metrics of the summed columns: each a mean over the scenes."""
    return {name: ratio(t[name], t["scenes"]) for name in
            ("delta_e", "delta_e_true_to_generated", "delta_e_generated_to_true")} | {
            "well_formed_rate": ratio(t["well_formed"], t["scenes"])}


def palette_stats(pred_texts: Sequence[str], true_texts: Sequence[str]) -> SummedStats:
    """Generated and true palette texts: per scene the ΔE distances and whether the generation is well formed."""
    rows = []
    for pred, true in zip(pred_texts, true_texts, strict=True):
        truth = _lab_palette(true)
        if not len(truth):
            raise ValueError(f"palette_stats: a true palette must hold a colour, got {true[:120]!r}")
        to_generated, to_true = (float(d[0]) for d in _chamfer(_lab_palette(pred), *_padded([truth])))
        rows.append([(to_generated + to_true) / 2, to_generated, to_true, float(well_formed(encode_palette, pred)),
                     1.0])
    columns = ["delta_e", "delta_e_true_to_generated", "delta_e_generated_to_true", "well_formed", "scenes"]
    return SummedStats("palette", columns, np.array(rows, dtype=np.float64).reshape(-1, len(columns)),
                       palette_finish)


def medoid_palette(train_texts: Sequence[str]) -> str:
    """The baseline palette: of (at most :data:`MAX_MEDOID_CANDIDATES` evenly spread) training palettes, the one
    with the smallest mean ``delta_e`` to all training palettes (ties: the first)."""
    palettes = [_lab_palette(t) for t in train_texts]
    if not palettes or not all(len(p) for p in palettes):
        raise ValueError("medoid_palette: needs training palettes, each holding a colour")
    train = _padded(palettes)
    picks = np.unique(np.linspace(0, len(palettes) - 1, min(len(palettes), MAX_MEDOID_CANDIDATES)).round()
                      .astype(int))
    cost = [np.mean(sum(_chamfer(palettes[i], *train))) for i in picks]  # mean delta_e, doubled
    return train_texts[int(picks[int(np.argmin(cost))])]


# ------------------------------------------------------------------------------------------------------- metadata


def _bins(field: str) -> int:
    """The number of bins of a metadata field."""
    return METADATA_FIELDS[field][1].max_bin + 1


def metadata_finish(t: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The metadata metrics of the summed columns (see the module docstring)."""
    return {"bin_error": ratio(t["bin_error"] + t["true_fields"] - t["shared_fields"], t["true_fields"]),
            "exact_bin_accuracy": ratio(t["exact"], t["true_fields"]),
            "field_coverage": ratio(t["shared_fields"], t["true_fields"]),
            "well_formed_rate": ratio(t["well_formed"], t["scenes"])}


def metadata_stats(pred_texts: Sequence[str], true_texts: Sequence[str]) -> SummedStats:
    """Generated and true metadata texts: per scene the summed normalised bin errors and exact bins over the
    fields both give, the counts of those and of the true fields, and whether the generation is well formed."""
    rows = []
    for pred, true in zip(pred_texts, true_texts, strict=True):
        generated, truth = parse_metadata_text(pred), parse_metadata_text(true)
        shared = [f for f in truth if f in generated]
        rows.append([sum(abs(generated[f] - truth[f]) / _bins(f) for f in shared),
                     sum(generated[f] == truth[f] for f in shared), len(shared), len(truth),
                     float(well_formed(encode_metadata, pred)), 1.0])
    columns = ["bin_error", "exact", "shared_fields", "true_fields", "well_formed", "scenes"]
    return SummedStats("metadata", columns, np.array(rows, dtype=np.float64).reshape(-1, len(columns)),
                       metadata_finish)


def median_metadata(train_texts: Sequence[str]) -> str:
    """The baseline metadata text: every field the training texts give, at its lower median training bin."""
    values: dict[str, list[int]] = {}
    for text in train_texts:
        for field, value in parse_metadata_text(text).items():
            values.setdefault(field, []).append(value)
    if not values:
        raise ValueError("median_metadata: no training metadata text gives a field")
    medians = {field: sorted(v)[(len(v) - 1) // 2] for field, v in values.items()}
    # Stored bins decode to their text (fields in the order of their ids): label_formats' one writer of it.
    return decode_metadata(json.dumps({METADATA_BINS_KEY: medians}).encode())
