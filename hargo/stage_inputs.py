"""What a stage read at its start, checked before it records anything (issue 42, item 3).

DVC records a stage's params and deps as they are *after* the stage ends (``dvc.lock``), so a
stage whose params file or declared dependencies (its ``deps`` in ``dvc.yaml``: code, data,
models) changed while it ran must not succeed: its outputs came from what it read at its start,
and DVC would call them up to date with the new state. :func:`check` raises when either changed;
the CLI runs it at the end of every stage (``hargo.cli._run``), :func:`hargo.tracking.stage_run`
at the end of the stage's MLflow run (which then ends FAILED), and ``register`` before its first
registry write (so a detected change leaves the registry as it was).

* The params file: its values as read (:func:`remember_params`); a reformatted file with the
  same values is no change.
* The declared deps of the stage DVC runs (``$DVC_STAGE``, which DVC sets for every stage
  command, e.g. ``register`` or ``rl@grpo``; ``dvc.yaml`` found from the working directory):
  noted by :func:`begin` before the stage's code is imported. Each file's size and mtime, and
  the md5 of files up to :data:`HASH_LIMIT` bytes; directories walked (``__pycache__`` and
  ``*.pyc``, which importing the code writes, left out). At the end a file whose size and mtime
  are unchanged is unchanged; one whose stat changed is compared by its md5 (a ``touch`` is no
  change), a large file by its stat. Outside DVC (no ``$DVC_STAGE``) only the params are
  checked.
"""
from __future__ import annotations

import contextlib
import hashlib
import os
import re
from pathlib import Path
from typing import Any, Iterator

__all__ = ["DependencyChanged", "HASH_LIMIT", "begin", "remember_params", "watching",
           "remember_deps",
           "stage_deps", "changed_params", "changed_deps", "check"]

HASH_LIMIT = 8 << 20      # files up to this size are hashed at the start (code, configs, rows)

STAGE_ENV = "DVC_STAGE"   # set by DVC for every stage command: the stage's address

_STATE: dict[str, Any] = {}


class DependencyChanged(RuntimeError):
    """A declared dependency of the running stage changed while it ran."""


def begin(stage: str | None = None, cwd: str | Path = ".") -> None:
    """Forget what an earlier command of this process read; note the declared deps of
    ``stage`` (default ``$DVC_STAGE``; none: no deps are checked)."""
    _STATE.clear()
    stage = stage if stage is not None else os.environ.get(STAGE_ENV)
    if stage:
        remember_deps(stage, cwd)


def remember_params(path: str | Path, values: Any) -> None:
    """Note the params file ``path`` and its values as the stage read them."""
    _STATE.update(params_path=str(path), params_file=os.path.abspath(path), params=values)


@contextlib.contextmanager
def watching() -> Iterator[None]:
    """The span of one stage (``hargo.cli._run``): :func:`check` checks only inside it, and
    everything noted is forgotten at its end (a later stage, or a test calling a stage directly
    in the same process, is not checked against it)."""
    _STATE["armed"] = True
    try:
        yield
    finally:
        _STATE.clear()


def remember_deps(stage: str, cwd: str | Path = ".") -> None:
    """Note the state of ``stage``'s declared deps (:func:`stage_deps`); a stage not found in a
    ``dvc.yaml`` is not checked."""
    try:
        deps = stage_deps(stage, cwd)
    except (OSError, ValueError, KeyError, TypeError):
        deps = None
    if deps:
        _STATE["deps"] = {p: _snapshot(p, hashed=True) for p in deps}
        _STATE.update(stage=stage, deps_cwd=Path(os.path.abspath(cwd)))


