"""Single-task ceilings and the HARGO-vs-GRPO heterogeneity curve on the synthetic test bed.

Two questions the committed comparison (``dvc repro synthetic/dvc.yaml``) does not answer:

- **Interference** (issue 27, item 3): does training on the three-task mix cost a task what it
  would gain alone, and does HARGO recover it? Per task, RL on that task alone
  (``synthetic.rl.prompts_per_task`` = 300 for it, 0 for the others) with
  ``prompts_per_step = 2``, the same prompts a step the task gets in the mix on average
  (6 prompts a step drawn from three equal pools), against the same task's eval reward in the
  mixed run (the curve's ``heterogeneity = 1`` point, the committed heterogeneous rewards).
- **The curve** (item 4): HARGO minus GRPO on the all-task eval reward and on the exact-match
  share, with the paired two-level bootstrap interval
  (:func:`hargo.stats.paired_bootstrap_ci_two_level`), against
  ``synthetic.data.heterogeneity`` h in {0, 1/3, 2/3, 1}: each graded reward (syn_short's
  tiers, syn_long's similarity) is ``h * graded + (1 - h) * exact match``, so h = 0 is the
  homogeneous control (every task 0/1) and h = 1 the committed heterogeneous rewards.

Every run starts from the SFT policy in ``--root`` (``models/synthetic/sft``: run
``dvc repro synthetic/dvc.yaml:synthetic_sft`` first) and is trained by the test bed's own
``train_run`` with the committed ``synthetic`` params otherwise (steps, lr, G, eval), through
``benchmarks/synthetic_sweep.py``'s worker; results go to one JSON-lines file (resumable: a run
already there is skipped), then a Markdown report and a figure are written.

    .venv/bin/python benchmarks/synthetic_study.py --seeds 1 2 3 4 5 6 --workers 2 \\
        --out metrics/synthetic/study.jsonl --report reports/synthetic_study.md

Run it alone on the machine (a busy neighbour makes torch ~11x slower) and name the CPU
(``grep -o 'avx512_bf16\\|amx_bf16' /proc/cpuinfo``) beside its times.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import synthetic_sweep as sweep  # noqa: E402  (the sweep's worker and run identity)

HETEROGENEITY = ("0", "0.333", "0.667", "1")
METHODS = ("grpo", "hargo")


def ceiling_point(task: str, tasks) -> dict[str, str]:
    """The overrides of RL on ``task`` alone at the mix's per-task budget."""
    counts = ", ".join(f"{t}: {300 if t == task else 0}" for t in tasks)
    return {"synthetic.rl.prompts_per_task": "{" + counts + "}",
            "synthetic.rl.prompts_per_step": "2"}


def curve_point(h: str) -> dict[str, str]:
    return {"synthetic.data.heterogeneity": h}


def _values(run: dict, metric: str):
    from hargo.compare.synthetic_report import prompt_values

    return prompt_values(run["run"]["eval"], metric)


def _by(rows: list[dict], point: dict, method: str, seeds) -> list[dict]:
    want = json.dumps(point, sort_keys=True)
    got = {r["seed"]: r for r in rows
           if r["method"] == method and json.dumps(r["point"], sort_keys=True) == want}
    missing = [s for s in seeds if s not in got]
    if missing:
        raise SystemExit(f"missing runs for {point} {method}: seeds {missing}")
    return [got[s] for s in seeds]


