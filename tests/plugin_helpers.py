"""Adding a plug-in module to a temporary copy of the ``hargo`` package (tests/test_methods.py's
toy method, tests/test_tasks.py's toy task): the copy, and this process's registry re-discovered
with the copy's sub-package on its path."""
from __future__ import annotations

import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def package_copy_with(tmp: Path, subpackage: str, module: str, source: str) -> Path:
    """A copy of the ``hargo`` package under ``tmp`` with one new module,
    ``hargo/<subpackage>/<module>.py`` holding ``source``; returns the folder to put on
    ``PYTHONPATH``."""
    shutil.copytree(ROOT / "hargo", tmp / "hargo", ignore=shutil.ignore_patterns("__pycache__"))
    (tmp / "hargo" / subpackage / f"{module}.py").write_text(source, encoding="utf-8")
    return tmp


def rediscover(monkeypatch, registry, package_copy: Path) -> None:
    """Make ``registry`` (``hargo.methods`` or ``hargo.tasks``) discover its modules again, with
    the copy's folder of the same sub-package on its ``__path__`` (so the new module is found as
    a module of the package), on a copy of its registry dict; ``monkeypatch`` restores all three
    afterwards (the caller drops the new module from ``sys.modules``)."""
    folder = package_copy.joinpath(*registry.__name__.split("."))
    monkeypatch.setattr(registry, "__path__", [*registry.__path__, str(folder)])
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    monkeypatch.setattr(registry, "_discovered", False)
