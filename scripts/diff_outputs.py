"""Do two runs of the pipelines agree? Compares the metrics and data outputs of two project folders
(e.g. the same test project built at two commits), leaving out what differs between any two runs:
timings, run ids, paths, commits, versions and MLflow's own store.

Usage: python scripts/diff_outputs.py BEFORE_DIR AFTER_DIR

Compared: every ``*.json`` under ``metrics/`` and every ``metrics.json`` (leaf by leaf), and every
``*.jsonl`` under ``data/`` (record by record: prepared splits, generations, preference pairs).
Prints one line per differing file and a count; exit status 1 when any file differs or is missing.

The refactor check of docs/development.md ("Changing the code without changing results"):

    git worktree add --detach /tmp/before <old commit>
    (cd /tmp/before && python -m pytest tests/test_compare.py::test_comparison_pipeline_through_dvc \
        -p no:randomly --basetemp=/tmp/before-tmp)
    python -m pytest tests/test_compare.py::test_comparison_pipeline_through_dvc -p no:randomly \
        --basetemp=/tmp/after-tmp
    python scripts/diff_outputs.py /tmp/before-tmp/dvc-compare-door0/project \
        /tmp/after-tmp/dvc-compare-door0/project

(The project is the session fixture ``dvc_compare_door`` since 16d2050; at an older commit it is
``test_comparison_pipeline_throu0/p`` under the basetemp.)
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

#: keys whose values differ between any two runs (whole keys: "versions" or "candidate" are
#: results, not timings)
IGNORED = re.compile(r"^(.*_s|.*_ms|.*_seconds|time|time/.*|wall.*|run_id|git_commit|.*_path|"
                     r".*_dir|started.*|ended.*|.*_uri|timestamp|peak_rss.*|rss.*|threads)$", re.I)


def leaves(x, prefix: str = ""):
    """``(dotted path, value)`` of every leaf of a JSON value, ignored keys left out."""
    if isinstance(x, dict):
        for k, v in x.items():
            if not IGNORED.search(str(k)):
                yield from leaves(v, f"{prefix}.{k}")
    elif isinstance(x, list):
        for i, v in enumerate(x):
            yield from leaves(v, f"{prefix}[{i}]")
    else:
        yield prefix, x


def _load(path: Path):
    if path.suffix == ".jsonl":
        # "\n" only: str.splitlines also breaks at U+2028/U+2029/U+0085 inside a JSON string
        return [json.loads(line) for line in path.read_text(encoding="utf-8").split("\n")
                if line.strip()]
    return json.loads(path.read_text(encoding="utf-8"))


def outputs(root: Path) -> list[Path]:
    """The compared files of a project folder, relative to it."""
    found = {p for p in (root / "metrics").rglob("*.json")} if (root / "metrics").is_dir() else set()
    found |= {p for p in root.rglob("metrics.json") if "mlruns" not in p.parts}
    if (root / "data").is_dir():
        found |= set((root / "data").rglob("*.jsonl"))
    return sorted(p.relative_to(root) for p in found)


def diff(before: Path, after: Path) -> list[str]:
    """One line per file that differs (or is missing in ``after``); empty when all agree."""
    lines = []
    for rel in outputs(before):
        if not (after / rel).is_file():
            lines.append(f"missing in {after}: {rel}")
            continue
        a, b = dict(leaves(_load(before / rel))), dict(leaves(_load(after / rel)))
        bad = [(k, a.get(k), b.get(k)) for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
        if bad:
            lines.append(f"{rel}: {len(bad)} values differ, e.g. {bad[:3]}")
    return lines


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    before, after = map(Path, argv)
    lines = diff(before, after)
    for line in lines:
        print(line)
    n = len(outputs(before))
    print(f"{n - len(lines)} of {n} files agree (timings, ids and paths left out)")
    return 1 if lines else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