def _flatten(d: Any, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        out.update(_flatten(v, f"{prefix}{k}.") if isinstance(v, dict) else {prefix + k: v})
    return out


def changed_params() -> str | None:
    """What changed in the params file since the stage read it (``key: old -> new``, at most
    five), or None."""
    from hargo.params import read_params_file

    if "params_path" not in _STATE:
        return None
    try:
        now = read_params_file(_STATE["params_file"])
    except (OSError, ValueError) as e:
        return f"it cannot be read now ({type(e).__name__}: {e})"
    if now == _STATE["params"]:
        return None
    old, new = _flatten(_STATE["params"]), _flatten(now)
    diff = [f"{k}: {old.get(k, '(absent)')!r} -> {new.get(k, '(absent)')!r}"
            for k in sorted(old.keys() | new.keys()) if old.get(k, ...) != new.get(k, ...)]
    return "; ".join(diff[:5]) + (f"; and {len(diff) - 5} more" if len(diff) > 5 else "")


def changed_deps() -> list[str]:
    """The declared deps (paths as dvc.yaml names them, with the changed file inside a
    directory) that changed since :func:`remember_deps`."""
    out = []
    for path, before in _STATE.get("deps", {}).items():
        what = _compare(path, before, _snapshot(path, hashed=False))
        if what:
            out.append(what)
    return out


def check() -> None:
    """Raise when the params file or a declared dependency changed since the stage read them
    (inside :func:`watching` only; elsewhere: nothing to check).

    Raises:
        hargo.params.ParamsError: the params file changed (names the keys).
        DependencyChanged: a declared dependency changed (names the paths).
    """
    from hargo.params import ParamsError

    if not _STATE.get("armed"):
        return
    changed = changed_params()
    if changed:
        raise ParamsError(f"{_STATE['params_path']} changed while the stage ran ({changed}): the "
                          "stage used the values it read at its start, so it fails and DVC "
                          "records nothing; run it again for the new values")
    deps = changed_deps()
    if deps:
        stage = _STATE.get("stage", "")
        raise DependencyChanged(
            f"{', '.join(deps[:5])}{f' and {len(deps) - 5} more' if len(deps) > 5 else ''} "
            f"(declared in dvc.yaml as a dependency of stage {stage}) changed while the stage "
            "ran: the stage used what it read at its start, so it fails and DVC records "
            "nothing; run it again")


# --------------------------------------------------------------------------- dvc.yaml's deps
_VAR = re.compile(r"\$\{\s*([A-Za-z0-9_.-]+)\s*\}")


def _find_dvcfile(stage: str, cwd: Path) -> tuple[Path, str]:
    """(the dvc.yaml defining ``stage``'s address, the stage's name in it): ``path:name`` names
    the file (relative to the project root, found from ``cwd`` upward), a bare name is in a
    ``dvc.yaml`` of ``cwd`` or a folder above it."""
    import yaml

    rel, _, name = stage.rpartition(":")
    base = name.split("@", 1)[0]
    for folder in (cwd, *cwd.parents):
        f = folder / (rel or "dvc.yaml")
        if f.is_file():
            doc = yaml.safe_load(f.read_text(encoding="utf-8")) or {}
            if base in (doc.get("stages") or {}):
                return f, name
    raise ValueError(f"stage {stage!r} not found in a dvc.yaml above {cwd}")


def _lookup(vars_: dict, dotted: str):
    cur: Any = vars_
    for part in dotted.split("."):
        cur = cur[int(part)] if isinstance(cur, list) else cur[part]
    return cur


def stage_deps(stage: str, cwd: str | Path = ".") -> list[Path]:
    """The declared deps of the DVC stage at address ``stage`` (``register``, ``rl@grpo``,
    ``sub/dvc.yaml:name``) as paths: relative to its ``wdir`` (the dvc.yaml's folder by
    default), with ``${item}``/``${key}`` of a ``foreach`` stage and ``${...}`` of params.yaml's
    values resolved (a dep that stays unresolved is left out).

    Raises:
        ValueError: no dvc.yaml defines the stage (or its ``foreach`` item).
    """
    import yaml

    cwd = Path(os.path.abspath(cwd))
    dvcfile, name = _find_dvcfile(stage, cwd)
    base_name, _, key = name.partition("@")
    spec = (yaml.safe_load(dvcfile.read_text(encoding="utf-8")) or {})["stages"][base_name]
    try:
        vars_ = yaml.safe_load((dvcfile.parent / "params.yaml").read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError):
        vars_ = {}
    local: dict[str, Any] = {}
    if "foreach" in spec:
        items = spec["foreach"]
        if isinstance(items, str):
            m = _VAR.fullmatch(items.strip())
            items = _lookup(vars_, m.group(1)) if m else items
        if isinstance(items, dict):
            local = {"key": key, "item": items[key]}
        elif isinstance(items, list):
            match = [i for i in items if str(i) == key] or \
                ([items[int(key)]] if key.isdigit() and int(key) < len(items) else [])
            if not match:
                raise ValueError(f"stage {stage!r}: no foreach item {key!r}")
            local = {"key": key, "item": match[0]}
        spec = spec.get("do") or {}
    elif "matrix" in spec:          # not resolved here: the stage is not checked
        return []
    wdir = dvcfile.parent / str(spec.get("wdir", "."))
    out = []
    for dep in spec.get("deps") or []:
        path = next(iter(dep)) if isinstance(dep, dict) else dep
        try:
            path = _VAR.sub(lambda m: str(_lookup({**vars_, **local}, m.group(1))), str(path))
        except (KeyError, IndexError, ValueError, TypeError):
            continue
        out.append(Path(os.path.abspath(wdir / path)))
    return out


# ------------------------------------------------------------------------- state of a path
def _md5(path: Path) -> str | None:
    try:
        h = hashlib.md5()
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        return h.hexdigest()
    except OSError:
        return None


def _files(path: Path) -> list[Path]:
    """``path`` itself (a file), or every file under it (a directory; ``__pycache__`` and
    ``*.pyc`` left out); empty when it is missing."""
    if path.is_file():
        return [path]
    out = []
    for dirpath, dirnames, filenames in os.walk(path):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        out += [Path(dirpath) / f for f in sorted(filenames) if not f.endswith(".pyc")]
    return out


def _snapshot(path: Path, hashed: bool) -> dict[str, tuple]:
    """``{file: (size, mtime_ns, md5 or None)}`` of the files of ``path`` (md5: only when
    ``hashed`` and the file is at most :data:`HASH_LIMIT` bytes)."""
    out = {}
    for f in _files(path):
        try:
            st = f.stat()
        except OSError:
            continue
        md5 = _md5(f) if hashed and st.st_size <= HASH_LIMIT else None
        out[str(f)] = (st.st_size, st.st_mtime_ns, md5)
    return out


def _compare(path: Path, before: dict, now: dict) -> str | None:
    """The first changed file of ``path`` (as a path relative to the stage's folder), or None."""
    def shown(f: str) -> str:
        try:
            return os.path.relpath(f, _STATE.get("deps_cwd", Path.cwd()))
        except ValueError:
            return f

    for f in sorted(before.keys() | now.keys()):
        if f not in now:
            return f"{shown(f)} (removed)"
        if f not in before:
            return f"{shown(f)} (added)"
        (size0, mtime0, md5), (size1, mtime1, _) = before[f], now[f]
        if (size0, mtime0) == (size1, mtime1):
            continue
        if md5 is None or size0 != size1 or _md5(Path(f)) != md5:
            return shown(f)
    return None
