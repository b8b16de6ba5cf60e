"""Rendering of the method comparison: the report document (markdown and self-contained HTML),
the summary metrics document and the figures, from :mod:`hargo.compare.aggregate`'s results.

The document is a list of blocks, each a tuple: ``("h", level, text)``, ``("p", text)``,
``("ul", [items])``, ``("table", header, rows)`` and ``("img", alt, png file name)``;
:func:`render_md` and :func:`render_html` (:mod:`hargo.compare.render_text`, re-exported) turn
it into text. Nothing here reads inputs or talks to MLflow; :func:`write_figures` is the only
function that writes (PNG files into a folder).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from hargo.methods import get_method
from hargo.param_values import ParamsError
from hargo.compare.aggregate import (SFT, VERBOSE_CHARS, Aggregates, cumulative_mass_share,
                                     headline_columns, mean_curve, metric_keys, metric_labels,
                                     reference_verbose_share)
from hargo.compare.render_text import render_html, render_md  # noqa: F401  (public here too)
from hargo.evaluation.plots import (PREDICTED, plot_confusion, plot_task_curves,
                                    plot_task_lengths)
from hargo.tasks import task_names

__all__ = ["PAPER", "PAPER_MODEL", "Setup", "pretty", "document", "summary",
           "render_md", "render_html", "write_figures"]

#: The paper's table (method.md "Paper results"): WinRate, DR-F1 and MLPerf EM in percent, PLP a
#: cosine in [0, 1]; SFT has no WinRate.
PAPER_MODEL = "Qwen2.5-0.5B-Instruct"
PAPER = {
    "sft": {"win_rate": None, "dr_f1": 89.59, "plp_similarity": 0.8242, "mlperf_em": 14.29},
    "grpo": {"win_rate": 53.17, "dr_f1": 90.73, "plp_similarity": 0.8351, "mlperf_em": 18.13},
    "dr_grpo": {"win_rate": 51.63, "dr_f1": 90.79, "plp_similarity": 0.8388, "mlperf_em": 15.93},
    "hargo": {"win_rate": 54.62, "dr_f1": 91.30, "plp_similarity": 0.8558, "mlperf_em": 17.58},
}
_PAPER_KEYS = ("win_rate", "dr_f1", "plp_similarity", "mlperf_em")


def pretty(m: str) -> str:
    """The display name of a method, its :attr:`hargo.methods.Method.label` (``hargo_b1`` ->
    ``HARGO-B1``), or of the SFT model (``sft`` -> ``SFT``); other names unchanged."""
    if m == SFT:
        return "SFT"
    try:
        return get_method(m).label
    except ParamsError:
        return m


@dataclass(frozen=True)
class Setup:
    """What the comparison ran with: the document's header, budget and summary fields.

    Attributes:
        model: ``model.source``; methods, seeds: ``compare.methods`` / ``compare.seeds``;
        judge: the WinRate judge's name; steps, prompts_per_step: ``compare``'s budget;
        num_generations: ``rl.num_generations`` (G); sft_samples_per_task, sft_epochs: SFT's
        budget (hpcgpt's); resamples, confidence, bootstrap_seed: of the bootstrap;
        data_version, git_commit: of the repository.
    """

    model: str
    methods: list[str]
    seeds: list[int]
    judge: str
    steps: int
    prompts_per_step: int
    num_generations: int
    sft_samples_per_task: object
    sft_epochs: object
    resamples: int
    confidence: float
    bootstrap_seed: int
    data_version: str
    git_commit: str

    @property
    def budget(self) -> int:
        """Prompts per RL / preference method: steps x prompts per step."""
        return self.steps * self.prompts_per_step


# ----------------------------------------------------------------------------- numbers

def _fmt(v, pct: bool) -> str:
    if v is None:
        return "-"
    return f"{100 * v:.2f}" if pct else f"{v:.4f}"


def _fmt_ms(ms, pct: bool) -> str:
    if ms is None:
        return "-"
    m, s = ms
    return f"{_fmt(m, pct)} ± {_fmt(s, pct)}"


def _fmt_diff(v, pct: bool) -> str:
    return f"{100 * v:+.2f}" if pct else f"{v:+.4f}"


def _n_per_task(samples: Sequence[Mapping]) -> dict[str, int]:
    return {t: sum(r["task"] == t for r in samples) for t in task_names()}


# ----------------------------------------------------------------------------- the document

def _header(setup: Setup, samples: Sequence[Mapping]) -> list:
    n_task = _n_per_task(samples)
    return [
        ("h", 1, "Method comparison"),
        ("ul", [f"model: {setup.model} (SFT from models/sft; hpcgpt from the base model)",
                f"seeds: {', '.join(map(str, setup.seeds))} ({len(setup.seeds)} runs per method; "
                f"SFT evaluated once)",
                f"budget: {setup.steps} steps x {setup.prompts_per_step} prompts = "
                f"{setup.budget} prompts per RL / preference method (RL: G = "
                f"{setup.num_generations} completions per prompt); hpcgpt: SFT's budget "
                f"({setup.sft_samples_per_task} examples per task x {setup.sft_epochs} epoch(s)) "
                f"from the base model",
                f"eval prompts: {len(samples)} ({', '.join(f'{t} {n}' for t, n in n_task.items())}), "
                f"the same for every model",
                f"WinRate judge: {setup.judge} (vs SFT on the same prompt ids; ties count half)",
                f"data version: {setup.data_version}; git commit: {setup.git_commit}"]),
    ]


def _results(setup: Setup, agg: Aggregates) -> list:
    keys, labels = metric_keys(), metric_labels()
    header = ["method"] + [labels[k][0] + (" (%)" if labels[k][1] else "") for k in keys]
    pct = {k: labels[k][1] for k in keys}
    table = [["SFT"] + [_fmt(agg.per_run[SFT].get(k), pct[k]) for k in keys]]
    for m in setup.methods:
        res = agg.results[m]
        table.append([pretty(m)] + [_fmt_ms(None if res[k] is None else
                                            (res[k]["mean"], res[k]["std"]), pct[k])
                                    for k in keys])
    return [
        ("h", 2, "Results (mean ± sample std over seeds)"),
        ("table", header, table),
        ("p", "WinRate, DR-F1, MLPerf EM and accuracies in percent; PLP similarity (MiniLM "
              "cosine), AvgScore (mean task reward) and the per-task mean task rewards as "
              "fractions."),
    ]


def _paper(setup: Setup, agg: Aggregates) -> list:
    rows, head = [], headline_columns()
    for m in PAPER:
        if m != SFT and m not in setup.methods:
            continue
        rows.append([f"{pretty(m)}: paper ({PAPER_MODEL})"] + [
            "-" if PAPER[m][k] is None else (f"{PAPER[m][k]:.2f}" if head[k][1]
                                             else f"{PAPER[m][k]:.4f}")
            for k in _PAPER_KEYS])
        ours = (agg.per_run[SFT] if m == SFT else
                {k: (agg.results[m][k] or {}).get("mean") for k in head})
        rows.append([f"{pretty(m)}: ours ({setup.model})"] + [
            _fmt(ours.get(k), head[k][1]) for k in _PAPER_KEYS])
    return [
        ("h", 2, "The paper's figures beside ours"),
        ("p", f"Rows marked 'paper ({PAPER_MODEL})' are the paper's published numbers "
              f"(method.md), not results of this project; 'ours' is mean over seeds here."),
        ("table", ["method", "WinRate (%)", "DR-F1 (%)", "PLP sim", "MLPerf EM (%)"], rows),
    ]


_RACE_COLUMNS = (("dr_f1", "DR-F1"), ("dr_mcc", "DR MCC"), ("dr_auc", "DR AUC"),
                 ("dr_yes_share", "yes share"))
_BASELINE_NAMES = {"always-yes": "always-yes (baseline)",
                   "nearest-train": "nearest-train (baseline)", "base": "base model (baseline)"}


def _race_baselines(setup: Setup, race: Mapping | None) -> list:
    """The race table against the baselines (``hargo.compare.baselines.race_table``), or
    nothing when ``race`` is None."""
    if race is None:
        return []
    f = lambda v: "-" if v is None else f"{v:.3f}"  # noqa: E731
    rows = [[_BASELINE_NAMES.get(n, n)] + [f(m[k]) for k, _ in _RACE_COLUMNS]
            for n, m in race["baselines"].items()]
    rows.append(["SFT"] + [f(race["sft"][k]) for k, _ in _RACE_COLUMNS])
    for m in setup.methods:
        r = race["methods"][m]
        rows.append([pretty(m)] + ["-" if r[k] is None else
                                   f"{r[k]['mean']:.3f} ± {r[k]['std']:.3f}"
                                   for k, _ in _RACE_COLUMNS])
    base_note = ("" if "base" in race["baselines"] else
                 " The untuned base model was not evaluated here (stage compare_base); "
                 "`hargo summary` shows it on the evaluate stage's prompts.")
    return [
        ("h", 2, "Data race detection against baselines (mean ± sample std over seeds)"),
        ("p", "Baselines: always-yes answers yes to every race prompt (MCC 0, AUC 0.5 whatever "
              "the label balance); nearest-train gives each prompt the label of the most "
              "similar train race kernel (Jaccard of token sets; AUC of nearest-yes minus "
              "nearest-no similarity); base is the untuned base model. DR AUC: ROC AUC of the "
              "first-token log P(yes) - log P(no). A race gain counts only above all baselines."
              + base_note),
        ("table", ["model"] + [label for _, label in _RACE_COLUMNS], rows),
    ]


def _intervals(setup: Setup, ci: Mapping[str, Mapping], notes: Sequence[str]) -> list:
    blocks: list = [
        ("h", 2, f"HARGO minus other methods: {int(setup.confidence * 100)}% paired bootstrap "
                 f"intervals"),
        ("p", f"Percentile bootstrap (Efron & Tibshirani 1993), {setup.resamples} resamples of "
              f"the eval prompts (paired by prompt, within each metric's tasks); seed s of HARGO "
              f"paired with seed s of the other method, the difference averaged over the "
              f"{len(setup.seeds)} seed pairs. Points for percentage metrics. Each interval "
              f"stands alone: with several metrics per pair, about 1 in 20 excludes 0 by chance "
              f"(no multiple-comparison correction)."),
    ]
    lines, labels = [], metric_labels()
    for k, c in ci.get("hargo-grpo", {}).items():
        p = labels[k][1]
        lines.append(f"HARGO - GRPO, {labels[k][0]}: {_fmt_diff(c['diff'], p)} "
                     f"[{_fmt_diff(c['low'], p)}, {_fmt_diff(c['high'], p)}]"
                     + (" (excludes 0)" if c["low"] > 0 or c["high"] < 0 else ""))
    if lines:
        blocks.append(("ul", lines))
    blocks += [("p", "Note: " + n) for n in notes]
    rows = [[f"HARGO - {pretty(pair.split('-', 1)[1])}", labels[k][0],
             _fmt_diff(c["diff"], labels[k][1]), _fmt_diff(c["low"], labels[k][1]),
             _fmt_diff(c["high"], labels[k][1]), str(c["n_prompts"])]
            for pair, cs in ci.items() for k, c in cs.items()]
    if rows:
        blocks.append(("table", ["pair", "metric", "diff", "low", "high", "prompts"], rows))
    return blocks


def _sft_intervals(setup: Setup, samples: Sequence[Mapping],
                   sft_ci: Mapping[str, Mapping]) -> list:
    if not sft_ci:
        return []
    ref = reference_verbose_share(samples)
    ref_text = ("" if ref is None else
                f" Its trivial baseline: the reference answers themselves, {100 * ref:.1f}% of "
                f"them over {VERBOSE_CHARS} characters (a model answering each MLPerf prompt with "
                f"its reference would score that).")
    labels = metric_labels()
    rows = [[f"{pretty(pair.rsplit('-', 1)[0])} - SFT", labels[k][0],
             _fmt_diff(c["diff"], labels[k][1]), _fmt_diff(c["low"], labels[k][1]),
             _fmt_diff(c["high"], labels[k][1]),
             "above 0" if c["low"] > 0 else "below 0" if c["high"] < 0 else "contains 0"]
            for pair, cs in sft_ci.items() for k, c in cs.items()]
    return [
        ("h", 2, f"Each method minus SFT: {int(setup.confidence * 100)}% paired bootstrap "
                 f"intervals"),
        ("p", f"Did post-training move the SFT model it starts from? The SFT model is evaluated "
              f"once (greedy), so it is paired with every seed of the method; {setup.resamples} "
              f"resamples of the eval prompts, the difference averaged over the "
              f"{len(setup.seeds)} seeds. Points for percentage metrics. MLPerf > "
              f"{VERBOSE_CHARS} chars is the share of verbose MLPerf answers (lower is better)."
              + ref_text),
        ("table", ["pair", "metric", "diff", "low", "high", "interval"], rows),
    ]


def _figures(agg: Aggregates) -> list:
    curves = ("Per-task mean reward per step; loss weight per step (solid: the largest weight "
              "in the task's groups, dashed: the mean, 1/G by construction)." if agg.histories
              else "No online RL method in compare.methods: no training history.")
    return [
        ("h", 2, "Data race confusion matrices (race_c + race_fortran, summed over seeds)"),
        ("table", ["model", "true yes: " + "/".join(PREDICTED), "true no: " + "/".join(PREDICTED)],
         [[pretty(n), " / ".join(map(str, c[0])), " / ".join(map(str, c[1]))]
          for n, c in agg.confusion.items()]),
        ("img", "confusion matrices", "confusion.png"),
        ("h", 2, "Training curves (online RL methods, mean over seeds)"),
        ("p", curves),
        ("img", "reward curves", "reward_curves.png"),
        ("img", "weight curves", "weight_curves.png"),
        ("p", "Cumulative share of the update mass per task (sum of w |A| over the task's "
              "completions so far / over all; GRPO's weights are 1/G, so its shares follow the "
              "advantages; HARGO's weights are meant to move mass toward the tasks whose groups "
              "discriminate). GRPO-family methods only: PPO logs the mean of its per-token "
              "advantages, not its update mass."),
        ("img", "update mass share", "update_mass_share.png"),
        ("h", 2, "Answer length (completion characters, median per task)"),
        ("table", ["model"] + list(task_names()),
         [[pretty(n)] + [str(int(np.median(c[t]))) if c.get(t) else "-" for t in task_names()]
          for n, c in agg.chars.items()]),
        ("img", "answer lengths", "answer_lengths.png"),
    ]


def _budget(setup: Setup, train: Mapping[str, Mapping[int, Mapping]],
            pref_stats: Mapping | None) -> list:
    rows = []
    for m in setup.methods:
        seen = [train[m][s].get("prompts_seen") for s in setup.seeds]
        wall = [train[m][s].get("wall_s") for s in setup.seeds]
        rows.append([pretty(m), "/".join("-" if v is None else str(v) for v in seen),
                     "-" if any(v is None for v in wall) else f"{np.mean(wall):.0f}"])
    blocks: list = [("h", 2, "Training budget as run"),
                    ("table", ["method", "prompts seen (per seed)", "train wall s (mean)"], rows)]
    if pref_stats is not None:
        blocks.append(("p", "Preference pairs (DPO, KTO, SimPO; ties dropped): " + ", ".join(
            f"{k} {v}" for k, v in sorted(pref_stats.items())
            if isinstance(v, (int, float, str)) and not isinstance(v, bool))))
    return blocks


def document(setup: Setup, samples: Sequence[Mapping], agg: Aggregates,
             ci: Mapping[str, Mapping], notes: Sequence[str],
             train: Mapping[str, Mapping[int, Mapping]], pref_stats: Mapping | None,
             race: Mapping | None = None, sft_ci: Mapping[str, Mapping] | None = None) -> list:
    """The report as blocks (module docstring), in order: header (model, seeds, budget, eval
    prompts, judge, data version and commit), the results table (mean +- std over seeds), the
    race table against the baselines (when ``race`` is given), the paper's figures beside ours,
    the bootstrap intervals and notes, confusion matrices, training curves, answer lengths and
    the training budget as run.

    Args:
        setup: what the comparison ran with.
        samples: the eval records (canonical prompt order).
        agg: the aggregates; ci, notes: :func:`hargo.compare.aggregate.bootstrap_cis`.
        train: per method and seed, the training metrics (``prompts_seen``, ``wall_s``).
        pref_stats: the preference pairs' stats, or None when no preference method is compared.
        race: ``hargo.compare.baselines.race_table``'s result, or None.
        sft_ci: :func:`hargo.compare.aggregate.sft_cis` (each method minus SFT), or None.
    """
    return (_header(setup, samples) + _results(setup, agg) + _race_baselines(setup, race)
            + _paper(setup, agg)
            + _intervals(setup, ci, notes) + _sft_intervals(setup, samples, sft_ci or {}) + _figures(agg) + _budget(setup, train, pref_stats))


def summary(setup: Setup, samples: Sequence[Mapping], agg: Aggregates,
            ci: Mapping[str, Mapping], notes: Sequence[str],
            train: Mapping[str, Mapping[int, Mapping]], pref_stats: Mapping | None,
            race: Mapping | None = None, sft_ci: Mapping[str, Mapping] | None = None) -> dict:
    """The summary metrics document (``metrics/compare/summary.json``; arguments as
    :func:`document`): setup and budget, SFT's metrics, ``results`` (mean/std/values per method
    and metric), ``runs`` (per-run metrics and WinRate counts), ``ci``, the bootstrap settings,
    confusion counts, preference stats, the paper's figures, the notes, ``race`` (the race
    table against the baselines, or None), ``sft_ci`` (each method minus SFT) and
    ``reference_mlperf_verbose`` (the reference answers' own verbosity share)."""
    return {
        "methods": setup.methods, "seeds": setup.seeds, "judge": setup.judge,
        "n_prompts": len(samples), "n_prompts_per_task": _n_per_task(samples),
        "data_version": setup.data_version, "git_commit": setup.git_commit,
        "budget": {"steps": setup.steps, "prompts_per_step": setup.prompts_per_step,
                   "prompts_per_method": setup.budget, "num_generations": setup.num_generations,
                   "prompts_seen": {m: {str(s): train[m][s].get("prompts_seen")
                                        for s in setup.seeds} for m in setup.methods}},
        "sft": {k: agg.per_run[SFT].get(k) for k in metric_keys()},
        "results": agg.results,
        "runs": {name: {**m, **({"win_wins": agg.wins[name]["wins"],
                                 "win_ties": agg.wins[name]["ties"],
                                 "win_losses": agg.wins[name]["losses"]}
                                if name in agg.wins else {})}
                 for name, m in agg.per_run.items()},
        "ci": ci, "bootstrap": {"resamples": setup.resamples, "confidence": setup.confidence,
                                "seed": setup.bootstrap_seed},
        "confusion": {"labels": ["yes", "no"], "predicted": list(PREDICTED),
                      "counts": agg.confusion},
        "preferences": pref_stats, "paper": {"model": PAPER_MODEL, "results": PAPER},
        "notes": list(notes), "race": race, "sft_ci": dict(sft_ci or {}),
        "reference_mlperf_verbose": reference_verbose_share(samples),
    }


# ----------------------------------------------------------------------------- figures

def _curves(histories: Mapping[str, list], metric: str,
            dashed: str | None) -> list[tuple[str, dict, dict]]:
    """Per method, the mean-over-seeds curves of ``<task>/<metric>`` (and ``<task>/<dashed>``)
    for ``hargo.evaluation.plots.plot_task_curves``."""
    ts = task_names()
    return [(pretty(m), {t: mean_curve(hists, f"{t}/{metric}") for t in ts},
             {t: mean_curve(hists, f"{t}/{dashed}") for t in ts} if dashed else {})
            for m, hists in histories.items()]


def write_figures(out_dir: Path, agg: Aggregates) -> None:
    """Write the report's figures into ``out_dir``: ``confusion.png`` (the pooled race
    confusion matrix per model, seeds summed), ``reward_curves.png``, ``weight_curves.png`` and
    ``update_mass_share.png`` (one panel per task, a line per online RL method, mean over
    seeds) and
    ``answer_lengths.png`` (completion characters per task, SFT and each method, seeds
    pooled)."""
    plot_confusion(out_dir / "confusion.png",
                   [(pretty(n), c) for n, c in agg.confusion.items()], panel_size=(3.6, 3.2),
                   title_size=10, suptitle="data race (race_c + race_fortran), summed over seeds")
    no_history = "no online RL training history"
    plot_task_curves(out_dir / "reward_curves.png", _curves(agg.histories, "reward_mean", None),
                     "mean task reward", empty=no_history)
    plot_task_curves(out_dir / "weight_curves.png",
                     _curves(agg.histories, "weight_max", "weight_mean"),
                     "loss weight (max; dashed: mean)", empty=no_history)
    plot_task_curves(out_dir / "update_mass_share.png",
                     [(pretty(m), {t: cumulative_mass_share(h, t) for t in task_names()}, {})
                      for m, h in agg.histories.items() if m != "ppo"],
                     "cumulative share of the update mass", empty=no_history)
    plot_task_lengths(out_dir / "answer_lengths.png",
                      [(pretty(n), c) for n, c in agg.chars.items()],
                      "answer length before (SFT) and after training, seeds pooled")
