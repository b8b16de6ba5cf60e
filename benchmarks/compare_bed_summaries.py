"""What moved between two runs of the synthetic test bed: two ``metrics/synthetic/summary.json``
files (e.g. the committed one from ``git show REV:metrics/synthetic/summary.json`` and a new
``dvc repro synthetic/dvc.yaml``) side by side, per configuration and method: the mean eval
reward over the seeds, its gain over SFT with the paired two-level interval, and HARGO minus each
other method with its interval.

    git show 87371b4:metrics/synthetic/summary.json > /tmp/old.json
    python benchmarks/compare_bed_summaries.py /tmp/old.json metrics/synthetic/summary.json

Prints a Markdown table (the numbers of docs/results.md's bed entries). A method or interval
present in only one file prints ``-`` on the other side. The two runs are independent: their
difference is not a paired interval (the intervals are each run's own).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def _iv(x: dict | None) -> str:
    """``+0.012 [-0.010, +0.034]`` from an interval record (``diff``, ``low``, ``high``)."""
    if not x:
        return "-"
    return f"{x['diff']:+.3f} [{x['low']:+.3f}, {x['high']:+.3f}]"


def rows(old: dict, new: dict, metric: str = "all/reward") -> list[str]:
    """Markdown rows: configuration, method, mean (old -> new), vs SFT (old; new), and HARGO
    minus the method (old; new). ``metric``: a key of the summaries' tables."""
    out = []
    for cfg in ("heterogeneous", "homogeneous"):
        o, n = old["configurations"].get(cfg, {}), new["configurations"].get(cfg, {})
        methods = list(dict.fromkeys([*old.get("methods", []), *new.get("methods", [])]))
        for m in methods:
            mo = o.get("table", {}).get(m, {}).get(metric, {}).get("mean")
            mn = n.get("table", {}).get(m, {}).get(metric, {}).get("mean")
            mean = f"{mo:.3f}" if mo is not None else "-"
            mean += " -> " + (f"{mn:.3f}" if mn is not None else "-")
            vs = (f"{_iv(o.get('vs_sft', {}).get(m, {}).get(metric))}; "
                  f"{_iv(n.get('vs_sft', {}).get(m, {}).get(metric))}")
            key = f"hargo-{m}"
            hd = (f"{_iv(o.get('intervals', {}).get(key, {}).get(metric))}; "
                  f"{_iv(n.get('intervals', {}).get(key, {}).get(metric))}")
            out.append(f"| {cfg} | {m} | {mean} | {vs} | {hd if m != 'hargo' else '-'} |")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("old", type=Path)
    ap.add_argument("new", type=Path)
    ap.add_argument("--metric", default="all/reward")
    a = ap.parse_args(argv)
    old, new = (json.loads(p.read_text()) for p in (a.old, a.new))
    print(f"old: {old.get('cpu', '?')}, seeds {old.get('seeds')}; "
          f"new: {new.get('cpu', '?')}, seeds {new.get('seeds')}; metric {a.metric}\n")
    print("| configuration | method | mean (old -> new) | minus SFT (old; new) | "
          "HARGO minus it (old; new) |")
    print("|---|---|---|---|---|")
    print("\n".join(rows(old, new, a.metric)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
