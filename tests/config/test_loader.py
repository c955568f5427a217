"""Config loading: presets, linked files, overrides, and errors that name the key and the file."""

from __future__ import annotations

import dataclasses
import json
import shutil
import typing

from pathlib import Path

import pytest

from fourm_kfp.config.loader import PRESETS_DIR, available_presets, load_config
from fourm_kfp.config.schema import ConfigError, to_dict


def test_presets_load_and_differ_in_scale():
    assert {"smoke", "demo", "4m-b"} <= set(available_presets())
    smoke, demo, base = (load_config(p) for p in ("smoke", "demo", "4m-b"))
    assert smoke.data.image_size == demo.data.image_size == 64
    assert base.data.image_size == 224
    assert smoke.prepare_data.num_train < demo.prepare_data.num_train < base.prepare_data.num_train
    assert (base.train.model.encoder_layers, base.train.model.dim, base.train.model.heads) == (12, 768, 12)
    assert (base.train.input_budget, base.train.target_budget) == (128, 128)
    assert [c.name for c in smoke.alphas.mixture] == ["all-to-all", "rgb-to-all"]


@pytest.mark.parametrize("preset", available_presets())
def test_every_preset_loads_and_one_that_draws_a_curve_has_snapshots_for_it(preset):
    config = load_config(preset)
    assert config.preset == preset
    if config.evaluate.curve_samples:  # scores against steps need weights from before the last step
        assert 0 < config.train.snapshot_every < config.train.steps


def test_overrides_beat_files_and_are_typed():
    config = load_config("smoke", overrides=["data.image_size=96", "train.model.dim=128",
                                              "prepare_data.max_bad_fraction=0.5"])
    assert config.data.image_size == 96
    assert config.train.model.dim == 128
    assert config.prepare_data.max_bad_fraction == 0.5


def test_config_is_frozen_and_round_trips_to_plain_data():
    config = load_config("smoke")
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.data.image_size = 32
    plain = to_dict(config)
    assert plain["data"]["modalities"][0] == "rgb"
    assert plain["alphas"]["mixture"][1]["input_alphas"] == {"rgb": 1.0}


@pytest.mark.parametrize("override, message", [
    ("data.image_size=abc", "data.image_size: expected an integer, got str 'abc'"),
    ("data.image_sz=3", "unknown key(s) 'image_sz'"),
    ("data.image_size=8", "data.image_size: 8 is below the minimum 16"),
    ("prepare_data.max_bad_fraction=1.5", "prepare_data.max_bad_fraction: 1.5 is above the maximum 1.0"),
    ("prepare_data.source=s3", "prepare_data.source: 's3' is not one of ['synthetic', 'image_folder', 'webdataset']"),
    ("prepare_data.source=image_folder", "source_uri is required"),
    ("train.model.heads=5", "not divisible by model.heads=5"),
    ("data.modalities=[rgb,sound]", "unknown modalities ['sound']"),
    ("nope.x=1", "unknown section 'nope'"),
    ("image_size=3", "expected SECTION.KEY=VALUE"),
])
def test_bad_overrides_name_the_override_and_key(override, message):
    with pytest.raises(ConfigError) as err:
        load_config("smoke", overrides=[override])
    assert message in str(err.value)
    if "." in override.split("=")[0] and not override.startswith("nope"):
        assert f"override {override!r}" in str(err.value)


def test_errors_in_files_name_the_file(tmp_path):
    folder = tmp_path / "cfg"
    shutil.copytree(PRESETS_DIR / "smoke", folder)
    data = folder / "data.yaml"
    data.write_text(data.read_text().replace("image_size: 64", "image_size: 64.5"))
    with pytest.raises(ConfigError) as err:
        load_config(config_dir=folder)
    assert str(data) in str(err.value) and "data.image_size: expected an integer" in str(err.value)

    data.write_text("image_size: [unclosed")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(config_dir=folder)


def test_linked_files_are_followed(tmp_path):
    folder = tmp_path / "cfg"
    shutil.copytree(PRESETS_DIR / "smoke", folder)
    (folder / "data.yaml").rename(folder / "my_data.yaml")
    train = folder / "train.yaml"
    train.write_text(train.read_text().replace("data: data.yaml", "data: my_data.yaml"))
    assert load_config(config_dir=folder).data.image_size == 64
    train.write_text(train.read_text().replace("data: my_data.yaml", "data: missing.yaml"))
    with pytest.raises(ConfigError, match="missing.yaml: config file not found"):
        load_config(config_dir=folder)


def test_cross_file_checks_name_both_files(tmp_path):
    folder = tmp_path / "cfg"
    shutil.copytree(PRESETS_DIR / "smoke", folder)
    with pytest.raises(ConfigError) as err:
        load_config(config_dir=folder, overrides=["data.input_modalities=[depth]"])
    assert "no input modality left" in str(err.value) and "alphas.yaml" in str(err.value)


def test_modalities_the_data_lacks_get_no_budget():
    """The README's real-data recipe: rgb + caption only; the preset's alphas name five more modalities."""
    only = "[rgb,caption]"
    config = load_config("demo", overrides=[f"data.modalities={only}", f"data.input_modalities={only}",
                                            f"data.target_modalities={only}"])
    for component in config.alphas.mixture:
        assert set(component.input_alphas) <= {"rgb", "caption"}
        assert set(component.target_alphas) <= {"rgb", "caption"}
    assert [c.name for c in config.alphas.mixture] == ["all-to-all", "rgb-to-all"]


