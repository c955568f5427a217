"""The ``color_palette`` labeler: each photo's dominant colours, as palettes of 1 to 7 colours (4M-21's
``color_palette``), by weighted k-means on a colour histogram.

The algorithm, for one image:

1. **Draw.** At most ``max_pixels`` of its pixels are drawn without replacement by a generator seeded with ``seed``
   (all of them when the image is that small).
2. **Histogram.** Each drawn pixel falls in a bin of its top ``bits`` bits per channel (5: 32 levels, bins 8 wide),
   one bit fewer while more than ``max_bins`` bins are occupied (noise-like images: it bounds the work per image);
   a bin is represented by the mean colour of its pixels, weighted by their count. A weighted k-means over the bins
   has the objective of a k-means over the pixels (the squared distance of a pixel to a centre is that of its bin's
   mean plus a constant) as long as no bin is split between clusters, so this loses little, and makes the clustering
   work on hundreds of colours instead of thousands. A flat colour alone in its bin is kept exactly.
3. **Seeds.** A deterministic, greedy k-means++: the first seed is the heaviest bin; each next one is, of the 8 bins
   with the largest ``weight * squared distance to the nearest seed so far`` (k-means++'s sampling weights), the one
   that lowers the weighted k-means cost of the seeds most. Length ``k`` starts from the first ``k`` seeds.
4. **Lloyd.** Weighted Lloyd steps (squared RGB distance), all lengths at once (one distance matrix per step for
   the 28 centres of lengths 1..7, each colour assigned to the nearest centre of each length), at most
   ``iterations`` of them, stopping once no length's assignment changes; a length whose assignment stopped changing
   is at its fixed point, so further steps leave it exactly as it is. A cluster that loses all its colours keeps
   its centre.
5. **Palettes.** Centres are rounded to ints and sorted by cluster weight, largest first, ties by ``(r, g, b)``.
   When an image has ``k`` or fewer bins, their colours are the palette as they are, and its dominant one fills
   the remaining places. The value is 4M's palette JSON (:mod:`fourm_kfp.data.label_formats`).

Nothing depends on the image's place in the batch and the arithmetic is numpy's in a fixed order (elementwise, or
:func:`numpy.bincount`'s sums in pixel order), so the labels are the same on every run and a batch gives what its
images give one by one.

Version 2 (this algorithm) replaced version 1: k-means++ with random seeding, one length at a time, on the drawn
pixels' exact colours. On the bench's 224 px photos (``bench/labelers.py``) version 2 labels about 6 times as many
images per second (about 500 against 80 on one worker of a 2-core machine) with palettes of about the same k-means
cost over the image's pixels (geometric mean of the ratio over the 15 photos and 7 lengths: 1.01).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np

from fourm_kfp.data.label_formats import MAX_PALETTE_COLORS
from fourm_kfp.labelers.base import LabelBatch, Labeler, LabelerSetup, check_labels

#: seeding: how many of the bins k-means++ would most likely draw are tried for each next seed
SEED_CANDIDATES = 8


class ColorPaletteLabeler(Labeler):
    """Palettes of 1..7 colours (see the module docstring): params ``max_pixels`` (pixels drawn per image), ``bits``
    (histogram bits per channel, 1..8; 8 with ``max_bins`` >= ``max_pixels``: every distinct colour its own bin),
    ``max_bins`` (most occupied bins before a bit is dropped), ``iterations`` (most Lloyd steps) and ``seed`` (of
    the pixel draw)."""

    name = "color_palette"
    version = "2"  # 2: k-means on a colour histogram with deterministic greedy seeding, all lengths at once
    modality = "color_palette"
    defaults: ClassVar[Mapping[str, Any]] = {"max_pixels": 4096, "bits": 5, "max_bins": 1024, "iterations": 30,
                                             "seed": 0}

    def __init__(self, setup: LabelerSetup) -> None:
        super().__init__(setup)
        for key, least in (("max_pixels", 1), ("max_bins", 1), ("iterations", 1), ("seed", 0)):
            self.check_number(key, least, integer=True)
        self.check_number("bits", 1, 8, integer=True)

    def label(self, batch: LabelBatch) -> list[Any]:
        return check_labels(self, batch, [self.palettes(image) for image in batch.images])

    def palettes(self, image: np.ndarray) -> list[dict[str, list[list[int]]]]:
        """4M's palette JSON of one uint8 ``[H, W, 3]`` RGB image."""
        pixels = np.asarray(image, dtype=np.uint8).reshape(-1, 3)
        if len(pixels) > self.params["max_pixels"]:
            pixels = pixels[np.random.default_rng(self.params["seed"]).choice(len(pixels), self.params["max_pixels"],
                                                                              replace=False)]
        bits = self.params["bits"]
        colours, weights = _histogram(pixels, bits)
        while len(colours) > self.params["max_bins"] and bits > 1:
            bits -= 1
            colours, weights = _histogram(pixels, bits)
        clustered = min(MAX_PALETTE_COLORS, len(colours) - 1)  # lengths 1..clustered have fewer centres than bins
        if clustered > 0:
            centres, sizes = _kmeans_all_lengths(colours, weights, _greedy_seeds(colours, weights, clustered),
                                                 self.params["iterations"])
        palettes = {}
        for k in range(1, MAX_PALETTE_COLORS + 1):
            if k <= clustered:
                palettes[str(k)] = _sorted_palette(centres[k - 1, :k], sizes[k - 1, :k])
            else:  # k or fewer bins: their colours, then the dominant one again
                fill = np.full(k - len(colours), int(np.argmax(weights)))
                palettes[str(k)] = _sorted_palette(np.concatenate([colours, colours[fill]]),
                                                   np.concatenate([weights, np.zeros(len(fill))]))
        return [palettes]


