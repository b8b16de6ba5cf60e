"""The synthetic test bed's report (stage ``synthetic_report``, :mod:`hargo.compare.synthetic`).

Per configuration (``heterogeneous``, ``homogeneous``):

- the eval table: per method the mean and std over seeds of the mean greedy eval reward (all
  prompts, and per task) and the exact-match share; the SFT policy (the untuned start of every
  run) as its own row;
- each method minus the SFT policy (did RL improve on it?) and HARGO minus every other
  method: paired two-level bootstrap intervals on the same metrics
  (:func:`hargo.stats.paired_bootstrap_ci_two_level`: seed pairs and prompts resampled), with
  a verdict per interval: above 0, below 0, or containing 0;
- figures: training reward per task (mean over seeds, per step) and each task's share of the
  update mass (``<task>/update_mass_share``), GRPO against HARGO.

Written whole or not at all: ``reports/synthetic.md``, ``reports/synthetic/*.png``,
``metrics/synthetic/summary.json`` (a plain output) and ``metrics/synthetic/headline.json``
(the DVC metrics: each configuration's mean ``all/reward`` and ``all/correct`` per method); then
logged as one MLflow run ``synthetic`` (tag ``hargo.kind = synthetic``) in the project's experiment: :func:`flat_metrics`, the plan's sizes
as params, the report, summary and figures as artifacts.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from hargo.compare.aggregate import mean_curve
from hargo.compare.layout import run_name
from hargo.compare.synthetic_plan import CONFIGURATIONS, FIGURES_DIR, METRICS_DIR, REPORT_MD
from hargo.compare.synthetic_plan import plan as synthetic_plan
from hargo.config import Config
from hargo.data.synthetic import SYNTHETIC_TASKS
from hargo.io import atomic_files, write_json
from hargo.stats import mean_std, paired_bootstrap_ci_two_level

__all__ = ["METRICS", "prompt_values", "method_table", "intervals", "sft_intervals", "verdict",
           "flat_metrics", "log_to_mlflow", "report"]

#: Report metrics: (key in eval_summary, column title).
METRICS: tuple[tuple[str, str], ...] = (
    ("all/reward", "reward, all"), ("syn_yesno/reward", "syn_yesno"),
    ("syn_short/reward", "syn_short"), ("syn_long/reward", "syn_long"),
    ("all/correct", "exact match, all"))


def prompt_values(ev: Mapping, metric: str) -> np.ndarray:
    """The per-prompt values of ``metric`` (``"<scope>/<reward|correct>"``) from one run's
    ``eval`` dict, in prompt order: shape ``(n,)`` with ``n`` the scope's prompts."""
    scope, key = metric.split("/")
    return np.asarray([v for t, v in zip(ev["tasks"], ev[key]) if scope == "all" or t == scope],
                      dtype=float)


def method_table(runs: Mapping[str, Mapping], methods: Sequence[str], seeds: Sequence[int]
                 ) -> dict[str, dict[str, dict[str, float]]]:
    """``{method: {metric: {"mean", "std", "n"}}}`` over seeds of each run's ``eval_summary``
    (:func:`hargo.stats.mean_std`: sample std, as the main comparison reports)."""
    out = {}
    for m in methods:
        out[m] = {}
        for key, _ in METRICS:
            mean, std = mean_std([runs[run_name(m, s)]["eval_summary"][key] for s in seeds])
            out[m][key] = {"mean": mean, "std": std, "n": len(seeds)}
    return out


def share_curve(histories: Sequence[Sequence[Mapping]], task: str
                ) -> tuple[list[int], list[float]]:
    """Mean over seeds of ``<task>/update_mass_share`` per step, a task absent from a step that
    had update mass counting 0 (absent is no share of the update, and leaving it out would
    average only the seeds that drew the task); steps without mass (all NaN) are left out."""
    vals: dict[int, list[float]] = {}
    for hist in histories:
        for h in hist:
            shares = {k: v for k, v in h.items() if k.endswith("/update_mass_share")}
            if not shares or all(isinstance(v, float) and math.isnan(v) for v in shares.values()):
                continue
            vals.setdefault(int(h["step"]), []).append(float(h.get(f"{task}/update_mass_share",
                                                                    0.0)))
    steps = sorted(vals)
    return steps, [float(np.mean(vals[s])) for s in steps]


