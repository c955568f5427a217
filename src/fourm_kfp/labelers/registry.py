"""Find a labeler by name (built in, or a plug-in of the ``fourm_kfp.labelers`` entry-point group) and build it.

A plug-in is any installed package that declares, in its ``pyproject.toml``::

    [project.entry-points."fourm_kfp.labelers"]
    my_depth = "my_package.labeler:MyDepthLabeler"

where ``MyDepthLabeler`` subclasses :class:`fourm_kfp.labelers.base.Labeler`. Its weights come from where the config
entry's ``weights`` says (:mod:`fourm_kfp.labelers.weights`: a file, a model folder, a pinned hub commit, or one of
our own pretrain outputs), copied to a local cache and hashed; a missing one is an error naming the entry and URI.
"""

from __future__ import annotations

import importlib
from importlib.metadata import entry_points
from typing import Any, Mapping

from fourm_kfp.labelers.base import Labeler, LabelerError, LabelerSetup
from fourm_kfp.labelers.weights import resolve_weights

ENTRY_POINT_GROUP = "fourm_kfp.labelers"

#: The built-in labelers: name -> "module:class" under this package (imported when first used).
BUILTINS: dict[str, str] = {
    "canny_edge": "canny_edge:CannyEdgeLabeler",
    "color_palette": "color_palette:ColorPaletteLabeler",
    "metadata": "metadata:MetadataLabeler",
    "fourm_model": "fourm_model:FourMModelLabeler",
    # Teacher networks on Hugging Face transformers (the `teachers` extra; labelers/teachers/).
    "hf_depth": "teachers.depth:DepthTeacher",
    "hf_semseg": "teachers.segmentation:SegmentationTeacher",
    "hf_det": "teachers.boxes:DetectionTeacher",
    "hf_caption": "teachers.captions:CaptionTeacher",
    "hf_normal": "teachers.normals:NormalTeacher",
    "normal_from_depth": "teachers.normals:NormalFromDepth",
    "hf_clip": "teachers.features:ClipFeatures",
    "hf_dinov2": "teachers.features:Dinov2Features",
}


def _plugins() -> dict[str, Any]:
    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


def available_labelers() -> list[str]:
    """Every labeler name that can be configured: the built-ins and the installed plug-ins."""
    return sorted(set(BUILTINS) | set(_plugins()))


def labeler_class(name: str) -> type[Labeler]:
    """The class registered as ``name``; a clear error lists the known names."""
    if name in BUILTINS:
        module, _, attr = BUILTINS[name].partition(":")
        cls = getattr(importlib.import_module(f"fourm_kfp.labelers.{module}"), attr)
    else:
        plugin = _plugins().get(name)
        if plugin is None:
            raise LabelerError(f"unknown labeler {name!r}; available: {', '.join(available_labelers())} (a plug-in "
                               f"registers itself in the {ENTRY_POINT_GROUP!r} entry-point group)")
        try:
            cls = plugin.load()
        except Exception as exc:  # noqa: BLE001 - a broken plug-in: name it
            raise LabelerError(f"labeler plug-in {name!r} ({plugin.value}) cannot be imported: {exc}") from exc
    if not (isinstance(cls, type) and issubclass(cls, Labeler)):
        raise LabelerError(f"labeler {name!r} is {cls!r}, not a subclass of fourm_kfp.labelers.base.Labeler")
    if cls.name != name:
        raise LabelerError(f"labeler registered as {name!r} calls itself {cls.name!r}: the names must match")
    return cls


def located(message: str, name: str, where: str | None) -> str:
    """An error of labeler ``name`` that names it once, behind the config entry ``where`` when given: a built-in
    labeler's errors start with ``labeler '<name>':`` already; a plug-in's may not."""
    own = f"labeler {name!r}"
    if not message.startswith(f"{own}:"):
        message = f"{own}: {message}"
    return f"{where}: {message}" if where and where != own else message


def build_labeler(name: str, params: Mapping[str, Any] | None = None, weights: str = "", device: str = "cpu",
                  where: str | None = None) -> Labeler:
    """The labeler ``name`` built from its params and weights URI (see :class:`LabelerSetup`); ``where`` names its
    config entry in errors (``label.labelers[2]``)."""
    cls = labeler_class(name)
    path = digest = None
    if cls.needs_weights or weights:
        path, digest = resolve_weights(cls.weights_kind, weights, where or f"labeler {name!r}")
    try:
        labeler = cls(LabelerSetup(dict(params or {}), path, digest, device))
    except LabelerError as exc:
        raise LabelerError(located(str(exc), name, where)) from None
    if not labeler.modality:
        raise LabelerError(located("the labeler does not say which modality it produces", name, where))
    return labeler
