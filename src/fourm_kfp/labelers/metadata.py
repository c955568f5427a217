"""The ``metadata`` labeler: 4M-21's image statistics of each photo, as raw numbers (the ``metadata`` modality).

For one uint8 ``[H, W, 3]`` RGB image with its caption and original size (:class:`LabelBatch`):

* ``original_width``, ``original_height``: the size of the file before the centre crop (``batch.original_sizes``);
  the image's own size where the source did not know it;
* ``caption_n_chars``, ``caption_n_words``, ``caption_n_sentences``: of the caption with surrounding white space
  stripped: its characters, its white-space separated words, and its sentences (runs of text ended by ``.``, ``!``
  or ``?`` and white space, or by the end); left out where the image has no caption;
* ``brightness``, ``contrast``: the mean and the (population) standard deviation of the grey image
  (``cv2.COLOR_RGB2GRAY``, 0..255);
* ``saturation``: the mean S channel of ``cv2.COLOR_RGB2HSV`` (0..255);
* ``colorfulness``: Hasler and Süsstrunk's (2003) ``sqrt(std(rg)² + std(yb)²) + 0.3 sqrt(mean(rg)² + mean(yb)²)``
  with ``rg = R - G``, ``yb = (R + G) / 2 - B``;
* ``entropy``: the Shannon entropy in bits of the 256-bin histogram of the grey image (0..8).

The statistics are float64 numpy reductions rounded to ``decimals`` places, so the stored JSON is stable; 4M's
quantisation into tokens happens when the shard is read (:mod:`fourm_kfp.data.label_formats`). Each image is
labelled on its own, so a batch gives what its images give one by one.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, ClassVar

import cv2
import numpy as np

from fourm_kfp.data.label_formats import METADATA_FIELDS
from fourm_kfp.labelers.base import LabelBatch, Labeler, LabelerSetup, check_labels

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


def caption_counts(caption: str) -> dict[str, int]:
    """Characters, words and sentences of a caption (see the module docstring)."""
    text = caption.strip()
    return {"caption_n_chars": len(text), "caption_n_words": len(text.split()),
            "caption_n_sentences": len([s for s in _SENTENCE_END.split(text) if s])}


def image_statistics(image: np.ndarray) -> dict[str, float]:
    """Brightness, contrast, saturation, colourfulness and entropy of one RGB image, unrounded."""
    rgb = np.ascontiguousarray(image, dtype=np.uint8)
    grey = cv2.cvtColor(rgb, cv2.COLOR_RGB2GRAY)
    saturation = cv2.cvtColor(rgb, cv2.COLOR_RGB2HSV)[..., 1]
    r, g, b = (rgb[..., c].astype(np.float64) for c in range(3))
    rg, yb = r - g, (r + g) / 2 - b
    colorfulness = np.hypot(rg.std(), yb.std()) + 0.3 * np.hypot(rg.mean(), yb.mean())
    p = np.bincount(grey.ravel(), minlength=256) / grey.size
    p = p[p > 0]
    return {"brightness": float(grey.mean(dtype=np.float64)), "contrast": float(grey.std(dtype=np.float64)),
            "saturation": float(saturation.mean(dtype=np.float64)), "colorfulness": float(colorfulness),
            "entropy": float(-(p * np.log2(p)).sum())}


class MetadataLabeler(Labeler):
    """4M-21's image statistics: param ``decimals`` (places the float statistics are rounded to)."""

    name = "metadata"
    version = "1"
    modality = "metadata"
    defaults: ClassVar[Mapping[str, Any]] = {"decimals": 4}

    def __init__(self, setup: LabelerSetup) -> None:
        super().__init__(setup)
        self.check_number("decimals", 0, 12, integer=True)

    def metadata(self, image: np.ndarray, caption: str | None, original_size: tuple[int, int] | None) -> dict:
        """The raw metadata of one image (field → number)."""
        width, height = original_size if original_size is not None else (image.shape[1], image.shape[0])
        fields: dict[str, Any] = {"original_width": int(width), "original_height": int(height)}
        if caption is not None:
            fields.update(caption_counts(caption))
        fields.update({k: round(v, self.params["decimals"]) for k, v in image_statistics(image).items()})
        return {name: fields[name] for name in METADATA_FIELDS if name in fields}

    def label(self, batch: LabelBatch) -> list[Any]:
        return check_labels(self, batch, [self.metadata(image, caption, size) for image, caption, size
                                          in zip(batch.images, batch.captions, batch.original_sizes, strict=True)])