def intervals(runs: Mapping[str, Mapping], methods: Sequence[str], seeds: Sequence[int],
              resamples: int, confidence: float, seed: int) -> dict[str, dict[str, dict]]:
    """``{"hargo-<other>": {metric: interval}}`` for every other method (GRPO first); empty
    when ``hargo`` is not compared or is alone. Intervals from
    :func:`hargo.stats.paired_bootstrap_ci_two_level`: seed pairs and prompts both resampled,
    so the spread of training over seeds is in the interval."""
    if "hargo" not in methods:
        return {}
    others = sorted((m for m in methods if m != "hargo"), key=lambda m: (m != "grpo", m))
    out = {}
    for other in others:
        out[f"hargo-{other}"] = {
            key: paired_bootstrap_ci_two_level(
                [prompt_values(runs[run_name("hargo", s)]["eval"], key) for s in seeds],
                [prompt_values(runs[run_name(other, s)]["eval"], key) for s in seeds],
                resamples, confidence, seed)
            for key, _ in METRICS}
    return out


def sft_intervals(runs: Mapping[str, Mapping], methods: Sequence[str], seeds: Sequence[int],
                  sft_eval: Mapping, resamples: int, confidence: float, seed: int
                  ) -> dict[str, dict[str, dict]]:
    """``{method: {metric: interval}}`` of each method minus the SFT policy it starts from:
    did RL improve on SFT? The SFT policy is one model whose greedy eval is deterministic, so
    it is paired with every seed of the method (``S`` copies of its per-prompt values) and
    :func:`hargo.stats.paired_bootstrap_ci_two_level` resamples the method's seeds and the
    prompts.

    Raises:
        ValueError: the SFT eval and a run were scored on different prompts (ids differ).
    """
    out = {}
    for m in methods:
        for s in seeds:
            if list(runs[run_name(m, s)]["eval"]["ids"]) != list(sft_eval["ids"]):
                raise ValueError(f"{run_name(m, s)}: eval prompts differ from the SFT eval's: "
                                 "re-run stage synthetic_sft and synthetic_rl together")
        out[m] = {key: paired_bootstrap_ci_two_level(
            [prompt_values(runs[run_name(m, s)]["eval"], key) for s in seeds],
            [prompt_values(sft_eval, key)] * len(seeds), resamples, confidence, seed)
            for key, _ in METRICS}
    return out


def verdict(ci: Mapping) -> str:
    """``"HARGO better"`` (interval above 0), ``"HARGO worse"`` (below 0) or ``"no
    difference shown"`` (0 inside)."""
    if ci["low"] > 0:
        return "HARGO better"
    if ci["high"] < 0:
        return "HARGO worse"
    return "no difference shown"


def flat_metrics(summary: Mapping) -> dict[str, float]:
    """The summary as MLflow metric names: ``<configuration>.<method>.<scope>.<reward|correct>``
    (mean over seeds), ``<configuration>.hargo-<other>.<scope>.<reward|correct>.<diff|low|
    high>`` (the intervals) and ``<configuration>.<method>-sft.all.reward.<diff|low|high>``
    (each method minus SFT); ``/`` in a metric key becomes ``.``."""
    out: dict[str, float] = {}
    for name, conf in summary["configurations"].items():
        for method, row in conf["table"].items():
            for key, v in row.items():
                out[f"{name}.{method}.{key.replace('/', '.')}"] = float(v["mean"])
        for pair, cis in conf["intervals"].items():
            for key, ci in cis.items():
                for part in ("diff", "low", "high"):
                    out[f"{name}.{pair}.{key.replace('/', '.')}.{part}"] = float(ci[part])
        for method, cis in conf.get("vs_sft", {}).items():
            ci = cis["all/reward"]
            for part in ("diff", "low", "high"):
                out[f"{name}.{method}-sft.all.reward.{part}"] = float(ci[part])
    return out


