"""The registry gate: does a candidate model beat the reference (the champion, else SFT)?

Pure functions over metric dicts, no MLflow: the ``register`` stage (:mod:`hargo.registry`)
reads the metrics and moves the ``champion`` alias when :func:`gate` passes.

The rule is :func:`gate`'s; :func:`check_gate_params` checks the ``register`` params it reads.
A champion is compared with a candidate only when their evaluations are the same one
(:func:`eval_identity`: prompts, decoding, judge and scoring code); otherwise
:func:`identity_mismatch` says what differs and the gate refuses.
"""
from __future__ import annotations

import math
from typing import Mapping, Sequence

__all__ = ["GATE_METRICS", "IDENTITY_FIELDS", "gate", "check_gate_params", "eval_identity",
           "identity_mismatch"]

# Metrics of metrics/eval.json that can gate the champion: all are higher-is-better.
GATE_METRICS = ("dr_f1", "dr_precision", "dr_recall", "dr_f1_race_c", "dr_f1_race_fortran",
                "plp_similarity", "mlperf_em", "avg_score", "win_rate", "accuracy_race_c",
                "accuracy_race_fortran", "accuracy_mlperf", "accuracy_plp")

def gate(candidate: Mapping[str, float], reference: Mapping[str, float],
         gate_metrics: Sequence[str], tolerance: float) -> tuple[bool, str]:
    """Does ``candidate`` beat ``reference``?

    Rule: ``candidate[g] >= reference[g] - tolerance`` for every ``g`` in ``gate_metrics``, and
    ``candidate[g] > reference[g]`` for at least one ``g``.

    Returns:
        ``(passed, reason)``; the reason lists each metric as ``name cand vs ref (+delta)`` and
        says which rule decided.

    Raises:
        KeyError: a gate metric is missing from either mapping (callers check first).
    """
    worse, better, parts = [], [], []
    for g in gate_metrics:
        c, r = float(candidate[g]), float(reference[g])
        d = c - r
        parts.append(f"{g} {c:.4f} vs {r:.4f} ({d:+.4f})")
        if c < r - tolerance:
            worse.append(g)
        elif c > r:
            better.append(g)
    detail = "; ".join(parts)
    if worse:
        return False, (f"worse than the reference by more than the tolerance {tolerance:g} on "
                       f"{', '.join(worse)}: {detail}")
    if not better:
        return False, f"not strictly better on any gate metric: {detail}"
    return True, f"better on {', '.join(better)}, none worse beyond {tolerance:g}: {detail}"


def check_gate_params(params_register: Mapping) -> tuple[str, list[str], float]:
    """``(model_name, gate_metrics, tolerance)`` from params.yaml ``register``.

    Raises:
        ValueError: empty model name, unknown gate metric (names it and the valid ones), a
            negative or non-numeric tolerance.
    """
    name = params_register.get("model_name")
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"register.model_name: expected a non-empty name, got {name!r}")
    gates = params_register.get("gate_metrics")
    if not isinstance(gates, list) or not gates:
        raise ValueError(f"register.gate_metrics: expected a non-empty list, got {gates!r}")
    for g in gates:
        if g not in GATE_METRICS:
            raise ValueError(f"register.gate_metrics: unknown gate metric {g!r}; valid "
                             f"(higher is better): {', '.join(GATE_METRICS)}")
    tol = params_register.get("tolerance", 0.0)
    if isinstance(tol, bool) or not isinstance(tol, (int, float)) or not math.isfinite(tol) \
            or tol < 0:
        raise ValueError(f"register.tolerance: expected a finite number >= 0, got {tol!r}")
    return name, list(gates), float(tol)


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
