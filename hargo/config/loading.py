"""Reading params.yaml: the YAML loader (YAML 1.2 floats), dotted-key access and per-run
overrides (``"rl.hargo.beta=0.04"``, as ``dvc exp run -S``). No checks here: those are the typed
config's (:mod:`hargo.config`). Re-exported by :mod:`hargo.params`."""
from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any, Iterable, Mapping

import yaml

from hargo.param_values import ParamsError

__all__ = ["ParamsLoader", "get", "apply_overrides", "read_params_file"]


class ParamsLoader(yaml.SafeLoader):
    """PyYAML's safe loader with YAML 1.2's float syntax: PyYAML follows YAML 1.1, which reads
    ``1e-5`` and ``1e-05`` (what ``dvc exp run -S`` writes) as *strings*; here every float
    spelling YAML 1.2 allows (``1e-5``, ``1E-5``, ``1e-05``, ``.5``, ``5.0e-5``, ``+1.5``,
    ``.inf``, ``.nan``) is a float."""


ParamsLoader.yaml_implicit_resolvers = {
    k: [(tag, rx) for tag, rx in v if tag != "tag:yaml.org,2002:float"]
    for k, v in yaml.SafeLoader.yaml_implicit_resolvers.items()}
ParamsLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
                  |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
                  |[-+]?\.[0-9_]+(?:[eE][-+]?[0-9]+)?
                  |[-+]?\.(?:inf|Inf|INF)
                  |\.(?:nan|NaN|NAN))$""", re.X),
    list("-+0123456789."))

def get(params: Mapping, dotted: str) -> Any:
    """Return ``params["a"]["b"]`` for ``dotted == "a.b"``.

    Raises:
        ParamsError: a key on the path is missing.
    """
    cur: Any = params
    for i, key in enumerate(dotted.split(".")):
        if not isinstance(cur, Mapping) or key not in cur:
            raise ParamsError(f"{dotted}: missing (no key '{'.'.join(dotted.split('.')[:i + 1])}')")
        cur = cur[key]
    return cur


def apply_overrides(params: dict, overrides: Mapping[str, Any] | Iterable[str] | None) -> dict:
    """Return a copy of ``params`` with overrides applied.

    ``overrides`` is a mapping ``{"rl.method": "hargo"}`` or strings ``"rl.steps=8"`` whose values
    are parsed as YAML (so ``8`` is an int, ``[grpo, hargo]`` a list). Only existing keys can be
    overridden, so a typo fails instead of being silently ignored.

    Raises:
        ParamsError: an override names a key that params.yaml does not have, or is malformed.
    """
    out = copy.deepcopy(params)
    if not overrides:
        return out
    if not isinstance(overrides, Mapping):
        parsed = {}
        for item in overrides:
            if "=" not in item:
                raise ParamsError(f"override '{item}': expected KEY=VALUE")
            k, v = item.split("=", 1)
            parsed[k.strip()] = yaml.safe_load(v)
        overrides = parsed
    for dotted, value in overrides.items():
        keys = dotted.split(".")
        cur = out
        for i, key in enumerate(keys[:-1]):
            if not isinstance(cur.get(key), dict):
                raise ParamsError(f"{dotted}: unknown parameter (no section "
                                  f"'{'.'.join(keys[:i + 1])}' in params.yaml)")
            cur = cur[key]
        if keys[-1] not in cur:
            raise ParamsError(f"{dotted}: unknown parameter (not in params.yaml)")
        cur[keys[-1]] = value
    return out


def read_params_file(path: str | Path = "params.yaml") -> dict:
    """``path`` read with :class:`ParamsLoader` (YAML 1.2 floats), not yet checked.

    Raises:
        FileNotFoundError: ``path`` does not exist.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: params file not found (run from the repository root)")
    with path.open(encoding="utf-8") as f:
        return yaml.load(f, Loader=ParamsLoader) or {}
