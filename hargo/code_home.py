"""Which ``hargo`` code runs: the project's own, or another clone's.

``scripts/setup.sh`` installs hargo editable, so the ``hargo`` command (and ``import hargo``)
runs the code of the clone it was installed from. In a copy of a clone (``cp -a clone copy``)
that is still the original's code, while DVC hashes the copy's ``hargo/`` files as the stages'
deps: a change made in the copy (a new ``hargo/tasks/toy.py``) would never run, and DVC would
record it as run (issue 42 item 9). :func:`foreign_code` is the check the ``hargo`` command makes
first (:func:`hargo.cli._first_use`); a moved clone whose old path is gone cannot start
``.venv/bin/hargo`` at all (its first line names the old path). Both are fixed by running
``scripts/setup.sh`` in the clone (docs/tracking.md).

The check is cheap: nothing when the imported package is the project's own folder; otherwise a
comparison of the two folders' files (``__pycache__`` left out), so a copy that holds the same
code (the tests' temporary projects, DVC's temporary workspace of ``dvc exp run --queue``) runs.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

__all__ = ["project_code", "foreign_code"]


def project_code(start: str | Path = ".") -> Optional[Path]:
    """The ``hargo/`` folder of the project that ``start`` is in: the nearest folder from
    ``start`` upwards holding both ``dvc.yaml`` and ``hargo/__init__.py``; None outside one."""
    here = Path(start).resolve()
    for folder in (here, *here.parents):
        if (folder / "dvc.yaml").is_file() and (folder / "hargo" / "__init__.py").is_file():
            return folder / "hargo"
    return None


def _files(pkg: Path) -> dict[str, Path]:
    return {p.relative_to(pkg).as_posix(): p for p in pkg.rglob("*")
            if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"}


def _same_code(a: Path, b: Path) -> bool:
    fa, fb = _files(a), _files(b)
    if fa.keys() != fb.keys():
        return False
    for rel, p in fa.items():
        q = fb[rel]
        if p.stat().st_size != q.stat().st_size or p.read_bytes() != q.read_bytes():
            return False
    return True


def foreign_code(start: str | Path = ".", running: str | Path | None = None) -> Optional[str]:
    """None when the ``hargo`` package this process imported (``running``: its folder, by
    default ``hargo.__file__``'s) is the code of the project ``start`` is in, or holds the same
    files, or ``start`` is in no project; else the one-line message naming both folders and the
    fix."""
    if running is None:
        import hargo

        running = Path(hargo.__file__).parent
    running = Path(running).resolve()
    own = project_code(start)
    if own is None or own == running or _same_code(own, running):
        return None
    return (f"this project's code is at {own}, but hargo runs the code at {running} (an "
            f"editable install of another clone: a copied or moved project): run "
            f"scripts/setup.sh in {own.parent} (or set PYTHONPATH={own.parent})")
