"""The one list of the labelers (docs/teachers.md, "The labelers") names every built-in labeler of the registry with
the modality it makes, and nothing else; the other pages link to it instead of listing them again."""

from __future__ import annotations

import re
from pathlib import Path

from fourm_kfp.labelers.registry import BUILTINS, labeler_class

REPO = Path(__file__).resolve().parents[2]


def _listed() -> dict[str, str]:
    """labeler -> the modality column of docs/teachers.md's table of the labelers."""
    section = (REPO / "docs" / "teachers.md").read_text().split("## The labelers\n", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `(\w+)` \| ([^|]+) \|", section, flags=re.MULTILINE)
    return {name: modality.strip() for name, modality in rows}


def test_the_list_names_every_built_in_labeler_and_its_modality():
    listed = _listed()
    assert set(listed) == set(BUILTINS)
    for name, modality in listed.items():
        made = labeler_class(name).modality
        # fourm_model makes whichever modality its params name: the table says so instead of naming one
        assert modality == (made or "`params.modality`"), (name, modality, made)


def test_the_other_pages_link_to_the_list_instead_of_naming_the_built_ins():
    for page in ("README.md", "docs/stages.md", "examples/fourm-kfp-tiny-depth/README.md"):
        text = (REPO / page).read_text()
        assert "teachers.md#the-labelers" in text, page
        assert "`canny_edge`, `color_palette`" not in text, f"{page} lists the built-in labelers again"
