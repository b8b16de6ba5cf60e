"""The git commit every MLflow run is tagged with (issue 42, item 9): ``-dirty`` only when the
sources differ from the commit, not when the pipeline rewrote its own tracked products."""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from hargo import tracking

ROOT = Path(__file__).resolve().parents[1]


def _git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True,
                          timeout=60, env={**os.environ, "GIT_AUTHOR_NAME": "t",
                                           "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
                                           "GIT_COMMITTER_EMAIL": "t@t"}).stdout.strip()


@pytest.fixture()
def repo(tmp_path) -> Path:
    """A git repository with the project's three dvc.yaml files, params.yaml, dvc.lock, a
    tracked metric of each pipeline and a source file, committed."""
    d = tmp_path / "repo"
    for rel in ("dvc.yaml", "compare/dvc.yaml", "synthetic/dvc.yaml", "params.yaml"):
        (d / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / rel, d / rel)
    for rel in ("dvc.lock", "compare/dvc.lock", ".gitignore", "metrics/eval.json",
                "metrics/rl/hargo.json", "data/prepared/stats.json",
                "metrics/compare/train/grpo-s1.json", "metrics/synthetic/summary.json",
                "reports/eval/confusion/sft.json", "hargo/rewards.py", "configs/x.yaml"):
        (d / rel).parent.mkdir(parents=True, exist_ok=True)
        (d / rel).write_text("v1\n")
    _git(d, "init", "-q")
    _git(d, "add", "-Af")
    _git(d, "commit", "-q", "-m", "c")
    return d


def test_the_pipelines_own_rewrites_do_not_make_a_run_dirty(repo):
    """Before: `dvc repro` rewrote data/prepared/stats.json and dvc.lock after its first stage,
    so every later stage's run said ``<sha>-dirty``; so did every run of `dvc exp run -S`."""
    sha = _git(repo, "rev-parse", "HEAD")
    assert tracking.git_commit(repo) == sha
    for rel in ("dvc.lock", "compare/dvc.lock", ".gitignore", "params.yaml", "metrics/eval.json",
                "metrics/rl/hargo.json", "data/prepared/stats.json",
                "metrics/compare/train/grpo-s1.json", "metrics/synthetic/summary.json",
                "reports/eval/confusion/sft.json"):
        (repo / rel).write_text("v2\n")
        assert tracking.git_commit(repo) == sha, rel
    for rel in ("hargo/rewards.py", "configs/x.yaml", "compare/dvc.yaml"):   # the sources
        (repo / rel).write_text("v2\n")
        assert tracking.git_commit(repo) == f"{sha}-dirty", rel
        _git(repo, "checkout", "--", rel)
    assert tracking.git_commit(repo.parent) == "unknown"           # outside git


def test_an_untracked_module_in_a_source_tree_makes_a_run_dirty(repo):
    """Issue 42 (new user): a new, uncommitted ``hargo/tasks/toy.py`` (which the task registry
    imports) left ``hargo.git_commit`` clean: git_commit asked git with
    ``--untracked-files=no``. An untracked .py file under hargo/ or flows/ now counts, at any
    depth; an ignored one, an untracked non-Python file and untracked files elsewhere do not."""
    sha = _git(repo, "rev-parse", "HEAD")
    (repo / ".gitignore").write_text("scratch_*.py\n__pycache__/\n")
    _git(repo, "commit", "-qam", "ignore")
    sha = _git(repo, "rev-parse", "HEAD")
    for rel in ("hargo/tasks/scratch_x.py", "hargo/__pycache__/rewards.py",   # ignored
                "hargo/tasks/notes.txt", "notebooks/try.py", "toy.py"):      # not sources
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text("x = 1\n")
    assert tracking.git_commit(repo) == sha
    for rel in ("hargo/tasks/toy.py", "hargo/tasks/toy/__init__.py", "flows/extra.py",
                "hargo/new.py"):
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text("x = 1\n")
        assert tracking.git_commit(repo) == f"{sha}-dirty", rel
        (repo / rel).unlink()
        assert tracking.git_commit(repo) == sha, rel
    (repo / "hargo/tasks/toy.py").write_text("x = 1\n")   # seen from a subfolder too
    assert tracking.git_commit(repo / "hargo") == f"{sha}-dirty"
