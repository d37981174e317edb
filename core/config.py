"""Strict loading of TOML files and dicts into frozen dataclasses.

Unknown keys are rejected with the closest valid key suggested (``difflib``); values keep their
TOML types (no lax coercion: the string "4" is not the integer 4). ``--set a.b=value`` overrides
go through :func:`apply_overrides`, so the rules are the same from a file and from the command line.

Examples
--------
>>> from dataclasses import dataclass
>>> @dataclass(frozen=True, kw_only=True)
... class Link:
...     latency_s: float = 0.0
...     bandwidth_bytes_per_s: float = 1e9
>>> load_dataclass(Link, {"latency_s": 1e-6}, where="link")
Link(latency_s=1e-06, bandwidth_bytes_per_s=1000000000.0)
>>> load_dataclass(Link, {"latncy_s": 1e-6}, where="link")
Traceback (most recent call last):
...
psgdlab.core.errors.ConfigError: link: unknown key 'latncy_s'; did you mean 'latency_s'?
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import tomllib
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

from psgdlab.core.errors import ConfigError

__all__ = ["load_toml", "load_dataclass", "check_keys", "apply_overrides", "closest"]

T = TypeVar("T")


def closest(key: str, known: typing.Iterable[str]) -> str:
    """``"; did you mean 'x'?"`` for the closest known key, or ``""``."""
    match = difflib.get_close_matches(key, list(known), n=1, cutoff=0.6)
    return f"; did you mean {match[0]!r}?" if match else ""


def check_keys(data: Mapping[str, Any], known: typing.Iterable[str], *, where: str) -> None:
    known = list(known)
    for key in data:
        if key not in known:
            raise ConfigError(f"{where}: unknown key {key!r}{closest(key, known)}")


def load_toml(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a TOML file; a missing or malformed file is a one-line :class:`ConfigError`."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist")
    try:
        with open(path, "rb") as fh:
            return tomllib.load(fh)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None


def load_dataclass(cls: type[T], data: Mapping[str, Any], *, where: str) -> T:
    """Build ``cls`` from ``data`` strictly: unknown keys rejected, nested dataclasses built
    recursively, ints accepted for float fields, lists turned into tuples."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"{where}: expected a table, got {type(data).__name__}")
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}  # type: ignore[arg-type]
    check_keys(data, fields, where=where)
    hints = typing.get_type_hints(cls)
    kwargs = {name: _convert(hints.get(name, Any), value, where=f"{where}.{name}") for name, value in data.items()}
    try:
        return cls(**kwargs)
    except TypeError as exc:
        raise ConfigError(f"{where}: {exc}") from None


def _convert(hint: Any, value: Any, *, where: str) -> Any:
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if dataclasses.is_dataclass(hint) and isinstance(value, Mapping):
        return load_dataclass(hint, value, where=where)  # type: ignore[arg-type]
    if origin is tuple and isinstance(value, list):
        inner = args[0] if args else Any
        return tuple(_convert(inner, v, where=f"{where}[{i}]") for i, v in enumerate(value))
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        for arg in args:
            if isinstance(arg, type) and dataclasses.is_dataclass(arg) and isinstance(value, Mapping):
                return load_dataclass(arg, value, where=where)
        if float in args and isinstance(value, int) and not isinstance(value, bool):
            return float(value)
    if hint in (int, float, str, bool):
        ok = isinstance(value, hint) and not (hint is int and isinstance(value, bool))
        if not ok:
            raise ConfigError(f"{where} ({value!r}) must be of type {hint.__name__}")
    return value


def apply_overrides(data: dict[str, Any], overrides: typing.Sequence[str]) -> dict[str, Any]:
    """Apply ``a.b=value`` overrides (value parsed as a TOML value, bare words as strings)."""
    out = _deep_copy(data)
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} must look like key.sub=value")
        key, raw = item.split("=", 1)
        try:
            value = tomllib.loads(f"v = {raw}")["v"]
        except tomllib.TOMLDecodeError:
            value = raw
        node = out
        parts = key.strip().split(".")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override {item!r}: {p!r} is not a table")
        node[parts[-1]] = value
    return out


def _deep_copy(data: Mapping[str, Any]) -> dict[str, Any]:
    return {k: _deep_copy(v) if isinstance(v, Mapping) else v for k, v in data.items()}
