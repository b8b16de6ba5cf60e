"""Stage ``report``: aggregate the nine-method comparison into a report (issue 7, "Report").

``run(params, root)`` reads, for every method ``m`` in ``compare.methods`` and seed ``s`` in
``compare.seeds`` (run ``<m>-s<s>``), and for the SFT model (run ``sft``, evaluated once):

- ``data/compare/eval/<run>/generations.jsonl`` (``hargo.metrics.score_samples`` rows: ``id``,
  ``task``, ``completion``, ``reward``, ``correct``, ``chars`` and ``prediction`` / ``em`` /
  ``similarity``) and ``data/compare/eval/<run>/metrics.json`` (stage ``compare_eval``);
- ``metrics/compare/train/<run>.json`` (``prompts_seen``, ``steps``, ``wall_s``, ``history``:
  StepRecorder rows, ``[]`` for offline methods; stage ``compare_train``);
- ``<compare.preferences.out_dir>/stats.json`` when a preference method (dpo, kto, simpo) is
  compared (stage ``preferences``);
- ``<data.out_dir>/eval.jsonl``: the race labels and references of the eval ids (stage
  ``prepare``).

Every metric is recomputed from the per-prompt rows with the definitions of ``hargo.metrics``
(DR-F1 pooled over race_c and race_fortran, an unparseable answer counting as the wrong one; PLP
similarity = mean cosine; MLPerf EM; AvgScore = mean task reward; per-task accuracy = mean
``correct``) and checked against the run's ``metrics.json``: a disagreement means the two files
come from different evaluations and is an error. No reward is recomputed (the PLP embedder is not
loaded): WinRate vs SFT uses the judge of ``params["evaluate"]`` (``hargo.judges.make_judge``)
through ``hargo.metrics.win_rate`` on the same prompt ids, and the ``reward`` judge reads the task
rewards stored in the generations (:class:`StoredRewards`).

Outputs (each whole or not at all; ``hargo.io``):

- ``reports/comparison.md`` (readable in a terminal) and ``reports/comparison.html``
  (self-contained: the images are embedded as base64 PNG);
- ``reports/comparison/*.png``: ``confusion.png`` (pooled race confusion matrix per model,
  summed over seeds), ``reward_curves.png`` and ``weight_curves.png`` (one panel per task, a line
  per online RL method, mean over seeds), ``answer_lengths.png`` (completion characters per task,
  SFT and each method, seeds pooled);
- ``metrics/compare/summary.json``;
- an MLflow run tagged ``hargo.kind=comparison`` with the summary metrics and all of the above as
  artifacts.

Contents: the paper-style table as mean +- std over seeds (sample std, ddof=1; SFT one row), the
paper's own figures beside ours (method.md), 95% paired-bootstrap CIs of HARGO minus each other
method (headline: HARGO - GRPO; ``hargo.compare.stats``), the confusion matrices, training
curves, answer lengths, the judge, budget, seeds, data version and git commit.
"""
from __future__ import annotations

import base64
import html
import json
import math
from pathlib import Path
from typing import Callable, Mapping, Sequence

import numpy as np

from hargo.compare.stats import (f1_statistic, mean_statistic, mean_std,
                                 paired_bootstrap_ci_seeds, race_f1_records)
from hargo.compare.evaluate import EVAL_ROOT
from hargo.compare.train import TRAIN_METRICS_ROOT
from hargo.io import HargoInputError, atomic_dir, atomic_write_json, atomic_write_text, read_jsonl
from hargo.params import PREFERENCE_METHODS
from hargo.params import RL_METHODS as ONLINE_RL_METHODS
from hargo.rewards import RACE_TASKS, TASKS, completion_text

__all__ = ["EVAL_ROOT", "TRAIN_METRICS_ROOT", "REPORT_MD", "REPORT_HTML", "FIGURES_DIR",
           "SUMMARY_FILE", "SFT", "PAPER", "PAPER_MODEL", "HEADLINE", "StoredRewards",
           "run_metrics", "per_prompt_values", "mean_curve", "run"]

REPORT_MD = Path("reports") / "comparison.md"
REPORT_HTML = Path("reports") / "comparison.html"
FIGURES_DIR = Path("reports") / "comparison"
SUMMARY_FILE = Path("metrics") / "compare" / "summary.json"
SFT = "sft"

#: The paper's table (method.md "Paper results"): WinRate, DR-F1 and MLPerf EM in percent, PLP a
#: cosine in [0, 1]; SFT has no WinRate.
PAPER_MODEL = "Qwen2.5-0.5B-Instruct"
PAPER = {
    "sft": {"win_rate": None, "dr_f1": 89.59, "plp_similarity": 0.8242, "mlperf_em": 14.29},
    "grpo": {"win_rate": 53.17, "dr_f1": 90.73, "plp_similarity": 0.8351, "mlperf_em": 18.13},
    "dr_grpo": {"win_rate": 51.63, "dr_f1": 90.79, "plp_similarity": 0.8388, "mlperf_em": 15.93},
    "hargo": {"win_rate": 54.62, "dr_f1": 91.30, "plp_similarity": 0.8558, "mlperf_em": 17.58},
}

