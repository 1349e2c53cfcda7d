"""Typed configuration: frozen dataclasses loaded from YAML with dotted overrides.

    cfg = load(RunConfig, "configs/local.yaml", ["trainer.optimizer.lr=1e-6"])

Rules (levanter-style):
- Every section is a frozen dataclass; unknown keys, wrong types and missing required
  fields are errors (`ConfigError`) naming the file, the dotted key and the reason.
- Ranges are declared next to the field with `bounded(default, ge=..., lt=...)`; a
  dataclass's `__post_init__` may raise ValueError for cross-field rules.
- Variants: a field typed as a union of dataclasses is chosen by the `type:` key, which
  each variant declares as `type: Literal["name"] = "name"`.
- Supported leaf types: bool, int, float (ints accepted), str, Literal, Optional,
  tuple[X, ...], tuple[X, Y], dict[str, X]. Bools are never coerced from numbers.
"""

from __future__ import annotations

import dataclasses
import logging
import re
import types
import typing
from pathlib import Path
from typing import Any, Literal, TypeVar, Union

import yaml

T = TypeVar("T")
log = logging.getLogger(__name__)
_RANGE = "dart_jax.range"


class _Loader(yaml.SafeLoader):
    """YAML 1.1 reads `1e-6` (no dot) as a string; resolve it as a float, as YAML 1.2 does."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"))


def _yaml(text: str) -> Any:
    return yaml.load(text, Loader=_Loader)


class UsageError(ValueError):
    """A problem with what a user gave a command (a config, a path, an id, a value), told in
    one line; the command exits with code 2."""


class ConfigError(UsageError):
    """A config problem, rendered on one line as `source: key: reason`."""

    def __init__(self, source: str, key: str, reason: str):
        super().__init__(f"{source}: {key or '<root>'}: {reason}")
        self.source, self.key, self.reason = source, key, reason


def bounded(default: Any = dataclasses.MISSING, *, ge: float | None = None,
            gt: float | None = None, le: float | None = None, lt: float | None = None) -> Any:
    """A dataclass field whose numeric value must lie in the given range."""
    return dataclasses.field(default=default, metadata={_RANGE: (ge, gt, le, lt)})


def load(cls: type[T], path: str | Path, overrides: typing.Sequence[str] = ()) -> T:
    """Read `path` (YAML), apply `key.sub=value` overrides, build and validate `cls`."""
    source = str(path)
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise ConfigError(source, "", f"cannot read config file ({e.strerror})") from None
    try:
        data = _yaml(text)
    except yaml.YAMLError as e:
        raise ConfigError(source, "", f"invalid YAML: {e}".replace("\n", " ")) from None
    if data is None:
        data = {}
    data = apply_overrides(data, overrides, source)
    return from_dict(cls, data, source)


def apply_overrides(data: Any, overrides: typing.Sequence[str], source: str) -> dict:
    """Set each dotted `a.b.c=value` (value parsed as YAML) in a copy of `data`."""
    if not isinstance(data, dict):
        raise ConfigError(source, "", f"top level must be a mapping, got {type(data).__name__}")
    data = _deep_copy(data)
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError("override", item, "expected KEY=VALUE with a dotted KEY")
        node = data
        parts = key.strip().split(".")
        for i, part in enumerate(parts[:-1]):
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError("override", ".".join(parts[: i + 1]), "is not a section")
            node = child
        try:
            node[parts[-1]] = _yaml(raw)
        except yaml.YAMLError:
            raise ConfigError("override", key, f"cannot parse value {raw!r}") from None
    return data


def from_dict(cls: type[T], data: Any, source: str = "<dict>", key: str = "") -> T:
    """Build dataclass `cls` from plain data, checking every key, type and range."""
    return _build(cls, data, source, key)


def to_dict(obj: Any) -> Any:
    """Plain data (dicts, lists, scalars) for a config, suitable for YAML."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, tuple):
        return [to_dict(v) for v in obj]
    if isinstance(obj, dict):
        return {k: to_dict(v) for k, v in obj.items()}
    return obj


def dump(obj: Any) -> str:
    """The config as YAML text (key order as declared)."""
    return yaml.safe_dump(to_dict(obj), sort_keys=False)


def _build(tp: Any, value: Any, source: str, key: str) -> Any:
    if dataclasses.is_dataclass(tp):
        return _build_dataclass(tp, value, source, key)
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (Union, types.UnionType):
        return _build_union(args, value, source, key)
    if origin is Literal:
        if value not in args:
            raise ConfigError(source, key, f"must be one of {list(args)}, got {value!r}")
        return value
    if origin is tuple:
        return _build_tuple(args, value, source, key)
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(source, key, f"expected a mapping, got {_kind(value)}")
        return {str(k): _build(args[1], v, source, f"{key}.{k}") for k, v in value.items()}
    return _build_scalar(tp, value, source, key)


def _build_scalar(tp: Any, value: Any, source: str, key: str) -> Any:
    if tp is Any:
        return value
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if tp in (bool, int, float, str) and type(value) is tp:
        return value
    if tp in (bool, int, float, str):
        raise ConfigError(source, key, f"expected {tp.__name__}, got {_kind(value)}")
    raise TypeError(f"config field {key} has unsupported type {tp!r}")