def log_to_mlflow(params: Config, plan, root: Path, summary: Mapping,
                  files: Sequence[Path]) -> str:
    """Log the test bed's results as an MLflow run ``synthetic`` (tag ``hargo.kind =
    synthetic``) of the typed config ``params``: :func:`flat_metrics`, the plan's sizes as
    params, ``files`` as artifacts
    (under ``synthetic/``). Returns the run id.

    Raises:
        RuntimeError: the MLflow store cannot be used (:func:`hargo.tracking.setup`).
    """
    import mlflow

    from hargo import tracking

    exp_id = tracking.setup(params, root)
    tags = {**tracking.common_tags(params, root), "hargo.kind": "synthetic",
            "hargo.methods": ",".join(plan.methods), "hargo.seeds": ",".join(map(str, plan.seeds))}
    with mlflow.start_run(experiment_id=exp_id, run_name="synthetic", tags=tags) as run:
        mlflow.log_metrics(flat_metrics(summary))
        mlflow.log_params({"synthetic.methods": ",".join(plan.methods),
                           "synthetic.seeds": ",".join(map(str, plan.seeds)),
                           "synthetic.rl.steps": plan.rl.steps,
                           "synthetic.rl.prompts_per_step": plan.rl.prompts_per_step,
                           "synthetic.rl.num_generations": plan.rl.num_generations,
                           "synthetic.data.n_train": plan.data.n_train,
                           "synthetic.data.n_eval": plan.data.n_eval,
                           "synthetic.parameters": summary["parameters"],
                           "cpu": summary["cpu"]})
        for f in files:
            mlflow.log_artifact(str(f), artifact_path="synthetic" if f.suffix != ".png"
                                else "synthetic/figures")
        return run.info.run_id


def _plot_curves(path: Path, histories: Mapping[str, list], metric: str, title: str,
                 ylabel: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(SYNTHETIC_TASKS), figsize=(4 * len(SYNTHETIC_TASKS), 3.2),
                             sharex=True)
    for ax, task in zip(axes, SYNTHETIC_TASKS):
        for method, hists in histories.items():
            steps, vals = (share_curve(hists, task) if metric == "update_mass_share"
                           else mean_curve(hists, f"{task}/{metric}"))
            if steps:
                ax.plot(steps, vals, marker="o", ms=3, label=method)
        ax.set_title(task)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel(ylabel)
    axes[-1].legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110, format="png")
    plt.close(fig)


def _fmt(x: float) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.3f}"


def _interval_table(head: str, rows: Mapping[str, Mapping]) -> list[str]:
    """A Markdown table: one row per name, ``diff [low, high]`` per :data:`METRICS` column."""
    lines = ["| " + head + " | " + " | ".join(t for _, t in METRICS) + " |",
             "|" + "---|" * (len(METRICS) + 1)]
    for name, cis in rows.items():
        lines.append(f"| {name} | " + " | ".join(
            f"{cis[k]['diff']:+.3f} [{cis[k]['low']:+.3f}, {cis[k]['high']:+.3f}]"
            for k, _ in METRICS) + " |")
    return lines


