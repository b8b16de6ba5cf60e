"""Building a block of hargo's typed config (:mod:`hargo.config`) from its params.yaml mapping:
:func:`_build` checks every key against the block's fields (unknown keys refused by name, the
section's ``_check`` / ``_after`` hooks run, numbers normalised into the mapping), with the
dynamic kinds: per-task maps against the task universe (:func:`_task_map`), completion budgets
(:func:`_check_budget`) and the ``<section>.<method>`` blocks of the method registry
(:func:`_method_block`). Private to the config's own modules.

Imports: :mod:`hargo.param_values`, :mod:`hargo.config.fields`, :mod:`hargo.config.knobs` and,
lazily, :mod:`hargo.config.registries`.
"""
from __future__ import annotations

import dataclasses
from dataclasses import MISSING
from types import MappingProxyType
from typing import Any, Mapping

from hargo.config.fields import check_value
from hargo.config.knobs import _names
from hargo.param_values import ParamsError

__all__: list[str] = []


def _freeze(v: Any) -> Any:
    if isinstance(v, Mapping):
        return MappingProxyType({k: _freeze(x) for k, x in v.items()})
    if isinstance(v, list):
        return tuple(_freeze(x) for x in v)
    return v


def _task_map(key: str, value: Any, item: Mapping, synthetic: bool = False) -> Mapping:
    """A per-task map: its keys tasks of the universe (``synthetic``: the test bed's tasks, else
    the HPC-GPT ones), each value checked by ``item``."""
    from hargo.config.registries import task_names

    if not isinstance(value, Mapping):
        raise ParamsError(f"{key}: expected one entry per task, got {value!r}")
    names = task_names(synthetic)
    for t in value:
        if t not in names:
            raise ParamsError(f"{key}.{t}: unknown task {t!r}; valid "
                              f"{'synthetic ' if synthetic else ''}tasks: {', '.join(names)}")
    meta = {"lo_open": False, "hi_open": False, "choices": None, "nullable": False, **item}
    return {t: check_value(f"{key}.{t}", v, meta) for t, v in value.items()}


def _build(cls: type, raw: Any, key: str, root: Mapping, synthetic: bool = False):
    """``cls`` from ``raw`` (the block at ``key``), checked; numbers normalised into ``raw``;
    per-task maps checked against the task universe ``synthetic`` (:meth:`Config.from_params`)."""
    if not isinstance(raw, Mapping):
        raise ParamsError(f"{key}: expected a mapping of {', '.join(_names(cls))}, got {raw!r}")
    dynamic = cls._dynamic(raw) if hasattr(cls, "_dynamic") else {}
    known = _names(cls)
    if hasattr(cls, "_check"):          # the section's own rules first (rl.methods' names)
        cls._check(raw, key, root)
    for k in raw:
        if k not in known and k not in dynamic:
            raise ParamsError(f"{f'{key}.' if key else ''}{k}: unknown key (known: "
                              f"{', '.join(known + [d for d in dynamic])})")
    kw = {}
    for f in dataclasses.fields(cls):
        meta = f.metadata
        kind = meta.get("kind")
        sub = f"{key}.{f.name}" if key else f.name
        if kind == "private":
            continue
        if kind == "method_blocks":
            kw[f.name] = MappingProxyType({n: _method_block(m, root) for n, m in dynamic.items()})
            continue
        if f.name not in raw:
            if meta.get("required") or (f.default is MISSING and f.default_factory is MISSING):
                raise ParamsError(f"{sub}: missing (no key '{sub}')")
            continue                                          # the default
        value = raw[f.name]
        if kind == "node":
            kw[f.name] = None if value is None and meta["nullable"] else \
                _build(meta["node"], value, sub, root, synthetic)
            continue
        if kind == "task_map":
            value = _task_map(sub, value, meta["item"], synthetic)
        elif kind == "budget":
            value = _check_budget(sub, value, raw, f.name, synthetic) \
                if not (value is None and meta["nullable"]) else None
        else:
            value = check_value(sub, value, meta)
        if isinstance(raw, dict) and not isinstance(value, tuple) and kind not in ("any",) \
                and value is not raw[f.name] and not isinstance(value, Mapping):
            raw[f.name] = value                              # "1e-5" -> 1e-05, 4.0 -> 4
        kw[f.name] = _freeze(value)
    out = cls(**kw)
    if hasattr(cls, "_after"):
        cls._after(out, key, root)
    return out


def _check_budget(key: str, value: Any, raw: Mapping, name: str, synthetic: bool = False):
    """A completion budget or prompt cap: an integer >= 1 (any number spelling), or one per
    registered task of the universe ``synthetic`` (:func:`hargo.generation_budget.check_budget`)."""
    from hargo.config import registries

    meta = {"kind": int, "lo": 1, "hi": None, "lo_open": False, "hi_open": False,
            "nullable": False}
    if isinstance(value, (str, float)) and not isinstance(value, bool):
        return check_value(key, value, meta)
    if isinstance(value, Mapping):   # each task's too (issue 42: {race_c: 64.0} was refused)
        value = {t: check_value(f"{key}.{t}", v, meta)
                 if isinstance(v, (str, float)) and not isinstance(v, bool) else v
                 for t, v in value.items()}
    return registries.check_budget(value, key, synthetic=synthetic)


def _method_block(method, root: Mapping):
    """The validated knobs of ``method``'s block, its params dataclass: ``rl.<name>`` (a key or
    the block left out: the field's default, :meth:`hargo.methods.Method.read_params`) or, for
    the preference methods and hpcgpt, ``compare.<name>`` (built as a section: the block and
    every key required, numbers normalised into ``root``)."""
    if method.is_rl:
        return method.read_params(root)
    block = (root.get("compare") or {}).get(method.name)
    where = method.params_block
    if not isinstance(block, Mapping):
        raise ParamsError(f"{where}: missing (no key '{where}')")
    return _build(method.params_class, block, where, root)
