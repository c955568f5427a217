"""A dataset's class vocabularies and modality settings: data that travels with the dataset, not code.

A dataset layer may hold :data:`META_FILE` (``dataset_meta.json``) at its root::

    {"vocabularies": {"semseg": ["background", "wall", ...], "det": ["person", "car", ...]},
     "modality_settings": {"depth": {"relative": true}}}

* ``vocabularies``: per class-valued modality, its class names in id order (a semseg id indexes its list, up to
  ``MAX_SEMSEG_CLASSES``; a det box names one of its entries, a single word);
* ``modality_settings``: per modality, how its stored values are to be read (:data:`SETTINGS` lists the known
  settings and their defaults, from the modality records; ``depth.relative``: a teacher's relative depth, which the
  depth tokenizer standardises per image, where metric depth is metres; a feature map's ``channels`` and token
  ``grid``, e.g. ``{"clip": {"channels": 512, "grid": 14}}``, 0 meaning unknown).

Both sections are optional, and so is every entry: what a dataset does not name has the defaults, the synthetic
scenes' ``CLASS_NAMES`` for semseg and ``OBJECT_CLASSES`` for det (:data:`DEFAULT_VOCABULARIES`), metric depth.
prepare-data writes no file (its sources have the defaults); the label stage writes one when a labeler has a
vocabulary or modality settings (relative depth, a feature map's size), merged over the file of the layer below it
(:meth:`DatasetMeta.merged`), so reading the dataset as one store (a :class:`~fourm_kfp.storage.LayeredStore`: the
top layer holding the file wins) sees every entry. :func:`read_dataset_meta` reads and checks it; a bad entry fails
naming the file and the modality.

Downstream, train-tokenizers sizes the semseg tokenizer by the vocabulary (and a feature map's by its channels and
grid) and records the vocabularies that differ from the defaults in its bundle (:mod:`fourm_kfp.tokenizers.bundle`),
where the evaluation and ``fourm-kfp generate`` read them back with the model.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Mapping

from fourm_kfp.data.modalities import CLASS_NAMES, MAX_SEMSEG_CLASSES, MODALITIES, OBJECT_CLASSES
from fourm_kfp.storage import Store

#: The file a dataset layer may hold at its root.
META_FILE = "dataset_meta.json"
#: The vocabularies of a dataset that names none: the synthetic scenes'.
DEFAULT_VOCABULARIES: dict[str, tuple[str, ...]] = {"semseg": CLASS_NAMES, "det": OBJECT_CLASSES}
#: The modality settings a dataset may give, with their defaults: each modality record's ``settings``
#: (:data:`~fourm_kfp.data.modalities.MODALITIES`).
SETTINGS: dict[str, dict[str, Any]] = {name: dict(m.settings) for name, m in MODALITIES.items() if m.settings}
_SECTIONS = ("vocabularies", "modality_settings")


class DatasetMetaError(ValueError):
    """A dataset's vocabularies or modality settings are malformed; the message names the file and the modality."""


def _vocabulary(modality: str, names: Any, where: str) -> tuple[str, ...]:
    if modality not in MODALITIES:
        raise DatasetMetaError(f"{where}: a vocabulary for {modality!r}, which is no modality "
                               f"(known: {', '.join(MODALITIES)})")
    if not isinstance(names, (list, tuple)) or not names:
        raise DatasetMetaError(f"{where}: the {modality} vocabulary must be a non-empty list of class names")
    bad = [n for n in names if not isinstance(n, str) or not n.strip()]
    if bad:
        raise DatasetMetaError(f"{where}: the {modality} vocabulary has names that are not non-empty strings: "
                               f"{bad[:5]}")
    repeated = sorted(n for n, count in Counter(names).items() if count > 1)
    if repeated:
        raise DatasetMetaError(f"{where}: the {modality} vocabulary names {repeated[:5]} more than once")
    if modality == "semseg" and len(names) > MAX_SEMSEG_CLASSES:
        raise DatasetMetaError(f"{where}: the semseg vocabulary has {len(names)} classes; a shard stores ids "
                               f"0..{MAX_SEMSEG_CLASSES - 1} (16-bit PNG)")
    if modality == "det":
        spaced = [n for n in names if len(n.split()) != 1]
        if spaced:
            raise DatasetMetaError(f"{where}: det names are single words (a det text is 'v0=.. v1=.. v2=.. v3=.. "
                                   f"name ...'), got {spaced[:5]}")
    return tuple(names)


def _settings(modality: str, values: Any, where: str) -> dict[str, Any]:
    known = SETTINGS.get(modality)
    if known is None:
        raise DatasetMetaError(f"{where}: settings for {modality!r}, which takes none (modalities with settings: "
                               f"{', '.join(SETTINGS)})")
    if not isinstance(values, Mapping):
        raise DatasetMetaError(f"{where}: the {modality} settings must be a mapping, got {values!r}")
    for name, value in values.items():
        if name not in known:
            raise DatasetMetaError(f"{where}: unknown {modality} setting {name!r}; known: {', '.join(known)}")
        if type(value) is not type(known[name]):
            raise DatasetMetaError(f"{where}: the {modality} setting {name!r} must be a "
                                   f"{type(known[name]).__name__}, got {value!r}")
    return dict(values)


