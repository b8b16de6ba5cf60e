"""The registry gate: does a candidate model beat the reference (the champion, else SFT), on
evidence rather than on a point difference?

Pure functions over per-prompt evaluation rows, no MLflow: the ``register`` stage
(:mod:`hargo.registry`) reads the rows (``data/eval/<model>.jsonl``, the champion's from its
registered run) and moves the ``champion`` alias when :func:`gate` passes. The gate resamples
prompts (a paired bootstrap), so a gain the size of one prompt's answer on 24 prompts per task
does not move the champion.

The rule is :func:`gate`'s; :func:`check_gate_params` checks the ``register`` params it reads
(defined, with :func:`gate_metrics`, in :mod:`hargo.config.gate_rule`, so that checking
params.yaml does not import the gate).
A champion is compared with a candidate only when their evaluations are the same one
(:func:`eval_identity`: prompts, decoding, judge and scoring code); otherwise
:func:`identity_mismatch` says what differs and the gate refuses.
"""
from __future__ import annotations

import math
from typing import Callable, Mapping, Sequence

import numpy as np

from hargo.config.gate_rule import GateParams, check_gate_params, gate_metrics
from hargo.io import HargoInputError
from hargo.stats import (STATISTIC_FUNCTIONS, mean_statistic, paired_bootstrap_ci,
                         race_f1_records)
from hargo.tasks import headline_metrics, metric_tasks, task_names

__all__ = ["IDENTITY_FIELDS", "GateParams", "gate_metrics", "metric_forms",
           "metric_values", "pair_rows", "gate", "check_rows_match_metrics",
           "check_gate_params", "eval_identity", "identity_mismatch"]


def metric_forms() -> dict[str, tuple]:
    """Per-prompt form of each gate metric (:func:`gate_metrics`), read from the task registry:
    ``{metric: (tasks whose rows count, None for all; the row field; the statistic over the
    per-prompt values)}``. A task's :class:`hargo.tasks.Metric` of the ``gate`` view counts the
    rows of every task declaring it, its ``field`` and ``statistic``; a yes/no statistic (the
    race ``dr_*``) uses ``(label is yes, predicted yes)`` records
    (:func:`hargo.stats.race_f1_records`) and has the field ``"race"``. ``win_rate`` uses
    ``(win + 1) / 2`` with the judge's verdict ``win`` in {1, 0, -1} against SFT (SFT's own
    rows: 0, a tie)."""
    forms = {m.key: (metric_tasks(m.key), "race" if m.statistic != "mean" else m.field,
                     STATISTIC_FUNCTIONS[m.statistic]) for m in headline_metrics("gate")}
    return {**forms, "avg_score": (None, "reward", mean_statistic),
            "win_rate": (None, "win", mean_statistic),
            **{f"accuracy_{t}": ((t,), "correct", mean_statistic) for t in task_names()}}


def metric_values(rows: Sequence[Mapping], metric: str) -> tuple[np.ndarray, Callable]:
    """The per-prompt values of gate ``metric`` over one model's evaluation rows
    (``data/eval/<model>.jsonl``), and the statistic that turns them into the metric.

    Args:
        rows: per-prompt rows (``id``, ``task``, and the fields the metric reads: ``label`` and
            ``prediction`` for race, ``similarity``, ``em``, ``reward``, ``correct``, ``win``).
        metric: one of :func:`gate_metrics`.

    Returns:
        ``(values, statistic)``: ``values`` has one entry per counted prompt in row order, shape
        ``(n, 2)`` int records for race metrics, ``(n,)`` floats otherwise;
        ``statistic(values)`` is the metric as ``metrics/eval.json`` reports it.

    Raises:
        ValueError: no row of the metric's tasks, or a row lacks the field (names the prompt id).
    """
    tasks, field, statistic = metric_forms()[metric]
    chosen = [r for r in rows if tasks is None or r["task"] in tasks]
    if not chosen:
        raise ValueError(f"gate metric {metric}: no evaluated prompt of task(s) "
                         f"{', '.join(tasks or ('any',))}")
    need = ("label", "prediction") if field == "race" else (field,)
    for r in chosen:
        missing = [k for k in need if k not in r]
        if missing:
            raise ValueError(f"gate metric {metric}: prompt {r.get('id')!r} has no {missing[0]!r} "
                             "(evaluated by an older hargo? re-run hargo evaluate)")
    if field == "race":
        return race_f1_records([r["label"] for r in chosen],
                               [r.get("prediction") for r in chosen]), statistic
    if field == "win":
        return np.array([(float(r["win"]) + 1.0) / 2.0 for r in chosen]), statistic
    return np.array([float(r[field]) for r in chosen]), statistic