def _build_tuple(args: tuple, value: Any, source: str, key: str) -> tuple:
    if not isinstance(value, (list, tuple)):
        raise ConfigError(source, key, f"expected a list, got {_kind(value)}")
    if len(args) == 2 and args[1] is Ellipsis:
        return tuple(_build(args[0], v, source, f"{key}[{i}]") for i, v in enumerate(value))
    if len(value) != len(args):
        raise ConfigError(source, key, f"expected {len(args)} items, got {len(value)}")
    return tuple(_build(a, v, source, f"{key}[{i}]") for i, (a, v) in enumerate(zip(args, value)))


def _build_union(args: tuple, value: Any, source: str, key: str) -> Any:
    if value is None:
        if type(None) in args:
            return None
        raise ConfigError(source, key, "must not be null")
    options = [a for a in args if a is not type(None)]
    if len(options) == 1:
        return _build(options[0], value, source, key)
    variants = {_variant_name(a): a for a in options if dataclasses.is_dataclass(a)}
    if len(variants) != len(options):
        raise TypeError(f"config field {key}: unions must be Optional[X] or dataclass variants")
    if not isinstance(value, dict) or "type" not in value:
        raise ConfigError(source, key, f"needs a 'type:' key, one of {sorted(variants)}")
    if value["type"] not in variants:
        raise ConfigError(source, f"{key}.type",
                          f"must be one of {sorted(variants)}, got {value['type']!r}")
    return _build(variants[value["type"]], value, source, key)


def _variant_name(cls: type) -> str:
    default = {f.name: f.default for f in dataclasses.fields(cls)}.get("type")
    if not isinstance(default, str):
        raise TypeError(f"variant {cls.__name__} needs a `type: Literal[...]` default")
    return default


def _build_dataclass(cls: type, value: Any, source: str, key: str) -> Any:
    if not isinstance(value, dict):
        raise ConfigError(source, key, f"expected a mapping, got {_kind(value)}")
    value = _renamed(cls, value, source, key)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(map(str, value)) - set(fields))
    if unknown:
        raise ConfigError(source, _join(key, unknown[0]),
                          f"unknown key (known: {', '.join(sorted(fields))})")
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for name, f in fields.items():
        sub = _join(key, name)
        if name in value:
            kwargs[name] = _build(hints[name], _with_default_type(f, value[name]), source, sub)
            _check_range(f, kwargs[name], source, sub)
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise ConfigError(source, sub, "required key is missing")
    try:
        return cls(**kwargs)
    except (ValueError, TypeError) as e:
        raise ConfigError(source, key, str(e)) from None


def _renamed(cls: type, value: dict, source: str, key: str) -> dict:
    """`value` with the keys a section renamed (its `RENAMED` class attribute, old -> new)
    under their new names, and the keys of a section folded into another (`FOLDED`, old
    section -> new) in that one; each old name found is logged once as deprecated."""
    renamed, folded = getattr(cls, "RENAMED", {}), getattr(cls, "FOLDED", {})
    if not any(old in value for old in (*renamed, *folded)):
        return value
    value = dict(value)
    for old, new in renamed.items():
        if old in value:
            _deprecated(new in value, source, _join(key, old), _join(key, new))
            value[new] = value.pop(old)
    for old, new in folded.items():
        if old not in value:
            continue
        moved, into = value.pop(old), value.get(new, {})
        for name, section in ((old, moved), (new, into)):
            if not isinstance(section, dict):
                raise ConfigError(source, _join(key, name), f"expected a mapping, got {_kind(section)}")
        into = dict(into)
        for name, v in moved.items():
            _deprecated(name in into, source, _join(key, f"{old}.{name}"), _join(key, f"{new}.{name}"))
            into[name] = v
        value[new] = into
    return value


def _deprecated(clash: bool, source: str, old: str, new: str) -> None:
    if clash:
        raise ConfigError(source, old, f"renamed to `{new}`, which is also set: keep one")
    log.warning("%s: `%s` is deprecated: it is now `%s`", source, old, new)


def _with_default_type(f: dataclasses.Field, value: Any) -> Any:
    """A variant section written without `type:` keeps the field default's variant."""
    if not isinstance(value, dict) or "type" in value:
        return value
    default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
    variant = getattr(default, "type", None) if dataclasses.is_dataclass(default) else None
    return {"type": variant, **value} if isinstance(variant, str) else value


def _check_range(f: dataclasses.Field, value: Any, source: str, key: str) -> None:
    if _RANGE not in f.metadata or value is None:
        return
    ge, gt, le, lt = f.metadata[_RANGE]
    for bound, ok, word in ((ge, lambda b: value >= b, ">="), (gt, lambda b: value > b, ">"),
                            (le, lambda b: value <= b, "<="), (lt, lambda b: value < b, "<")):
        if bound is not None and not ok(bound):
            raise ConfigError(source, key, f"must be {word} {bound}, got {value!r}")


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def _kind(value: Any) -> str:
    return "null" if value is None else f"{type(value).__name__} {value!r}"[:80]


def _deep_copy(data: Any) -> Any:
    if isinstance(data, dict):
        return {k: _deep_copy(v) for k, v in data.items()}
    if isinstance(data, list):
        return [_deep_copy(v) for v in data]
    return data