@dataclass(frozen=True)
class DatasetMeta:
    """A dataset's vocabularies and modality settings, as its file names them (defaults not filled in: see
    :meth:`vocabulary`, :attr:`all_vocabularies` and :meth:`setting` for the values in force)."""

    vocabularies: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    modality_settings: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    @classmethod
    def from_json(cls, doc: Any, where: str) -> "DatasetMeta":
        """The checked meta of a JSON document (``where`` names it in errors: the file, the bundle, ...)."""
        if not isinstance(doc, Mapping) or set(doc) - set(_SECTIONS):
            raise DatasetMetaError(f"{where}: expected a JSON object with the sections {list(_SECTIONS)}, got "
                                   f"{sorted(doc) if isinstance(doc, Mapping) else type(doc).__name__}")
        sections = {name: doc.get(name) or {} for name in _SECTIONS}
        for name, section in sections.items():
            if not isinstance(section, Mapping):
                raise DatasetMetaError(f"{where}: {name!r} must map modalities to entries, got {section!r}")
        return cls({m: _vocabulary(m, v, where) for m, v in sections["vocabularies"].items()},
                   {m: _settings(m, v, where) for m, v in sections["modality_settings"].items()})

    def to_json(self) -> bytes:
        """The file's bytes (sections that are empty left out; keys sorted, so equal metas give equal bytes)."""
        doc = {"vocabularies": {m: list(v) for m, v in self.vocabularies.items()},
               "modality_settings": {m: dict(v) for m, v in self.modality_settings.items()}}
        return json.dumps({k: v for k, v in doc.items() if v}, indent=1, sort_keys=True).encode()

    def __bool__(self) -> bool:
        return bool(self.vocabularies or self.modality_settings)

    def merged(self, over: "DatasetMeta") -> "DatasetMeta":
        """This meta with ``over``'s entries on top (a modality's vocabulary or one setting replaced by over's)."""
        settings = {m: dict(v) for m, v in self.modality_settings.items()}
        for modality, values in over.modality_settings.items():
            settings.setdefault(modality, {}).update(values)
        return DatasetMeta({**self.vocabularies, **over.vocabularies}, settings)

    def vocabulary(self, modality: str) -> tuple[str, ...] | None:
        """The class names of ``modality`` in id order: the dataset's, else the default; None when it has none."""
        return self.vocabularies.get(modality, DEFAULT_VOCABULARIES.get(modality))

    @property
    def all_vocabularies(self) -> dict[str, tuple[str, ...]]:
        """Every vocabulary in force: the defaults with the dataset's on top."""
        return {**DEFAULT_VOCABULARIES, **self.vocabularies}

    @property
    def custom_vocabularies(self) -> dict[str, list[str]]:
        """The dataset's vocabularies that differ from the defaults (what a tokenizer bundle records)."""
        return {m: list(v) for m, v in sorted(self.vocabularies.items()) if v != DEFAULT_VOCABULARIES.get(m)}

    def settings(self, modality: str) -> dict[str, Any]:
        """Every setting of ``modality``: the dataset's, else the defaults (:data:`SETTINGS`; empty: it takes none)."""
        return {**SETTINGS.get(modality, {}), **self.modality_settings.get(modality, {})}

    def setting(self, modality: str, name: str) -> Any:
        """A modality setting: the dataset's, else its default (:data:`SETTINGS`)."""
        try:
            default = SETTINGS[modality][name]
        except KeyError:
            raise KeyError(f"no modality setting {modality}.{name}; known: "
                           f"{[f'{m}.{s}' for m, names in SETTINGS.items() for s in names]}") from None
        return self.modality_settings.get(modality, {}).get(name, default)

    @property
    def text_class_names(self) -> tuple[str, ...]:
        """The class names a caption or det text may use, each once, semseg's first: the text tokenizer keeps each
        as one token."""
        names = [n for m in ("semseg", "det") for n in self.vocabulary(m) or ()]
        return tuple(dict.fromkeys(names))


def read_dataset_meta(store: Store) -> DatasetMeta:
    """The vocabularies and modality settings of the dataset in ``store`` (a layered store reads the top layer's
    file); an empty meta (every default) when it has no file."""
    if not store.exists(META_FILE):
        return DatasetMeta()
    where = store.uri_of(META_FILE)
    try:
        doc = json.loads(store.get_bytes(META_FILE))
    except ValueError as exc:
        raise DatasetMetaError(f"{where}: not JSON ({exc})") from None
    return DatasetMeta.from_json(doc, where)
