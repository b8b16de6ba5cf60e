"""The code a synthetic test-bed run executes, as the files its fingerprint digests.

A run's result depends on the hargo modules its process imports, not on all of ``hargo/``: a
commit to the DVC flows, the GPU check or the HPC-GPT rewards must not re-train the bed (issue
40, item 6). :func:`run_modules` is the import closure of :data:`ENTRIES` read from the source
(:mod:`ast`, no import): every ``import hargo...`` / ``from hargo... import`` / relative import
anywhere in a file (functions' lazy imports included, so the closure over-approximates what a
run imports, never under), each module's parent packages, and every module of the plug-in
packages that import their modules themselves (:data:`DISCOVERED`). :func:`code_digest`
digests those files. :func:`unlisted` names hargo modules a process has loaded that the closure
misses (the interference map's worker checks it after every run, and a test after a real run),
so a module the closure cannot see (an import by string) shows up instead of going unnoticed.
No torch at import.
"""
from __future__ import annotations

import ast
from functools import lru_cache
from pathlib import Path
from typing import Iterable

__all__ = ["ENTRIES", "DISCOVERED", "run_modules", "code_digest", "unlisted"]

#: What a bed run's process imports first: the stages and the sweep workers (train_run,
#: train_sft, read_split, plan, load_params, resolve_model_dir, model_digest, describe_cpu).
ENTRIES: tuple[str, ...] = ("hargo.compare.synthetic", "hargo.compare.synthetic_data",
                            "hargo.compare.synthetic_report", "hargo.params",
                            "hargo.models.loading", "hargo.hardware")
#: Plug-in packages that import every module of their own (``hargo.plugins.discover``).
DISCOVERED: tuple[str, ...] = ("hargo.methods", "hargo.tasks")

_PKG = Path(__file__).resolve().parents[1]   # hargo/


def _file(name: str, pkg: Path) -> Path | None:
    rel = name.split(".")[1:]
    base = pkg.joinpath(*rel)
    for cand in (base.with_suffix(".py") if rel else None, base / "__init__.py"):
        if cand is not None and cand.is_file():
            return cand
    return None


def _imports(path: Path, name: str) -> set[str]:
    """The hargo module names ``path`` (module ``name``) imports, at any depth of its code."""
    is_pkg = path.name == "__init__.py"
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = name.split(".")[:len(name.split(".")) - node.level + (1 if is_pkg else 0)]
                base = ".".join(parts + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            out.add(base)
            out.update(f"{base}.{a.name}" for a in node.names)   # `from pkg import module`
    return {m for m in out if m == "hargo" or m.startswith("hargo.")}


@lru_cache(maxsize=8)
def _closure(entries: tuple[str, ...], discovered: tuple[str, ...], pkg: Path
             ) -> tuple[Path, ...]:
    seen: dict[str, Path] = {}
    todo = list(entries)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        path = _file(name, pkg)
        if path is None:          # `from pkg import function`: not a module
            continue
        seen[name] = path
        parts = name.split(".")
        todo += [".".join(parts[:i]) for i in range(1, len(parts))]   # parent packages run too
        todo += sorted(_imports(path, name))
        if name in discovered:
            todo += [f"{name}.{p.stem}" for p in path.parent.glob("*.py")
                     if p.name != "__init__.py"]
    return tuple(sorted(set(seen.values())))


def run_modules(entries: Iterable[str] = ENTRIES, pkg: str | Path | None = None
                ) -> list[Path]:
    """The source files of the hargo modules a run imports (module docstring), sorted."""
    root = Path(pkg).resolve() if pkg is not None else _PKG
    return list(_closure(tuple(entries), DISCOVERED, root))


def code_digest(root: str | Path | None = None) -> str:
    """sha256 of the files of :func:`run_modules` (name relative to ``hargo/`` and content, in
    path order): the code a run executes; a commit that touches none of them keeps the runs.
    ``root``: a checkout whose ``hargo/`` to read (default: this package's)."""
    import hashlib

    pkg = Path(root).resolve() / "hargo" if root is not None else _PKG
    h = hashlib.sha256()
    for p in run_modules(pkg=pkg):
        h.update(p.relative_to(pkg).as_posix().encode() + b"\0")
        h.update(p.read_bytes())
    return h.hexdigest()


def unlisted(module_files: Iterable[str], entries: Iterable[str] = ENTRIES) -> list[str]:
    """The files among ``module_files`` (e.g. ``m.__file__`` of ``sys.modules``) under this
    ``hargo/`` that :func:`run_modules` lacks: code a run executed that its digest misses."""
    listed = set(run_modules(entries))
    out = []
    for f in module_files:
        p = Path(f).resolve()
        if p.suffix == ".py" and _PKG in p.parents and p not in listed:
            out.append(p.relative_to(_PKG).as_posix())
    return sorted(out)
