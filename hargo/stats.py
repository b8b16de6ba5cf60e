"""Statistics of the method comparison: mean +- std over seeds and paired bootstrap confidence
intervals of the difference between two methods (pure functions, numpy only).

The bootstrap is the percentile bootstrap of Efron & Tibshirani, *An Introduction to the
Bootstrap* (1993), ch. 13, applied to a paired design: both methods answered the same eval
prompts, so one resample draws prompt indices with replacement and evaluates both methods on the
*same* drawn prompts (the per-prompt difficulty cancels in the difference).

Seeds (:func:`paired_bootstrap_ci_seeds`): each method is trained once per seed; seed ``s`` of
method A is paired with seed ``s`` of method B (the same data order and initial sampling), every
resample draws one set of prompt indices and applies it to all seed pairs, and the resampled
difference is the mean over seeds of ``statistic(A_s[idx]) - statistic(B_s[idx])``. The point
estimate is the same average on the original prompts, i.e. the difference of the seed means in
the report's table. Seed-to-seed variation is thus averaged into the estimate, not resampled:
with three seeds there is too little to resample.
"""
from __future__ import annotations

import math
from typing import Callable, Sequence

import numpy as np

__all__ = ["mean_std", "paired_bootstrap_ci", "paired_bootstrap_ci_seeds",
           "paired_bootstrap_ci_two_level", "f1_statistic",
           "precision_statistic", "recall_statistic", "race_f1_records", "mean_statistic",
           "STATISTIC_FUNCTIONS"]


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (``ddof=1``) of ``values`` (e.g. one metric over seeds).

    ``std = sqrt(sum((x - mean)^2) / (n - 1))``; for a single value the std is 0.0.

    Raises:
        ValueError: ``values`` is empty or holds a None / NaN.
    """
    xs = [float(v) if v is not None else math.nan for v in values]
    if not xs:
        raise ValueError("mean_std: no values")
    if any(math.isnan(x) for x in xs):
        raise ValueError(f"mean_std: values contain None or NaN: {list(values)!r}")
    m = math.fsum(xs) / len(xs)
    if len(xs) == 1:
        return m, 0.0
    return m, math.sqrt(math.fsum((x - m) ** 2 for x in xs) / (len(xs) - 1))


def mean_statistic(x: np.ndarray) -> float:
    """The mean of per-prompt values, shape ``(n,)`` (PLP similarity, MLPerf EM, reward, win
    score)."""
    return float(np.mean(x))


def race_f1_records(labels: Sequence[str], predictions: Sequence[str | None]) -> np.ndarray:
    """Per-prompt records for :func:`f1_statistic`: an int array ``(n, 2)`` of
    ``(label == "yes", predicted "yes")``.

    An unparseable prediction (None) counts as the opposite of the label, as DR-F1 does
    (``hargo.metrics.race_classification``).
    """
    rows = []
    for lab, pred in zip(labels, predictions, strict=True):
        yes = lab == "yes"
        p_yes = (pred == "yes") if pred is not None else (not yes)
        rows.append((int(yes), int(p_yes)))
    return np.asarray(rows, dtype=np.int64).reshape(-1, 2)


def _counts(records: np.ndarray) -> tuple[int, int, int]:
    r = np.asarray(records)
    t, p = r[:, 0].astype(bool), r[:, 1].astype(bool)
    return int(np.sum(t & p)), int(np.sum(~t & p)), int(np.sum(t & ~p))


def f1_statistic(records: np.ndarray) -> float:
    """F1 of the positive class "yes" over per-prompt records ``(n, 2)`` of
    ``(true is yes, predicted yes)``: ``2 TP / (2 TP + FP + FN)``, 0.0 when the denominator is 0
    (scikit-learn's ``zero_division=0``, as DR-F1 in ``hargo.metrics``)."""
    tp, fp, fn = _counts(records)
    den = 2 * tp + fp + fn
    return 0.0 if den == 0 else 2.0 * tp / den


def precision_statistic(records: np.ndarray) -> float:
    """Precision of "yes" over records ``(n, 2)`` as :func:`f1_statistic`'s:
    ``TP / (TP + FP)``, 0.0 when nothing is predicted "yes" (``zero_division=0``, as
    ``dr_precision`` in ``hargo.metrics``)."""
    tp, fp, _ = _counts(records)
    return 0.0 if tp + fp == 0 else tp / (tp + fp)


def recall_statistic(records: np.ndarray) -> float:
    """Recall of "yes" over records ``(n, 2)`` as :func:`f1_statistic`'s: ``TP / (TP + FN)``,
    0.0 when no label is "yes" (``zero_division=0``, as ``dr_recall``)."""
    tp, _, fn = _counts(records)
    return 0.0 if tp + fn == 0 else tp / (tp + fn)


#: A :class:`hargo.tasks.Metric`'s ``statistic`` -> the function of its per-prompt values (the
#: mean of ``(n,)`` floats, or a yes/no statistic of ``(n, 2)`` :func:`race_f1_records`).
STATISTIC_FUNCTIONS: dict[str, Callable[[np.ndarray], float]] = {
    "mean": mean_statistic, "f1": f1_statistic, "precision": precision_statistic,
    "recall": recall_statistic}


def paired_bootstrap_ci_seeds(a_runs: Sequence, b_runs: Sequence,
                              statistic: Callable[[np.ndarray], float] = mean_statistic,
                              resamples: int = 2000, confidence: float = 0.95,
                              seed: int = 0) -> dict:
    """Percentile bootstrap CI of ``mean_s [statistic(a_s) - statistic(b_s)]`` over seed pairs,
    resampling prompts jointly (module docstring).

    Args:
        a_runs, b_runs: ``S`` runs each (one per seed, seed ``s`` paired with seed ``s``); each
            run is an array whose first axis is the ``n`` prompts, in the same prompt order in
            every run (shape ``(n,)`` for per-prompt values, ``(n, k)`` for per-prompt records
            such as :func:`race_f1_records`).
        statistic: maps a (resampled) run to a float.
        resamples: number of bootstrap resamples ``R``.
        confidence: e.g. 0.95: the interval is the ``(1-c)/2`` and ``(1+c)/2`` quantiles of the
            ``R`` resampled differences (numpy's linear interpolation).
        seed: seeds ``numpy.random.default_rng``; the same seed gives the same interval.

    Returns:
        ``{"diff": point estimate, "low", "high", "resamples": R, "confidence": c,
        "n_prompts": n, "n_seeds": S}``.

    Raises:
        ValueError: no runs, different numbers of runs, runs of different prompt counts, no
            prompts, ``resamples < 1`` or ``confidence`` outside (0, 1).
    """
    a = [np.asarray(x) for x in a_runs]
    b = [np.asarray(x) for x in b_runs]
    if not a or len(a) != len(b):
        raise ValueError(f"paired bootstrap: {len(a)} and {len(b)} runs; need the same, >= 1")
    n = len(a[0])
    if n == 0 or any(len(x) != n for x in a + b):
        raise ValueError(f"paired bootstrap: runs must share one non-empty prompt axis, got "
                         f"lengths {[len(x) for x in a]} and {[len(x) for x in b]}")
    if int(resamples) < 1 or not 0.0 < float(confidence) < 1.0:
        raise ValueError(f"paired bootstrap: resamples={resamples} must be >= 1 and "
                         f"confidence={confidence} in (0, 1)")
    diff = float(np.mean([statistic(x) - statistic(y) for x, y in zip(a, b)]))
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, n, size=(int(resamples), n))
    if statistic is mean_statistic and all(x.ndim == 1 for x in a + b):
        # vectorised: the mean of each resample is a row mean of x[idx] (R, n)
        diffs = np.mean([x[idx].mean(axis=1) - y[idx].mean(axis=1) for x, y in zip(a, b)],
                        axis=0)
    else:
        diffs = np.array([np.mean([statistic(x[i]) - statistic(y[i]) for x, y in zip(a, b)])
                          for i in idx])
    tail = (1.0 - float(confidence)) / 2.0
    low, high = np.quantile(diffs, [tail, 1.0 - tail])
    return {"diff": diff, "low": float(low), "high": float(high), "resamples": int(resamples),
            "confidence": float(confidence), "n_prompts": n, "n_seeds": len(a)}