#: Headline metrics: key -> (label, shown in percent?).
HEADLINE = {"win_rate": ("WinRate vs SFT", True), "dr_f1": ("DR-F1", True),
            "plp_similarity": ("PLP sim", False), "mlperf_em": ("MLPerf EM", True),
            "avg_score": ("AvgScore", False)}
_CHECKED = ("dr_f1", "plp_similarity", "mlperf_em", "avg_score")
_TASK_FIELD = {"race_c": "prediction", "race_fortran": "prediction", "mlperf": "em",
               "plp": "similarity"}
_PRETTY = {"sft": "SFT", "hpcgpt": "HPC-GPT", "ppo": "PPO", "dpo": "DPO", "kto": "KTO",
           "simpo": "SimPO", "grpo": "GRPO", "dr_grpo": "Dr.GRPO", "hargo": "HARGO",
           "hargo_b1": "HARGO-B1", "hargo_b2": "HARGO-B2"}


def _pretty(m: str) -> str:
    return _PRETTY.get(m, m)


def _missing(path: Path, stage: str) -> FileNotFoundError:
    return FileNotFoundError(f"{path}: missing; it is written by the {stage} stage "
                             "(run the comparison first: `dvc repro compare/dvc.yaml`, or "
                             "scripts/compare.sh)")


# ----------------------------------------------------------------------------- inputs

def _read_json(path: Path, stage: str) -> dict:
    if not path.exists():
        raise _missing(path, stage)
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise HargoInputError(path, f"not valid JSON: {e}") from e
    if not isinstance(doc, dict):
        raise HargoInputError(path, f"expected a JSON object, got {type(doc).__name__}")
    return doc


def _load_eval_records(path: Path) -> dict[str, dict]:
    if not path.exists():
        raise _missing(path, "prepare")
    out = {}
    for i, r in enumerate(read_jsonl(path)):
        if not isinstance(r.get("id"), str):
            raise HargoInputError(path, "missing or non-string id", record=i, field="id")
        out[r["id"]] = r
    return out


def _race_labels(records: Mapping[str, dict], path: Path) -> dict[str, str]:
    from hargo.rewards.race import normalise_label

    out = {}
    for i, r in records.items():
        if r.get("task") in RACE_TASKS:
            try:
                out[i] = normalise_label(r.get("label"))
            except ValueError as e:
                raise HargoInputError(path, f"record id {i!r}: {e}", field="label") from None
    return out


def _load_generations(path: Path, records: Mapping[str, dict]) -> dict[str, dict]:
    """Rows of one run keyed by id, each field checked (names file, record and field)."""
    if not path.exists():
        raise _missing(path, "compare_eval")
    out: dict[str, dict] = {}
    for i, r in enumerate(read_jsonl(path)):
        rid = r.get("id")
        if rid not in records:
            raise HargoInputError(path, f"id {rid!r} is not in the eval split", record=i,
                                  field="id")
        if rid in out:
            raise HargoInputError(path, f"id {rid!r} appears twice", record=i, field="id")
        task = r.get("task")
        if task != records[rid].get("task"):
            raise HargoInputError(path, f"task {task!r} but the eval split says "
                                  f"{records[rid].get('task')!r}", record=i, field="task")
        for f, kinds in (("reward", (int, float)), ("correct", (bool,)), ("chars", (int,)),
                         ("completion", (str,))):
            if not isinstance(r.get(f), kinds) or (f == "reward" and isinstance(r[f], bool)):
                raise HargoInputError(path, f"expected {'/'.join(k.__name__ for k in kinds)}, "
                                      f"got {r.get(f)!r:.60}", record=i, field=f)
        f = _TASK_FIELD[task]
        v = r.get(f)
        ok = (v in ("yes", "no", None)) if f == "prediction" else \
            isinstance(v, bool) if f == "em" else \
            isinstance(v, (int, float)) and not isinstance(v, bool)
        if f not in r or not ok:
            raise HargoInputError(path, f"bad or missing value {v!r:.60} for a {task} row",
                                  record=i, field=f)
        out[rid] = r
    if not out:
        raise HargoInputError(path, "no generations")
    return out


# ----------------------------------------------------------------------------- metrics

def run_metrics(rows: Sequence[Mapping], labels: Mapping[str, str]) -> dict:
    """Headline metrics and per-task accuracy of one run from its per-prompt rows.

    Args:
        rows: generations rows (``id``, ``task``, ``reward``, ``correct`` and ``prediction`` /
            ``em`` / ``similarity``).
        labels: race label ("yes"/"no") per race id.

    Returns:
        ``dr_f1``, ``plp_similarity``, ``mlperf_em``, ``avg_score`` and ``accuracy_<task>``,
        ``n_<task>`` per task present (definitions of ``hargo.metrics``); a metric whose task
        is absent is None.
    """
    by = {t: [r for r in rows if r["task"] == t] for t in TASKS}
    race = [r for r in rows if r["task"] in RACE_TASKS]
    mean = lambda xs: float(np.mean(xs)) if len(xs) else None  # noqa: E731
    m = {"dr_f1": f1_statistic(race_f1_records([labels[r["id"]] for r in race],
                                               [r["prediction"] for r in race])) if race else None,
         "plp_similarity": mean([float(r["similarity"]) for r in by["plp"]]),
         "mlperf_em": mean([float(r["em"]) for r in by["mlperf"]]),
         "avg_score": mean([float(r["reward"]) for r in rows])}
    for t, rs in by.items():
        if rs:
            m[f"accuracy_{t}"] = mean([float(r["correct"]) for r in rs])
            m[f"n_{t}"] = len(rs)
    return m


