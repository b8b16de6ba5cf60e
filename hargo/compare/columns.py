"""The comparison report's metric columns, built from the task registry: the headline metrics
(WinRate, each registered task's metrics of the ``report`` view, AvgScore), the MLPerf
verbosity share, per-task accuracy and mean reward; and each run's values of them from its
per-prompt rows (:func:`run_metrics`) and per prompt for the bootstrap
(:func:`per_prompt_values`). A new task's :class:`hargo.tasks.Metric` of the ``report`` view
becomes a column, a bootstrap interval and a checked metric of the report with no edit here.

Pure functions of rows already loaded (``hargo.compare.report`` reads them); re-exported by
:mod:`hargo.compare.aggregate`.
"""
from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from hargo.stats import STATISTIC_FUNCTIONS, race_f1_records
from hargo.tasks import Metric, get_task, headline_metrics, metric_tasks, task_names

__all__ = ["SFT", "VERBOSE_CHARS", "headline_columns", "metric_keys", "metric_labels",
           "interval_keys", "sft_interval_keys", "statistic", "run_metrics",
           "per_prompt_values", "reference_verbose_share"]

SFT = "sft"
#: An MLPerf completion longer than this many characters counts as verbose (``mlperf_verbose``).
#: The paper motivates HARGO with it: its SFT model answers 65.9% of the MLPerf questions with
#: more than 40 characters, where the reference answers are a number or a name (docs/method.md).
VERBOSE_CHARS = 40


def headline_columns() -> dict[str, tuple[str, bool]]:
    """Headline metrics, key -> (label, shown in percent?): WinRate vs SFT, the registered
    tasks' metrics of the ``report`` view (:func:`hargo.tasks.headline_metrics`; the built-ins:
    DR-F1, PLP sim, MLPerf EM), AvgScore. Each function here reads the registry when called."""
    return {"win_rate": ("WinRate vs SFT", True),
            **{m.key: (m.label, m.percent) for m in headline_metrics("report")},
            "avg_score": ("AvgScore", False)}


def metric_keys() -> list[str]:
    """The metrics of the results table, in column order: the headline ones, the MLPerf
    verbosity share, then per-task accuracy and per-task mean task reward (the RL objective, on
    the eval prompts)."""
    ts = task_names()
    return list(headline_columns()) + ["mlperf_verbose"] + [f"accuracy_{t}" for t in ts] \
        + [f"reward_{t}" for t in ts]


def interval_keys() -> list[str]:
    """The metrics that get HARGO-minus-other bootstrap intervals."""
    return list(headline_columns()) + ["mlperf_verbose"] + [f"reward_{t}" for t in task_names()]


def sft_interval_keys() -> list[str]:
    """The metrics that get method-minus-SFT intervals (WinRate is already against SFT)."""
    return [k for k in interval_keys() if k != "win_rate"]


def metric_labels() -> dict[str, tuple[str, bool]]:
    """key -> (label, shown in percent?) for every metric of :func:`metric_keys`."""
    ts = task_names()
    return headline_columns() | {"mlperf_verbose": (f"MLPerf > {VERBOSE_CHARS} chars", True)} \
        | {f"accuracy_{t}": (f"acc {t}", True) for t in ts} \
        | {f"reward_{t}": (f"reward {t}", False) for t in ts}


def statistic(key: str):
    """The statistic of metric ``key``'s per-prompt values (a function of the array of
    :func:`per_prompt_values`): its task :class:`hargo.tasks.Metric`'s, else the mean."""
    stats = {m.key: m.statistic for m in headline_metrics("report")}
    return STATISTIC_FUNCTIONS[stats.get(key, "mean")]


def _values(rows: Sequence[Mapping], m: Metric, labels: Mapping[str, str]) -> np.ndarray | None:
    """The per-prompt values of task metric ``m`` over the rows of the tasks that report it
    (``(n,)`` floats for a mean, ``(n, 2)`` yes/no records otherwise); None without rows."""
    tasks = metric_tasks(m.key)
    chosen = [r for r in rows if r["task"] in tasks]
    if not chosen:
        return None
    if m.statistic == "mean":
        return np.array([float(r[m.field]) for r in chosen])
    return race_f1_records([labels[r["id"]] for r in chosen], [r[m.field] for r in chosen])


