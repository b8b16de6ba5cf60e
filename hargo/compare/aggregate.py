"""Aggregation of the method comparison: per-run metrics, WinRate vs SFT, mean +- std over seeds,
paired bootstrap intervals, confusion counts, answer lengths and training curves.

Pure functions of rows already loaded and checked (``hargo.compare.report`` reads the files): no
file, plot or MLflow access here. The one outside call is the WinRate judge, which the caller
passes in (``hargo.judges.make_judge``; the ``reward`` judge answers from :class:`StoredRewards`,
so no reward model is loaded).

Metric definitions are those of ``hargo.metrics``: DR-F1 pooled over race_c and race_fortran (an
unparseable answer counts as the wrong one), PLP similarity = mean cosine, MLPerf EM, AvgScore =
mean task reward, per-task accuracy = mean ``correct``, MLPerf verbosity = share of MLPerf
completions longer than :data:`VERBOSE_CHARS` characters. Run names are ``sft`` (the SFT model,
evaluated once) and ``<method>-s<seed>``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import numpy as np

from hargo.compare import columns
from hargo.compare.columns import (SFT, VERBOSE_CHARS, headline_columns,  # re-exported
                                   interval_keys, metric_keys, metric_labels,
                                   per_prompt_values, reference_verbose_share, run_metrics,
                                   sft_interval_keys, statistic)
from hargo.compare.layout import run_name  # re-exported
from hargo.stats import mean_std, paired_bootstrap_ci_seeds
from hargo.rewards import completion_text
from hargo.tasks import get_task

__all__ = ["SFT", "run_name", "run_metrics", "per_prompt_values",
           "StoredRewards", "RecordingJudge", "mean_curve", "cumulative_mass_share", "confusion_counts", "seed_summary",
           "Aggregates", "aggregate", "bootstrap_cis", "sft_cis", "VERBOSE_CHARS",
           "reference_verbose_share", "headline_columns", "metric_keys", "metric_labels",
           "interval_keys", "sft_interval_keys"]


def _yes_no(task: str) -> bool:
    """A registered yes/no task (the pooled DR-F1's rows); an unknown task raises, naming it."""
    return get_task(task).kind == "yes_no"


def _reward_key(task: str, answer, label, text: str) -> tuple:
    return (task, label if get_task(task).labelled else answer, text)


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
            vals = self._fallback(prompts=None if prompts is None else [prompts[i] for i in miss],
                                  completions=[texts[i] for i in miss],
                                  task=[task[i] for i in miss], answer=[answer[i] for i in miss],
                                  label=[label[i] for i in miss])
            for i, v in zip(miss, vals):
                out[i] = float(v)
        return out


class RecordingJudge:
    """Delegates to a judge and keeps the last batch of verdicts (per-prompt WinRate scores
    for the bootstrap without asking the judge twice).

    Attributes:
        judge: the wrapped judge; ``name``: its name; ``last``: the verdicts (+1 / 0 / -1) of
            the last :meth:`compare_batch`.
    """

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


def cumulative_mass_share(histories: Sequence[Sequence[Mapping]],
                          task: str) -> tuple[list[int], list[float]]:
    """Mean over seeds of ``task``'s cumulative share of the update mass up to each step:
    ``sum_{s <= t} mass_task(s) / sum_{s <= t} mass_all(s)`` with ``mass = sum_i w_i |A_i|``
    (``<task>/update_mass`` and ``all/update_mass`` of :class:`hargo.training.rl_logging.
    StepRecorder`). A step that sampled no group of ``task`` adds 0 to its mass (with 2 prompts
    a step most steps miss some task, so per-step shares would jump between 0 and 1).

    Returns:
        ``(steps, means)``, steps ascending; a seed counts at step t once its mass so far is
        > 0; steps where no seed does are left out.
    """
    vals: dict[int, list[float]] = {}
    for hist in histories:
        num = den = 0.0
        for h in sorted((h for h in hist if "step" in h), key=lambda h: int(h["step"])):
            m_t, m_all = h.get(f"{task}/update_mass"), h.get("all/update_mass")
            num += 0.0 if m_t is None or math.isnan(m_t) else float(m_t)
            den += 0.0 if m_all is None or math.isnan(m_all) else float(m_all)
            if den > 0:
                vals.setdefault(int(h["step"]), []).append(num / den)
    steps = sorted(vals)
    return steps, [float(np.mean(vals[s])) for s in steps]


def confusion_counts(rows: Sequence[Mapping], labels: Mapping[str, str]) -> list[list[int]]:
    """The race confusion matrix of one run (``hargo.evaluation.plots.confusion_counts``: rows
    actual yes/no, columns predicted yes/no/unparsed) from its generations rows."""
    from hargo.evaluation.plots import confusion_counts as counts

    return counts([{"actual": labels[r["id"]], "predicted": r["prediction"] or "unparsed"}
                   for r in rows if _yes_no(r["task"])])


def seed_summary(per_run: Mapping[str, Mapping], methods: Sequence[str], seeds: Sequence[int],
                 keys: Sequence[str] | None = None) -> dict[str, dict]:
    """Mean and sample std (ddof=1) over seeds of every metric of every method.

    Args:
        per_run: metrics per run name (:func:`run_metrics`, plus ``win_rate``).
        methods, seeds: the runs ``<method>-s<seed>`` to aggregate.
        keys: the metrics (default :func:`metric_keys`).

    Returns:
        ``{method: {key: {"mean", "std", "values": [one per seed]} or None}}``; None when a
        seed lacks the metric (its task has no prompts).
    """
    out: dict[str, dict] = {}
    for m in methods:
        out[m] = {}
        for k in metric_keys() if keys is None else keys:
            vals = [per_run[run_name(m, s)].get(k) for s in seeds]
            if any(v is None for v in vals):
                out[m][k] = None
                continue
            mu, sd = mean_std(vals)
            out[m][k] = {"mean": mu, "std": sd, "values": [float(v) for v in vals]}
    return out


@dataclass
class Aggregates:
    """Everything the report shows, computed from the runs' rows.

    Attributes:
        per_run: metrics per run name (:func:`run_metrics` plus ``win_rate``; None for SFT).
        per_prompt: per run name, the bootstrap arrays of :func:`per_prompt_values` plus
            ``win_rate`` (per-prompt win scores 1 / 0.5 / 0; not for SFT).
        wins: per run name but SFT, ``hargo.metrics.win_rate``'s result against SFT.
        results: :func:`seed_summary` of ``per_run``.
        confusion: per model (SFT, then each method, seeds summed), the 2 x 3 race counts.
        chars: per model (SFT, then each method, seeds pooled), completion characters per task.
        histories: per online RL method (one that logged a training history), the histories of
            its seeds.
    """

    per_run: dict[str, dict]
    per_prompt: dict[str, dict[str, np.ndarray]]
    wins: dict[str, dict]
    results: dict[str, dict]
    confusion: dict[str, list[list[int]]]
    chars: dict[str, dict[str, list[int]]]
    histories: dict[str, list[list]]


def aggregate(samples: Sequence[Mapping], rows: Mapping[str, Sequence[Mapping]],
              labels: Mapping[str, str], train: Mapping[str, Mapping[int, Mapping]],
              methods: Sequence[str], seeds: Sequence[int], judge: RecordingJudge) -> Aggregates:
    """Aggregate the comparison's runs.

    Args:
        samples: the eval records, in the canonical prompt order.
        rows: per run name (``sft`` first, then ``<method>-s<seed>``), its generations rows in
            the order of ``samples``.
        labels: race label per race id.
        train: per method and seed, the run's training metrics (``history`` used).
        methods, seeds: the compared methods and seeds.
        judge: the WinRate judge (each run against SFT on the same prompts).

    Returns:
        The :class:`Aggregates`.
    """
    from hargo.metrics import win_rate

    per_run = {name: run_metrics(rs, labels) for name, rs in rows.items()}
    per_prompt = {name: per_prompt_values(rs, labels) for name, rs in rows.items()}
    sft_completions = [r["completion"] for r in rows[SFT]]
    wins: dict[str, dict] = {}
    for name in [n for n in rows if n != SFT]:
        w = win_rate(samples, [r["completion"] for r in rows[name]], sft_completions, judge)
        wins[name] = w
        per_run[name]["win_rate"] = w["win_rate"]
        per_prompt[name]["win_rate"] = (np.array(judge.last, dtype=float) + 1.0) / 2.0
    per_run[SFT]["win_rate"] = None

    histories = {m: [train[m][s].get("history") or [] for s in seeds] for m in methods
                 if any(train[m][s].get("history") for s in seeds)}
    confusion = {SFT: confusion_counts(rows[SFT], labels)}
    chars: dict[str, dict[str, list[int]]] = {SFT: {}}
    for r in rows[SFT]:
        chars[SFT].setdefault(r["task"], []).append(int(r["chars"]))
    for m in methods:
        tot = np.zeros((2, 3), dtype=int)
        chars[m] = {}
        for s in seeds:
            tot += np.array(confusion_counts(rows[run_name(m, s)], labels))
            for r in rows[run_name(m, s)]:
                chars[m].setdefault(r["task"], []).append(int(r["chars"]))
        confusion[m] = tot.tolist()
    return Aggregates(per_run=per_run, per_prompt=per_prompt, wins=wins,
                      results=seed_summary(per_run, methods, seeds), confusion=confusion,
                      chars=chars, histories=histories)


def bootstrap_cis(per_prompt: Mapping[str, Mapping[str, np.ndarray]], methods: Sequence[str],
                  seeds: Sequence[int], resamples: int, confidence: float,
                  seed: int) -> tuple[dict[str, dict], list[str]]:
    """Paired bootstrap intervals of HARGO minus every other compared method, GRPO first
    (``hargo.stats.paired_bootstrap_ci_seeds``; each task metric with its own statistic,
    DR-F1 the F1, the others the mean).

    Args:
        per_prompt: :attr:`Aggregates.per_prompt`.
        methods, seeds: the compared methods and seeds (seed s of HARGO paired with seed s of
            the other method).
        resamples, confidence, seed: of the bootstrap.

    Returns:
        ``({"hargo-<other>": {metric: interval}}, notes)``: a metric missing in a run (no
        prompts of its task) has no interval; the notes say why an interval is missing (no
        HARGO, or no GRPO).
    """
    notes: list[str] = []
    ci: dict[str, dict] = {}
    if "hargo" not in methods:
        notes.append("hargo is not in compare.methods: no bootstrap confidence intervals.")
        return ci, notes
    if "grpo" not in methods:
        notes.append("grpo is not in compare.methods: no HARGO - GRPO interval; intervals "
                     "against the other methods follow.")
    others = (["grpo"] if "grpo" in methods else []) + [m for m in methods
                                                        if m not in ("hargo", "grpo")]
    for other in others:
        pair = f"hargo-{other}"
        ci[pair] = {}
        for k in interval_keys():
            a = [per_prompt[run_name("hargo", s)].get(k) for s in seeds]
            b = [per_prompt[run_name(other, s)].get(k) for s in seeds]
            if any(x is None for x in a + b):
                continue
            ci[pair][k] = paired_bootstrap_ci_seeds(a, b, statistic(k), resamples, confidence,
                                                    seed)
    return ci, notes


def sft_cis(per_prompt: Mapping[str, Mapping[str, np.ndarray]], methods: Sequence[str],
            seeds: Sequence[int], resamples: int, confidence: float,
            seed: int) -> dict[str, dict]:
    """Paired bootstrap intervals of each compared method minus the SFT model it starts from
    (did post-training move the metric at all?), for every metric of
    :func:`sft_interval_keys`.

    The SFT model is one run (greedy decoding, evaluated once), so it is paired with every seed
    of the method (``S`` copies of its per-prompt values) and
    :func:`hargo.stats.paired_bootstrap_ci_seeds` resamples the prompts with the seeds fixed,
    as for :func:`bootstrap_cis` (DR-F1 with the F1 statistic, the others with the mean).

    Args:
        per_prompt: :attr:`Aggregates.per_prompt` (``sft`` and ``<method>-s<seed>``).
        methods, seeds: the compared methods and seeds.
        resamples, confidence, seed: of the bootstrap.

    Returns:
        ``{"<method>-sft": {metric: interval}}`` in the order of ``methods``; a metric missing
        in a run (no prompts of its task) has no interval.
    """
    out: dict[str, dict] = {}
    for m in methods:
        out[f"{m}-{SFT}"] = {}
        for k in sft_interval_keys():
            a = [per_prompt[run_name(m, s)].get(k) for s in seeds]
            b = [per_prompt[SFT].get(k)] * len(seeds)
            if any(x is None for x in a + b):
                continue
            out[f"{m}-{SFT}"][k] = paired_bootstrap_ci_seeds(a, b, statistic(k), resamples,
                                                             confidence, seed)
    return out
