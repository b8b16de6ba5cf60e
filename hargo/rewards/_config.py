"""Reading a reward's constants from params.yaml into its config dataclass."""
from __future__ import annotations

from dataclasses import fields
from typing import Mapping, TypeVar

T = TypeVar("T")


def config_from_params(cls: type[T], d: Mapping | None) -> T:
    """``cls(**d)`` for a dataclass of int and float constants, each value converted to its
    field's type; keys ``d`` lacks keep the defaults, keys ``cls`` lacks are ignored (params.py
    refuses unknown ones). ``d`` None: the defaults.

    Raises:
        ValueError, TypeError: a value that is not a number of the field's type.
    """
    d = d or {}
    return cls(**{f.name: (int if f.type in ("int", int) else float)(d[f.name])
                  for f in fields(cls) if f.name in d})
