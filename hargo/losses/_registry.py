"""The registries' shared helpers: register a function under a unique name, look one up."""
from __future__ import annotations


def register(table: dict, kind: str, name: str):
    def deco(fn):
        if name in table:
            raise ValueError(f"{kind} {name!r} is already registered")
        table[name] = fn
        return fn
    return deco


def lookup(table: dict, kind: str, name: str):
    try:
        return table[name]
    except KeyError:
        raise ValueError(f"unknown {kind} {name!r}; valid: {sorted(table)}") from None