def per_prompt_values(rows: Sequence[Mapping], labels: Mapping[str, str]) -> dict[str, np.ndarray]:
    """Per-prompt arrays for the bootstrap, in the order of ``rows``: ``dr_f1`` (``(n_race, 2)``
    records of :func:`race_f1_records`), ``plp_similarity`` (``(n_plp,)``), ``mlperf_em``
    (``(n_mlperf,)``, 0/1), ``avg_score`` (``(n,)`` rewards). Metrics without prompts are left
    out."""
    race = [r for r in rows if r["task"] in RACE_TASKS]
    out = {"avg_score": np.array([float(r["reward"]) for r in rows])}
    if race:
        out["dr_f1"] = race_f1_records([labels[r["id"]] for r in race],
                                       [r["prediction"] for r in race])
    for key, task, field in (("plp_similarity", "plp", "similarity"), ("mlperf_em", "mlperf", "em")):
        vals = [float(r[field]) for r in rows if r["task"] == task]
        if vals:
            out[key] = np.array(vals)
    return out


def _reward_key(task: str, answer, label, text: str) -> tuple:
    return (task, label if task in RACE_TASKS else answer, text)


class StoredRewards:
    """A ``TaskReward``-compatible callable that answers from rewards already computed.

    The report must not recompute PLP rewards (that loads the embedding model); the eval stage
    stored every completion's task reward in ``generations.jsonl``. The table maps
    ``(task, label for race / answer otherwise, completion text)`` to the stored reward; a
    completion not in it (never the case for the report's own judge calls) is scored by
    ``fallback`` (a ``hargo.rewards.TaskReward``), built only when needed.

    Args:
        fallback: zero-argument factory of the fallback reward function.

    Attributes:
        table: ``{key: reward}``, filled by :meth:`add`.
    """

    __name__ = "task_reward"

    def __init__(self, fallback: Callable[[], Callable] | None = None):
        self.table: dict[tuple, float] = {}
        self._fallback_factory = fallback
        self._fallback = None

    def add(self, sample: Mapping, row: Mapping) -> None:
        """Store ``row["reward"]`` for ``row["completion"]`` on ``sample``."""
        self.table[_reward_key(sample["task"], sample.get("answer"), sample.get("label"),
                               row["completion"])] = float(row["reward"])

    def __call__(self, prompts=None, completions=None, task=None, answer=None, label=None,
                 **kwargs) -> list[float]:
        """Rewards of N completions (same keyword lists as ``TaskReward.__call__``)."""
        texts = [completion_text(c) for c in completions]
        n = len(texts)
        answer = answer if answer is not None else [None] * n
        label = label if label is not None else [None] * n
        keys = [_reward_key(t, a, l, x) for t, a, l, x in zip(task, answer, label, texts)]
        out = [self.table.get(k) for k in keys]
        miss = [i for i, v in enumerate(out) if v is None]
        if miss:
            if self._fallback is None:
                if self._fallback_factory is None:
                    raise KeyError(f"StoredRewards: no stored reward for {len(miss)} completions "
                                   f"and no fallback")
                self._fallback = self._fallback_factory()
            vals = self._fallback(completions=[texts[i] for i in miss],
                                  task=[task[i] for i in miss], answer=[answer[i] for i in miss],
                                  label=[label[i] for i in miss])
            for i, v in zip(miss, vals):
                out[i] = float(v)
        return out


class _RecordingJudge:
    """Delegates to a judge and keeps the last batch of verdicts (per-prompt WinRate scores
    for the bootstrap without asking the judge twice)."""

    def __init__(self, judge):
        self.judge, self.name, self.last = judge, judge.name, []

    def compare(self, sample, a, b):
        return self.compare_batch([sample], [a], [b])[0]

    def compare_batch(self, samples, a, b):
        self.last = list(self.judge.compare_batch(samples, a, b))
        return self.last


def mean_curve(histories: Sequence[Sequence[Mapping]], key: str) -> tuple[list[int], list[float]]:
    """Mean over seeds of ``key`` (e.g. ``"plp/reward_mean"``) per training step.

    Args:
        histories: one StepRecorder history per seed (rows ``{"step": int, key: float, ...}``).

    Returns:
        ``(steps, means)``, steps ascending; a step's mean is over the seeds that logged a
        finite value there (None / NaN skipped); steps without any value are left out.
    """
    vals: dict[int, list[float]] = {}
    for hist in histories:
        for h in hist:
            v = h.get(key)
            if v is None or "step" not in h or (isinstance(v, float) and math.isnan(v)):
                continue
            vals.setdefault(int(h["step"]), []).append(float(v))
    steps = sorted(vals)
    return steps, [float(np.mean(vals[s])) for s in steps]


