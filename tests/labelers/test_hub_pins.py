"""Every hub commit a preset pins is sourced: each preset's hub address (a labeler's ``source`` or ``hf://``
weights) is a full 40-hex commit with a public trace recorded in fourm_kfp.labelers.hub_pins, every record is a pin
some preset uses, ``fourm-kfp teachers`` prints where each was seen, and docs/usage.md names each commit with its
trace."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from fourm_kfp.config.loader import available_presets, load_config
from fourm_kfp.labelers.base import LabelerError
from fourm_kfp.labelers.hub_pins import PIN_SOURCES, hub_addresses, pin_source

DOCS = Path(__file__).resolve().parents[2] / "docs" / "usage.md"


def _pins() -> dict[str, list[str]]:
    """Each hub address any preset names → the presets' entries naming it."""
    found: dict[str, list[str]] = {}
    for preset in available_presets():
        for i, entry in enumerate(load_config(preset).label.labelers):
            for uri in hub_addresses(entry.weights, entry.source):
                found.setdefault(uri, []).append(f"{preset}: label.labelers[{i}]")
    return found


def test_every_preset_pins_full_commits_each_with_a_recorded_public_trace():
    pins = _pins()
    assert len(pins) >= 6  # photos-4m21's teachers at least
    for uri, where in pins.items():
        assert re.fullmatch(r"hf://[\w.-]+/[\w.-]+@[0-9a-f]{40}", uri), where
        seen = pin_source(uri, where[0])
        assert seen is not None and seen.where and seen.what, f"{where}: {uri} has no recorded public trace"
    # No record outlives its pin: each one is a commit some preset uses.
    assert {f"hf://{key}" for key in PIN_SOURCES} == set(pins)


def test_the_teachers_command_prints_where_each_pinned_commit_was_seen(tmp_path, monkeypatch, capsys):
    from fourm_kfp.cli import main

    monkeypatch.chdir(tmp_path)
    main(["teachers", "--preset", "photos-4m21"])
    printed = capsys.readouterr().out
    for entry in load_config("photos-4m21").label.labelers:
        for uri in hub_addresses(entry.weights, entry.source):
            seen = pin_source(uri, "test")
            assert f"pinned {uri}\n" in printed and f"seen in {seen.where}: {seen.what}\n" in printed


def test_a_commit_without_a_trace_is_said_so_and_a_branch_is_refused_naming_the_entry(tmp_path, monkeypatch, capsys):
    from fourm_kfp.cli import main

    monkeypatch.chdir(tmp_path)
    unrecorded = "hf://someone/some-depth@" + "0" * 40
    labelers = f"label.labelers=[{{name: hf_depth, weights: models/d, source: '{unrecorded}'}}]"
    assert main(["teachers", "--preset", "photos-4m21", "--set", labelers]) == 1  # the folder is missing
    printed = capsys.readouterr().out
    assert f"pinned {unrecorded}\n" in printed and "no public trace of this commit is recorded" in printed
    with pytest.raises(LabelerError, match=r"label.labelers\[2\]: .*40-hex commit"):
        pin_source("hf://someone/some-depth@main", "label.labelers[2]")


def test_the_docs_name_each_pinned_commit_with_where_it_was_seen():
    rows = [line for line in DOCS.read_text().splitlines() if line.startswith("| `")]
    for key, seen in PIN_SOURCES.items():
        repo, commit = key.split("@")
        [row] = [r for r in rows if commit in r]
        assert f"`{repo}`" in row and seen.where.split()[0] in row, row
