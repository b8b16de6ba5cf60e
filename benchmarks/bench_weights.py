"""Micro-benchmark: the cost of HARGO's weights against GRPO's advantages.

Times ``hargo.advantages.estimate`` for every estimator on 4,096 groups of 4 (16,384 responses,
binary rewards, random reference log-probs) and prints the median over several runs in ms. For
scale: one stock TRL GRPO step with SmolLM2-135M on this 2-core CPU takes ~100 s
(../shared/docs/stack.md), and even the smallest RL step here is tens of seconds, so the
estimator's cost is negligible.

Usage: ``python benchmarks/bench_weights.py [--groups 4096] [--G 4] [--repeats 21] [--threads 1]``
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from hargo.advantages import ESTIMATORS, EMABaseline, HargoConfig, estimate

RL_STEP_S = 100.0  # stock GRPO step measured on this CPU (stack.md: ~101 s, LoRA, 16 completions)


def bench(method: str, rewards: torch.Tensor, ref: torch.Tensor, repeats: int) -> float:
    """Median wall time in ms of one ``estimate`` call (a fresh EMA baseline per call)."""
    cfg = HargoConfig()
    times = []
    for _ in range(repeats + 1):  # first call warms up
        base = EMABaseline(cfg.rho)
        t0 = time.perf_counter()
        estimate(method, rewards, ref, base, cfg)
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times[1:])


def main(argv: list[str] | None = None) -> list[tuple[str, float]]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--groups", type=int, default=4096)
    ap.add_argument("--G", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=21)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    gen = torch.Generator().manual_seed(args.seed)
    rewards = (torch.rand(args.groups, args.G, generator=gen) > 0.5).float()
    ref = -3.0 * torch.rand(args.groups, args.G, generator=gen)
    rows = [(m, bench(m, rewards, ref, args.repeats)) for m in ESTIMATORS]
    grpo = dict(rows)["grpo"]
    print(f"{args.groups} groups x G={args.G} ({args.groups * args.G} responses), "
          f"{args.threads} thread(s), median of {args.repeats} runs")
    print(f"{'estimator':<10} {'ms':>9} {'x grpo':>8} {'% of a ' + str(int(RL_STEP_S)) + ' s RL step':>22}")
    for m, ms in rows:
        print(f"{m:<10} {ms:>9.3f} {ms / grpo:>8.2f} {100 * ms / 1e3 / RL_STEP_S:>21.5f}%")
    worst = max(ms for _, ms in rows)
    print(f"\nslowest estimator: {worst:.2f} ms = {worst / 1e3 / RL_STEP_S:.1e} of one ~{RL_STEP_S:.0f} s "
          "RL step on this CPU (negligible).")
    return rows


if __name__ == "__main__":
    main()
