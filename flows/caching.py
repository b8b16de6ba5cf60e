"""Input-keyed caching of pipeline stages for the Prefect flows.

A stage is skipped when re-running it would only repeat work. "Its inputs" are exactly what
DVC tracks for the same stage in ``dvc.yaml`` -- the ``deps`` (data, upstream models, the
stage's code) and the ``params`` keys -- so both doors agree on what a stage depends on:

    cache key = sha256(stage name, project root, values of the stage's params keys,
                       content hash of every dep [, content of model.source if a local folder])

The key is computed by :class:`StageInputs`, a Prefect ``CachePolicy``; Prefect stores the
task's result under it. A cached result is only honest while the stage's outputs on disk are
still the ones that run wrote (a later run with other params may have replaced them), so the
stage task returns the digest of its outputs (:func:`outputs_digest`) with its summary and the
flow re-runs the stage when the outputs changed since (``flows.pipeline``). Outputs marked
``persist: true`` in ``dvc.yaml`` (RL checkpoints) are bookkeeping, not results, and are left
out of the digest.

Documented limits, shared with DVC: an input that ``dvc.yaml`` does not list is not part of the
key (except a local ``model.source`` folder, which the base-model stage copies and DVC does not
track; it is hashed here).
"""
from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import yaml
from prefect.cache_policies import CachePolicy

from hargo.params import get as get_param

_INTERP = re.compile(r"\$\{([^}]+)\}")
_SKIP_DIRS = {"__pycache__", ".ipynb_checkpoints"}


@dataclass(frozen=True)
class StageSpec:
    """One stage of ``dvc.yaml`` after ``${...}`` substitution.

    Attributes:
        name: the DVC stage name (``rl@hargo`` for a ``foreach`` item).
        deps: dependency paths, relative to the project root.
        params: params keys (dotted) the stage depends on.
        outs: output paths (``outs``, ``metrics``, ``plots``), without ``persist: true`` ones.
    """

    name: str
    deps: tuple[str, ...]
    params: tuple[str, ...]
    outs: tuple[str, ...]


def _substitute(text: str, item: str | Mapping | None, params: Mapping) -> str:
    def repl(m: re.Match) -> str:
        key = m.group(1).strip()
        if key.startswith("item.") and isinstance(item, Mapping):  # a matrix stage
            if key[5:] not in item:
                raise ValueError(f"dvc.yaml: '${{{key}}}' names no matrix key of {dict(item)}")
            return str(item[key[5:]])
        if key == "item":
            if item is None:
                raise ValueError(f"dvc.yaml: '${{item}}' used outside a foreach stage in {text!r}")
            return str(item)
        return str(get_param(params, key))

    return _INTERP.sub(repl, text)


def _entries(section: list | None) -> list[tuple[str, dict]]:
    """``["a", {"b": {"cache": false}}]`` -> ``[("a", {}), ("b", {"cache": False})]``."""
    out = []
    for e in section or []:
        if isinstance(e, str):
            out.append((e, {}))
        elif isinstance(e, Mapping):
            for k, v in e.items():
                out.append((str(k), dict(v or {}) if isinstance(v, Mapping) else {"_list": v}))
    return out


def stage_spec(dvc_yaml: str | Path, stage: str, params: Mapping,
               item: str | Mapping | None = None) -> StageSpec:
    """Read ``stage`` from ``dvc_yaml``; ``item`` is the ``foreach`` value (the RL method), or
    for a ``matrix`` stage the dict of its keys (``{"method": "hargo", "seed": 1}``; the name is
    DVC's, ``stage@hargo-1``). Paths are taken as written: the stages of ``compare/dvc.yaml``
    run from the repository root (``wdir: ..``), like those of ``dvc.yaml``.

    Raises:
        FileNotFoundError: ``dvc_yaml`` does not exist.
        ValueError: no such stage, or ``item`` given for a stage without ``foreach`` (or the
            reverse); names the file and the stage.
    """
    path = Path(dvc_yaml)
    stages = (yaml.safe_load(path.read_text(encoding="utf-8")) or {}).get("stages", {})
    if stage not in stages:
        raise ValueError(f"{path}: no stage {stage!r} (stages: {', '.join(stages)})")
    body = stages[stage]
    if "matrix" in body:
        keys_m = list(body["matrix"])
        if not isinstance(item, Mapping) or set(item) != set(keys_m):
            raise ValueError(f"{path}: stage {stage!r} is a matrix stage over {keys_m}; "
                             f"give a dict of them, got {item!r}")
        name = f"{stage}@{'-'.join(str(item[k]) for k in keys_m)}"
    elif "foreach" in body:
        if item is None:
            raise ValueError(f"{path}: stage {stage!r} is a foreach stage; give its item")
        body, name = body["do"], f"{stage}@{item}"
    elif item is not None:
        raise ValueError(f"{path}: stage {stage!r} has no foreach; got item {item!r}")
    else:
        name = stage
    deps = tuple(_substitute(d, item, params) for d, _ in _entries(body.get("deps")))
    keys: list[str] = []
    for k, opts in _entries(body.get("params")):
        if "_list" in opts:  # `- other_params.yaml: [a, b]`
            keys.extend(str(x) for x in opts["_list"] or [])
        else:
            keys.append(_substitute(k, item, params))
    outs = tuple(_substitute(o, item, params)
                 for o, opts in (_entries(body.get("outs")) + _entries(body.get("metrics"))
                                 + _entries(body.get("plots")))
                 if not opts.get("persist", False))
    return StageSpec(name=name, deps=deps, params=tuple(keys), outs=outs)


