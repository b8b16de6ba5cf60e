"""Two sweeps of the same methods and seeds (``benchmarks/synthetic_sweep.py`` JSON lines) from
the same SFT policy, e.g. one from a checkout before a change and one after: per method and
metric, the greedy eval reward of each, new - old with the paired two-level 95% interval
(:func:`hargo.stats.paired_bootstrap_ci_two_level`), per-seed differences, and the first
training step whose rollouts differ. docs/results.md, "One loss path", is its output for the
GRPO family's move off TRL's loss:

    git worktree add ../old 68b264e
    (cd ../old && PYTHONPATH=$PWD python benchmarks/synthetic_sweep.py --root <bed root> \\
        --config heterogeneous --methods grpo dr_grpo --seeds 1 2 3 4 5 --workers 2 --out old.jsonl)
    python benchmarks/synthetic_sweep.py --root <bed root> --config heterogeneous \\
        --methods grpo dr_grpo --seeds 1 2 3 4 5 --workers 2 --out new.jsonl
    python benchmarks/compare_loss_paths.py old.jsonl new.jsonl
"""
from __future__ import annotations

import argparse
import json

METRICS = ("all/reward", "syn_yesno/reward", "syn_short/reward", "syn_long/reward", "all/correct")


def _load(path: str) -> dict:
    with open(path, encoding="utf-8") as f:
        return {(r["method"], r["seed"]): r for r in map(json.loads, f)}


def main(argv=None) -> dict:
    from hargo.compare.synthetic_report import prompt_values
    from hargo.stats import paired_bootstrap_ci_two_level

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("old")
    ap.add_argument("new")
    args = ap.parse_args(argv)
    old, new = _load(args.old), _load(args.new)
    out = {}
    for m in sorted({k[0] for k in old} & {k[0] for k in new}):
        seeds = sorted(s for (mm, s) in old if mm == m and (m, s) in new)
        for metric in METRICS:
            a = [prompt_values(new[(m, s)]["run"]["eval"], metric) for s in seeds]
            b = [prompt_values(old[(m, s)]["run"]["eval"], metric) for s in seeds]
            ci = paired_bootstrap_ci_two_level(a, b, 2000, 0.95, 0)
            per_seed = [float(x.mean() - y.mean()) for x, y in zip(a, b)]
            o, n = (sum(float(v.mean()) for v in r) / len(r) for r in (b, a))
            print(f"{m:10s} {metric:18s} old {o:.3f} new {n:.3f} new-old {ci['diff']:+.3f} "
                  f"[{ci['low']:+.3f}, {ci['high']:+.3f}] per seed "
                  f"{', '.join(f'{d:+.3f}' for d in per_seed)}")
            out[f"{m}/{metric}"] = {"old": o, "new": n, "per_seed": per_seed,
                                    **{k: ci[k] for k in ("diff", "low", "high")}}
        first = []
        for s in seeds:
            ho, hn = old[(m, s)]["run"]["history"], new[(m, s)]["run"]["history"]
            first.append(next((a["step"] for a, b in zip(ho, hn)
                               if abs(a["all/reward_mean"] - b["all/reward_mean"]) > 1e-6), None))
        print(f"{m:10s} first step whose rollouts differ, by seed: {first}")
        out[f"{m}/first_divergent_step"] = first
    return out


if __name__ == "__main__":
    main()
