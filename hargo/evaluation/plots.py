"""Plots of the evaluate stage: DVC plot data (CSV) and PNG images.

Layout of the plots folder (``reports/eval``; ``dvc.yaml``'s evaluate stage declares it):

- ``confusion/<model>.csv``: one row per race sample (race_c and race_fortran pooled), columns
  ``actual`` (the label, yes/no) and ``predicted`` (the extracted answer: yes, no, or
  ``unparsed`` when the completion holds both words or neither). DVC's ``confusion`` template
  draws it. DR-F1 counts ``unparsed`` as the wrong answer (hargo.metrics).
- ``task_scores.csv``: one row per (model, task): ``model``, ``task``, ``task_model`` (the bar
  label), ``reward`` (mean task reward) and ``accuracy``. DVC's ``bar_horizontal`` template draws
  ``reward`` per ``task_model``.
- ``images/confusion_<model>.png`` and ``images/task_scores.png``: the same as PNG images
  (matplotlib, Agg backend).
"""
from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Mapping, Sequence

from hargo.rewards import RACE_TASKS, TASKS

__all__ = ["ACTUAL", "PREDICTED", "confusion_rows", "confusion_counts", "task_score_rows",
           "write_plots"]

ACTUAL = ("yes", "no")
PREDICTED = ("yes", "no", "unparsed")


def confusion_rows(scored: Sequence[Mapping], samples: Sequence[Mapping]) -> list[dict]:
    """``[{"actual", "predicted"}]`` for the race samples of one model.

    Args:
        scored: ``hargo.metrics.score_samples`` output (``prediction`` on race rows).
        samples: the aligned eval records (``task``, ``label``).
    """
    from hargo.rewards.race import normalise_label

    rows = []
    for s, r in zip(samples, scored):
        if s["task"] in RACE_TASKS:
            rows.append({"actual": normalise_label(s["label"]),
                         "predicted": r.get("prediction") or "unparsed"})
    return rows


def confusion_counts(rows: Sequence[Mapping]) -> list[list[int]]:
    """Counts as a 2 x 3 matrix: rows ``ACTUAL`` (yes, no), columns ``PREDICTED``
    (yes, no, unparsed)."""
    m = [[0] * len(PREDICTED) for _ in ACTUAL]
    for r in rows:
        m[ACTUAL.index(r["actual"])][PREDICTED.index(r["predicted"])] += 1
    return m


def task_score_rows(scored_by_model: Mapping[str, Sequence[Mapping]]) -> list[dict]:
    """Mean reward and accuracy per (model, task), models in the given order, tasks in
    ``hargo.rewards.TASKS`` order (tasks without samples left out)."""
    rows = []
    for model, scored in scored_by_model.items():
        for task in TASKS:
            rs = [r for r in scored if r["task"] == task]
            if not rs:
                continue
            rows.append({"model": model, "task": task, "task_model": f"{task} / {model}",
                         "reward": sum(r["reward"] for r in rs) / len(rs),
                         "accuracy": sum(bool(r["correct"]) for r in rs) / len(rs)})
    return rows


def _csv(rows: Sequence[Mapping], columns: Sequence[str]) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(columns), lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow({c: r[c] for c in columns})
    return buf.getvalue()


def _confusion_png(path: Path, model: str, counts: list[list[int]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(4.2, 3.2), dpi=100)
    ax.imshow(counts, cmap="Blues")
    ax.set_xticks(range(len(PREDICTED)), PREDICTED)
    ax.set_yticks(range(len(ACTUAL)), ACTUAL)
    ax.set_xlabel("predicted")
    ax.set_ylabel("actual")
    hi = max(max(r) for r in counts) or 1
    for i, row in enumerate(counts):
        for j, v in enumerate(row):
            ax.text(j, i, str(v), ha="center", va="center",
                    color="white" if v > hi / 2 else "black")
    ax.set_title(f"data race (pooled): {model}")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def _task_scores_png(path: Path, rows: Sequence[Mapping]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = list(dict.fromkeys(r["model"] for r in rows))
    tasks = [t for t in TASKS if any(r["task"] == t for r in rows)]
    width = 0.8 / max(len(models), 1)
    fig, ax = plt.subplots(figsize=(1.6 + 1.4 * len(tasks), 3.4), dpi=100)
    for k, model in enumerate(models):
        vals = {r["task"]: r["reward"] for r in rows if r["model"] == model}
        xs = [i + (k - (len(models) - 1) / 2) * width for i in range(len(tasks))]
        ax.bar(xs, [vals.get(t, 0.0) for t in tasks], width, label=model)
    ax.set_xticks(range(len(tasks)), tasks)
    ax.set_ylabel("mean task reward")
    ax.set_title("per-task score by model")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def write_plots(out_dir: str | Path, samples: Sequence[Mapping],
                scored_by_model: Mapping[str, Sequence[Mapping]]) -> dict:
    """Write the plot data and images (layout in the module docstring) into ``out_dir``.

    ``out_dir`` should be a fresh folder (the stage passes the temporary folder of
    ``hargo.io.atomic_dir``). Returns ``{"confusion": {model: 2x3 counts}, "task_scores": rows}``.
    """
    out = Path(out_dir)
    (out / "confusion").mkdir(parents=True, exist_ok=True)
    (out / "images").mkdir(parents=True, exist_ok=True)
    confusion = {}
    for model, scored in scored_by_model.items():
        rows = confusion_rows(scored, samples)
        (out / "confusion" / f"{model}.csv").write_text(_csv(rows, ("actual", "predicted")),
                                                         encoding="utf-8")
        confusion[model] = confusion_counts(rows)
        _confusion_png(out / "images" / f"confusion_{model}.png", model, confusion[model])
    task_rows = task_score_rows(scored_by_model)
    (out / "task_scores.csv").write_text(
        _csv(task_rows, ("model", "task", "task_model", "reward", "accuracy")), encoding="utf-8")
    _task_scores_png(out / "images" / "task_scores.png", task_rows)
    return {"confusion": confusion, "task_scores": task_rows}
