"""Reading a reward's constants from params.yaml into its config dataclass: from the typed
config's block (:mod:`hargo.config`, a frozen dataclass with the same field names) or from a
params mapping. This package does not import :mod:`hargo.config` (the config looks up the task
registry, whose tasks import the rewards): a typed block is recognised as a dataclass."""
from __future__ import annotations

from dataclasses import fields, is_dataclass
from typing import Any, Mapping, TypeVar

T = TypeVar("T")


def block_items(d: Any) -> Mapping:
    """The knobs of a params block as a mapping: a typed config block (a dataclass instance) by
    its field names, a mapping as it is, None as ``{}``."""
    if d is None:
        return {}
    if is_dataclass(d) and not isinstance(d, type):
        return {f.name: getattr(d, f.name) for f in fields(d)}
    return d


def config_from_params(cls: type[T], d: Any) -> T:
    """``cls(**d)`` for a dataclass of int and float constants, each value converted to its
    field's type; keys ``d`` lacks keep the defaults, keys ``cls`` lacks are ignored (the typed
    config refuses unknown ones). ``d``: the typed config's block (a dataclass instance, e.g.
    :class:`hargo.config.PLPReward`), a mapping, or None (the defaults).

    Raises:
        ValueError, TypeError: a value that is not a number of the field's type.
    """
    d = block_items(d)
    return cls(**{f.name: (int if f.type in ("int", int) else float)(d[f.name])
                  for f in fields(cls) if f.name in d})
