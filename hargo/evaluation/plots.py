"""Plots of the evaluate stage (DVC plot data (CSV) and PNG images), and the figures that the
comparison report (``hargo.compare.render``) draws with the same code.

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
import math
from pathlib import Path
from typing import Mapping, Sequence

from hargo import vocab  # its task lists read when used (a task module added later counts)

__all__ = ["ACTUAL", "PREDICTED", "confusion_rows", "confusion_counts", "task_score_rows",
           "plot_confusion", "plot_task_curves", "plot_task_lengths", "write_plots"]

ACTUAL = ("yes", "no")
PREDICTED = ("yes", "no", "unparsed")


def confusion_rows(scored: Sequence[Mapping], samples: Sequence[Mapping]) -> list[dict]:
    """``[{"actual", "predicted"}]`` for the race samples of one model.

    Args:
        scored: ``hargo.metrics.score_samples`` output (``prediction`` on race rows).
        samples: the aligned eval records (``task``, ``label``).
    """
    from hargo.rewards.race import canonical_label

    rows = []
    for s, r in zip(samples, scored):
        if s["task"] in vocab.RACE_TASKS:
            rows.append({"actual": canonical_label(s["label"]),
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
        for task in vocab.TASKS:
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


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_confusion(path: str | Path, panels: Sequence[tuple[str, Sequence[Sequence[int]]]], *,
                   panel_size: tuple[float, float] = (4.2, 3.2), max_cols: int = 3,
                   title_size: float | None = None, suptitle: str | None = None) -> None:
    """Draw race confusion matrices into the PNG ``path``: one heat-map panel per model, at
    most ``max_cols`` panels a row, each cell annotated with its count.

    Used by the evaluate stage (one model per image) and by the comparison report (every
    model in one image).

    Args:
        panels: ``(title, counts)`` per panel, in order; counts as :func:`confusion_counts`
            (rows ``ACTUAL``, columns ``PREDICTED``).
        panel_size: inches (width, height) of one panel (the figure is 100 dpi).
        title_size: font size of the panel titles (matplotlib's title default when None).
        suptitle: a title over all panels, if any.
    """
    plt = _pyplot()
    cols = min(max_cols, len(panels))
    nrows = math.ceil(len(panels) / cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(panel_size[0] * cols, panel_size[1] * nrows),
                             dpi=100, squeeze=False)
    for ax in axes.flat[len(panels):]:
        ax.axis("off")
    for ax, (title, counts) in zip(axes.flat, panels):
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
        ax.set_title(title, **({} if title_size is None else {"fontsize": title_size}))
    if suptitle is not None:
        fig.suptitle(suptitle)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def _task_scores_png(path: Path, rows: Sequence[Mapping]) -> None:
    plt = _pyplot()
    models = list(dict.fromkeys(r["model"] for r in rows))
    tasks = [t for t in vocab.TASKS if any(r["task"] == t for r in rows)]
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


def plot_task_curves(path: str | Path,
                     curves: Sequence[tuple[str, Mapping[str, tuple], Mapping[str, tuple]]],
                     ylabel: str, *, xlabel: str = "RL step",
                     empty: str = "no training history") -> None:
    """Draw per-task curves into the PNG ``path``: one panel per task (``TASKS`` order), one
    colour per series, a shared legend in the last panel (``empty`` written across the figure
    when no series has a point).

    Args:
        curves: ``(label, solid, dashed)`` per series, in order; ``solid`` and ``dashed`` map a
            task to ``(steps, values)`` (a task missing or without points draws no line; the
            dashed line is thin, in the series' colour, and not in the legend).
    """
    from matplotlib.ticker import MaxNLocator

    plt = _pyplot()
    ts = vocab.TASKS
    fig, axes = plt.subplots(1, len(ts), figsize=(3.6 * len(ts), 3.2), dpi=100,
                             squeeze=False)
    any_line = False
    for ax, task in zip(axes[0], ts):
        for k, (label, solid, dashed) in enumerate(curves):
            x, y = solid.get(task, ([], []))
            if x:
                any_line = True
                ax.plot(x, y, marker="o", ms=3, color=f"C{k % 10}", label=label)
            x, y = dashed.get(task, ([], []))
            if x:
                ax.plot(x, y, ls="--", lw=0.8, color=f"C{k % 10}")
        ax.set_title(task)
        ax.set_xlabel(xlabel)
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
        fig.text(0.5, 0.5, empty, ha="center", va="center")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def plot_task_lengths(path: str | Path, chars: Sequence[tuple[str, Mapping[str, Sequence[int]]]],
                      title: str) -> None:
    """Draw completion lengths into the PNG ``path``: one panel per task (``TASKS`` order), a
    box plot per model.

    Args:
        chars: ``(label, {task: completion characters})`` per model, in order.
    """
    plt = _pyplot()
    ts = vocab.TASKS
    fig, axes = plt.subplots(1, len(ts), figsize=(3.8 * len(ts), 3.4), dpi=100,
                             squeeze=False)
    for ax, task in zip(axes[0], ts):
        data = [c.get(task, []) for _, c in chars]
        if any(data):
            ax.boxplot([d if d else [0] for d in data], showfliers=True)
            ax.set_xticks(range(1, len(chars) + 1), [label for label, _ in chars], rotation=60,
                          fontsize=7)
        ax.set_title(task)
        ax.grid(alpha=0.3, axis="y")
    axes[0][0].set_ylabel("completion characters")
    fig.suptitle(title)
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
        plot_confusion(out / "images" / f"confusion_{model}.png",
                       [(f"data race (pooled): {model}", confusion[model])])
    task_rows = task_score_rows(scored_by_model)
    (out / "task_scores.csv").write_text(
        _csv(task_rows, ("model", "task", "task_model", "reward", "accuracy")), encoding="utf-8")
    _task_scores_png(out / "images" / "task_scores.png", task_rows)
    return {"confusion": confusion, "task_scores": task_rows}
