"""A stage sees only the config it is addressed by.

A stage's output address covers the config keys its spec declares. If the stage could read any other key, a change
to that key would silently reuse a stale output. :class:`GuardedConfig` wraps the resolved config so that reading
an undeclared key raises :class:`UndeclaredConfigKeyError`, naming the key and the stage. Declaring a section
(``"prepare_data"``) allows everything in it; declaring a field (``"data.image_size"``) allows that field only.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

from fourm_kfp.config.fourm_config import FourMConfig


class UndeclaredConfigKeyError(AttributeError):
    """A stage read a config key its spec does not declare (a bug in the stage: declare the key)."""


class GuardedConfig:
    """A read-only view of ``config`` below ``path`` that allows only the ``declared`` dotted keys."""

    __slots__ = ("_node", "_declared", "_stage", "_path")

    def __init__(self, config: Any, declared: Sequence[str], stage: str, path: str = ""):
        object.__setattr__(self, "_node", config)
        object.__setattr__(self, "_declared", tuple(declared))
        object.__setattr__(self, "_stage", stage)
        object.__setattr__(self, "_path", path)

    def __getattr__(self, name: str) -> Any:
        if name == "preset" and not self._path:
            return self._node.preset  # which preset a run came from is metadata, not content
        key = f"{self._path}.{name}" if self._path else name
        if any(key == d or key.startswith(f"{d}.") for d in self._declared):
            return getattr(self._node, name)
        value = getattr(self._node, name)
        if dataclasses.is_dataclass(value):  # a section: its fields are checked one by one, by their full key
            return GuardedConfig(value, self._declared, self._stage, key)
        raise UndeclaredConfigKeyError(
            f"stage {self._stage!r} read config key {key!r}, which its spec does not declare (declared: "
            f"{', '.join(self._declared)}); add it to the stage's config_keys so its output address covers it")

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("the config is read-only")

    def __repr__(self) -> str:
        return f"GuardedConfig({self._stage!r}, {self._path or '<root>'}, declared={list(self._declared)})"


def guard(config: FourMConfig, declared: Sequence[str], stage: str) -> GuardedConfig:
    """The view of ``config`` that stage ``stage`` gets."""
    return GuardedConfig(config, declared, stage)
