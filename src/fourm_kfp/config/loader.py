"""Load a config set: a named preset or a folder of linked YAML files, plus dotted command-line overrides.

``load_config("smoke", overrides=["data.image_size=96"])`` reads ``configs/smoke/train.yaml``, follows its
``data:`` link to the data config and that file's ``alphas:`` link to the alphas config, reads the stage configs,
applies the overrides (which beat the files), and returns a frozen :class:`FourMConfig`. Any problem raises a
:class:`ConfigError` that names the key and the file (or the override) it came from.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any, Sequence

import yaml

from fourm_kfp.config.fourm_config import SECTIONS, FourMConfig
from fourm_kfp.config.schema import ConfigError, did_you_mean, from_dict

log = logging.getLogger(__name__)
PRESETS_DIR = Path(__file__).resolve().parent.parent / "configs"
#: Linked sections: section -> (section holding the link, link key).
LINKS = {"data": ("train", "data"), "alphas": ("data", "alphas")}
#: The file each other section is read from: ``<section>.yaml``.
DEFAULT_FILES = {name: f"{name}.yaml" for name in SECTIONS if name not in LINKS}
#: Sections whose file may be absent (their defaults then apply): the stage sections; ``train`` and the linked files
#: say what is trained on what, which no default can.
OPTIONAL_FILES = frozenset(DEFAULT_FILES) - {"train"}


def available_presets() -> list[str]:
    return sorted(p.name for p in PRESETS_DIR.iterdir() if (p / "train.yaml").is_file())


def preset_dir(preset: str) -> Path:
    path = PRESETS_DIR / preset
    if not (path / "train.yaml").is_file():
        presets = available_presets()
        raise ConfigError(f"unknown preset {preset!r}{did_you_mean(preset, presets)}; available presets: "
                          f"{', '.join(presets)}")
    return path


def _read_yaml(path: Path) -> dict:
    try:
        data = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{path}: config file not found") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping, got {type(data).__name__}")
    return data


def parse_override(text: str) -> tuple[list[str], Any]:
    """``"data.image_size=96"`` → ``(["data", "image_size"], 96)``; the value is parsed as YAML."""
    key, sep, raw = text.partition("=")
    parts = key.strip().split(".")
    if not sep or len(parts) < 2 or not all(parts):
        raise ConfigError(f"override {text!r}: expected SECTION.KEY=VALUE, e.g. data.image_size=96")
    if parts[0] not in SECTIONS:
        raise ConfigError(f"override {text!r}: unknown section {parts[0]!r}{did_you_mean(parts[0], SECTIONS)}; "
                          f"sections: {', '.join(SECTIONS)}")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as exc:
        raise ConfigError(f"override {text!r}: value is not valid YAML: {exc}") from None
    return parts, value


def _set_dotted(data: dict, keys: list[str], value: Any, text: str) -> None:
    node = data
    for key in keys[:-1]:
        child = node.setdefault(key, {})
        if not isinstance(child, dict):
            raise ConfigError(f"override {text!r}: {key!r} is not a mapping")
        node = child
    node[keys[-1]] = value


def _blame(message: str, overrides: list[tuple[str, list[str]]]) -> str:
    """Name the override whose key the error is about (else all overrides of the section)."""
    for text, keys in sorted(overrides, key=lambda o: -len(o[1])):
        if message.startswith(".".join(keys) + ":") or message.startswith(".".join(keys) + "["):
            return f"override {text!r}"
    if len(overrides) == 1:
        return f"override {overrides[0][0]!r}"
    return "overrides " + ", ".join(repr(text) for text, _ in overrides)


def load_config(preset: str | None = "smoke", config_dir: str | Path | None = None,
                overrides: Sequence[str] = ()) -> FourMConfig:
    """Resolve a config set (see module docstring). ``config_dir`` replaces the preset folder."""
    folder = Path(config_dir) if config_dir else preset_dir(preset or "smoke")
    parsed = [(text, *parse_override(text)) for text in overrides]
    sections: dict[str, Any] = {}
    files: dict[str, Path] = {}
    for name, cls in SECTIONS.items():
        if name in LINKS:
            holder, key = LINKS[name]
            link = getattr(sections[holder], key)
            files[name] = files[holder].parent / link
        else:
            files[name] = folder / DEFAULT_FILES[name]
        raw = {} if name in OPTIONAL_FILES and not files[name].exists() else _read_yaml(files[name])
        sections[name] = from_dict(cls, raw, f"{files[name]}: {name}")
        mine = [(text, keys) for text, keys, value in parsed if keys[0] == name]
        if mine:
            for text, keys, value in parsed:
                if keys[0] == name:
                    _set_dotted(raw, keys[1:], value, text)
            try:
                sections[name] = from_dict(cls, raw, name)
            except ConfigError as exc:
                raise ConfigError(f"{_blame(str(exc), mine)}: {exc}") from None
    try:
        sections["alphas"], notes = sections["alphas"].restricted_to(sections["data"].input_modalities,
                                                                     sections["data"].target_modalities)
        if notes:
            log.info("alphas restricted to the data's modalities: %s", "; ".join(notes))
        return FourMConfig(preset=preset if not config_dir else str(folder), **sections)
    except ValueError as exc:
        where = ", ".join(str(files[s]) for s in ("data", "alphas"))
        raise ConfigError(f"{where}: {exc}") from None


def pinned_overrides(config: FourMConfig) -> list[str]:
    """``section.key=value`` overrides that pin every value of ``config``: loaded on top of the same preset from any
    version of the package whose schema has these keys, they give this very config, whatever that version's preset
    files say. ``fourm-kfp submit`` sends them, so the pods run the config the submitter resolved (and recorded in
    the lineage) even when their image's presets differ; a key the pods' schema lacks fails there by name. The links
    between files (``train.data``, ``data.alphas``) are left out: the overrides beat whatever the links read."""
    from fourm_kfp.config.schema import to_dict

    links = {f"{holder}.{key}" for holder, key in LINKS.values()}
    pins = []
    for section in SECTIONS:
        for key, value in to_dict(getattr(config, section)).items():
            if f"{section}.{key}" not in links:
                text = yaml.safe_dump(value, default_flow_style=True, width=1 << 30, sort_keys=False)
                pins.append(f"{section}.{key}={text.removesuffix(chr(10) + '...' + chr(10)).strip()}")
    return pins


def config_from_dict(data: dict) -> FourMConfig:
    """Rebuild a resolved config from :func:`fourm_kfp.config.schema.to_dict` output (e.g. a manifest)."""
    sections = {name: from_dict(cls, data[name], f"resolved config: {name}") for name, cls in SECTIONS.items()}
    return FourMConfig(preset=data.get("preset", ""), **sections)


def replace_section(config: FourMConfig, section: str, **changes: Any) -> FourMConfig:
    """A copy of ``config`` with fields of one section replaced (used by tests and the CLI)."""
    return dataclasses.replace(config, **{section: dataclasses.replace(getattr(config, section), **changes)})
