"""The interference map's analysis (``benchmarks/interference_map.py``): pure functions of the
JSON-lines rows, so a test can check every number on crafted rows.

Per cell (a mechanism at one value) and task, GRPO's alone-minus-mixed eval reward with its
paired two-level bootstrap interval (:func:`hargo.stats.paired_bootstrap_ci_two_level`: seed
pairs and prompts resampled; seed s alone paired with seed s mixed), in the heterogeneous and
the homogeneous configuration, and their difference (the difference-in-differences: the
per-prompt alone-minus-mixed of the heterogeneous runs against the homogeneous ones' on the same
seeds), each read three ways: at the end, by the area under the eval curve (the trapezoid over
the ``eval_curve_prompts`` points divided by the steps: the mean reward over training) and at
an early step. A cell is flagged for a task when one reading's heterogeneous interval lies above
0; otherwise the report gives the interval's bounds: the sizes ruled out.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

READINGS = ("end", "auc", "early")
FINDING_SEEDS = 10    # an interval read as a finding needs this many seeds


def point_key(point: Mapping) -> str:
    return json.dumps(dict(point), sort_keys=True)


def index(rows: Sequence[Mapping]) -> dict[tuple, dict[int, Mapping]]:
    """``{(point_key, method, config): {seed: row}}`` of the scored runs: a run the divergence
    guard stopped (``run`` None, :func:`diverged`) has no scores, so a pair it belongs to
    drops out of every interval (the cell's ``seeds`` count says how many remain)."""
    out: dict[tuple, dict[int, Mapping]] = {}
    for r in (r for r in rows if r.get("run")):
        out.setdefault((point_key(r["point"]), r["method"], r["config"]), {})[int(r["seed"])] = r
    return out


def _task_mask(run: Mapping, task: str) -> np.ndarray:
    return np.asarray([t == task for t in run["eval"]["tasks"]])


def values(row: Mapping, task: str, reading: str, metric: str = "reward",
           early_step: int | None = None) -> np.ndarray | None:
    """One run's per-prompt values of ``task`` (the eval split's order) for a reading: ``end``
    (the final eval), ``auc`` (trapezoid over the eval curve's points divided by the span of
    steps) or ``early`` (the curve point at ``early_step``; None: the first after step 0).
    None when the run has no per-prompt curve (``synthetic.evaluate.every_steps`` 0)."""
    run = row["run"]
    mask = _task_mask(run, task)
    if reading == "end":
        return np.asarray(run["eval"][metric], dtype=float)[mask]
    curve = run.get("eval_curve_prompts")
    if not curve or len(curve) < 2:
        return None
    steps = np.asarray([c["step"] for c in curve], dtype=float)
    vals = np.stack([np.asarray(c[metric], dtype=float)[mask] for c in curve])   # (P, n)
    if reading == "auc":
        area = ((vals[1:] + vals[:-1]) / 2 * np.diff(steps)[:, None]).sum(axis=0)
        return area / (steps[-1] - steps[0])
    want = early_step if early_step is not None else steps[steps > 0][0]
    hit = np.flatnonzero(steps == want)
    return vals[hit[0]] if hit.size else None


def _fmt(ci: Mapping | None) -> str:
    if not ci:
        return "-"
    mark = " **>0**" if ci["low"] > 0 else ""
    return f"{ci['diff']:+.3f} [{ci['low']:+.3f}, {ci['high']:+.3f}]{mark}"


def interval(a: Sequence[np.ndarray], b: Sequence[np.ndarray], resamples: int,
             confidence: float) -> dict:
    from hargo.stats import paired_bootstrap_ci_two_level

    return paired_bootstrap_ci_two_level(a, b, resamples, confidence, 0)


def compare(runs_a: Mapping[int, Mapping], runs_b: Mapping[int, Mapping], task: str,
            metric: str, early_step, resamples: int, confidence: float,
            control: tuple[Mapping, Mapping] | None = None) -> dict[str, dict | None]:
    """Per reading, the interval of a minus b over the seeds both have (and, with ``control``
    = (c, d), of (a - b) - (c - d) over the seeds all four have): ``{reading: ci or None}``."""
    seeds = sorted(set(runs_a) & set(runs_b) & (set(control[0]) & set(control[1])
                                                if control else set(runs_a)))
    out: dict[str, dict | None] = {}
    for reading in READINGS:
        got = lambda runs: [values(runs[s], task, reading, metric, early_step)  # noqa: E731
                            for s in seeds]
        a, b = got(runs_a), got(runs_b)
        if not seeds or any(x is None for x in a + b):
            out[reading] = None
            continue
        if control:
            c, d = got(control[0]), got(control[1])
            if any(x is None for x in c + d):
                out[reading] = None
                continue
            a, b = [x - y for x, y in zip(a, b)], [x - y for x, y in zip(c, d)]
        out[reading] = interval(a, b, resamples, confidence)
    return out


def analyse(rows: Sequence[Mapping], cells: Sequence, tasks: Sequence[str], points,
            methods: Sequence[str] = (), metric: str = "reward", early_step: int | None = None,
            resamples: int = 2000, confidence: float = 0.95) -> dict:
    """The map's numbers: ``{"<mechanism>=<value>": {task: {"n_seeds", "het", "hom", "did",
    "full_step", "methods": {m: ...}, "flag", "readings_above_0"}}}``. ``points`` is the
    object of ``interference_map`` that names a run's point: ``points.mixed(cell, method)``,
    ``points.alone(cell, task, method, full)``."""
    idx = index(rows)
    get = lambda pt, m, conf: idx.get((point_key(pt), m, conf), {})  # noqa: E731
    args = (metric, early_step, resamples, confidence)
    out: dict = {}
    for cell in cells:
        rec = {}
        for task in tasks:
            mh, mo = get(points.mixed(cell, "grpo"), "grpo", "heterogeneous"), \
                get(points.mixed(cell, "grpo"), "grpo", "homogeneous")
            ah = get(points.alone(cell, task, "grpo"), "grpo", "heterogeneous")
            ao = get(points.alone(cell, task, "grpo"), "grpo", "homogeneous")
            full = get(points.alone(cell, task, "grpo", True), "grpo", "heterogeneous")
            r = {"n_seeds": len(set(mh) & set(ah)),
                 "het": compare(ah, mh, task, *args), "hom": compare(ao, mo, task, *args),
                 "did": compare(ah, mh, task, *args, control=(ao, mo)),
                 "full_step": compare(full, mh, task, *args) if full else None,
                 "methods": {m: compare(get(points.mixed(cell, m), m, "heterogeneous"), mh,
                                        task, *args)
                             for m in methods if get(points.mixed(cell, m), m, "heterogeneous")}}
            ctl = get(points.mixed(cell, UNIFORM), UNIFORM, "heterogeneous")
            r["methods_vs_uniform"] = {
                m: compare(get(points.mixed(cell, m), m, "heterogeneous"), ctl, task, *args)
                for m in r["methods"] if m != UNIFORM and ctl}
            r["readings_above_0"] = [x for x in READINGS if r["het"][x] and r["het"][x]["low"] > 0]
            r["flag"] = bool(r["readings_above_0"])
            rec[task] = r
        out[cell.name] = rec
    return out


def transfer(rows: Sequence[Mapping], cells: Sequence, tasks: Sequence[str], points,
             metric: str = "reward", resamples: int = 2000, confidence: float = 0.95,
             config: str = "heterogeneous") -> dict:
    """What each GRPO arm of a cell does to every task, the shared-habit check of issue 40,
    item 4 (a habit the tasks share, such as one hedge, is unlearned for all by training any
    one of them, and then lifts a task that was never trained as much as its own training).

    Returns ``{cell: {arm: {task: {"n_seeds", "mean", "sft", "vs_sft"}}}}``: ``arm`` is
    ``"mixed"`` or ``"alone <task>"`` (the alone run at the mixed run's prompts a step),
    ``mean`` the task's final eval ``metric`` averaged over the arm's scored seeds (per seed the
    mean over the task's eval prompts), ``sft`` the same at step 0 of the same runs (the SFT
    policy: every run starts from it), ``vs_sft`` the paired two-level bootstrap interval
    (:func:`interval`, seeds and prompts resampled) of end minus step 0, None without a step-0
    curve point (``synthetic.evaluate.every_steps`` 0). Arms without runs are left out."""
    idx = index(rows)
    done: dict[str, dict] = {}      # point key -> per task: cells share arms (neutral, alone)

    def arm_readings(point: Mapping) -> dict | None:
        key = point_key(point)
        if key not in done:
            runs = idx.get((key, "grpo", config), {})
            seeds = sorted(runs)
            per = {}
            for t in tasks if runs else ():
                end = [values(runs[s], t, "end", metric) for s in seeds]
                sft = [values(runs[s], t, "early", metric, 0) for s in seeds]
                ok = all(x is not None for x in sft)
                per[t] = {"n_seeds": len(seeds),
                          "mean": float(np.mean([e.mean() for e in end])),
                          "sft": float(np.mean([x.mean() for x in sft])) if ok else None,
                          "vs_sft": interval(end, sft, resamples, confidence) if ok else None}
            done[key] = per
        return done[key] or None

    out: dict = {}
    for cell in cells:
        arms = {"mixed": points.mixed(cell, "grpo"),
                **{f"alone {u}": points.alone(cell, u, "grpo") for u in tasks}}
        out[cell.name] = {arm: got for arm, pt in arms.items()
                          if (got := arm_readings(pt)) is not None}
    return out


def transfer_markdown(tr: Mapping, tasks: Sequence[str], confidence: float,
                      config: str = "heterogeneous") -> str:
    """:func:`transfer` as a table: one row per cell and arm (the SFT policy first), per task
    the mean final eval and, in brackets, minus the SFT policy with its interval."""
    pct = int(round(confidence * 100))
    lines = [f"### What each arm does to every task ({config}, end)", "",
             "Each GRPO arm's final eval reward per task (mean over its seeds) and, after it, "
             f"minus the SFT policy (the same runs' step-0 eval; paired two-level {pct}% "
             "interval). A task lifted as much by another task trained alone as by its own "
             "training is lifted by a habit the tasks share (the shared hedge): that hides "
             "interference.", "",
             "| cell | arm | seeds | " + " | ".join(tasks) + " |",
             "|---|---|---:|" + "---|" * len(tasks)]
    for cell, rec in tr.items():
        if not rec:
            continue
        first = next(iter(rec.values()))
        lines.append(f"| {cell} | SFT (step 0) | | " + " | ".join(
            f"{first[t]['sft']:.3f}" if first[t]["sft"] is not None else "-" for t in tasks)
            + " |")
        for arm, per in rec.items():
            n = per[tasks[0]]["n_seeds"]
            lines.append(f"| {cell} | {arm} | {n} | " + " | ".join(
                f"{per[t]['mean']:.3f} ({_fmt(per[t]['vs_sft'])})" for t in tasks) + " |")
    lines.append("")
    return "\n".join(lines)


#: The uniform-weight control at HARGO's std convention (hargo/methods/uniform.py): a method
#: minus it is its weighting alone (the std convention and the loss path being the same).
UNIFORM = "uniform_pop"


def flagged(numbers: Mapping) -> list[str]:
    """The cells flagged for at least one task."""
    return [c for c, rec in numbers.items() if any(r["flag"] for r in rec.values())]


def _finding(r: Mapping) -> str:
    tag = "" if r["n_seeds"] >= FINDING_SEEDS else " (screening)"
    if r["flag"]:
        did = [x for x in READINGS if r["did"][x] and r["did"][x]["low"] > 0]
        return (f"interference ({', '.join(r['readings_above_0'])})"
                + (f"; beyond dilution (DiD {', '.join(did)})" if did else "") + tag)
    end = r["het"]["end"]
    if not end:
        return "-"
    return f"none shown: ruled out below {end['low']:+.3f} and above {end['high']:+.3f}{tag}"


def markdown(numbers: Mapping, cells: Sequence, confidence: float, early_label: str) -> str:
    pct = int(round(confidence * 100))
    lines = []
    by_mech: dict[str, list] = {}
    for c in cells:
        by_mech.setdefault(c.mechanism, []).append(c)
    for mech, cs in by_mech.items():
        lines += [f"### {mech}", "",
                  "| value | task | seeds | alone - mixed, end | AUC | " + early_label +
                  " | homogeneous, end | DiD, end | DiD, AUC | DiD, " + early_label +
                  " | finding |", "|---|---|---:|" + "---:|" * 7 + "---|"]
        for c in cs:
            for task, r in numbers[c.name].items():
                lines.append(f"| {c.value} | {task} | {r['n_seeds']} | " + " | ".join(
                    [_fmt(r["het"][x]) for x in READINGS] + [_fmt(r["hom"]["end"])]
                    + [_fmt(r["did"][x]) for x in READINGS]) + f" | {_finding(r)} |")
        lines.append("")
    extra = [(c, t, r) for c in cells for t, r in numbers[c.name].items()
             if r["full_step"] or r["methods"]]
    if any(r["full_step"] for _, _, r in extra):
        lines += ["### Alone at the full step (flagged cells)", "",
                  "Alone with every prompt of the step from the task, minus mixed "
                  f"(heterogeneous; {pct}% intervals).", "",
                  f"| cell | task | end | AUC | {early_label} |", "|---|---|---:|---:|---:|"]
        lines += [f"| {c.name} | {t} | " + " | ".join(_fmt(r["full_step"][x]) for x in READINGS)
                  + " |" for c, t, r in extra if r["full_step"]] + [""]
    if any(r["methods"] for _, _, r in extra):
        lines += ["### Methods minus GRPO and minus the uniform control, mixed (flagged cells)",
                  "",
                  f"Each method's mixed run (heterogeneous) minus GRPO's on the same seeds, and "
                  f"minus `{UNIFORM}` (weights 1/G at HARGO's std convention: the weighting "
                  f"alone); {pct}% intervals.", "",
                  f"| cell | task | method | end | AUC | {early_label} | - {UNIFORM}, end | "
                  f"- {UNIFORM}, AUC |", "|---|---|---|---:|---:|---:|---:|---:|"]
        for c, t, r in extra:
            for m, ci in r["methods"].items():
                vu = r.get("methods_vs_uniform", {}).get(m)
                lines.append(f"| {c.name} | {t} | {m} | "
                             + " | ".join(_fmt(ci[x]) for x in READINGS) + " | "
                             + " | ".join(_fmt(vu[x]) if vu else "-" for x in ("end", "auc"))
                             + " |")
        lines.append("")
    return "\n".join(lines)


def plot(numbers: Mapping, cells: Sequence, path: Path, confidence: float) -> None:
    """One panel per mechanism: per value and task, heterogeneous alone - mixed at the end
    (filled) and the DiD (hollow), with their intervals."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    mechs = list(dict.fromkeys(c.mechanism for c in cells))
    fig, axes = plt.subplots(1, len(mechs), figsize=(4 * len(mechs), 3.4), squeeze=False)
    for ax, mech in zip(axes[0], mechs):
        cs = [c for c in cells if c.mechanism == mech]
        tasks = list(numbers[cs[0].name])
        for j, task in enumerate(tasks):
            for kind, fill, off in (("het", True, -0.12), ("did", False, 0.12)):
                xs, ys, lo, hi = [], [], [], []
                for i, c in enumerate(cs):
                    ci = numbers[c.name][task][kind]["end"]
                    if ci:
                        xs.append(i + off + 0.06 * (j - 1))
                        ys.append(ci["diff"])
                        lo.append(ci["diff"] - ci["low"])
                        hi.append(ci["high"] - ci["diff"])
                if xs:
                    ax.errorbar(xs, ys, yerr=[lo, hi], fmt="o", capsize=2, color=f"C{j}",
                                mfc=None if fill else "white",
                                label=f"{task}{'' if fill else ' DiD'}")
        ax.axhline(0, color="grey", lw=0.8)
        ax.set_xticks(range(len(cs)), [c.value for c in cs])
        ax.set_title(mech)
    axes[0][0].set_ylabel(f"GRPO alone - mixed (eval, {int(round(confidence * 100))}% CI)")
    axes[0][-1].legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def diverged(rows: Sequence[Mapping]) -> list[str]:
    """One line per run the divergence guard stopped (``run`` None, ``diverged`` its message):
    arm, configuration, method, seed, point and the guard's message."""
    return [f"{r.get('arm', '?')} {r['config']} {r['method']} seed {r['seed']} at "
            f"{point_key(r['point'])}: {r['diverged']}" for r in rows if r.get("run") is None]


def timing(rows: Sequence[Mapping]) -> dict[str, float]:
    """Mean ``wall_s`` per run (mixed and alone), over the rows that have it."""
    out = {}
    for arm in ("mixed", "alone"):
        w = [r["run"]["wall_s"] for r in rows
             if r.get("arm") == arm and r.get("run") and "wall_s" in r["run"]]
        out[arm] = float(np.mean(w)) if w else math.nan
    return out
