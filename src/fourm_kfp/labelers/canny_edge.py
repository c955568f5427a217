"""The ``canny_edge`` labeler: Canny edges of each photo (4M-21's ``canny_edge`` modality), with OpenCV.

Each RGB image is converted to grey (``cv2.COLOR_RGB2GRAY``), optionally smoothed by a Gaussian of standard
deviation ``blur`` pixels (kernel size chosen by OpenCV from the sigma; ``0`` = no smoothing), and passed to
``cv2.Canny`` with hysteresis thresholds ``low`` and ``high`` (3×3 Sobel aperture, L1 gradient norm). The result is
uint8 ``[H, W]`` with 1 on an edge and 0 elsewhere, the in-memory form of the ``edge`` modality. The defaults,
100 and 200 without smoothing, are the common ControlNet-style choice. Every step is integer or fixed-order
arithmetic, so the labels are the same on every run, whatever OpenCV's thread count, and each image is labelled on
its own, so a batch gives what its images give one by one.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import cv2
import numpy as np

from fourm_kfp.labelers.base import LabelBatch, Labeler, LabelerError, LabelerSetup, check_labels


class CannyEdgeLabeler(Labeler):
    """Canny edges: params ``low`` and ``high`` (hysteresis thresholds on the gradient magnitude, 0 ≤ low ≤ high)
    and ``blur`` (Gaussian sigma in pixels before the edge detector; 0 = none)."""

    name = "canny_edge"
    version = "1"
    modality = "canny_edge"
    defaults: ClassVar[Mapping[str, Any]] = {"low": 100, "high": 200, "blur": 0.0}

    def __init__(self, setup: LabelerSetup) -> None:
        super().__init__(setup)
        for key in ("low", "high", "blur"):
            self.check_number(key, 0, float("inf"))
        if self.params["low"] > self.params["high"]:
            raise LabelerError(f"labeler {self.name!r}: param 'low' ({self.params['low']}) must not exceed 'high' "
                               f"({self.params['high']})")

    def edges(self, image: np.ndarray) -> np.ndarray:
        """The 0/1 edge map of one uint8 ``[H, W, 3]`` RGB image."""
        grey = cv2.cvtColor(np.ascontiguousarray(image, dtype=np.uint8), cv2.COLOR_RGB2GRAY)
        if self.params["blur"] > 0:
            grey = cv2.GaussianBlur(grey, (0, 0), sigmaX=float(self.params["blur"]))
        edges = cv2.Canny(grey, float(self.params["low"]), float(self.params["high"]))
        return (edges > 0).astype(np.uint8)

    def label(self, batch: LabelBatch) -> list[Any]:
        return check_labels(self, batch, [self.edges(image) for image in batch.images])
