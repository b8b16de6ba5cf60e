"""The registry of the GRPO family's advantage estimators, torch-free, so a method module can
register its own estimator beside its :class:`hargo.methods.Method` (one file) and listing or
choosing methods still imports no torch.

An estimator is ``f(rewards, ref_logprob, baseline, config) -> hargo.advantages.EstimatorOutput``
(shapes and conventions: :mod:`hargo.advantages`); ``config`` is the
:class:`hargo.advantages.HargoConfig` of the method's params block, whose ``params`` attribute
is the block itself (so an estimator with knobs of its own reads them there). A function
registered from a method module imports torch inside its body, not at module level.

The built-ins (``grpo``, ``dr_grpo``, ``hargo``, ...) are registered by :mod:`hargo.advantages`
on import; :func:`get_estimator` imports it and discovers the method modules first, so a name a
plug-in registers is found without importing anything by hand.
"""
from __future__ import annotations

from typing import Any, Callable

__all__ = ["ESTIMATORS", "CONSTANTS", "register_estimator", "get_estimator", "needs_reference",
           "estimator_defaults", "estimator_names"]

#: name -> estimator function (filled by :func:`register_estimator`).
ESTIMATORS: dict[str, Callable[..., Any]] = {}
_NEEDS_REFERENCE: set[str] = set()
_DEFAULTS: dict[str, dict] = {}
#: The fields of :class:`hargo.advantages.HargoConfig` an estimator's defaults may set
#: (tests/test_advantages.py checks the two agree).
CONSTANTS: tuple[str, ...] = ("alpha", "rho", "eps", "eps_w", "std", "std_eps", "std_scope")


def register_estimator(name: str, *, needs_reference: bool = False, **defaults):
    """Decorator registering an estimator ``f(rewards, ref_logprob, baseline, config)`` under
    ``name``.

    Args:
        name: the key a :class:`hargo.methods.Method` names (``estimator=``).
        needs_reference: it reads the reference model's log-probs ``l`` (the trainer runs its
            own reference pass for it, and ``hargo.advantages.estimate`` requires them).
        **defaults: :data:`CONSTANTS` values used when ``estimate`` gets no config (in training
            the method's params block supplies its own).

    Raises:
        ValueError: the name is taken, or a default is not one of :data:`CONSTANTS`.
    """
    bad = sorted(set(defaults) - set(CONSTANTS))
    if bad:
        raise ValueError(f"register_estimator({name!r}): unknown constant(s) {', '.join(bad)}; "
                         f"valid: {', '.join(CONSTANTS)}")

    def deco(fn):
        if name in ESTIMATORS:
            raise ValueError(f"advantage estimator {name!r} is already registered")
        ESTIMATORS[name] = fn
        if needs_reference:
            _NEEDS_REFERENCE.add(name)
        _DEFAULTS[name] = dict(defaults)
        return fn
    return deco


#: The modules that register the built-in estimators, by name: the registry imports them when
#: asked (as the method registry imports its modules), so it imports no torch itself and no
#: import circle runs through it.
BUILTIN_MODULES: tuple[str, ...] = ("hargo.advantages",)


def _load() -> None:
    """Register the built-ins (:data:`BUILTIN_MODULES`) and every method module's own."""
    import importlib

    from hargo.methods import methods

    for name in BUILTIN_MODULES:
        importlib.import_module(name)
    methods()


def get_estimator(name: str) -> Callable[..., Any]:
    """The estimator ``name`` (built-in or registered by a method module).

    Raises:
        ValueError: an unknown name (the message lists the valid ones).
    """
    if name not in ESTIMATORS:
        _load()
    try:
        return ESTIMATORS[name]
    except KeyError:
        raise ValueError(f"unknown advantage estimator {name!r}; valid: "
                         f"{sorted(ESTIMATORS)}") from None


def needs_reference(name: str) -> bool:
    """Whether estimator ``name`` reads the reference model's log-probs. Raises ValueError for
    an unknown name."""
    get_estimator(name)
    return name in _NEEDS_REFERENCE


def estimator_defaults(name: str) -> dict:
    """The :data:`CONSTANTS` estimator ``name`` registered as its stand-alone defaults. Raises
    ValueError for an unknown name."""
    get_estimator(name)
    return dict(_DEFAULTS[name])


def estimator_names() -> tuple[str, ...]:
    """Every registered estimator, built-ins and the method modules' own."""
    _load()
    return tuple(ESTIMATORS)
