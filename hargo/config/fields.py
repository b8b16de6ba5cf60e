"""The field kind of hargo's typed config (:mod:`hargo.config`): :func:`knob` declares one
parameter of params.yaml (its type, default, help text, range and source) and :func:`check_value`
checks a raw value against it. A leaf: imports nothing of hargo's but
:mod:`hargo.param_values`, so :mod:`hargo.method_config` (the ``rl.<method>`` blocks) and the
config's sections share one definition.
"""
from __future__ import annotations

import dataclasses
from dataclasses import MISSING, field
from typing import Any, Mapping

from hargo.param_values import ParamsError, as_number

__all__ = ["knob", "node", "REQUIRED", "check_value", "describe_range", "KINDS"]

#: ``knob(REQUIRED, ...)``: params.yaml must give the key (no default).
REQUIRED = MISSING

#: The kinds a knob may have: ``float`` / ``int`` (any number spelling, ``lo``/``hi``), ``bool``
#: (a real boolean), ``str`` (a string; ``choices`` restricts it), ``"range"`` / ``"int_range"``
#: (``[min, max]``), ``"budget"`` (an integer >= 1 or one per task), ``"task_map"`` (task ->
#: the knob's ``item`` kind), ``"list"`` (a list), ``"any"`` (checked by the section).
KINDS = (float, int, bool, str, "range", "int_range", "budget", "task_map", "list", "any")


def knob(default=REQUIRED, help: str = "", lo=None, hi=None, lo_open=False, hi_open=False,
         kind=float, *, choices: tuple | None = None, nullable: bool = False,
         source: str = "params.yaml", item: Mapping | None = None, required: bool = False):
    """A config dataclass field: its ``default`` (:data:`REQUIRED`: params.yaml must give it;
    with ``required`` params.yaml must give it too, and ``default`` is only what code that
    builds the dataclass itself gets, e.g. a reward's constants in a test),
    ``help`` text, range (``lo``/``hi``, each closed unless ``lo_open``/``hi_open``), ``kind``
    (:data:`KINDS`), ``choices`` (a str's allowed values), ``nullable`` (None, YAML's empty
    value, is allowed), ``source`` (where the value and its default come from) and, for a
    ``task_map``, the ``item`` rule of its values (keyword arguments of :func:`knob`'s metadata).
    :func:`check_value` checks a value against it."""
    if kind not in KINDS:
        raise ValueError(f"knob: unknown kind {kind!r}")
    meta = {"help": help, "lo": lo, "hi": hi, "lo_open": lo_open, "hi_open": hi_open,
            "kind": kind, "choices": choices, "nullable": nullable, "source": source,
            "item": item, "required": bool(required)}
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda d=default: type(d)(d), metadata=meta)
    return field(default=default, metadata=meta)


def node(cls: type, help: str = "", default=REQUIRED, source: str = "params.yaml"):
    """A nested block (a config dataclass ``cls``); ``default`` None: params.yaml may omit it
    (the field is then None)."""
    return field(default=default, metadata={"help": help, "node": cls, "kind": "node",
                                            "nullable": default is None, "source": source})


def describe_range(meta: Mapping) -> str:
    """The knob's range in words: ``[0, 1)``, ``> 0``, ``one of a, b`` ("" when unrestricted)."""
    if meta.get("choices"):
        return "one of " + ", ".join(map(str, meta["choices"]))
    lo, hi = meta.get("lo"), meta.get("hi")
    if lo is not None and hi is not None:
        return (f"{'(' if meta['lo_open'] else '['}{lo}, {hi}{')' if meta['hi_open'] else ']'}")
    if lo is not None:
        return f"{'>' if meta['lo_open'] else '>='} {lo}"
    if hi is not None:
        return f"{'<' if meta['hi_open'] else '<='} {hi}"
    return ""


def _number(key: str, value: Any, meta: Mapping) -> int | float:
    integer = meta["kind"] is int
    v = as_number(key, value, integer)
    lo, hi = meta.get("lo"), meta.get("hi")
    if lo is not None and (v <= lo if meta["lo_open"] else v < lo):
        raise ParamsError(f"{key}: must be {'>' if meta['lo_open'] else '>='} {lo}, got {v!r}")
    if hi is not None and (v >= hi if meta["hi_open"] else v > hi):
        raise ParamsError(f"{key}: must be {'<' if meta['hi_open'] else '<='} {hi}, got {v!r}")
    return v if integer else float(v)


def _pair(key: str, v: Any, meta: Mapping) -> tuple:
    if not isinstance(v, (list, tuple)) or len(v) != 2:
        raise ParamsError(f"{key}: expected [min, max], got {v!r}")
    lo, hi = meta.get("lo"), meta.get("hi")
    for x in v:
        kind = int if meta["kind"] == "int_range" else (int, float)
        if isinstance(x, bool) or not isinstance(x, kind):
            raise ParamsError(f"{key}: expected [min, max] of numbers, got {v!r}")
        if (lo is not None and x < lo) or (hi is not None and x > hi):
            raise ParamsError(f"{key}: bounds must lie in [{lo}, {hi}], got {v!r}")
    if v[0] > v[1]:
        raise ParamsError(f"{key}: min {v[0]} is above max {v[1]}")
    return tuple(v)


def check_value(key: str, value: Any, meta: Mapping) -> Any:
    """``value`` checked against the knob ``meta`` (a field's metadata) and normalised (a number
    of any spelling to its int or float, a list to a tuple).

    Raises:
        ParamsError: the wrong type, out of range or not a choice; the message names ``key``
            and the range (``rl.steps: must be >= 1, got 0``).
    """
    kind = meta["kind"]
    if value is None and meta.get("nullable"):
        return None
    if kind in (int, float):
        return _number(key, value, meta)
    if kind is bool:
        if not isinstance(value, bool):
            raise ParamsError(f"{key}: expected true or false, got {value!r}")
        return value
    if kind is str:
        if meta.get("choices") is not None:
            if value not in meta["choices"]:
                raise ParamsError(f"{key}: must be one of "
                                  f"{', '.join(map(str, meta['choices']))}; got {value!r}")
            return value
        if not isinstance(value, str):
            raise ParamsError(f"{key}: expected a string, got {value!r}")
        return value
    if kind in ("range", "int_range"):
        return _pair(key, value, meta)
    if kind == "list":
        if not isinstance(value, (list, tuple)):
            raise ParamsError(f"{key}: expected a list, got {value!r}")
        return tuple(value)
    return value            # budget, task_map, any: the section checks them


def field_info(cls: type) -> dict[str, dict]:
    """Per field of the config dataclass ``cls``: ``type``, ``default`` (``"required"`` when
    params.yaml must give it), ``help``, ``range`` (:func:`describe_range`) and ``source``: what
    help texts and docs are generated from."""
    out = {}
    for f in dataclasses.fields(cls):
        m = f.metadata
        if m.get("required"):
            default = "required"
        elif f.default is not MISSING:
            default = f.default
        elif f.default_factory is not MISSING:
            default = f.default_factory()
        else:
            default = "required"
        kind = m.get("kind", float)
        out[f.name] = {"type": m["node"].__name__ if kind == "node" else
                       (kind.__name__ if isinstance(kind, type) else kind),
                       "default": default, "help": m.get("help", ""),
                       "range": describe_range(m) if kind != "node" else "",
                       "source": m.get("source", "params.yaml")}
    return out