def pair_rows(candidate: Sequence[Mapping], reference: Sequence[Mapping]) -> list[Mapping]:
    """The ``reference`` rows in ``candidate``'s prompt order (paired by ``id``).

    Raises:
        ValueError: the two are not the same unique prompt ids (names up to three ids on each
            side, sorted as text, and the row counts).
    """
    by_id = {r["id"]: r for r in reference}
    ids = [r["id"] for r in candidate]
    if len(by_id) != len(reference) or len(set(ids)) != len(ids) or set(ids) != set(by_id):
        only_c = sorted(set(ids) - set(by_id), key=str)[:3]
        only_r = sorted(set(by_id) - set(ids), key=str)[:3]
        raise ValueError(f"the gate pairs prompts: candidate and reference rows must hold the same "
                         f"unique prompt ids (only in candidate: {only_c}, only in reference: "
                         f"{only_r}, {len(ids)} vs {len(reference)} rows)")
    return [by_id[i] for i in ids]


def gate(candidate: Sequence[Mapping], reference: Sequence[Mapping], gate_metrics: Sequence[str],
         tolerance: float, resamples: int = 2000, confidence: float = 0.95,
         seed: int = 0) -> tuple[bool, str, dict]:
    """Does ``candidate`` beat ``reference``, on evidence?

    Both are per-prompt evaluation rows of the same prompts (paired by ``id``). For each gate
    metric a paired percentile bootstrap over prompts (:func:`hargo.stats.paired_bootstrap_ci`;
    Efron & Tibshirani 1993, ch. 13) gives the difference ``candidate - reference`` and its
    ``confidence`` interval ``[low, high]``. Rule: the candidate passes iff no metric's
    difference is below ``-tolerance`` and at least one metric's interval lies above zero
    (``low > 0``). A point gain whose interval reaches zero is noise and does not count.

    Args:
        candidate, reference: rows as :func:`metric_values` reads them.
        gate_metrics: names from :func:`hargo.config.gate_rule.gate_metrics`.
        tolerance: the largest loss (point difference) allowed on any gate metric, >= 0.
        resamples, confidence, seed: of the bootstrap; each metric resamples its own prompts
            (e.g. DR-F1 the race prompts) from a generator seeded with ``seed``.

    Returns:
        ``(passed, reason, intervals)``; ``intervals`` is ``{metric: {"candidate", "reference",
        "diff", "low", "high", "n_prompts"}}``; the reason lists each metric as
        ``name cand vs ref (+diff, 95% CI [low, high], n prompts)`` and says which rule decided.
        Passing on any one metric is not corrected for testing several: with k gate metrics
        the chance that noise passes is up to about k times (1 - confidence) / 2.

    Raises:
        ValueError: the two row sets are not the same prompts (names the first ids that differ),
            or a metric has no prompts (:func:`metric_values`).
    """
    paired = pair_rows(candidate, reference)
    worse, better, parts, intervals = [], [], [], {}
    pct = f"{100 * confidence:g}%"
    for g in gate_metrics:
        a, stat = metric_values(candidate, g)
        b, _ = metric_values(paired, g)
        ci = paired_bootstrap_ci(a, b, stat, resamples=resamples, confidence=confidence,
                                 seed=seed)
        c, r = stat(a), stat(b)
        intervals[g] = {"candidate": c, "reference": r, "diff": ci["diff"], "low": ci["low"],
                        "high": ci["high"], "n_prompts": ci["n_prompts"]}
        parts.append(f"{g} {c:.4f} vs {r:.4f} ({ci['diff']:+.4f}, {pct} CI "
                     f"[{ci['low']:+.4f}, {ci['high']:+.4f}], {ci['n_prompts']} prompts)")
        if ci["diff"] < -tolerance:
            worse.append(g)
        elif ci["low"] > 0:
            better.append(g)
    detail = "; ".join(parts)
    n = f"{resamples} bootstrap resamples of each metric's paired prompts"
    if worse:
        return False, (f"worse than the reference by more than the tolerance {tolerance:g} on "
                       f"{', '.join(worse)}: {detail} ({n})"), intervals
    if not better:
        return False, (f"no gate metric better with its {pct} interval above zero: {detail} "
                       f"({n})"), intervals
    return True, (f"better on {', '.join(better)} ({pct} interval above zero), none worse beyond "
                  f"{tolerance:g}: {detail} ({n})"), intervals