def _section(name: str, data: Mapping, sft_summary: Mapping, plan, figures: Mapping[str, str]
             ) -> list[str]:
    runs = data["runs"]
    table = method_table(runs, plan.methods, plan.seeds)
    lines = [f"## {name} rewards" + (" (the control: 0/1 exact match for every task)"
                                     if name == "homogeneous" else ""), ""]
    head = ["method"] + [title for _, title in METRICS]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines.append("| SFT (start of every run) | " + " | ".join(
        _fmt(sft_summary[k]) for k, _ in METRICS) + " |")
    for m in plan.methods:
        lines.append(f"| {m} | " + " | ".join(
            f"{table[m][k]['mean']:.3f} ± {table[m][k]['std']:.3f}" for k, _ in METRICS) + " |")
    lines += ["", f"Mean ± std over {len(plan.seeds)} seeds of the mean greedy eval reward "
              f"({len(runs[run_name(plan.methods[0], plan.seeds[0])]['eval']['ids'])} eval "
              "prompts; each task's reward divided by its scale; exact match: the 0/1 reward).",
              ""]
    vs = data.get("vs_sft") or {}
    if vs:
        lines += [f"Did RL improve on SFT? Each method minus the SFT policy, paired two-level "
                  f"bootstrap {int(plan.bootstrap.confidence * 100)}% intervals (the method's "
                  f"seeds and the "
                  "prompts resampled):", ""] + _interval_table("method minus SFT", vs)
        above = [m for m, cis in vs.items() if cis["all/reward"]["low"] > 0]
        lines += ["", f"Above SFT on the all-task eval reward (interval above 0): "
                  f"**{len(above)} of {len(vs)}** methods"
                  + (f" ({', '.join(above)})" if 0 < len(above) < len(vs) else "") + ".", ""]
    ci = data["intervals"]
    if ci:
        lines += [f"Paired two-level bootstrap {int(plan.bootstrap.confidence * 100)}% "
                  f"intervals of HARGO minus each method ({plan.bootstrap.resamples} resamples "
                  f"of seed pairs and prompts):",
                  ""] + _interval_table("HARGO minus", {pair.split("-", 1)[1]: cis
                                                        for pair, cis in ci.items()})
        grpo = ci.get("hargo-grpo", {}).get("all/reward")
        if grpo:
            lines += ["", f"HARGO vs GRPO on the mean eval reward: **{verdict(grpo)}** "
                      f"({grpo['diff']:+.3f} [{grpo['low']:+.3f}, {grpo['high']:+.3f}])."]
    else:
        lines.append("No intervals: they compare hargo with the other methods, and "
                     f"synthetic.methods is {list(plan.methods)}.")
    lines += [""] + [f"![{cap}]({path})" for cap, path in figures.items()] + [""]
    return lines


def _load_metrics(root: Path, name: str) -> dict:
    """``metrics/synthetic/<name>.json`` (``sft`` or a configuration). Raises FileNotFoundError
    naming the stage to run when it is missing."""
    path = root / METRICS_DIR / f"{name}.json"
    if not path.exists():
        stage = "synthetic_sft" if name == "sft" else f"synthetic_rl@{name}"
        raise FileNotFoundError(f"{path} is missing: run stage {stage} "
                                "(dvc repro synthetic/dvc.yaml)")
    return json.loads(path.read_text())