def paired_bootstrap_ci_two_level(a_runs: Sequence, b_runs: Sequence, resamples: int = 2000,
                                  confidence: float = 0.95, seed: int = 0) -> dict:
    """Two-level (hierarchical) percentile bootstrap CI of ``mean_s [mean(a_s) - mean(b_s)]``:
    each resample draws ``S`` seed pairs with replacement *and* ``n`` prompt indices with
    replacement (shared by every drawn pair), so the interval carries the seed-to-seed variance
    of training as well as the prompt sampling (Davison & Hinkley 1997, sec. 3.8, resampling
    both stages). :func:`paired_bootstrap_ci_seeds` keeps the seeds fixed; use this one when
    there are enough seeds (>= 5) for their spread to be estimated.

    Args:
        a_runs, b_runs: ``S`` arrays of shape ``(n,)`` each (per-prompt values of one run, the
            same prompt order in every run); seed ``s`` of a is paired with seed ``s`` of b.
        resamples, confidence, seed: as :func:`paired_bootstrap_ci_seeds`.

    Returns:
        ``{"diff", "low", "high", "resamples", "confidence", "n_prompts", "n_seeds",
        "method": "two-level"}``.

    Raises:
        ValueError: as :func:`paired_bootstrap_ci_seeds`, or a run that is not 1-D.
    """
    a = [np.asarray(x, dtype=float) for x in a_runs]
    b = [np.asarray(x, dtype=float) for x in b_runs]
    base = paired_bootstrap_ci_seeds(a, b, mean_statistic, 1, confidence, seed)  # the checks
    if any(x.ndim != 1 for x in a + b):
        raise ValueError("two-level bootstrap: every run must be a 1-D array of prompt values")
    S, n, R = len(a), base["n_prompts"], int(resamples)
    rng = np.random.default_rng(seed)
    prompts = rng.integers(0, n, size=(R, n))
    seeds = rng.integers(0, S, size=(R, S))
    per_seed = np.stack([x[prompts].mean(axis=1) - y[prompts].mean(axis=1)
                         for x, y in zip(a, b)])                     # (S, R)
    diffs = per_seed[seeds.T, np.arange(R)].mean(axis=0)              # (R,)
    tail = (1.0 - float(confidence)) / 2.0
    low, high = np.quantile(diffs, [tail, 1.0 - tail])
    return {"diff": base["diff"], "low": float(low), "high": float(high), "resamples": R,
            "confidence": float(confidence), "n_prompts": n, "n_seeds": S,
            "method": "two-level"}


def paired_bootstrap_ci(a, b, statistic: Callable[[np.ndarray], float] = mean_statistic,
                        resamples: int = 2000, confidence: float = 0.95, seed: int = 0) -> dict:
    """Percentile bootstrap CI of ``statistic(a) - statistic(b)`` for one pair of runs on the same
    ``n`` prompts (first axis; same order), resampling prompts jointly: each resample draws
    ``n`` prompt indices with replacement and evaluates both runs on them (Efron & Tibshirani
    1993). For DR-F1 pass :func:`race_f1_records` arrays and :func:`f1_statistic`, so every
    resample computes F1 over the drawn prompts.

    Returns ``{"diff", "low", "high", ...}`` as :func:`paired_bootstrap_ci_seeds` (one seed pair).
    """
    return paired_bootstrap_ci_seeds([a], [b], statistic, resamples, confidence, seed)