def check_rows_match_metrics(rows: Mapping[str, Sequence[Mapping]], metrics: Mapping[str, Mapping],
                             gates: Sequence[str], path) -> None:
    """The per-prompt rows (``{model: rows}``) must give the metrics ``metrics/eval.json`` (at
    ``path``) reports (``{model: {metric: value}}``): the gate resamples the rows, so a mismatch
    means the two files come from different evaluations.

    Raises:
        HargoInputError: a gate metric computed from ``data/eval/<model>.jsonl`` differs from
            ``metrics/eval.json`` by more than 1e-6, or the rows cannot give it (names both).
    """
    for m, rs in rows.items():
        for g in gates:
            try:
                values, stat = metric_values(rs, g)
            except ValueError as e:
                raise HargoInputError(path, str(e), field=f"{m}.{g}") from None
            got = stat(values)
            if not math.isclose(got, float(metrics[m][g]), abs_tol=1e-6):
                raise HargoInputError(path, f"{g} of {m} is {metrics[m][g]!r} but its per-prompt "
                                      f"rows give {got!r}: data/eval and metrics/eval.json come "
                                      "from different evaluations; re-run hargo evaluate",
                                      field=f"{m}.{g}")


#: What makes two evaluations comparable (:func:`eval_identity`), in the order a refusal names them.
IDENTITY_FIELDS = ("prompts", "n_prompts", "max_new_tokens", "temperature", "max_prompt_tokens",
                   "backend", "dtype", "judge", "metric_code")


def eval_identity(run: Mapping, prompt_ids: Sequence[str], metric_code: str) -> dict:
    """The identity of an evaluation: which prompts, how answers were decoded and scored.

    Args:
        run: ``metrics/eval.json``'s ``run`` block (``max_new_tokens``, ``temperature``,
            ``max_prompt_tokens``, ``backend``, ``dtype``, ``judge``); a missing key is None.
        prompt_ids: the evaluated prompt ids (``data/eval/prompts.json``), any order.
        metric_code: a digest of the code that scores answers (rewards, metrics, judges).

    Returns:
        ``{field: value}`` for :data:`IDENTITY_FIELDS`; ``prompts`` is the first 16 hex digits of
        the SHA-256 of the sorted ids joined by newlines.
    """
    import hashlib

    ids = sorted(str(i) for i in prompt_ids)
    out = {"prompts": hashlib.sha256("\n".join(ids).encode()).hexdigest()[:16],
           "n_prompts": len(ids), "metric_code": metric_code}
    for k in IDENTITY_FIELDS:
        out.setdefault(k, run.get(k))
    return out


def identity_mismatch(candidate: Mapping, reference: Mapping | None) -> list[str]:
    """Why two evaluations cannot be compared: ``["field: candidate vs reference", ...]`` for
    each field of :data:`IDENTITY_FIELDS` that differs; ``["the reference has no recorded
    evaluation identity"]`` when ``reference`` is None; ``[]`` when comparable."""
    if reference is None:
        return ["the reference has no recorded evaluation identity"]
    return [f"{k}: {candidate.get(k)!r} vs {reference.get(k)!r}" for k in IDENTITY_FIELDS
            if candidate.get(k) != reference.get(k)]