def _histogram(pixels: np.ndarray, bits: int) -> tuple[np.ndarray, np.ndarray]:
    """The occupied bins of ``[n, 3]`` uint8 pixels at ``bits`` bits per channel, in bin order: (mean colour of each,
    ``[b, 3]`` float64; its pixel count, ``[b]`` float64)."""
    top = (pixels >> (8 - bits)).astype(np.intp)
    codes = (top[:, 0] << (2 * bits)) | (top[:, 1] << bits) | top[:, 2]
    counts = np.bincount(codes, minlength=1 << (3 * bits))
    occupied = np.flatnonzero(counts)
    which = np.searchsorted(occupied, codes)  # each pixel's bin, as an index into ``occupied``
    weights = counts[occupied].astype(np.float64)
    sums = np.stack([np.bincount(which, weights=pixels[:, c], minlength=len(occupied)) for c in range(3)], axis=1)
    return sums / weights[:, None], weights


def _greedy_seeds(points: np.ndarray, weights: np.ndarray, k: int) -> np.ndarray:
    """``k`` distinct seeds of ``points`` (more than ``k`` of them) by deterministic greedy k-means++ (module
    docstring, step 3), in the order chosen: ``[k, 3]``."""
    channels = points.T
    chosen = [int(np.argmax(weights))]
    nearest = _squared_distances(channels, points[chosen].T)[:, 0]
    for _ in range(1, k):
        candidates = np.argsort(-(weights * nearest), kind="stable")[:SEED_CANDIDATES]
        distances = np.minimum(nearest[:, None], _squared_distances(channels, points[candidates].T))  # [n, m]
        best = int(np.argmin((weights[:, None] * distances).sum(axis=0)))  # each candidate's cost
        chosen.append(int(candidates[best]))
        nearest = distances[:, best]
    return points[chosen]


def _kmeans_all_lengths(points: np.ndarray, weights: np.ndarray, seeds: np.ndarray,
                        iterations: int) -> tuple[np.ndarray, np.ndarray]:
    """Weighted Lloyd for every length 1..K (K = ``len(seeds)``) at once, length ``k`` from the first ``k`` seeds:
    (centres ``[K, K, 3]``, cluster weights ``[K, K]``), row ``k - 1`` holding length ``k`` in its first ``k``
    places."""
    lengths = len(seeds)
    used = np.arange(lengths)[None, :] <= np.arange(lengths)[:, None]  # [length - 1, slot]: slot < length
    centres = np.where(used[..., None], seeds[None], 0.0).reshape(-1, 3)  # [K * K, 3], row-major by length
    used = used.ravel()
    channels = points.T
    # each (colour, length) pair: its weight and weighted colour, repeated so that one bincount sums every length
    pair_weights = np.repeat(weights, lengths)
    pair_sums = [np.repeat(weights * points[:, c], lengths) for c in range(3)]
    length_offsets = lengths * np.arange(lengths)
    distances = np.full((len(points), lengths * lengths), np.inf)
    assign = None
    for _ in range(iterations):
        distances[:, used] = _squared_distances(channels, centres[used].T)  # unused slots stay infinitely far
        new = distances.reshape(len(points), lengths, lengths).argmin(axis=2)  # [n, K]: slot at each length
        if assign is not None and np.array_equal(new, assign):
            break
        assign = new
        clusters = (assign + length_offsets).ravel()
        sizes = np.bincount(clusters, weights=pair_weights, minlength=lengths * lengths)
        sums = np.stack([np.bincount(clusters, weights=s, minlength=lengths * lengths) for s in pair_sums], axis=1)
        kept = sizes > 0
        centres[kept] = sums[kept] / sizes[kept, None]
    return centres.reshape(lengths, lengths, 3), sizes.reshape(lengths, lengths)  # sizes: of the last assignment


def _sorted_palette(centres: np.ndarray, sizes: np.ndarray) -> list[list[int]]:
    """Centres rounded to ints, largest cluster first, ties by ``(r, g, b)``."""
    rounded = np.clip(np.rint(centres), 0, 255).astype(int)
    order = sorted(range(len(rounded)), key=lambda i: (-sizes[i], *rounded[i]))
    return [rounded[i].tolist() for i in order]


def _squared_distances(channels: np.ndarray, centres: np.ndarray) -> np.ndarray:
    """``[n, k]`` squared RGB distances of points ``channels`` (``[3, n]``) to ``centres`` (``[3, k]``), summed in
    channel order from the first: the values ``((p - c) ** 2).sum(axis=-1)`` gives, bit for bit, without its
    ``[n, k, 3]`` temporary and slow reduction over three."""
    total = None
    for point, centre in zip(channels, centres):
        diff = point[:, None] - centre[None, :]
        total = diff * diff if total is None else total + diff * diff
    return total
