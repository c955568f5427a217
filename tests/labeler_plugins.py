"""Labeler plug-ins visible to the registry without installing them, and small labelers for the gate's tests.

:func:`expose_entry_points` writes the ``*.dist-info`` folder pip would write for a package declaring entry points in
the ``fourm_kfp.labelers`` group into a temporary folder on ``sys.path``: all ``importlib.metadata`` looks at. The
labelers below are such plug-ins (``tests.labeler_plugins:<class>``), each wrong in one way the gate must catch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar, Mapping

import numpy as np

from fourm_kfp.labelers.base import LabelBatch, Labeler, check_labels
from fourm_kfp.labelers.registry import ENTRY_POINT_GROUP


def expose_entry_points(folder: Path, monkeypatch, name: str, version: str, entries: Mapping[str, str]) -> None:
    """Make the distribution ``name`` with these ``fourm_kfp.labelers`` entry points (name -> "module:attr")
    visible, as if installed."""
    dist = folder / f"{name.replace('-', '_')}-{version}.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    (dist / "entry_points.txt").write_text(f"[{ENTRY_POINT_GROUP}]\n" + "".join(f"{k} = {v}\n"
                                                                              for k, v in entries.items()))
    monkeypatch.syspath_prepend(str(folder))


class _DepthFromGrey(Labeler):
    """A metric depth in metres from the grey level (1 m black .. 11 m white): a stand-in for a teacher."""

    modality = "depth"
    defaults: ClassVar[Mapping[str, Any]] = {}

    def depth(self, image: np.ndarray) -> np.ndarray:
        return (1.0 + image.mean(axis=-1) / 25.5).astype(np.float32)

    def label(self, batch: LabelBatch) -> list[Any]:
        return check_labels(self, batch, [self.depth(image) for image in batch.images])


class FarDepthLabeler(_DepthFromGrey):
    """Depth beyond any plausible range on the brightest photo of a batch: the gate's value check must fail."""

    name = "far_depth"

    def label(self, batch: LabelBatch) -> list[Any]:
        values = super().label(batch)
        values[_brightest(batch)] = values[_brightest(batch)] * 1e6
        return values


def _brightest(batch: LabelBatch) -> int:
    return int(np.argmax([image.mean() for image in batch.images]))


class NanDepthLabeler(_DepthFromGrey):
    """NaN depth in one pixel of the brightest photo of a batch: a teacher whose forward overflowed."""

    name = "nan_depth"

    def label(self, batch: LabelBatch) -> list[Any]:
        values = super().label(batch)
        values[_brightest(batch)][0, 0] = np.nan
        return values


class OutOfVocabularySemsegLabeler(Labeler):
    """Class ids of a three-class vocabulary, and on the brightest photo an id past it."""

    name = "out_of_vocabulary_semseg"
    modality = "semseg"

    @property
    def classes(self) -> tuple[str, ...]:
        return ("background", "dark", "bright")

    def label(self, batch: LabelBatch) -> list[Any]:
        values = [(image.mean(axis=-1) > 127).astype(np.int64) + 1 for image in batch.images]
        values[_brightest(batch)][0, 0] = len(self.classes) + 2
        return check_labels(self, batch, values)


class OffImageDetLabeler(Labeler):
    """One box per photo, and on the brightest photo a box that reaches past the image's right edge."""

    name = "off_image_det"
    modality = "det"

    @property
    def classes(self) -> tuple[str, ...]:
        return ("photo",)

    def label(self, batch: LabelBatch) -> list[Any]:
        values = ["v0=10 v1=20 v2=500 v3=600 photo" for _ in batch.images]
        values[_brightest(batch)] = "v0=10 v1=20 v2=1200 v3=600 photo"
        return check_labels(self, batch, values)


class SlowDepthLabeler(_DepthFromGrey):
    """A teacher that takes its time (0.4 s a batch), so that a test can kill the label stage between shards."""

    name = "slow_depth"

    def label(self, batch: LabelBatch) -> list[Any]:
        import time

        time.sleep(0.4)
        return super().label(batch)


class PatchyDepthLabeler(_DepthFromGrey):
    """No depth for a photo whose mean red is above its mean blue (None: the teacher could not label it)."""

    name = "patchy_depth"

    def label(self, batch: LabelBatch) -> list[Any]:
        values = super().label(batch)
        return [None if image[..., 0].mean() > image[..., 2].mean() else value
                for image, value in zip(batch.images, values)]


class CaptionTeacherLabeler(Labeler):
    """A caption for every photo ("a photo"): for data that may already have its own captions."""

    name = "caption_teacher"
    modality = "caption"

    def label(self, batch: LabelBatch) -> list[Any]:
        return check_labels(self, batch, ["a photo"] * len(batch))


class FeatureMapLabeler(Labeler):
    """A stand-in for a feature-map teacher (CLIP's, DINOv2's): each photo average-pooled to ``grid`` x ``grid``
    cells, each cell's colour (centred, with its squares, for some non-linearity) mapped by a fixed random projection
    to ``channels`` features through a tanh. Deterministic, and its features move with the image. ``modality``:
    ``clip`` or ``dinov2``; it reports its ``channels`` and ``grid`` as a teacher must."""

    name = "feature_map"
    defaults: ClassVar[Mapping[str, Any]] = {"modality": "clip", "grid": 4, "channels": 8}

    def __init__(self, setup) -> None:
        super().__init__(setup)
        self.modality = str(self.params["modality"])
        self.check_number("grid", 1, integer=True)
        self.check_number("channels", 1, integer=True)
        self.grid, self.channels = int(self.params["grid"]), int(self.params["channels"])
        self.projection = np.random.default_rng(55).normal(size=(6, self.channels)) / np.sqrt(6)

    @property
    def modality_settings(self) -> dict[str, Any]:
        return {"channels": self.channels, "grid": self.grid}

    def features(self, image: np.ndarray) -> np.ndarray:
        g, cell = self.grid, image.shape[0] // self.grid
        pooled = image[:g * cell, :g * cell].reshape(g, cell, g, cell, 3).mean(axis=(1, 3)) / 127.5 - 1.0
        return np.tanh(2.0 * np.concatenate([pooled, pooled ** 2 - 0.5], -1) @ self.projection).astype(np.float32)

    def label(self, batch: LabelBatch) -> list[Any]:
        return check_labels(self, batch, [self.features(image) for image in batch.images])


GATE_LABELERS = {"far_depth": "tests.labeler_plugins:FarDepthLabeler",
                 "nan_depth": "tests.labeler_plugins:NanDepthLabeler",
                 "slow_depth": "tests.labeler_plugins:SlowDepthLabeler",
                 "out_of_vocabulary_semseg": "tests.labeler_plugins:OutOfVocabularySemsegLabeler",
                 "off_image_det": "tests.labeler_plugins:OffImageDetLabeler",
                 "patchy_depth": "tests.labeler_plugins:PatchyDepthLabeler",
                 "caption_teacher": "tests.labeler_plugins:CaptionTeacherLabeler",
                 "feature_map": "tests.labeler_plugins:FeatureMapLabeler"}