def _configuration(root: Path, name: str, plan, seed, sft_eval: Mapping, place,
                   figures_dir: Path) -> tuple[list[str], dict]:
    """One configuration's part of the report: its intervals (against each other and SFT,
    ``sft_eval`` its SFT evaluation), its two figures (staged through ``place``), its section
    of the report and its entry of the summary. Raises FileNotFoundError when its metrics
    file lacks a run of the plan."""
    runs = _load_metrics(root, name)["runs"]
    missing = [run_name(m, s) for m in plan.methods for s in plan.seeds
               if run_name(m, s) not in runs]
    if missing:
        raise FileNotFoundError(f"{root / METRICS_DIR / (name + '.json')} lacks runs "
                                f"{missing}: re-run stage synthetic_rl@{name}")
    boot = plan.bootstrap
    ci = intervals(runs, plan.methods, plan.seeds, boot.resamples, boot.confidence,
                   seed)
    shown = [m for m in ("grpo", "hargo") if m in plan.methods] or list(plan.methods[:2])
    hists = {m: [runs[run_name(m, s)]["history"] for s in plan.seeds] for m in shown}
    figures = {}
    for metric, title, ylabel in (
            ("reward_mean", "training reward per task (mean over seeds)", "reward"),
            ("update_mass_share", "share of the update mass sum w|A| per task",
             "share")):
        fname = f"{name}_{metric}.png"
        _plot_curves(place(figures_dir / fname), hists, metric,
                     f"{name}: {title}", ylabel)
        figures[f"{name}: {title}"] = f"synthetic/{fname}"
    vs_sft = sft_intervals(runs, plan.methods, plan.seeds, sft_eval,
                           plan.bootstrap.resamples, plan.bootstrap.confidence,
                           seed)
    lines = _section(name, {"runs": runs, "intervals": ci, "vs_sft": vs_sft},
                     sft_eval["summary"], plan, figures)
    entry = {
        "table": method_table(runs, plan.methods, plan.seeds), "intervals": ci,
        "vs_sft": vs_sft,
        "runs_wall_s": round(sum(r["wall_s"] for r in runs.values()), 1),
        "train_s_mean": float(np.mean([r["train_s"] for r in runs.values()]))}
    return lines, entry


def report(params: Config, root: str | Path = ".") -> dict:
    """Stage ``synthetic_report`` (``params``: the typed config): build, write and log the
    report (module docstring); returns
    ``metrics/synthetic/summary.json``'s content.

    Raises:
        FileNotFoundError: a configuration's or the SFT metrics file is missing (names the
            stage to run).
    """
    from hargo.hardware import describe_cpu

    root = Path(root)
    plan = synthetic_plan(params)
    seed = params.seed

    sft = _load_metrics(root, "sft")
    summary: dict = {"cpu": describe_cpu(), "methods": list(plan.methods),
                     "seeds": list(plan.seeds), "sft": {n: sft["eval"][n]["summary"]
                                                        for n in CONFIGURATIONS},
                     "parameters": sft["parameters"]["parameters"], "configurations": {}}
    lines = ["# Synthetic test bed: HARGO against the GRPO family", "",
             f"CPU: {summary['cpu']}. Tiny policy: {summary['parameters']:,} parameters "
             f"({plan.policy.tokenizer} tokenizer, {plan.policy.num_layers} layers of "
             f"{plan.policy.hidden_size}); SFT {sft['sft']['steps']} steps in "
             f"{sft['sft']['train_seconds']:.0f} s. RL: {plan.rl.steps} steps x "
             f"{plan.rl.prompts_per_step} prompts x G={plan.rl.num_generations}, prompt "
             f"pool {dict(plan.rl.prompts_per_task)}, per method and seed.", ""]
    figures_dir = root / FIGURES_DIR
    figures_dir.mkdir(parents=True, exist_ok=True)
    (root / REPORT_MD).parent.mkdir(parents=True, exist_ok=True)
    with atomic_files() as place:
        for name in CONFIGURATIONS:
            section, summary["configurations"][name] = _configuration(
                root, name, plan, seed, sft["eval"][name], place, figures_dir)
            lines += section
        place(root / REPORT_MD).write_text("\n".join(lines))
        write_json(place(root / METRICS_DIR / "summary.json"), summary)
        # the DVC metrics: each configuration's mean reward and correct share per method
        write_json(place(root / METRICS_DIR / "headline.json"), {
            name: {m: {"reward": t["all/reward"]["mean"], "correct": t["all/correct"]["mean"]}
                   for m, t in c["table"].items()}
            for name, c in summary["configurations"].items()})
    figures = sorted(figures_dir.glob("*.png"))
    run_id = log_to_mlflow(params, plan, root, summary,
                           [root / REPORT_MD, root / METRICS_DIR / "summary.json", *figures])
    print(f"report: {root / REPORT_MD}; MLflow run {run_id} (synthetic)", flush=True)
    return summary
