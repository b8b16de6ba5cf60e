"""What the two plug-in registries share (:mod:`hargo.methods`, :mod:`hargo.tasks`): adding a
named object to a registry dict, and discovering a package's modules once.

A plug-in package keeps its own ``_REGISTRY`` (name -> object) and ``_discovered`` flag as
module attributes (tests swap them for copies) and calls these two functions.
"""
from __future__ import annotations

import importlib
import pkgutil
from types import ModuleType
from typing import Any

__all__ = ["register", "discover"]


def register(registry: dict, item: Any, cls: type, what: str) -> Any:
    """Add ``item`` (a ``cls`` with a ``name``) to ``registry`` and return it; ``what`` names
    the kind in errors (e.g. ``"hargo.methods.Method"``).

    Raises:
        TypeError: ``item`` is not a ``cls``.
        ValueError: an item of that name is already registered.
    """
    kind = what.rsplit(".", 1)[-1].lower()
    if not isinstance(item, cls):
        raise TypeError(f"register_{kind}: expected a {what}, got {item!r}")
    if item.name in registry:
        raise ValueError(f"{kind} {item.name!r} is already registered")
    registry[item.name] = item
    return item


def discover(package: ModuleType) -> None:
    """Import every public module of ``package`` (on its ``__path__``; not ``_*`` nor ``base``)
    once, so that each registers its objects. The flag ``package._discovered`` is set before the
    imports (a module may query the registry) and cleared again if an import fails."""
    if package._discovered:
        return
    package._discovered = True
    try:
        for info in pkgutil.iter_modules(package.__path__):
            if not info.name.startswith("_") and info.name != "base":
                importlib.import_module(f"{package.__name__}.{info.name}")
    except BaseException:
        package._discovered = False
        raise
