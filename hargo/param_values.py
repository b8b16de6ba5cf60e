"""The leaf of params handling: the error every parameter check raises, and how a value is read
as a number. :mod:`hargo.params` (params.yaml) and :mod:`hargo.method_config` (the RL methods'
blocks) both use it, so neither has to import the other to raise or parse.
"""
from __future__ import annotations

import math
import re
from typing import Any

__all__ = ["ParamsError", "as_number"]


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