# ----------------------------------------------------------------------------- plots

def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _confusion_counts(rows: Sequence[Mapping], labels: Mapping[str, str]) -> list[list[int]]:
    from hargo.evaluation.plots import ACTUAL, PREDICTED

    m = [[0] * len(PREDICTED) for _ in ACTUAL]
    for r in rows:
        if r["task"] in RACE_TASKS:
            m[ACTUAL.index(labels[r["id"]])][PREDICTED.index(r["prediction"] or "unparsed")] += 1
    return m


def _plot_confusion(path: Path, counts: Mapping[str, list[list[int]]]) -> None:
    from hargo.evaluation.plots import ACTUAL, PREDICTED

    plt = _plt()
    names = list(counts)
    cols = min(3, len(names))
    nrows = math.ceil(len(names) / cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(3.6 * cols, 3.2 * nrows), dpi=100,
                             squeeze=False)
    for ax in axes.flat[len(names):]:
        ax.axis("off")
    for ax, name in zip(axes.flat, names):
        c = counts[name]
        ax.imshow(c, cmap="Blues")
        ax.set_xticks(range(len(PREDICTED)), PREDICTED)
        ax.set_yticks(range(len(ACTUAL)), ACTUAL)
        ax.set_xlabel("predicted")
        ax.set_ylabel("actual")
        hi = max(max(r) for r in c) or 1
        for i, row in enumerate(c):
            for j, v in enumerate(row):
                ax.text(j, i, str(v), ha="center", va="center",
                        color="white" if v > hi / 2 else "black")
        ax.set_title(_pretty(name), fontsize=10)
    fig.suptitle("data race (race_c + race_fortran), summed over seeds")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def _plot_curves(path: Path, histories: Mapping[str, list], metric: str, ylabel: str,
                 dashed: str | None = None) -> None:
    from matplotlib.ticker import MaxNLocator

    plt = _plt()
    fig, axes = plt.subplots(1, len(TASKS), figsize=(3.6 * len(TASKS), 3.2), dpi=100,
                             squeeze=False)
    any_line = False
    for ax, task in zip(axes[0], TASKS):
        for k, (method, hists) in enumerate(histories.items()):
            x, y = mean_curve(hists, f"{task}/{metric}")
            if x:
                any_line = True
                ax.plot(x, y, marker="o", ms=3, color=f"C{k % 10}", label=_pretty(method))
            if dashed:
                x, y = mean_curve(hists, f"{task}/{dashed}")
                if x:
                    ax.plot(x, y, ls="--", lw=0.8, color=f"C{k % 10}")
        ax.set_title(task)
        ax.set_xlabel("RL step")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel(ylabel)
    if any_line:
        handles = {}
        for ax in axes[0]:
            for h, lab in zip(*ax.get_legend_handles_labels()):
                handles.setdefault(lab, h)
        axes[0][-1].legend(list(handles.values()), list(handles), fontsize=7)
    else:
        fig.text(0.5, 0.5, "no online RL training history", ha="center", va="center")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def _plot_lengths(path: Path, chars: Mapping[str, Mapping[str, list[int]]]) -> None:
    plt = _plt()
    fig, axes = plt.subplots(1, len(TASKS), figsize=(3.8 * len(TASKS), 3.4), dpi=100,
                             squeeze=False)
    names = list(chars)
    for ax, task in zip(axes[0], TASKS):
        data = [chars[n].get(task, []) for n in names]
        if any(data):
            ax.boxplot([d if d else [0] for d in data], showfliers=True)
            ax.set_xticks(range(1, len(names) + 1), [_pretty(n) for n in names], rotation=60,
                          fontsize=7)
        ax.set_title(task)
        ax.grid(alpha=0.3, axis="y")
    axes[0][0].set_ylabel("completion characters")
    fig.suptitle("answer length before (SFT) and after training, seeds pooled")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


# ----------------------------------------------------------------------------- rendering

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


