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
import math
import os
import re
import tomllib
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

from psgdlab.core.errors import ConfigError

__all__ = [
    "load_toml",
    "parse_toml",
    "read_config_text",
    "check_values",
    "MAX_TOML_DEPTH",
    "load_dataclass",
    "check_keys",
    "apply_overrides",
    "closest",
    "unknown",
    "listing",
    "parse_rate",
    "format_rate",
]

T = TypeVar("T")


def closest(key: str, known: typing.Iterable[str], n: int = 1) -> str:
    """``"; did you mean 'x'?"`` for the closest known key (up to ``n`` of them, closest first:
    ``"; did you mean 'x' or 'y'?"``), or ``""``. Close is :mod:`difflib`'s ratio of at least
    0.6, then, where that finds fewer than ``n``, a known key that starts with ``key`` (a short
    name's long form).

    >>> closest("h100-sxm", ["a100-sxm-hdr", "h100-sxm-ndr", "l40s-pcie-100gbe"], n=2)
    "; did you mean 'h100-sxm-ndr' or 'a100-sxm-hdr'?"
    >>> closest("h100", ["a100-sxm-hdr", "h100-sxm-ndr"])
    "; did you mean 'h100-sxm-ndr'?"
    """
    known = list(known)
    match = difflib.get_close_matches(key, known, n=n, cutoff=0.6)
    if key and len(match) < n:
        match += [k for k in known if k.lower().startswith(key.lower()) and k not in match][: n - len(match)]
    return f"; did you mean {' or '.join(repr(m) for m in match)}?" if match else ""


def unknown(what: str, name: object, known: typing.Iterable[str], *, n: int = 1) -> ConfigError:
    """The error of a name that is none of ``known``: what was looked up, the name, every known
    name, and the closest ones (:func:`closest`). Every registry that is looked up by name
    (algorithms, topologies, presets, workloads, models, ...) raises it, so the message has one
    shape wherever a name is mistyped.

    >>> str(unknown("preset", "h100", ["a100-sxm-hdr", "h100-sxm-ndr"]))
    "preset ('h100') is not known (known: a100-sxm-hdr, h100-sxm-ndr); did you mean 'h100-sxm-ndr'?"
    """
    known = list(known)
    return ConfigError(f"{what} ({name!r}) is not known (known: {', '.join(known)}){closest(str(name), known, n=n)}")


def listing(names: typing.Iterable[str], last: str = "or") -> str:
    """Names as a sentence says them: ``"a, b or c"`` (``last="and"``: ``"a, b and c"``).

    >>> listing(["gloo", "nccl", "mpi"]), listing(["gloo"]), listing(["adpsgd", "dpsgd"], "and")
    ('gloo, nccl or mpi', 'gloo', 'adpsgd and dpsgd')
    """
    names = list(names)
    return f"{', '.join(names[:-1])} {last} {names[-1]}" if len(names) > 1 else "".join(names)


def check_keys(data: Mapping[str, Any], known: typing.Iterable[str], *, where: str) -> None:
    known = list(known)
    for key in data:
        if key not in known:
            raise ConfigError(f"{where}: unknown key {key!r}{closest(key, known)}")


#: the deepest nesting of tables and arrays a config file may have (psgdlab's own go 4 deep)
MAX_TOML_DEPTH = 32
#: integers in config files fit in 64 bits (counts and sizes reach numpy as int64)
_INT64 = (-(2**63), 2**63 - 1)


