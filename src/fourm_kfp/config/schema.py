"""Typed, validated config dataclasses: loading from plain dicts, field metadata, versioned views.

Every config is a frozen dataclass whose fields are declared with :func:`option`: a default, a one-line doc, an
optional range or choice set, and whether the field is *versioned* (changes the stage's output, and therefore its
content address) or not (worker counts, logging intervals). :func:`from_dict` builds a dataclass from YAML data and
rejects unknown keys (suggesting the closest known one), wrong types and out-of-range values with a
:class:`ConfigError` naming the key and the file.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from typing import Any, Literal, TypeVar, get_args, get_origin

from fourm_kfp.errors import UserError

T = TypeVar("T")


class ConfigError(UserError, ValueError):
    """A config value is wrong; the message names the key and where it came from (file or override)."""


def option(default: Any = dataclasses.MISSING, doc: str = "", *, versioned: bool = True,
           min: float | None = None, max: float | None = None, choices: tuple | None = None,
           omit_at_default: bool = False) -> Any:
    """Declare a config field. Mutable defaults (lists, dicts) are copied per instance.

    ``omit_at_default``: a versioned field added to a section that addressed outputs already: at its default (which
    must do what the code did before the field existed) it is left out of the content address, so adding it moved
    no address; set to anything else, it is addressed like every versioned field."""
    metadata = {"doc": doc, "versioned": versioned, "min": min, "max": max, "choices": choices,
                "omit_at_default": omit_at_default}
    if isinstance(default, (list, dict)):
        return dataclasses.field(default_factory=lambda: type(default)(default), metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def did_you_mean(name: str, known: typing.Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` for the known name closest to a mistyped ``name``, else ``""``."""
    close = difflib.get_close_matches(name, list(known), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _coerce(value: Any, tp: Any, where: str) -> Any:
    """Check ``value`` against the annotation ``tp``; return it converted (lists → tuples, dicts → dataclasses)."""
    origin, args = get_origin(tp), get_args(tp)
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(value, arg, where)
            except ConfigError as exc:
                errors.append(str(exc))
        raise ConfigError(errors[0] if len(errors) == 1 else f"{where}: expected {_type_name(tp)}, got {value!r}")
    if origin is Literal:
        if value not in args:
            raise ConfigError(f"{where}: expected one of {list(args)}, got {value!r}")
        return value
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a mapping for {tp.__name__}, got {type(value).__name__}")
        return from_dict(tp, value, where)
    if origin in (tuple, list):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where}: expected a list, got {type(value).__name__} {value!r}")
        item_type = args[0] if args else Any
        return tuple(_coerce(v, item_type, f"{where}[{i}]") for i, v in enumerate(value))
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a mapping, got {type(value).__name__} {value!r}")
        key_type, value_type = args or (Any, Any)
        return {_coerce(k, key_type, f"{where}") : _coerce(v, value_type, f"{where}.{k}") for k, v in value.items()}
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: expected true/false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where}: expected an integer, got {type(value).__name__} {value!r}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{where}: expected a number, got {type(value).__name__} {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{where}: expected a string, got {type(value).__name__} {value!r}")
        return value
    raise TypeError(f"{where}: unsupported config annotation {tp!r}")


def _check_range(value: Any, meta: dict, where: str) -> None:
    values = value if isinstance(value, tuple) else (value,)
    for v in values:
        if meta.get("choices") is not None and v not in meta["choices"]:
            raise ConfigError(f"{where}: {v!r} is not one of {list(meta['choices'])}")
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            if meta.get("min") is not None and v < meta["min"]:
                raise ConfigError(f"{where}: {v} is below the minimum {meta['min']}")
            if meta.get("max") is not None and v > meta["max"]:
                raise ConfigError(f"{where}: {v} is above the maximum {meta['max']}")


def from_dict(cls: type[T], data: dict, where: str) -> T:
    """Build the dataclass ``cls`` from ``data``; ``where`` prefixes every error (e.g. ``"data.yaml: data"``)."""
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        named = ", ".join(f"{key!r}{did_you_mean(key, fields)}" for key in unknown)
        raise ConfigError(f"{where}: unknown key(s) {named}; known: {', '.join(fields)}")
    kwargs = {}
    for name, field in fields.items():
        key_where = f"{where}.{name}"
        if name not in data:
            if field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING:
                raise ConfigError(f"{key_where}: required key is missing")
            continue
        value = _coerce(data[name], hints[name], key_where)
        _check_range(value, field.metadata, key_where)
        kwargs[name] = value
    try:
        return cls(**kwargs)
    except (ValueError, TypeError) as exc:  # cross-field checks in __post_init__
        raise ConfigError(f"{where}: {exc}") from None


def to_dict(obj: Any) -> Any:
    """A plain, JSON/YAML-serialisable copy (tuples become lists)."""
    if dataclasses.is_dataclass(obj):
        return {f.name: to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, (list, tuple)):
        return [to_dict(v) for v in obj]
    if isinstance(obj, dict):
        return {k: to_dict(v) for k, v in obj.items()}
    return obj


def _at_default(f: dataclasses.Field, value: Any) -> bool:
    default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
    return to_dict(value) == to_dict(default)


def versioned_dict(obj: Any) -> Any:
    """Like :func:`to_dict` but keeps only the fields declared ``versioned`` (recursively), less those declared
    ``omit_at_default`` that are at their default."""
    if dataclasses.is_dataclass(obj):
        return {
            f.name: versioned_dict(getattr(obj, f.name))
            for f in dataclasses.fields(obj)
            if f.metadata.get("versioned", True)
            and not (f.metadata.get("omit_at_default") and _at_default(f, getattr(obj, f.name)))
        }
    return to_dict(obj)


@dataclasses.dataclass(frozen=True)
class FieldDescription:
    """One config field as ``fourm-kfp config --describe`` lists it."""

    key: str  #: dotted, e.g. ``data.image_size``
    type: str
    choices: tuple  #: the accepted values (a ``Literal`` or ``choices=``), else empty
    default: str  #: as JSON (a YAML subset) writes it, or ``(required)``
    doc: str


def _choices(tp: Any, meta: typing.Mapping[str, Any]) -> tuple:
    if meta.get("choices") is not None:
        return tuple(meta["choices"])
    if get_origin(tp) is Literal:
        return get_args(tp)
    if get_origin(tp) in (typing.Union, types.UnionType):
        return tuple(c for arg in get_args(tp) for c in _choices(arg, {}))
    return ()


def _default_text(f: dataclasses.Field) -> str:
    import json

    if f.default_factory is not dataclasses.MISSING:
        return json.dumps(to_dict(f.default_factory()))
    if f.default is dataclasses.MISSING:
        return "(required)"
    return json.dumps(to_dict(f.default))


def describe(cls: type, prefix: str = "") -> list[FieldDescription]:
    """Every field of the config class ``cls``, recursively (a nested class's fields under its dotted key): its
    type, accepted values, default and doc."""
    rows = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        key = f"{prefix}{f.name}"
        if dataclasses.is_dataclass(hints[f.name]):
            rows += describe(hints[f.name], f"{key}.")
        else:
            rows.append(FieldDescription(key, _type_name(hints[f.name]), _choices(hints[f.name], f.metadata),
                                         _default_text(f), f.metadata.get("doc", "")))
    return rows
