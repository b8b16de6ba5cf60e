"""hargo's methods as plug-ins: each method is one :class:`Method` object, registered by the
module of ``hargo/methods/`` that defines it, and everything that lists or runs methods asks this
registry (the CLI's ``--method`` help and check, ``params.yaml``'s checks, the trainers, the
comparison's method list and labels).

Modules (one per method or method family): ``grpo`` (grpo), ``dr_grpo``, ``hargo`` (hargo and
its ablations hargo_b1, hargo_b2), ``ppo``, ``preference`` (dpo, kto, simpo), ``hpcgpt``. The
package finds its modules itself (:func:`pkgutil.iter_modules` over the package's ``__path__``,
on the first query), so a new method is one new module here that calls :func:`register_method`,
plus its block in ``params.yaml`` (``rl.<name>`` for an RL method with a params dataclass).
docs/development.md, "Add a method", has the recipe.

Public API:

:func:`register_method`
    add a :class:`Method` (a module does this at import); a name can be registered once.
:func:`get_method`
    the method of a name; an unknown name raises :class:`UnknownMethodError` listing the valid
    names (of the families asked for).
:func:`methods` / :func:`methods_of_family` / :func:`method_names`
    the registered methods in listing order (family, then :attr:`Method.rank`, then name).
:func:`method_params` / :func:`kl_coef`
    a method's validated params block (its dataclass) and its KL coefficient.

Importing this package is cheap (no torch): a method names its advantage estimator, policy loss
and KL estimator by their registry names in :mod:`hargo.advantages` and :mod:`hargo.losses`; the
trainers look them up there.
"""
from __future__ import annotations

import sys
from typing import Any, Mapping

from hargo.methods.base import FAMILIES, LOSSES, RL_FAMILIES, Method
from hargo.param_values import ParamsError
from hargo.plugins import discover, register

__all__ = ["Method", "FAMILIES", "RL_FAMILIES", "LOSSES", "UnknownMethodError", "register_method",
           "get_method", "methods", "methods_of_family", "method_names", "method_params",
           "kl_coef"]

_REGISTRY: dict[str, Method] = {}
_discovered = False


class UnknownMethodError(ParamsError):
    """A method name that is not registered (or not of the family asked for). A
    :class:`~hargo.param_values.ParamsError`, hence a ``ValueError``."""


def register_method(method: Method) -> Method:
    """Register ``method`` (a :class:`Method`) under its name and return it; a second method of
    that name, or an object that is not a Method, is refused (:func:`hargo.plugins.register`)."""
    return register(_REGISTRY, method, Method, "hargo.methods.Method")


def _discover() -> None:
    """Import every module of this package once (each registers its methods)."""
    discover(sys.modules[__name__])


def _sort_key(m: Method) -> tuple:
    return FAMILIES.index(m.family), m.rank, m.name


def methods(families: tuple[str, ...] | None = None) -> tuple[Method, ...]:
    """Every registered method (of ``families`` when given: names from :data:`FAMILIES`), in
    listing order: family (``grpo_family``, ``value``, ``preference``, ``sft``), then
    :attr:`Method.rank`, then name.

    Raises:
        ValueError: an unknown family name.
    """
    _discover()
    if families is not None:
        bad = [f for f in families if f not in FAMILIES]
        if bad:
            raise ValueError(f"unknown method family {bad[0]!r}; valid: {', '.join(FAMILIES)}")
    return tuple(sorted((m for m in _REGISTRY.values()
                         if families is None or m.family in families), key=_sort_key))


def methods_of_family(*families: str) -> tuple[Method, ...]:
    """The registered methods of the given families (e.g. ``methods_of_family(*RL_FAMILIES)``;
    every method when none is given), in listing order."""
    return methods(tuple(families) if families else None)


def method_names(*families: str) -> tuple[str, ...]:
    """Names of :func:`methods_of_family` (every method when no family is given)."""
    return tuple(m.name for m in methods_of_family(*families))


def get_method(name: Any, *families: str) -> Method:
    """The registered method ``name``; with ``families``, it must be of one of them.

    Raises:
        UnknownMethodError: unknown name (or of another family); the message lists the valid
            names of the families asked for.
    """
    _discover()
    m = _REGISTRY.get(name) if isinstance(name, str) else None
    if m is None or (families and m.family not in families):
        valid = ", ".join(method_names(*families))
        if m is None:
            raise UnknownMethodError(f"unknown method {name!r}; valid: {valid}")
        raise UnknownMethodError(f"method {name!r} is of family {m.family}, not "
                                 f"{'/'.join(families)}; valid: {valid}")
    return m


def method_params(params: Mapping, name: str):
    """The validated dataclass of ``name``'s params block (``rl.<name>``): see
    :meth:`Method.read_params`.

    Raises:
        ParamsError: unknown method, a method without a params dataclass, a missing block or key,
            an unknown key, a value of the wrong type or out of range (named
            ``rl.<name>.<field>``).
    """
    return get_method(name).read_params(params)


def kl_coef(params: Mapping, name: str) -> float:
    """The KL coefficient of the RL method ``name`` (its params' ``kl_coef``: ``beta`` of the
    GRPO family, ``kl_coef`` of PPO). Raises ParamsError as :func:`method_params`."""
    return float(method_params(params, name).kl_coef)

