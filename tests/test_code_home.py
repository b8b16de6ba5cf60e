"""Issue 42 item 9: a copied project ran the original clone's code. ``cp -a clone copy`` and a
new ``hargo/tasks/toy.py`` in the copy: the editable install maps ``hargo`` to the original's
folder, so every stage of the copy ran the original's code while DVC hashed the copy's files.
Now the first hargo command says so in one line and stops (``hargo.code_home``)."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from hargo.code_home import foreign_code, project_code

ROOT = Path(__file__).resolve().parents[1]


def _project(dst: Path, extra: dict[str, str] | None = None) -> Path:
    """A project folder: dvc.yaml and a copy of this hargo package (plus ``extra`` files)."""
    dst.mkdir(parents=True)
    shutil.copy(ROOT / "dvc.yaml", dst / "dvc.yaml")
    shutil.copy(ROOT / "params.yaml", dst / "params.yaml")
    shutil.copytree(ROOT / "hargo", dst / "hargo", ignore=shutil.ignore_patterns("__pycache__"))
    for rel, text in (extra or {}).items():
        (dst / "hargo" / rel).write_text(text, encoding="utf-8")
    return dst


def test_a_copy_with_its_own_code_is_refused_naming_both_folders(tmp_path):
    copy = _project(tmp_path / "copy", {"tasks/toy.py": "# the copy's new task\n"})
    msg = foreign_code(copy / "data", running=ROOT / "hargo")      # from a subfolder, too
    assert msg == (f"this project's code is at {copy / 'hargo'}, but hargo runs the code at "
                   f"{ROOT / 'hargo'} (an editable install of another clone: a copied or "
                   f"moved project): run scripts/setup.sh in {copy} (or set PYTHONPATH={copy})")
    # a changed file (same names) is foreign as well
    edited = _project(tmp_path / "edited")
    (edited / "hargo" / "vocab.py").write_text("# edited\n", encoding="utf-8")
    assert foreign_code(edited, running=ROOT / "hargo") is not None


def test_the_projects_own_code_or_the_same_code_runs(tmp_path):
    same = _project(tmp_path / "same")
    (same / "hargo" / "__pycache__").mkdir(exist_ok=True)
    (same / "hargo" / "__pycache__" / "x.cpython-311.pyc").write_bytes(b"\0")   # not code
    assert project_code(same / "a" / "b") == same / "hargo"
    assert foreign_code(same, running=ROOT / "hargo") is None      # the tests' project copies
    assert foreign_code(same, running=same / "hargo") is None      # PYTHONPATH = the project
    assert foreign_code(ROOT) is None                              # this repository
    assert project_code(tmp_path) is None and foreign_code(tmp_path) is None   # no project


def test_the_first_hargo_command_in_a_copy_stops_with_one_line(tmp_path, monkeypatch):
    """The reported case through the CLI: any command (here ``check-params --explain``, which
    checks nothing) stops with exit 2 before it runs."""
    from typer.testing import CliRunner

    from hargo.cli import app

    copy = _project(tmp_path / "copy", {"tasks/toy.py": "# the copy's new task\n"})
    monkeypatch.chdir(copy)
    res = CliRunner().invoke(app, ["check-params", "--explain", "seed"])
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert lines == [f"error: {foreign_code(copy)}"], res.output
    assert "run scripts/setup.sh in" in lines[0]
    shutil.rmtree(copy / "hargo")
    _project(tmp_path / "same")
    monkeypatch.chdir(tmp_path / "same")
    res = CliRunner().invoke(app, ["check-params", "--explain", "seed"])
    assert res.exit_code == 0 and res.output.startswith("seed"), res.output