def load_toml(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a TOML file: :func:`parse_toml` of :func:`read_config_text`."""
    return parse_toml(read_config_text(path), source=str(path))


def read_config_text(path: str | os.PathLike[str]) -> str:
    """The text of the config file ``path``; a missing file, a directory or a file that is not
    UTF-8 is a one-line :class:`ConfigError`."""
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"config file {path} is a directory, not a TOML file")
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist")
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"config file {path} is not UTF-8 text ({exc.reason} at byte {exc.start})") from None


def parse_toml(text: str, *, source: str) -> dict[str, Any]:
    """The values of the TOML document ``text`` (from ``source``); malformed TOML is a one-line
    :class:`ConfigError`.

    Beyond TOML's own rules, every number must be finite (no ``inf`` or ``nan``), every integer
    must fit in 64 bits and tables and arrays nest at most :data:`MAX_TOML_DEPTH` deep
    (:func:`check_values`): a value that would overflow later, or a document nested so deep that
    reading it exhausts the stack, is refused here, naming the key that holds it.

    >>> parse_toml("a = [[[[1]]]]", source="x.toml")["a"]
    [[[[1]]]]
    >>> parse_toml("a = " + "[" * 5000 + "]" * 5000, source="x.toml")
    Traceback (most recent call last):
    ...
    psgdlab.core.errors.ConfigError: config file x.toml nests arrays or tables too deeply to read
    """
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {source} is not valid TOML: {exc}") from None
    except RecursionError:
        raise ConfigError(f"config file {source} nests arrays or tables too deeply to read") from None
    check_values(data, where=f"config file {source}")
    return data


def check_values(data: Mapping[str, Any], *, where: str) -> None:
    """Refuse a non-finite number, an integer beyond 64 bits, or nesting deeper than
    :data:`MAX_TOML_DEPTH` in ``data`` (parsed TOML), naming the key (walked without recursion).

    >>> check_values({"platform": {"nic": {"latency_s": float("inf")}}}, where="f.toml")
    Traceback (most recent call last):
    ...
    psgdlab.core.errors.ConfigError: f.toml: platform.nic.latency_s (inf) must be a finite number
    """
    stack: list[tuple[str, Any, int]] = [("", data, 0)]
    while stack:
        key, value, depth = stack.pop()
        if depth > MAX_TOML_DEPTH:
            raise ConfigError(f"{where}: {key or 'the file'} nests deeper than {MAX_TOML_DEPTH} tables or arrays")
        if isinstance(value, Mapping):
            stack.extend((f"{key}.{k}" if key else str(k), v, depth + 1) for k, v in value.items())
        elif isinstance(value, list):
            stack.extend((f"{key}[{i}]", v, depth + 1) for i, v in enumerate(value))
        elif isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"{where}: {key} ({value!r}) must be a finite number")
        elif isinstance(value, int) and not isinstance(value, bool) and not _INT64[0] <= value <= _INT64[1]:
            raise ConfigError(f"{where}: {key} ({value}) must fit in a 64-bit integer (at most {_INT64[1]})")


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


#: unit of a rate -> bytes per second (SI prefixes, powers of 1000, as NIC rates are quoted)
_RATE_UNITS = {
    "bit/s": 1 / 8,
    "kbit/s": 1e3 / 8,
    "Mbit/s": 1e6 / 8,
    "Gbit/s": 1e9 / 8,
    "B/s": 1.0,
    "kB/s": 1e3,
    "MB/s": 1e6,
    "GB/s": 1e9,
}
_RATE_RE = re.compile(r"^\s*((?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]+/s)\s*$")
#: the rates a shaped link (``tc`` tbf) honours here: 1 Mbit/s to 400 Gbit/s
RATE_RANGE_BYTES_PER_S = (1e6 / 8, 400e9 / 8)


def parse_rate(text: str, *, name: str = "nic-bandwidth") -> float:
    """Bytes per second of a rate written as a number and a unit (``1Gbit/s``, ``500Mbit/s``,
    ``125MB/s``; SI prefixes, powers of 1000); anything else is a :class:`ConfigError` naming
    ``name``, the value and the rule.

    Examples
    --------
    >>> parse_rate("1Gbit/s"), parse_rate("500 Mbit/s"), parse_rate("2.5GB/s")
    (125000000.0, 62500000.0, 2500000000.0)
    >>> parse_rate("1Gbps")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    psgdlab.core.errors.ConfigError: nic-bandwidth ('1Gbps') must be a number and a unit, one of bit/s, ...
    """
    units = ", ".join(_RATE_UNITS)
    match = _RATE_RE.match(text) if isinstance(text, str) else None
    if match is None or match.group(2) not in _RATE_UNITS:
        raise ConfigError(f"{name} ({text!r}) must be a number and a unit, one of {units} (like 1Gbit/s or 500Mbit/s)")
    rate = float(match.group(1)) * _RATE_UNITS[match.group(2)]
    low, high = RATE_RANGE_BYTES_PER_S
    if not low <= rate <= high:
        raise ConfigError(f"{name} ({text!r}) must be between 1Mbit/s and 400Gbit/s (what a shaped link honours)")
    return rate


def format_rate(bytes_per_s: float) -> str:
    """The rate in the largest bit/s unit that keeps it >= 1: ``format_rate(125e6) == "1Gbit/s"``.

    >>> format_rate(125e6), format_rate(62.5e6), format_rate(1.5e9 / 8)
    ('1Gbit/s', '500Mbit/s', '1.5Gbit/s')
    """
    bits = bytes_per_s * 8
    for unit, scale in (("Gbit/s", 1e9), ("Mbit/s", 1e6), ("kbit/s", 1e3)):
        if bits >= scale:
            return f"{bits / scale:.6g}{unit}"
    return f"{bits:.6g}bit/s"
