"""The leaf of params handling: the error every parameter check raises, and how a value is read
as a number. :mod:`hargo.params` (params.yaml) and :mod:`hargo.method_config` (the RL methods'
blocks) both use it, so neither has to import the other to raise or parse.
"""
from __future__ import annotations

import math
import re
from typing import Any

__all__ = ["ParamsError", "as_number", "dataclass_from_params"]


class ParamsError(ValueError):
    """A parameter is missing, of the wrong type or out of range; the message names it."""


_NUMBER = re.compile(r"^[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?$")


def as_number(key: str, value: Any, integer: bool = False) -> int | float:
    """``value`` as a finite number, or a ParamsError naming ``key``.

    Accepts ints, floats and strings in any decimal or exponent spelling (``1e-5``, ``1E-5``,
    ``1e-05``, ``.5``, ``5.0e-5``: a YAML 1.1 reader or a hand-edited file may leave these as
    strings). Rejects booleans, NaN, infinities and anything else; with ``integer`` only whole
    numbers (``4``, ``4.0``, ``"4"``) pass and an int is returned.
    """
    v = value
    if isinstance(v, str) and _NUMBER.match(v.strip()):
        v = float(v.strip())
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ParamsError(f"{key}: expected {'an integer' if integer else 'a number'}, "
                          f"got {value!r}")
    if not math.isfinite(v):
        raise ParamsError(f"{key}: must be finite, got {value!r}")
    if integer:
        if float(v) != int(v):
            raise ParamsError(f"{key}: expected an integer, got {value!r}")
        return int(v)
    return v


def dataclass_from_params(cls, d: Any, where: str):
    """``cls(**d)`` for a dataclass of plain fields (``int``, ``float``, ``bool``, ``str``)
    filled from a params block; missing keys keep the defaults, ``None`` is an empty block.
    Numbers go through :func:`as_number` (``"2e-3"`` and ``4.0`` for an int pass), booleans
    must be real booleans, strings real strings; the dataclass's own ``__post_init__`` checks
    ranges.

    Raises:
        ValueError: not a mapping, an unknown key (named with the valid ones, as
            ``<where>: unknown keys [...]``), or a value of the wrong kind (``<where>.<key>``).
    """
    from collections.abc import Mapping
    from dataclasses import fields

    if d is not None and not isinstance(d, Mapping):
        raise ValueError(f"{where}: expected a mapping, got {d!r}")
    d = dict(d or {})
    kinds = {f.name: str(f.type) for f in fields(cls)}
    unknown = sorted(set(d) - set(kinds))
    if unknown:
        raise ValueError(f"{where}: unknown keys {unknown}; valid: {sorted(kinds)}")
    kw = {}
    for k, v in d.items():
        kind = kinds[k]
        if kind == "bool":
            if not isinstance(v, bool):
                raise ValueError(f"{where}.{k} must be true or false, got {v!r}")
        elif kind in ("int", "float"):
            v = as_number(f"{where}.{k}", v, integer=kind == "int")
            v = float(v) if kind == "float" else v
        elif kind == "str" and not isinstance(v, str):
            raise ValueError(f"{where}.{k} must be a string, got {v!r}")
        kw[k] = v
    return cls(**kw)
