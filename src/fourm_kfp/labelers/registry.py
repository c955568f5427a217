"""Find a labeler by name (built in, or a plug-in of the ``fourm_kfp.labelers`` entry-point group) and build it.

A plug-in is any installed package that declares, in its ``pyproject.toml``::

    [project.entry-points."fourm_kfp.labelers"]
    my_depth = "my_package.labeler:MyDepthLabeler"

where ``MyDepthLabeler`` subclasses :class:`fourm_kfp.labelers.base.Labeler`. Its weights are never fetched from a
model hub: the config names a local path or an ``s3://`` URI (``label.labelers[].weights``), which
:func:`fetch_weights` copies to a local cache (fetched again when the object changes) and hashes; a missing file is
an error naming the URI. A teacher that is one of our own models names a pretrain output instead
(:func:`model_weights`).
"""

from __future__ import annotations

import hashlib
import importlib
import os
import tempfile
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any, Mapping

from fourm_kfp.labelers.base import Labeler, LabelerError, LabelerSetup
from fourm_kfp.storage import file_store, is_s3_uri, open_store

ENTRY_POINT_GROUP = "fourm_kfp.labelers"

#: The built-in labelers: name -> "module:class" under this package (imported when first used).
BUILTINS: dict[str, str] = {
    "canny_edge": "canny_edge:CannyEdgeLabeler",
    "color_palette": "color_palette:ColorPaletteLabeler",
    "metadata": "metadata:MetadataLabeler",
    "fourm_model": "fourm_model:FourMModelLabeler",
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


def file_digest(path: str | os.PathLike) -> str:
    """``sha256:<hex>`` of a file, read in 8 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(8 << 20), b""):
            digest.update(block)
    return "sha256:" + digest.hexdigest()


def _cache_dir() -> Path:
    return Path(os.environ.get("FOURM_LABELER_CACHE") or Path(tempfile.gettempdir()) / "fourm-kfp-labeler-weights")


def fetch_weights(uri: str, where: str) -> tuple[str, str]:
    """``(local path, digest)`` of the weights file at ``uri`` (a local path or ``s3://``); an ``s3://`` file is
    copied into a local cache, again whenever the object's version (size, ETag, time) changed. ``where`` names the
    config entry in errors."""
    if not uri:
        raise LabelerError(f"{where}: this labeler needs weights; set its 'weights' to a local path or s3:// URI")
    if is_s3_uri(uri):
        store, name = file_store(uri)
        if not name or not store.exists(name):
            raise LabelerError(f"{where}: weights file {uri} does not exist")
        target = _cache_dir() / hashlib.sha256(uri.encode()).hexdigest()[:16] / name
        stamp, version = target.with_name(name + ".version"), store.version(name)
        if not target.exists() or not stamp.exists() or stamp.read_text() != version:
            target.parent.mkdir(parents=True, exist_ok=True)
            store.get_file(name, target)
            stamp.write_text(version)
        return str(target), file_digest(target)
    path = Path(uri).expanduser()
    if not path.is_file():
        raise LabelerError(f"{where}: weights file {uri} does not exist")
    return str(path), file_digest(path)


def model_weights(uri: str, where: str) -> tuple[str, str]:
    """``(URI, digest)`` of a committed pretrain output used as weights (a teacher that is one of our models): its
    manifest's payload digest, which changes with any of its files."""
    from fourm_kfp.contract.manifest import read_manifest

    if not uri:
        raise LabelerError(f"{where}: this labeler needs a model; set its 'weights' to a pretrain output's URI")
    found = read_manifest(open_store(uri))
    if found is None:
        raise LabelerError(f"{where}: no committed model at {uri} (no _MANIFEST.json: run its pipeline first)")
    return uri, found[0]["payload_digest"]


def resolve_weights(cls: type[Labeler], uri: str, where: str) -> tuple[str, str]:
    """Where a labeler of class ``cls`` reads its weights from, and their digest (:attr:`Labeler.weights_kind`)."""
    return (model_weights if cls.weights_kind == "model" else fetch_weights)(uri, where)


def build_labeler(name: str, params: Mapping[str, Any] | None = None, weights: str = "", device: str = "cpu",
                  where: str | None = None) -> Labeler:
    """The labeler ``name`` built from its params and weights URI (see :class:`LabelerSetup`)."""
    where = where or f"labeler {name!r}"
    cls = labeler_class(name)
    path = digest = None
    if cls.needs_weights or weights:
        path, digest = resolve_weights(cls, weights, where)
    try:
        labeler = cls(LabelerSetup(dict(params or {}), path, digest, device))
    except LabelerError as exc:
        raise LabelerError(f"{where}: {exc}") from None
    if not labeler.modality:
        raise LabelerError(f"{where}: the labeler does not say which modality it produces")
    return labeler
