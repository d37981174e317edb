"""Typed results: what crosses a module boundary, what ``--json`` prints and run directories hold.

A result is a frozen dataclass with declared fields (units in their names or docs), written to a
JSON object by its ``to_json`` and read back by its ``from_json``: one function each way, and
``from_json(to_json(r)) == r``. Where a field is truly open (an algorithm's hyperparameters, the
failure report of :mod:`psgdlab.sim.failures`) its type says so: ``dict[str, Any]``, named by one
of the aliases below.

A result that the team's code and users read as a dictionary (a prediction's row,
``row["speedup"]``) is also a read-only :class:`~collections.abc.Mapping` (:class:`Record`) whose
keys and values are exactly those of its JSON object: the mapping *is* ``to_json()``, read a key
at a time. Code inside psgdlab reads the attributes.

A *document* (one object ``--json`` prints, a ``summary.json``) carries ``schema_version``
(:data:`SCHEMA_VERSION`, :func:`document`); :func:`schema_version_of` reads it back, taking a
document without one as written before it existed (version 0, the same keys) and refusing one
from a newer psgdlab. The version rises when a key is removed or renamed or a value changes
its meaning or unit; a new key does not raise it.

Examples
--------
>>> from dataclasses import dataclass
>>> @dataclass(frozen=True, slots=True, kw_only=True)
... class Point(Record):
...     x_m: float
...     label: str | None = None
...     def to_json(self):
...         return {"x_m": self.x_m, **({"label": self.label} if self.label is not None else {})}
>>> p = Point(x_m=1.5)
>>> p["x_m"], "label" in p, dict(p)
(1.5, False, {'x_m': 1.5})
>>> document({"rows": []})
{'schema_version': 1, 'rows': []}
>>> schema_version_of({"rows": []}, where="summary.json")
0
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from psgdlab.core.errors import ConfigError

__all__ = [
    "SCHEMA_VERSION",
    "Record",
    "OpenDict",
    "document",
    "schema_version_of",
    "present",
    "optional",
]

#: the version of every JSON document psgdlab writes (module docstring)
SCHEMA_VERSION = 1
#: a JSON object whose keys are open by design (named where it is a field's type)
OpenDict = dict[str, Any]


class Record(Mapping[str, Any]):
    """A typed result read as a mapping over its JSON object's keys (module docstring).

    Subclasses are frozen dataclasses that define ``to_json``; the mapping reads it."""

    __slots__ = ()

    def to_json(self) -> dict[str, Any]:
        raise NotImplementedError

    def __getitem__(self, key: str) -> Any:
        return self.to_json()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.to_json())

    def __len__(self) -> int:
        return len(self.to_json())


def document(body: Mapping[str, Any]) -> dict[str, Any]:
    """``body`` as a document: ``schema_version`` first, then its keys."""
    return {"schema_version": SCHEMA_VERSION, **body}


def schema_version_of(obj: Mapping[str, Any], *, where: object) -> int:
    """The ``schema_version`` of a document read back: 0 where it has none (written before it
    existed), a :class:`ConfigError` naming ``where`` for one that is not a whole number or that a
    newer psgdlab wrote."""
    version = obj.get("schema_version", 0)
    if not isinstance(version, int) or isinstance(version, bool) or version < 0:
        raise ConfigError(f"{where}: schema_version ({version!r}) must be a whole number >= 0")
    if version > SCHEMA_VERSION:
        raise ConfigError(
            f"{where}: schema_version ({version}) is newer than this psgdlab reads ({SCHEMA_VERSION}); "
            "upgrade psgdlab to read it"
        )
    return version


def present(**keys: Any) -> dict[str, Any]:
    """The keys whose value is not ``None``: a JSON object's optional keys, written only when
    they hold something (``present(a=1, b=None) == {"a": 1}``)."""
    return {k: v for k, v in keys.items() if v is not None}


def optional(obj: Mapping[str, Any], key: str, read: Any = None) -> Any:
    """``read(obj[key])`` where ``obj`` has ``key`` and it is not ``None``, else ``None``: the
    reader's side of :func:`present`."""
    value = obj.get(key)
    if value is None:
        return None
    return read(value) if read is not None else value
