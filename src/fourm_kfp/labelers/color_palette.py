"""The ``color_palette`` labeler: each photo's dominant colours, as palettes of 1 to 7 colours (4M-21's
``color_palette``), by k-means++ on its pixels.

For one image: at most ``max_pixels`` of its pixels are drawn without replacement by a generator seeded with
``seed`` (all of them when the image is that small), and their distinct colours are counted. For each length
``k`` in 1..7 the colours are clustered by weighted k-means (weight = how many drawn pixels have the colour;
squared RGB distance): k-means++ seeding from a generator seeded with ``(seed, k)``, then at most ``iterations``
Lloyd steps, stopping early once the assignment no longer changes; a cluster that loses all its colours keeps its
centre. When an image has ``k`` or fewer distinct colours, they are the palette as they are, and its dominant colour
fills the remaining places. Centres are rounded to ints and sorted by cluster weight, largest first, ties by
``(r, g, b)``. The value is 4M's palette JSON (:mod:`fourm_kfp.data.label_formats`).

The generators depend on ``seed`` and ``k`` only, never on the image's place in the batch, and the arithmetic is
numpy's in a fixed order, so the labels are the same on every run and a batch gives what its images give one by one.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np

from fourm_kfp.data.label_formats import MAX_PALETTE_COLORS
from fourm_kfp.labelers.base import LabelBatch, Labeler, LabelerSetup, check_labels


class ColorPaletteLabeler(Labeler):
    """Palettes of 1..7 colours: params ``max_pixels`` (pixels drawn per image), ``iterations`` (most Lloyd steps
    per length) and ``seed`` (of the pixel draw and the k-means++ seeding)."""

    name = "color_palette"
    version = "1"
    modality = "color_palette"
    defaults: ClassVar[Mapping[str, Any]] = {"max_pixels": 4096, "iterations": 30, "seed": 0}

    def __init__(self, setup: LabelerSetup) -> None:
        super().__init__(setup)
        for key, least in (("max_pixels", 1), ("iterations", 1), ("seed", 0)):
            self.check_number(key, least, integer=True)

    def label(self, batch: LabelBatch) -> list[Any]:
        return check_labels(self, batch, [self.palettes(image) for image in batch.images])

    def palettes(self, image: np.ndarray) -> list[dict[str, list[list[int]]]]:
        """4M's palette JSON of one uint8 ``[H, W, 3]`` RGB image."""
        pixels = np.asarray(image, dtype=np.uint8).reshape(-1, 3)
        if len(pixels) > self.params["max_pixels"]:
            pixels = pixels[np.random.default_rng(self.params["seed"]).choice(len(pixels), self.params["max_pixels"],
                                                                              replace=False)]
        # distinct colours as 24-bit ints: the order np.unique(pixels, axis=0) gives, without its row sort
        packed, counts = np.unique((pixels[:, 0].astype(np.int32) << 16) | (pixels[:, 1].astype(np.int32) << 8)
                                   | pixels[:, 2], return_counts=True)
        colours = np.stack([packed >> 16, (packed >> 8) & 255, packed & 255], axis=1).astype(np.float64)
        counts = counts.astype(np.float64)
        return [{str(k): self._palette(colours, counts, k) for k in range(1, MAX_PALETTE_COLORS + 1)}]

    def _palette(self, colours: np.ndarray, weights: np.ndarray, k: int) -> list[list[int]]:
        if len(colours) <= k:
            centres, sizes = colours, weights
            fill = int(np.argmax(weights))
            centres = np.concatenate([centres, np.repeat(centres[fill:fill + 1], k - len(colours), axis=0)])
            sizes = np.concatenate([sizes, np.zeros(k - len(colours))])
        else:
            centres, sizes = self._kmeans(colours, weights, k, np.random.default_rng([self.params["seed"], k]))
        rounded = np.clip(np.rint(centres), 0, 255).astype(int)
        order = sorted(range(k), key=lambda i: (-sizes[i], *rounded[i]))
        return [rounded[i].tolist() for i in order]

    def _kmeans(self, points: np.ndarray, weights: np.ndarray, k: int,
                rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """Weighted k-means with k-means++ seeding of more than ``k`` distinct points: (centres, cluster weights)."""
        channels = points.T  # [3, n]: each distance is summed channel by channel, r + g + b, as a sum over them would
        centres = [points[rng.choice(len(points), p=weights / weights.sum())]]
        nearest = _squared_distances(channels, centres[0][:, None])[:, 0]
        for _ in range(1, k):
            score = weights * nearest
            centres.append(points[rng.choice(len(points), p=score / score.sum())])
            nearest = np.minimum(nearest, _squared_distances(channels, centres[-1][:, None])[:, 0])
        centres = np.stack(centres)
        assign = None
        for _ in range(self.params["iterations"]):
            new = _squared_distances(channels, centres.T).argmin(axis=1)
            if assign is not None and np.array_equal(new, assign):
                break
            assign = new
            sizes = np.bincount(assign, weights=weights, minlength=k)
            sums = np.stack([np.bincount(assign, weights=weights * points[:, c], minlength=k) for c in range(3)], 1)
            kept = sizes > 0
            centres[kept] = sums[kept] / sizes[kept, None]
        return centres, sizes  # sizes of the last assignment (iterations >= 1)


def _squared_distances(channels: np.ndarray, centres: np.ndarray) -> np.ndarray:
    """``[n, k]`` squared RGB distances of points ``channels`` (``[3, n]``) to ``centres`` (``[3, k]``), summed in
    channel order from the first: the values ``((p - c) ** 2).sum(axis=-1)`` gives, bit for bit, without its
    ``[n, k, 3]`` temporary and slow reduction over three."""
    total = None
    for point, centre in zip(channels, centres):
        diff = point[:, None] - centre[None, :]
        total = diff * diff if total is None else total + diff * diff
    return total