def hash_path(path: str | Path) -> str:
    """sha256 of a file's bytes, or of a folder's sorted (relative path, file sha256) pairs.

    ``__pycache__`` folders are skipped (derived from the sources next to them).

    Raises:
        FileNotFoundError: ``path`` does not exist.
    """
    path = Path(path)
    if path.is_file():
        with path.open("rb") as f:
            return hashlib.file_digest(f, "sha256").hexdigest()
    if not path.is_dir():
        raise FileNotFoundError(f"{path}: not found")
    h = hashlib.sha256()
    for p in sorted(path.rglob("*")):
        rel = p.relative_to(path)
        if p.is_dir() or any(part in _SKIP_DIRS for part in rel.parts):
            continue
        h.update(rel.as_posix().encode() + b"\0" + hash_path(p).encode() + b"\n")
    return h.hexdigest()


def outputs_digest(spec: StageSpec, root: str | Path = ".") -> str | None:
    """sha256 over the stage's outputs' content hashes; ``None`` if any output is missing."""
    root = Path(root)
    h = hashlib.sha256()
    for out in spec.outs:
        p = root / out
        if not p.exists():
            return None
        h.update(out.encode() + b"\0" + hash_path(p).encode() + b"\n")
    return h.hexdigest()


def inputs_key(spec: StageSpec, params: Mapping, root: str | Path = ".") -> str | None:
    """The cache key of one stage run (module docstring); ``None`` when a dep is missing
    (then nothing is cached and the stage itself reports what is missing)."""
    root = Path(root).resolve()
    deps = {}
    for d in spec.deps:
        p = root / d
        if not p.exists():
            return None
        deps[d] = hash_path(p)
    parts: dict[str, Any] = {
        "stage": spec.name, "root": str(root), "deps": deps,
        "params": {k: get_param(params, k) for k in spec.params},
    }
    if spec.name == "base_model":
        src = Path(str(get_param(params, "model.source")))
        if not src.is_absolute():
            src = root / src
        if src.is_dir():
            parts["model.source"] = hash_path(src)
    blob = json.dumps(parts, sort_keys=True, default=str).encode()
    return f"hargo-{spec.name.replace('@', '-')}-{hashlib.sha256(blob).hexdigest()[:40]}"


@dataclass
class StageInputs(CachePolicy):
    """Prefect cache policy: the key of :func:`inputs_key` for stage ``stage``.

    The task it is attached to must take ``params`` (the loaded params dict) and, for the
    ``foreach`` stage ``rl``, ``method``; for a matrix stage of ``compare/dvc.yaml``, ``method``
    and ``seed``. The project root is the working directory, as for the stage functions
    themselves (their paths are relative).
    """

    stage: str = ""
    dvc_yaml: str = "dvc.yaml"

    def compute_key(self, task_ctx, inputs: dict[str, Any], flow_parameters: dict[str, Any],
                    **kwargs: Any) -> str | None:
        params = inputs["params"]
        item = inputs.get("method")
        if "seed" in inputs:
            item = {"method": inputs["method"], "seed": inputs["seed"]}
        spec = stage_spec(Path(self.dvc_yaml), self.stage, params, item)
        return inputs_key(spec, params, Path.cwd())