def analyse(rows: list[dict], seeds, resamples: int, confidence: float, tasks,
            sft_eval: dict, figure: Path) -> tuple[str, dict]:
    """The report's Markdown and its numbers: the curve (HARGO - GRPO per h) and the
    ceilings (per task, alone - mixed per method)."""
    from hargo.compare.synthetic_report import prompt_values
    from hargo.stats import mean_std, paired_bootstrap_ci_two_level

    def ci(a, b):
        return paired_bootstrap_ci_two_level(a, b, resamples, confidence, 0)

    def fmt(c):
        return f"{c['diff']:+.3f} [{c['low']:+.3f}, {c['high']:+.3f}]"

    def ms(vals):
        m, s = mean_std(vals)
        return f"{m:.3f} ± {s:.3f}"

    out: dict = {"curve": {}, "ceilings": {}}
    pct = int(confidence * 100)
    lines = [f"## HARGO minus GRPO against the reward heterogeneity h ({len(seeds)} seeds, "
             f"paired two-level bootstrap {pct}% intervals)", "",
             "| h | GRPO, all | HARGO, all | HARGO - GRPO, all | HARGO - GRPO, exact match |",
             "|---:|---:|---:|---:|---:|"]
    for h in HETEROGENEITY:
        runs = {m: _by(rows, curve_point(h), m, seeds) for m in METHODS}
        rec = {}
        for metric in ("all/reward", "all/correct"):
            rec[metric] = ci([_values(r, metric) for r in runs["hargo"]],
                             [_values(r, metric) for r in runs["grpo"]])
        rec["means"] = {m: [float(_values(r, "all/reward").mean()) for r in runs[m]]
                        for m in METHODS}
        out["curve"][h] = rec
        lines.append(f"| {h} | {ms(rec['means']['grpo'])} | {ms(rec['means']['hargo'])} | "
                     f"{fmt(rec['all/reward'])} | {fmt(rec['all/correct'])} |")
    lines += ["", "h = 0: every task's reward is 0/1 exact match (the homogeneous control); "
              "h = 1: the committed graded rewards. The all-task reward is scored under each "
              "h's own rewards; the exact-match share is the same yardstick at every h.", "",
              f"![HARGO minus GRPO against h]({figure.name})", ""]
    lines += [f"## Single-task ceilings and interference ({len(seeds)} seeds)", "",
              "Each task's greedy eval reward: SFT, RL on the three-task mix (h = 1), RL on the "
              "task alone at the same prompts a step; alone minus mixed with its paired "
              f"two-level {pct}% interval (seed s alone paired with seed s mixed; > 0: the mix "
              "costs the task that much).", "",
              "| task | SFT | GRPO mixed | GRPO alone | GRPO alone - mixed | HARGO mixed | "
              "HARGO alone | HARGO alone - mixed | HARGO - GRPO, mixed |",
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for t in tasks:
        metric = f"{t}/reward"
        sft = float(prompt_values(sft_eval, metric).mean())
        rec = {"sft": sft}
        cells = [t, f"{sft:.3f}"]
        for m in METHODS:
            mixed = [_values(r, metric) for r in _by(rows, curve_point("1"), m, seeds)]
            alone = [_values(r, metric) for r in _by(rows, ceiling_point(t, tasks), m, seeds)]
            c = ci(alone, mixed)
            rec[m] = {"mixed": [float(x.mean()) for x in mixed],
                      "alone": [float(x.mean()) for x in alone], "alone-mixed": c}
            cells += [ms(rec[m]["mixed"]), ms(rec[m]["alone"]), fmt(c)]
        hm = ci([_values(r, metric) for r in _by(rows, curve_point("1"), "hargo", seeds)],
                [_values(r, metric) for r in _by(rows, curve_point("1"), "grpo", seeds)])
        rec["hargo-grpo mixed"] = hm
        cells.append(fmt(hm))
        out["ceilings"][t] = rec
        lines.append("| " + " | ".join(cells) + " |")
    _plot(out["curve"], figure, pct)
    return "\n".join(lines) + "\n", out


def _plot(curve: dict, path: Path, pct: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    hs = [float(h) for h in curve]
    fig, ax = plt.subplots(figsize=(6, 3.6))
    for metric, label, off in (("all/reward", "all-task reward", -0.01),
                               ("all/correct", "exact-match share", 0.01)):
        d = [curve[h][metric] for h in curve]
        ax.errorbar([h + off for h in hs], [c["diff"] for c in d],
                    yerr=[[c["diff"] - c["low"] for c in d], [c["high"] - c["diff"] for c in d]],
                    marker="o", capsize=3, label=label)
    ax.axhline(0, color="grey", lw=0.8)
    ax.set_xlabel("reward heterogeneity h (0: all tasks 0/1 exact match; 1: graded)")
    ax.set_ylabel(f"HARGO - GRPO (eval, {pct}% CI)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--params", default="params.yaml")
    ap.add_argument("--seeds", nargs="+", type=int, default=list(range(1, 7)))
    ap.add_argument("--root", default=".", help="folder holding data/synthetic and the SFT policy")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--out", default="metrics/synthetic/study.jsonl")
    ap.add_argument("--report", default="reports/synthetic_study.md")
    ap.add_argument("-S", "--set", dest="sets", action="append", default=[],
                    help="a fixed override key=value for every run (e.g. synthetic.rl.steps=25)")
    ap.add_argument("--analyse-only", action="store_true")
    a = ap.parse_args(argv)

    from hargo.compare.synthetic_plan import METRICS_DIR, MODEL_DIR, plan
    from hargo.config import as_config
    from hargo.data.synthetic import SYNTHETIC_TASKS
    from hargo.models.loading import model_digest, resolve_model_dir
    from hargo.params import ParamsError, load_params

    tasks = SYNTHETIC_TASKS
    fixed = dict(s.partition("=")[::2] for s in a.sets)
    points = [{**fixed, **curve_point(h)} for h in HETEROGENEITY] + \
             [{**fixed, **ceiling_point(t, tasks)} for t in tasks]
    for pt in points:   # a bad value fails here, before any run
        try:
            p = plan(as_config(load_params(a.params, [f"{k}={v}" for k, v in pt.items()])))
        except (ParamsError, ValueError) as e:
            raise SystemExit(f"error: {e}")
    root = Path(a.root)
    sft_path = root / METRICS_DIR / "sft.json"
    if not sft_path.exists():
        raise SystemExit(f"{sft_path} is missing: run `dvc repro synthetic/dvc.yaml:synthetic_sft`")
    policy = model_digest(resolve_model_dir(root / MODEL_DIR))
    out = Path(a.out)
    done = [json.loads(x) for x in out.read_text().splitlines() if x.strip()] \
        if out.exists() else []
    done = [r for r in done if r.get("policy") == policy]
    if not a.analyse_only:
        have = {r["key"] for r in done}
        threads = 1 if a.workers > 1 else 2
        jobs = [(a.params, [], pt, m, s, "heterogeneous", str(root), threads, policy)
                for pt in points for s in a.seeds for m in METHODS
                if sweep._run_key(pt, m, s, "heterogeneous", policy) not in have]
        print(f"[study] {len(jobs)} runs to train ({len(done)} in {out} already), "
              f"{a.workers} worker(s); {p.rl.steps} steps a run", flush=True)
        out.parent.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        with mp.get_context("spawn").Pool(a.workers) as pool, \
                out.open("a") as f:
            for i, r in enumerate(pool.imap_unordered(sweep._worker, jobs), 1):
                f.write(json.dumps(r) + "\n")
                f.flush()
                done.append(r)
                print(f"[study] {i}/{len(jobs)} {r['point']} {r['method']} s{r['seed']}: "
                      f"eval {r['run']['eval_summary']['all/reward']:.3f} "
                      f"({time.perf_counter() - t0:.0f} s)", flush=True)
        wall = time.perf_counter() - t0
        print(f"[study] {len(jobs)} runs in {wall:.0f} s", flush=True)
    report = Path(a.report)
    report.parent.mkdir(parents=True, exist_ok=True)
    figure = report.with_suffix(".png")
    sft_eval = json.loads(sft_path.read_text())["eval"]["heterogeneous"]
    rows = [{**r, "point": {k: v for k, v in r["point"].items() if k not in fixed}}
            for r in done]
    md, numbers = analyse(rows, a.seeds, p.bootstrap.resamples, p.bootstrap.confidence, tasks, sft_eval, figure)
    from hargo.hardware import describe_cpu

    head = (f"# Synthetic test bed: single-task ceilings and the heterogeneity curve\n\n"
            f"CPU: {describe_cpu()}. {p.rl.steps} RL steps a run, lr "
            f"{p.rl.learning_rate}, from the SFT policy {policy[:12]}; "
            f"`benchmarks/synthetic_study.py` (fixed overrides: {fixed or 'none'}).\n\n")
    from hargo.io import atomic_write_text

    atomic_write_text(report, head + md)
    atomic_write_text(report.with_suffix(".json"), json.dumps(numbers, indent=1))
    print(head + md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
