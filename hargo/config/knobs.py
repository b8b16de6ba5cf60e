"""The shorthands the sections of hargo's typed config (:mod:`hargo.config`) declare their
fields with: :data:`section` (a frozen, keyword-only dataclass), the
:func:`~hargo.config.fields.knob` spellings of an int, a string, a boolean and a completion
budget, the dtypes a model may be saved and generated in, and :func:`_names` (a block's
params.yaml keys). Private to the config's own modules (the names keep their leading underscore
there).

Imports: :mod:`hargo.config.fields` only.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from hargo.config.fields import REQUIRED, knob

__all__ = ["section"]

section = dataclass(frozen=True, kw_only=True)

_DTYPES = ("float32", "bfloat16", "float16")


def _int(default=REQUIRED, help="", lo=None, hi=None, **kw):
    return knob(default, help, lo, hi, kind=int, **kw)


def _str(default=REQUIRED, help="", **kw):
    return knob(default, help, kind=str, **kw)


def _bool(default=REQUIRED, help=""):
    return knob(default, help, kind=bool)


def _budget(default=REQUIRED, help="", nullable=False):
    return knob(default, help, kind="budget", nullable=nullable)


def _names(cls) -> list[str]:
    return [f.name for f in dataclasses.fields(cls)
            if f.metadata.get("kind") not in ("method_blocks", "private")]

