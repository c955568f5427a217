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
        brightest = int(np.argmax([image.mean() for image in batch.images]))
        values[brightest] = values[brightest] * 1e6
        return values


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


GATE_LABELERS = {"far_depth": "tests.labeler_plugins:FarDepthLabeler",
                 "patchy_depth": "tests.labeler_plugins:PatchyDepthLabeler",
                 "caption_teacher": "tests.labeler_plugins:CaptionTeacherLabeler"}
