"""Where a run came from: the git commit (and whether the sources differ from it) and the DVC
version of the raw data, for the tags every MLflow run carries (:func:`hargo.tracking.common_tags`).
"""
from __future__ import annotations

import subprocess
from pathlib import Path

__all__ = ["git_commit", "pipeline_products", "data_version", "SOURCE_TREES", "SOURCE_SUFFIXES"]


#: The source trees whose untracked modules a run imports (a new ``hargo/tasks/toy.py`` is
#: picked up by the task registry): an untracked, not ignored, file there with one of
#: :data:`SOURCE_SUFFIXES` makes the run dirty.
SOURCE_TREES = ("hargo", "flows")
SOURCE_SUFFIXES = (".py",)


def git_commit(root: str | Path = ".") -> str:
    """``HEAD``'s sha, suffixed ``-dirty`` when tracked files other than the pipeline's own
    products have changes, or when an untracked Python file sits in a source tree
    (:data:`SOURCE_TREES`: the registries import a new ``hargo/tasks/toy.py`` without its being
    committed; ignored files do not count); ``unknown`` outside git.

    The pipeline's products (:func:`pipeline_products`) are what DVC and the stages rewrite
    during a run -- ``dvc.lock``, the stages' outputs, metrics and plots, ``params.yaml`` (``dvc
    exp run -S`` writes it; every run logs its values as params) and ``.gitignore`` -- so a
    stage that ran after another stage, or in an experiment, is not marked dirty for them; an
    edited source file or config still marks it."""
    import fnmatch

    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True,
                             text=True, check=True).stdout.strip()
        status = subprocess.run(["git", "status", "--porcelain", "-z", "--untracked-files=no"],
                                cwd=root, capture_output=True, text=True, check=True).stdout
        untracked = subprocess.run(   # the trees at the repository's top, from any folder
            ["git", "ls-files", "--others", "--exclude-standard", "-z", "--full-name", "--",
             *(f":(top){t}" for t in SOURCE_TREES)],
            cwd=root, capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    changed = [e[3:] for e in status.split("\0") if len(e) > 3]
    products = pipeline_products(root)
    dirty = [p for p in changed
             if not any(fnmatch.fnmatchcase(p, pat) or fnmatch.fnmatchcase(p, pat + "/*")
                        for pat in products)]
    dirty += [p for p in untracked.split("\0") if p.endswith(SOURCE_SUFFIXES)]
    return sha + ("-dirty" if dirty else "")


def pipeline_products(root: str | Path = ".") -> list[str]:
    """Path patterns (``fnmatch``, relative to ``root``) of the tracked files a pipeline run
    rewrites: every ``dvc.lock``, ``params.yaml`` and ``.gitignore``, and the ``outs``,
    ``metrics`` and ``plots`` of the stages of ``root``'s ``dvc.yaml`` files (the root's and
    one level down: ``compare/``, ``synthetic/``), relative to each stage's ``wdir``
    (``${item}``-style templates match anything)."""
    import posixpath
    import re

    import yaml

    root = Path(root)
    pats = ["dvc.lock", "*/dvc.lock", "params.yaml", ".gitignore", "*/.gitignore"]
    for spec in [root / "dvc.yaml", *sorted(root.glob("*/dvc.yaml"))]:
        try:
            stages = (yaml.safe_load(spec.read_text(encoding="utf-8")) or {}).get("stages", {})
        except (OSError, yaml.YAMLError, AttributeError):
            continue
        base = spec.parent.relative_to(root).as_posix()
        for stage in stages.values():
            if not isinstance(stage, dict):
                continue
            body = stage.get("do", stage)
            wdir = str(stage.get("wdir", body.get("wdir", ".")))
            wdir = posixpath.normpath(posixpath.join(base, wdir))
            for key in ("outs", "metrics", "plots"):
                for out in body.get(key, []) or []:
                    rel = out if isinstance(out, str) else next(iter(out), None)
                    if isinstance(rel, str):
                        path = posixpath.normpath(posixpath.join(wdir, rel))
                        pats.append(re.sub(r"\$\{[^}]*\}", "*", path))
    return pats


def data_version(root: str | Path = ".") -> str:
    """The DVC hash of the raw data (``data/raw/hpc-gpt.dvc``'s md5), or ``unknown``."""
    import yaml

    p = Path(root) / "data" / "raw" / "hpc-gpt.dvc"
    try:
        return str(yaml.safe_load(p.read_text())["outs"][0]["md5"])
    except (OSError, KeyError, IndexError, TypeError):
        return "unknown"