def run_metrics(rows: Sequence[Mapping], labels: Mapping[str, str]) -> dict:
    """Headline metrics and per-task accuracy of one run from its per-prompt rows.

    Args:
        rows: generations rows (``id``, ``task``, ``reward``, ``correct`` and the fields of the
            tasks' metrics: ``prediction`` / ``em`` / ``similarity`` for the built-ins).
        labels: race label ("yes"/"no") per race id.

    Returns:
        each task metric of the ``report`` view (built-ins: ``dr_f1``, ``plp_similarity``,
        ``mlperf_em``), ``mlperf_verbose`` (share of MLPerf
        completions with more than :data:`VERBOSE_CHARS` characters, ``chars``),
        ``avg_score`` and ``accuracy_<task>``,
        ``reward_<task>`` (mean task reward), ``n_<task>`` per task present (definitions of
        ``hargo.metrics``); a metric whose task is absent is None.

    Raises:
        UnknownTaskError: a row of an unregistered task (names it).
    """
    for r in rows:
        get_task(r["task"])
    by = {t: [r for r in rows if r["task"] == t] for t in task_names()}
    mean = lambda xs: float(np.mean(xs)) if len(xs) else None  # noqa: E731
    m: dict = {}
    for metric in headline_metrics("report"):
        v = _values(rows, metric, labels)
        m[metric.key] = None if v is None else STATISTIC_FUNCTIONS[metric.statistic](v)
    m["mlperf_verbose"] = mean([float(int(r["chars"]) > VERBOSE_CHARS)
                                for r in by.get("mlperf", [])])
    m["avg_score"] = mean([float(r["reward"]) for r in rows])
    for t, rs in by.items():
        if rs:
            m[f"accuracy_{t}"] = mean([float(r["correct"]) for r in rs])
            m[f"reward_{t}"] = mean([float(r["reward"]) for r in rs])
            m[f"n_{t}"] = len(rs)
    return m


def reference_verbose_share(samples: Sequence[Mapping]) -> float | None:
    """Share of the MLPerf eval prompts whose reference answer has more than
    :data:`VERBOSE_CHARS` characters: the ``mlperf_verbose`` of a model that answers every
    MLPerf prompt with exactly its reference. The trivial baseline beside a model's verbosity
    share -- not 0, since many MLPerf reference answers are sentences ("The submitter is IEI and
    the number of processors is 2.").

    Args:
        samples: eval records (``task``, ``answer``).

    Returns:
        The share in [0, 1], or None when no sample is an MLPerf one.
    """
    refs = [len(str(s.get("answer") or "")) > VERBOSE_CHARS for s in samples
            if s["task"] == "mlperf"]
    return float(np.mean(refs)) if refs else None


def per_prompt_values(rows: Sequence[Mapping], labels: Mapping[str, str]) -> dict[str, np.ndarray]:
    """Per-prompt arrays for the bootstrap, in the order of ``rows``: each task metric of the
    ``report`` view over its tasks' rows (``dr_f1``: ``(n_race, 2)`` records of
    :func:`race_f1_records`; ``plp_similarity`` ``(n_plp,)``, ``mlperf_em`` ``(n_mlperf,)``
    0/1), ``mlperf_verbose`` (``(n_mlperf,)``, 0/1: more than :data:`VERBOSE_CHARS`
    characters), ``avg_score`` (``(n,)`` rewards), ``reward_<task>`` (``(n_task,)`` rewards).
    Metrics without prompts are left out."""
    out = {"avg_score": np.array([float(r["reward"]) for r in rows])}
    for metric in headline_metrics("report"):
        v = _values(rows, metric, labels)
        if v is not None:
            out[metric.key] = v
    verbose = [float(int(r["chars"]) > VERBOSE_CHARS) for r in rows if r["task"] == "mlperf"]
    if verbose:
        out["mlperf_verbose"] = np.array(verbose)
    for task in task_names():
        vals = [float(r["reward"]) for r in rows if r["task"] == task]
        if vals:
            out[f"reward_{task}"] = np.array(vals)
    return out
