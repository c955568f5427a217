"""The one small interface every labeler implements, built in or plug-in.

A labeler is a class with a registry ``name``, a ``version`` (bump it when its output changes for the same input),
the ``modality`` it produces (a name of the modality table) and, where it has one, a class vocabulary. It is built
from its config entry's ``params`` and, for a teacher network, the local path of its weights (a file or a model
folder; :class:`LabelerSetup`); :meth:`Labeler.label` maps a :class:`LabelBatch` (RGB images, plus what the source knew of
each: the caption, the size before the centre crop) to one value per image in the modality's in-memory form
(:mod:`fourm_kfp.data.modalities`). A labeler must be deterministic: the same batch gives the same values, and a
batch gives what its images give one by one (up to float rounding for a network, whose batched kernels may sum in
another order).

A labeler's identity (:meth:`Labeler.identity`: name, version, params and the weights' digest) goes into the label
stage's content address, so a changed threshold, a new version or new weights make a new output.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass, field
from typing import Any, ClassVar, Mapping, Sequence

import numpy as np

from fourm_kfp.errors import UserError


class LabelerError(UserError, ValueError):
    """A labeler cannot be built or run as configured; the message names the labeler and the config entry."""


@dataclass(frozen=True)
class LabelBatch:
    """A batch to label: ``images`` are uint8 ``[H, W, 3]`` RGB arrays (the prepared dataset's square crops).

    ``captions`` and ``original_sizes`` (``(width, height)`` of the file before the centre crop) hold ``None`` where
    the source did not know them; ``labels`` holds, for a labeler that reads them (:attr:`Labeler.reads`), the
    labels other labelers made of these images (one value or None per image); the keys name the samples (for error
    messages)."""

    keys: tuple[str, ...]
    images: tuple[np.ndarray, ...]
    captions: tuple[str | None, ...] = ()
    original_sizes: tuple[tuple[int, int] | None, ...] = ()
    labels: Mapping[str, tuple[Any, ...]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        n = len(self.keys)
        if len(self.images) != n:
            raise ValueError(f"a label batch needs one image per key: {n} keys, {len(self.images)} images")
        if not self.captions:
            object.__setattr__(self, "captions", (None,) * n)
        if not self.original_sizes:
            object.__setattr__(self, "original_sizes", (None,) * n)
        if len(self.captions) != n or len(self.original_sizes) != n:
            raise ValueError("a label batch needs one caption and one original size (or None) per key")
        if any(len(values) != n for values in self.labels.values()):
            raise ValueError("a label batch needs one label (or None) per key of each modality in labels")
        for key, image in zip(self.keys, self.images):
            if image.dtype != np.uint8 or image.ndim != 3 or image.shape[-1] != 3:
                raise ValueError(f"image of key {key!r}: expected uint8 [H, W, 3] RGB, got {image.dtype} "
                                 f"{list(image.shape)}")

    def __len__(self) -> int:
        return len(self.keys)

    def item(self, i: int) -> "LabelBatch":
        """The batch of sample ``i`` alone."""
        return LabelBatch(self.keys[i:i + 1], self.images[i:i + 1], self.captions[i:i + 1],
                          self.original_sizes[i:i + 1], {m: v[i:i + 1] for m, v in self.labels.items()})


@dataclass(frozen=True)
class LabelerSetup:
    """What a labeler is built from: its config entry's ``params``, the local path of its weights (a file or a
    folder; ``None`` when it has none) and their digest, and the device to run on."""

    params: Mapping[str, Any] = field(default_factory=dict)
    weights_path: str | None = None
    weights_digest: str | None = None
    device: str = "cpu"


class Labeler:
    """Base class of the labelers (see the module docstring). Subclasses set the class attributes and implement
    :meth:`label`; a labeler whose modality depends on its params (a teacher producing the modality it is asked
    for) sets ``self.modality`` in ``__init__``."""

    #: the registry name (the config's ``label.labelers[].name``)
    name: ClassVar[str] = ""
    #: bump when the labels change for the same input and params
    version: ClassVar[str] = "1"
    #: the modality produced (a key of the modality table)
    modality: str = ""
    #: True: it needs weights (a teacher network); ``label.labelers[].weights`` must name them
    needs_weights: ClassVar[bool] = False
    #: True: it runs much faster on an accelerator (the pipeline gives its workers GPU pods)
    wants_accelerator: ClassVar[bool] = False
    #: its weights are one file (``"file"``: a local path or ``s3://`` URI), a model folder (``"folder"``: local,
    #: ``s3://`` or ``hf://<repo>@<commit>``) or a committed pretrain output (``"model"``: a teacher that is one of
    #: our own 4M models); :mod:`fourm_kfp.labelers.weights`
    weights_kind: ClassVar[str] = "file"
    #: modalities it reads besides the photo: another labeler's labels of the same batch (``LabelBatch.labels``),
    #: which must be made by a labeler listed before it
    reads: ClassVar[tuple[str, ...]] = ()
    #: True: it runs even where the prepared data holds its modality, and labels only the samples that lack it
    #: (returning the others' own values, unchanged): a captioner for photos without text
    fills_gaps: ClassVar[bool] = False
    #: a depth labeler whose depth is relative (a monocular teacher's): the gate checks only that it is finite
    relative_depth: bool = False
    #: the params it accepts, with their defaults (unknown params are an error naming the labeler)
    defaults: ClassVar[Mapping[str, Any]] = {}

    def __init__(self, setup: LabelerSetup) -> None:
        unknown = sorted(set(setup.params) - set(self.defaults))
        if unknown:
            raise LabelerError(f"labeler {self.name!r}: unknown params {unknown}; it takes "
                               f"{sorted(self.defaults) or 'no params'}")
        self.params: dict[str, Any] = {**self.defaults, **setup.params}
        self.setup = setup

    def check_number(self, key: str, least: float = 0, most: float = float("inf"), integer: bool = False) -> None:
        """Fail naming this labeler unless param ``key`` is a number (an integer with ``integer``) in
        ``[least, most]``."""
        value = self.params[key]
        kind = numbers.Integral if integer else numbers.Real
        if isinstance(value, bool) or not isinstance(value, kind) or not least <= value <= most:
            span = f">= {least}" if most == float("inf") else f"in {least}..{most}"
            what = "an integer" if integer else "a number"
            raise LabelerError(f"labeler {self.name!r}: param {key!r} must be {what} {span}, got {value!r}")

    @property
    def modality_settings(self) -> dict[str, Any]:
        """How the values it makes are to be read, recorded in the dataset's ``modality_settings``
        (:mod:`fourm_kfp.data.vocabularies`): ``{"relative": True}`` for a relative depth; a feature map's
        ``channels`` and token ``grid``. Empty: the modality's defaults."""
        return {"relative": True} if self.relative_depth else {}

    @property
    def classes(self) -> tuple[str, ...] | None:
        """The class vocabulary of a class-valued modality (semseg ids, det names), in id order; None otherwise."""
        return None

    def label(self, batch: LabelBatch) -> list[Any]:
        """One value of :attr:`modality` per image of ``batch``, in order."""
        raise NotImplementedError

    def identity(self) -> dict[str, Any]:
        """What the label stage's address covers of this labeler."""
        return {"name": self.name, "version": str(self.version), "modality": self.modality,
                "params": dict(sorted(self.params.items())), "weights": self.setup.weights_digest}


def label_one_by_one(labeler: Labeler, batch: LabelBatch) -> list[Any]:
    """The labels of ``batch`` computed one image at a time (what a batched labeler must equal)."""
    return [labeler.label(batch.item(i))[0] for i in range(len(batch))]


def check_labels(labeler: Labeler, batch: LabelBatch, values: Sequence[Any]) -> list[Any]:
    """``values`` as a list, after checking there is one per image."""
    values = list(values)
    if len(values) != len(batch):
        raise LabelerError(f"labeler {labeler.name!r} returned {len(values)} values for a batch of {len(batch)} "
                           f"images (keys {batch.keys[0]}..{batch.keys[-1]})")
    return values