def test_unknown_preset_lists_the_available_ones():
    with pytest.raises(ConfigError, match="unknown preset 'huge'.*smoke"):
        load_config("huge")


@pytest.mark.parametrize("mistyped, where", [
    ("smok", "preset"),  # --preset
    ("dta.image_size=96", "section"),  # --set: the section
    ("data.imagesize=96", "key"),  # --set: a key of a section
    ("train.model.encoder_layer=2", "key"),  # a key of a nested section
    ("train_tokenizers.image.architectur=vit", "key"),
])
def test_a_mistyped_name_gets_the_closest_known_one(mistyped, where):
    """The suggestion is the known name difflib finds closest; a name far from any gets none."""
    import difflib

    from fourm_kfp.config.fourm_config import SECTIONS

    known = {"preset": available_presets(), "section": list(SECTIONS)}
    name = mistyped if where == "preset" else mistyped.split("=")[0].split(".")[0 if where == "section" else -1]
    if where == "key":
        cls = SECTIONS[mistyped.split(".")[0]]
        for part in mistyped.split("=")[0].split(".")[1:-1]:
            cls = typing.get_type_hints(cls)[part]
        known["key"] = [f.name for f in dataclasses.fields(cls)]
    expected = difflib.get_close_matches(name, known[where], n=1)
    assert expected and expected[0] != name
    with pytest.raises(ConfigError) as err:
        load_config(mistyped) if where == "preset" else load_config("smoke", overrides=[mistyped])
    assert f"{name!r} (did you mean {expected[0]!r}?)" in str(err.value)
    with pytest.raises(ConfigError) as err:  # nothing close: no suggestion
        load_config("zzzzzz") if where == "preset" else load_config("smoke", overrides=[
            mistyped.replace(name, "zzzzzz", 1) if where == "section" else mistyped.replace(name + "=", "zzzzzz=")])
    assert "did you mean" not in str(err.value)


def _external_sources(preset: str, folder: Path) -> list[str]:
    """Overrides pointing a preset's outside files (``finetune-4m``'s ml-4m model and tokenizers) at stand-ins, which
    the addresses read (their listing and digest); ``photos-4m21``'s teacher folders (relative to the working
    directory, which the caller makes ``folder``) made as stand-ins."""
    from fourm_kfp.tokenizers.text_tokenizer import save_text_tokenizer, train_text_tokenizer

    config = load_config(preset)
    overrides = []
    for entry in config.label.labelers:
        if entry.source:
            (folder / entry.weights).mkdir(parents=True)
            (folder / entry.weights / "config.json").write_text('{"model_type": "stand-in"}')
    if config.train.init_from:
        (folder / "ml4m").mkdir()
        (folder / "ml4m" / "config.json").write_text('{"domains_in": []}')
        overrides.append(f"train.init_from={folder / 'ml4m'}")
    if config.train_tokenizers.text_tokenizer_from:
        save_text_tokenizer(train_text_tokenizer(["a red cube", "a blue ball"], 64, 4), folder / "text.json")
        overrides.append(f"train_tokenizers.text_tokenizer_from={folder / 'text.json'}")
    for modality in config.train_tokenizers.from_ml4m:  # ml-4m tokenizer folders: the address reads their digests
        stand_in = folder / "ml4m_tokenizers" / modality
        stand_in.mkdir(parents=True)
        (stand_in / "config.json").write_text(json.dumps({"codebook_size": 8}))
        (stand_in / "model.safetensors").write_bytes(modality.encode())
        overrides.append(f"train_tokenizers.from_ml4m.{modality}={stand_in}")
    return overrides


@pytest.mark.parametrize("preset", available_presets())
def test_pinned_overrides_rebuild_the_config_and_its_addresses(preset, tmp_path, monkeypatch):
    from fourm_kfp.config.loader import pinned_overrides

    monkeypatch.chdir(tmp_path)
    from fourm_kfp.contract.addressing import stage_address
    from fourm_kfp.stages import STAGES

    # a float PyYAML would read back as text if written as JSON writes it (1e-08), a string YAML would split
    config = load_config(preset, overrides=["train.optimizer.base_lr=1.0e-8", "evaluate.gate.model_name='m: v2'",
                                            *_external_sources(preset, tmp_path)])
    again = load_config(preset, overrides=pinned_overrides(config))
    assert again == config
    assert [stage_address(s, again) for s in STAGES.values()] == [stage_address(s, config) for s in STAGES.values()]


def test_pinned_overrides_beat_an_older_preset(tmp_path):
    """The pods' image may hold an older preset: the submitter's pinned config is what they load."""
    from fourm_kfp.config.loader import pinned_overrides

    submitted = load_config("smoke", overrides=["train.steps=7"])
    old = tmp_path / "smoke"
    shutil.copytree(PRESETS_DIR / "smoke", old)
    train = old / "train.yaml"
    train.write_text(train.read_text().replace("steps: 2", "steps: 3"))
    assert load_config(config_dir=old).train.steps == 3
    in_pod = load_config(config_dir=old, overrides=pinned_overrides(submitted))
    assert to_dict(dataclasses.replace(in_pod, preset="smoke")) == to_dict(submitted)