def _md_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A pipe table padded to column width (aligned in a terminal); first column left-aligned,
    the others right-aligned."""
    cells = [list(map(str, header))] + [list(map(str, r)) for r in rows]
    w = [max(len(r[i]) for r in cells) for i in range(len(header))]
    line = lambda r: "| " + " | ".join(c.ljust(w[i]) if i == 0 else c.rjust(w[i])  # noqa: E731
                                       for i, c in enumerate(r)) + " |"
    sep = "|" + "|".join(("-" * (w[i] + 2)) if i == 0 else ("-" * (w[i] + 1) + ":")
                         for i in range(len(header))) + "|"
    return "\n".join([line(cells[0]), sep] + [line(r) for r in cells[1:]])


def _render_md(blocks: list) -> str:
    out = []
    for b in blocks:
        kind = b[0]
        if kind == "h":
            out.append("#" * b[1] + " " + b[2])
        elif kind == "p":
            out.append(b[1])
        elif kind == "ul":
            out.append("\n".join(f"- {x}" for x in b[1]))
        elif kind == "table":
            out.append(_md_table(b[1], b[2]))
        elif kind == "img":
            out.append(f"![{b[1]}]({FIGURES_DIR.name}/{b[2]})")
    return "\n\n".join(out) + "\n"


def _render_html(blocks: list, images: Mapping[str, bytes], title: str) -> str:
    e = html.escape
    out = [f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{e(title)}</title>",
           "<style>body{font-family:sans-serif;max-width:1200px;margin:2em auto;padding:0 1em}"
           "table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;"
           "padding:3px 8px;text-align:right}td:first-child,th:first-child{text-align:left}"
           "img{max-width:100%}code{background:#f4f4f4}</style></head><body>"]
    for b in blocks:
        kind = b[0]
        if kind == "h":
            out.append(f"<h{b[1]}>{e(b[2])}</h{b[1]}>")
        elif kind == "p":
            out.append(f"<p>{e(b[1])}</p>")
        elif kind == "ul":
            out.append("<ul>" + "".join(f"<li>{e(x)}</li>" for x in b[1]) + "</ul>")
        elif kind == "table":
            head = "".join(f"<th>{e(str(c))}</th>" for c in b[1])
            body = "".join("<tr>" + "".join(f"<td>{e(str(c))}</td>" for c in r) + "</tr>"
                           for r in b[2])
            out.append(f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>")
        elif kind == "img":
            data = base64.b64encode(images[b[2]]).decode("ascii")
            out.append(f"<p><img alt='{e(b[1])}' src='data:image/png;base64,{data}'></p>")
    out.append("</body></html>")
    return "\n".join(out) + "\n"


# ----------------------------------------------------------------------------- stage

def run(params: dict, root: str | Path = ".") -> dict:
    """Run the ``report`` stage (see the module docstring).

    Args:
        params: the loaded params.yaml (``seed``, ``data.out_dir``, ``evaluate`` (judge),
            ``rewards``, ``rl.num_generations``, ``sft``, ``model.source``, ``mlflow``,
            ``compare``: ``methods``, ``seeds``, ``steps``, ``prompts_per_step``,
            ``preferences.out_dir``, ``report.bootstrap_resamples``, ``report.confidence``).
        root: the repository root that relative paths start from.

    Returns:
        ``{"report": md path, "html": html path, "summary": summary path, "figures": [png
        paths], "methods", "seeds", "judge", "ci": {"<a>-<b>": {metric: {diff, low, high}}},
        "run_id": MLflow run id}``.

    Raises:
        FileNotFoundError: an input is missing (the message names it and the stage that writes
            it: compare_train, compare_eval, preferences or prepare).
        HargoInputError: a bad input record, a run whose prompt ids differ from SFT's, or a
            ``metrics.json`` that disagrees with its ``generations.jsonl``.
        RuntimeError: the MLflow store cannot be used.
    """
    from hargo import tracking
    from hargo.judges import make_judge
    from hargo.metrics import win_rate

    root = Path(root)
    cmp = params["compare"]
    methods = list(cmp["methods"])
    seeds = [int(s) for s in cmp["seeds"]]
    rep = cmp.get("report", {}) or {}
    resamples = int(rep.get("bootstrap_resamples", 2000))
    confidence = float(rep.get("confidence", 0.95))
    boot_seed = int(params.get("seed", 0))
    notes: list[str] = []

    # 1. inputs, all checked before anything is written
    records = _load_eval_records(root / params["data"]["out_dir"] / "eval.jsonl")
    labels = _race_labels(records, root / params["data"]["out_dir"] / "eval.jsonl")
    runs = [SFT] + [f"{m}-s{s}" for m in methods for s in seeds]
    rows: dict[str, dict[str, dict]] = {}
    for name in runs:
        d = root / EVAL_ROOT / name
        rows[name] = _load_generations(d / "generations.jsonl", records)
        stored = _read_json(d / "metrics.json", "compare_eval")
        if name != SFT and set(rows[name]) != set(rows[SFT]):
            diff = sorted(set(rows[name]) ^ set(rows[SFT]))
            raise HargoInputError(d / "generations.jsonl", f"prompt ids differ from the SFT run's "
                                  f"({len(diff)} ids, e.g. {diff[:3]}); every model must answer "
                                  f"the same prompts: re-run compare_eval", field="id")
        ids_order = list(rows[SFT])
        m = run_metrics([rows[name][i] for i in ids_order], labels)
        for k in _CHECKED:
            if stored.get(k) is not None and (m[k] is None or abs(stored[k] - m[k]) > 1e-6):
                raise HargoInputError(d / "metrics.json", f"{stored[k]!r} disagrees with "
                                      f"{m[k]!r} recomputed from generations.jsonl (files of "
                                      f"different evaluations?): re-run compare_eval", field=k)
    ids = list(rows[SFT])  # the canonical prompt order
    samples = [records[i] for i in ids]
    train: dict[str, dict[int, dict]] = {m: {} for m in methods}
    for m in methods:
        for s in seeds:
            p = root / TRAIN_METRICS_ROOT / f"{m}-s{s}.json"
            doc = _read_json(p, "compare_train")
            if not isinstance(doc.get("history", []), list):
                raise HargoInputError(p, "expected a list", field="history")
            train[m][s] = doc
    pref_stats = None
    if any(m in PREFERENCE_METHODS for m in methods):
        pref_stats = _read_json(root / cmp["preferences"]["out_dir"] / "stats.json", "preferences")

    # 2. metrics per run, WinRate vs SFT with the configured judge
    from hargo.rewards import RewardConfig, TaskReward

    stored_rewards = StoredRewards(lambda: TaskReward(RewardConfig.from_params(params.get("rewards"))))
    for name in runs:
        for i in ids:
            stored_rewards.add(records[i], rows[name][i])
    judge = _RecordingJudge(make_judge(params["evaluate"], stored_rewards))
    ordered = {name: [rows[name][i] for i in ids] for name in runs}
    per_run = {name: run_metrics(ordered[name], labels) for name in runs}
    per_prompt = {name: per_prompt_values(ordered[name], labels) for name in runs}
    sft_completions = [r["completion"] for r in ordered[SFT]]
    wins: dict[str, dict] = {}
    for name in runs[1:]:
        w = win_rate(samples, [r["completion"] for r in ordered[name]], sft_completions, judge)
        wins[name] = w
        per_run[name]["win_rate"] = w["win_rate"]
        per_prompt[name]["win_rate"] = (np.array(judge.last, dtype=float) + 1.0) / 2.0
    per_run[SFT]["win_rate"] = None

    metric_keys = list(HEADLINE) + [f"accuracy_{t}" for t in TASKS]
    agg: dict[str, dict] = {}
    for m in methods:
        agg[m] = {}
        for k in metric_keys:
            vals = [per_run[f"{m}-s{s}"].get(k) for s in seeds]
            if any(v is None for v in vals):
                agg[m][k] = None
                continue
            mu, sd = mean_std(vals)
            agg[m][k] = {"mean": mu, "std": sd, "values": [float(v) for v in vals]}

    # 3. paired bootstrap CIs: hargo minus every other method present (headline: grpo)
    stats = {"dr_f1": f1_statistic}
    ci: dict[str, dict] = {}
    if "hargo" not in methods:
        notes.append("hargo is not in compare.methods: no bootstrap confidence intervals.")
    else:
        if "grpo" not in methods:
            notes.append("grpo is not in compare.methods: no HARGO - GRPO interval; intervals "
                         "against the other methods follow.")
        others = (["grpo"] if "grpo" in methods else []) + [m for m in methods
                                                            if m not in ("hargo", "grpo")]
        for other in others:
            pair = f"hargo-{other}"
            ci[pair] = {}
            for k in HEADLINE:
                a = [per_prompt[f"hargo-s{s}"].get(k) for s in seeds]
                b = [per_prompt[f"{other}-s{s}"].get(k) for s in seeds]
                if any(x is None for x in a + b):
                    continue
                ci[pair][k] = paired_bootstrap_ci_seeds(a, b, stats.get(k, mean_statistic),
                                                        resamples, confidence, boot_seed)

    # 4. curves, confusion, lengths
    histories = {m: [train[m][s].get("history") or [] for s in seeds] for m in methods
                 if any(train[m][s].get("history") for s in seeds)}
    confusion = {SFT: _confusion_counts(ordered[SFT], labels)}
    chars: dict[str, dict[str, list[int]]] = {SFT: {}}
    for r in ordered[SFT]:
        chars[SFT].setdefault(r["task"], []).append(int(r["chars"]))
    for m in methods:
        tot = np.zeros((2, 3), dtype=int)
        chars[m] = {}
        for s in seeds:
            tot += np.array(_confusion_counts(ordered[f"{m}-s{s}"], labels))
            for r in ordered[f"{m}-s{s}"]:
                chars[m].setdefault(r["task"], []).append(int(r["chars"]))
        confusion[m] = tot.tolist()

    # 5. the document
    G = int(params["rl"]["num_generations"])
    budget = int(cmp["steps"]) * int(cmp["prompts_per_step"])
    commit, dver = tracking.git_commit(root), tracking.data_version(root)
    n_task = {t: sum(r["task"] == t for r in samples) for t in TASKS}
    pct_label = lambda k: HEADLINE[k][0] + (" (%)" if HEADLINE[k][1] else "")  # noqa: E731
    acc_cols = [f"acc {t} (%)" for t in TASKS]
    header = ["method"] + [pct_label(k) for k in HEADLINE] + acc_cols
    pct = {k: HEADLINE[k][1] for k in HEADLINE} | {f"accuracy_{t}": True for t in TASKS}
    table = [["SFT"] + [_fmt(per_run[SFT].get(k), pct[k]) for k in metric_keys]]
    for m in methods:
        table.append([_pretty(m)] + [_fmt_ms(None if agg[m][k] is None else
                                             (agg[m][k]["mean"], agg[m][k]["std"]), pct[k])
                                     for k in metric_keys])
    model_name = str(params.get("model", {}).get("source", "?"))
    blocks: list = [
        ("h", 1, "Method comparison"),
        ("ul", [f"model: {model_name} (SFT from models/sft; hpcgpt from the base model)",
                f"seeds: {', '.join(map(str, seeds))} ({len(seeds)} runs per method; SFT "
                f"evaluated once)",
                f"budget: {cmp['steps']} steps x {cmp['prompts_per_step']} prompts = {budget} "
                f"prompts per RL / preference method (RL: G = {G} completions per prompt); "
                f"hpcgpt: SFT's budget ({params['sft'].get('samples_per_task')} examples per "
                f"task x {params['sft'].get('epochs')} epoch(s)) from the base model",
                f"eval prompts: {len(ids)} ({', '.join(f'{t} {n_task[t]}' for t in TASKS)}), "
                f"the same for every model",
                f"WinRate judge: {judge.name} (vs SFT on the same prompt ids; ties count half)",
                f"data version: {dver}; git commit: {commit}"]),
        ("h", 2, "Results (mean ± sample std over seeds)"),
        ("table", header, table),
        ("p", "WinRate, DR-F1, MLPerf EM and accuracies in percent; PLP similarity (MiniLM "
              "cosine) and AvgScore (mean task reward) as fractions."),
        ("h", 2, f"The paper's figures beside ours"),
        ("p", f"Rows marked 'paper ({PAPER_MODEL})' are the paper's published numbers "
              f"(method.md), not results of this project; 'ours' is mean over seeds here."),
    ]
    ptab = []
    for m in PAPER:
        if m != SFT and m not in methods:
            continue
        ptab.append([f"{_pretty(m)}: paper ({PAPER_MODEL})"] + [
            "-" if PAPER[m][k] is None else (f"{PAPER[m][k]:.2f}" if HEADLINE[k][1]
                                             else f"{PAPER[m][k]:.4f}")
            for k in ("win_rate", "dr_f1", "plp_similarity", "mlperf_em")])
        ours = per_run[SFT] if m == SFT else {k: (agg[m][k] or {}).get("mean") for k in HEADLINE}
        ptab.append([f"{_pretty(m)}: ours ({model_name})"] + [
            _fmt(ours.get(k), HEADLINE[k][1]) for k in ("win_rate", "dr_f1", "plp_similarity",
                                                        "mlperf_em")])
    blocks.append(("table", ["method", "WinRate (%)", "DR-F1 (%)", "PLP sim", "MLPerf EM (%)"],
                   ptab))

    blocks.append(("h", 2, f"HARGO minus other methods: {int(confidence * 100)}% paired "
                           f"bootstrap intervals"))
    blocks.append(("p", f"Percentile bootstrap (Efron & Tibshirani 1993), {resamples} resamples "
                        f"of the eval prompts (paired by prompt, within each metric's tasks); "
                        f"seed s of HARGO paired with seed s of the other method, the "
                        f"difference averaged over the {len(seeds)} seed pairs. Points for "
                        f"percentage metrics."))
    lines = []
    if "hargo-grpo" in ci:
        for k, c in ci["hargo-grpo"].items():
            p = HEADLINE[k][1]
            lines.append(f"HARGO - GRPO, {HEADLINE[k][0]}: {_fmt_diff(c['diff'], p)} "
                         f"[{_fmt_diff(c['low'], p)}, {_fmt_diff(c['high'], p)}]"
                         + (" (excludes 0)" if c["low"] > 0 or c["high"] < 0 else ""))
    if lines:
        blocks.append(("ul", lines))
    for n in notes:
        blocks.append(("p", "Note: " + n))
    ci_rows = [[f"HARGO - {_pretty(pair.split('-', 1)[1])}", HEADLINE[k][0],
                _fmt_diff(c["diff"], HEADLINE[k][1]), _fmt_diff(c["low"], HEADLINE[k][1]),
                _fmt_diff(c["high"], HEADLINE[k][1]), str(c["n_prompts"])]
               for pair, cs in ci.items() for k, c in cs.items()]
    if ci_rows:
        blocks.append(("table", ["pair", "metric", "diff", "low", "high", "prompts"], ci_rows))

    from hargo.evaluation.plots import PREDICTED

    blocks.append(("h", 2, "Data race confusion matrices (race_c + race_fortran, summed over "
                           "seeds)"))
    blocks.append(("table", ["model", "true yes: " + "/".join(PREDICTED),
                             "true no: " + "/".join(PREDICTED)],
                   [[_pretty(n), " / ".join(map(str, c[0])), " / ".join(map(str, c[1]))]
                    for n, c in confusion.items()]))
    blocks.append(("img", "confusion matrices", "confusion.png"))
    blocks.append(("h", 2, "Training curves (online RL methods, mean over seeds)"))
    if histories:
        blocks.append(("p", "Per-task mean reward per step; loss weight per step (solid: the "
                            "largest weight in the task's groups, dashed: the mean, 1/G by "
                            "construction)."))
    else:
        blocks.append(("p", "No online RL method in compare.methods: no training history."))
    blocks.append(("img", "reward curves", "reward_curves.png"))
    blocks.append(("img", "weight curves", "weight_curves.png"))
    blocks.append(("h", 2, "Answer length (completion characters, median per task)"))
    blocks.append(("table", ["model"] + list(TASKS),
                   [[_pretty(n)] + [str(int(np.median(c[t]))) if c.get(t) else "-"
                                    for t in TASKS] for n, c in chars.items()]))
    blocks.append(("img", "answer lengths", "answer_lengths.png"))
    brows = []
    for m in methods:
        seen = [train[m][s].get("prompts_seen") for s in seeds]
        wall = [train[m][s].get("wall_s") for s in seeds]
        brows.append([_pretty(m), "/".join("-" if v is None else str(v) for v in seen),
                      "-" if any(v is None for v in wall) else f"{np.mean(wall):.0f}"])
    blocks.append(("h", 2, "Training budget as run"))
    blocks.append(("table", ["method", "prompts seen (per seed)", "train wall s (mean)"], brows))
    if pref_stats is not None:
        blocks.append(("p", "Preference pairs (DPO, KTO, SimPO; ties dropped): " + ", ".join(
            f"{k} {v}" for k, v in sorted(pref_stats.items())
            if isinstance(v, (int, float, str)) and not isinstance(v, bool))))

    summary = {
        "methods": methods, "seeds": seeds, "judge": judge.name, "n_prompts": len(ids),
        "n_prompts_per_task": n_task, "data_version": dver, "git_commit": commit,
        "budget": {"steps": int(cmp["steps"]), "prompts_per_step": int(cmp["prompts_per_step"]),
                   "prompts_per_method": budget, "num_generations": G,
                   "prompts_seen": {m: {str(s): train[m][s].get("prompts_seen") for s in seeds}
                                    for m in methods}},
        "sft": {k: per_run[SFT].get(k) for k in metric_keys},
        "results": agg,
        "runs": {name: {**per_run[name], **({"win_wins": wins[name]["wins"],
                                             "win_ties": wins[name]["ties"],
                                             "win_losses": wins[name]["losses"]}
                                            if name in wins else {})} for name in runs},
        "ci": ci, "bootstrap": {"resamples": resamples, "confidence": confidence,
                                "seed": boot_seed},
        "confusion": {"labels": ["yes", "no"], "predicted": list(PREDICTED),
                      "counts": confusion},
        "preferences": pref_stats, "paper": {"model": PAPER_MODEL, "results": PAPER},
        "notes": notes,
    }

    # 6. outputs, each whole or not at all
    fig_dir = root / FIGURES_DIR
    images: dict[str, bytes] = {}
    with atomic_dir(fig_dir) as tmp:
        _plot_confusion(tmp / "confusion.png", confusion)
        _plot_curves(tmp / "reward_curves.png", histories, "reward_mean", "mean task reward")
        _plot_curves(tmp / "weight_curves.png", histories, "weight_max",
                     "loss weight (max; dashed: mean)", dashed="weight_mean")
        _plot_lengths(tmp / "answer_lengths.png", chars)
        for p in sorted(tmp.glob("*.png")):
            images[p.name] = p.read_bytes()
    md_path = atomic_write_text(root / REPORT_MD, _render_md(blocks))
    html_path = atomic_write_text(root / REPORT_HTML,
                                  _render_html(blocks, images, "hargo method comparison"))
    summary_path = atomic_write_json(root / SUMMARY_FILE, summary)
    figures = [fig_dir / n for n in sorted(images)]

    # 7. MLflow
    import mlflow

    exp_id = tracking.setup(params, root)
    tags = {**tracking.common_tags(params, root), "hargo.kind": "comparison",
            "hargo.judge": judge.name, "hargo.seeds": ",".join(map(str, seeds)),
            "hargo.methods": ",".join(methods)}
    with mlflow.start_run(experiment_id=exp_id, run_name="comparison", tags=tags) as mlrun:
        flat: dict[str, float] = {}
        for k, v in per_run[SFT].items():
            if isinstance(v, (int, float)) and v is not None:
                flat[f"sft/{k}"] = float(v)
        for m, ks in agg.items():
            for k, v in ks.items():
                if v is not None:
                    flat[f"{m}/{k}_mean"], flat[f"{m}/{k}_std"] = v["mean"], v["std"]
        for pair, cs in ci.items():
            for k, c in cs.items():
                for f in ("diff", "low", "high"):
                    flat[f"ci/{pair}/{k}_{f}"] = c[f]
        mlflow.log_metrics({k: v for k, v in flat.items() if math.isfinite(v)})
        mlflow.log_params({"compare.methods": ",".join(methods),
                           "compare.seeds": ",".join(map(str, seeds)),
                           "compare.steps": cmp["steps"],
                           "compare.prompts_per_step": cmp["prompts_per_step"],
                           "bootstrap_resamples": resamples, "confidence": confidence})
        for p in (md_path, html_path, summary_path):
            mlflow.log_artifact(str(p), artifact_path="comparison")
        for p in figures:
            mlflow.log_artifact(str(p), artifact_path="comparison/figures")
        run_id = mlrun.info.run_id

    return {"report": str(md_path), "html": str(html_path), "summary": str(summary_path),
            "figures": [str(p) for p in figures], "methods": methods, "seeds": seeds,
            "judge": judge.name,
            "ci": {pair: {k: {f: c[f] for f in ("diff", "low", "high")} for k, c in cs.items()}
                   for pair, cs in ci.items()},
            "run_id": run_id}
