"""The ``photos-4m21`` preset, 4M-21's recipe: its teachers are transformers networks in folders under models/, each
pinned by a hub commit; a missing folder fails naming the config field and giving the command that fetches it, and
that command is one huggingface_hub's own ``hf`` CLI accepts."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from fourm_kfp.config.loader import load_config
from fourm_kfp.labelers.base import LabelBatch, LabelerError
from fourm_kfp.labelers.registry import build_labeler, labeler_class
from fourm_kfp.stages.label import labelers_fingerprint
from tests.teacher_models import save_teacher

PRESET = "photos-4m21"


def _folder_entries(config):
    return [(i, e) for i, e in enumerate(config.label.labelers) if labeler_class(e.name).weights_kind == "folder"]


def test_the_real_recipe_names_4m21s_teachers_in_model_folders_pinned_to_hub_commits():
    config = load_config(PRESET)
    names = [e.name for e in config.label.labelers]
    assert {"hf_depth", "normal_from_depth", "hf_semseg", "hf_det", "hf_caption"} <= set(names)
    assert names.index("hf_depth") < names.index("normal_from_depth")  # it reads the depth labels
    for _, entry in _folder_entries(config):
        assert entry.weights.startswith("models/"), entry
        assert re.fullmatch(r"hf://[\w.-]+/[\w.-]+@[0-9a-f]{40}", entry.source), entry
    assert dict(config.label.labelers[names.index("hf_det")].params) == {"threshold": 0.6}  # 4M-21's score floor
    # No labeler is the self-trained demo model here: that one only shows the path working end to end.
    assert "fourm_model" not in names


def test_a_missing_teacher_folder_fails_naming_the_field_and_giving_the_command_that_fetches_it(tmp_path,
                                                                                                monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = load_config(PRESET)
    [(index, entry), *_] = _folder_entries(config)
    with pytest.raises(LabelerError) as failure:
        labelers_fingerprint(config)
    message = str(failure.value)
    assert f"label.labelers[{index}].weights: the model folder {entry.weights} does not exist" in message
    command = message.split("fetch it with:\n", 1)[1].strip()
    repo, commit = entry.source[len("hf://"):].split("@")
    assert command.startswith(f"hf download {repo} --revision {commit} ") and command.endswith(
        f"--local-dir {entry.weights}")
    # The hf CLI accepts the command as written: offline, its dry run gets as far as asking the hub for that commit.
    hf = Path(sys.executable).with_name("hf")
    argv = [str(hf), *shlex.split(command)[1:], "--dry-run"]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"}, cwd=tmp_path)
    assert proc.returncode == 1 and "No such option" not in proc.stderr, proc.stderr[-2000:]
    assert f"tree/{commit}" in proc.stderr and "offline mode is enabled" in proc.stderr


def test_with_its_folders_in_place_the_recipes_teachers_label_a_photo(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = load_config(PRESET)
    for _, entry in _folder_entries(config):  # tiny random-weight stand-ins of the same families
        save_teacher(entry.name, tmp_path / entry.weights, 64)
    assert labelers_fingerprint(config).startswith("sha256:")
    photo = (np.indices((64, 64)).sum(0) % 255).astype(np.uint8)[..., None].repeat(3, -1)
    batch = LabelBatch(("k",), (photo,))
    made = {}
    for i, entry in enumerate(config.label.labelers):
        labeler = build_labeler(entry.name, entry.params, entry.weights, where=f"label.labelers[{i}]")
        reading = LabelBatch(batch.keys, batch.images, labels={m: (made[m],) for m in labeler.reads})
        made[labeler.modality] = labeler.label(reading)[0]
    assert made["depth"].shape == (64, 64) and made["normal"].shape == (64, 64, 3)
    assert made["semseg"].shape == (64, 64) and isinstance(made["caption"], str)


def test_the_teachers_command_lists_the_missing_folders_with_their_fetch_commands(tmp_path, monkeypatch, capsys):
    from fourm_kfp.cli import main

    monkeypatch.chdir(tmp_path)
    assert main(["teachers", "--preset", PRESET]) == 1
    printed = capsys.readouterr().out
    config = load_config(PRESET)
    for _, entry in _folder_entries(config):
        assert f"{entry.weights}  MISSING" in printed and f"--local-dir {entry.weights}\n" in printed + "\n"
    for _, entry in _folder_entries(config):
        (tmp_path / entry.weights).mkdir(parents=True)
    assert main(["teachers", "--preset", PRESET]) == 0
    assert "MISSING" not in capsys.readouterr().out
