"""The table of prepare-data's sources: one :class:`~fourm_kfp.data.source_record.Source` record per value of
``prepare_data.source``.

What reads it and needs no edit: the config (``prepare_data.source``'s accepted values, and ``source_uri`` required
for an external source), prepare-data's content address (the modalities a source writes, its fingerprint and
processing: :mod:`fourm_kfp.stages`) and the stage itself (:mod:`fourm_kfp.stages.prepare_data`: the plan, the
items, the collect step). A new source is its module, holding its record (plan, items, and a fingerprint when it
reads outside the config), and one entry here.
"""

from __future__ import annotations

from fourm_kfp.data.photo_sources import IMAGE_FOLDER, WEBDATASET
from fourm_kfp.data.source_record import Source
from fourm_kfp.data.synthetic_source import SYNTHETIC
from fourm_kfp.errors import UserError

#: every source by its ``prepare_data.source`` name, the default first
SOURCES: dict[str, Source] = {source.name: source for source in (SYNTHETIC, IMAGE_FOLDER, WEBDATASET)}


class UnknownSourceError(UserError, ValueError):
    """``prepare_data.source`` names no source of :data:`SOURCES`."""


def source_of(name: str) -> Source:
    """The record of source ``name``; an unknown name is an error naming the setting and the sources there are."""
    try:
        return SOURCES[name]
    except KeyError:
        raise UnknownSourceError(f"prepare_data.source: unknown source {name!r}; the sources are "
                                 f"{', '.join(SOURCES)}") from None
