"""The metrics of one RL step from the records the trainer handed the recorder
(:class:`hargo.training.rl_logging.StepRecorder`): per task and ``all``, the generation metrics
(rewards, accuracy, lengths, advantages, weights, update mass, zero-variance groups, dynamic
sampling's counts, time split) and the loss metrics (KL, clip fraction, advantage-weighted
log-prob and log-ratio). Pure functions over plain lists; the names and meanings are listed in
:mod:`hargo.training.rl_logging`'s docstring.
"""
from __future__ import annotations

import math
from typing import Sequence

from hargo.tasks import get_task

__all__ = ["is_correct", "generation_metrics", "loss_metrics"]

#: The generation record's per-completion columns.
_COLUMNS = ("rewards", "advantages", "weights", "completion_lengths", "confidence", "ref_logprob")
#: The sampled-groups lists of a generation record (dynamic sampling).
_SAMPLED = ("tasks", "zero_variance", "kept", "refill")


def is_correct(task: str, reward: float) -> bool:
    """Accuracy rule: the task's own (``hargo.tasks.Task.correct``, the rule of evaluation's
    ``accuracy_<task>`` too) on the reward, which a degenerate completion's reward has already
    paid for: ``plp``: ``reward >= PLP_ACCURACY_THRESHOLD``; race_c, race_fortran, mlperf:
    ``reward == 1`` (the reward of an exact/label match). A None or NaN reward is not correct.

    Raises:
        UnknownTaskError: ``task`` is not registered (named)."""
    return get_task(task).correct(reward)


def _mean(xs: Sequence[float]) -> float:
    return float(sum(xs) / len(xs)) if xs else float("nan")


def _std(xs: Sequence[float]) -> float:
    if not xs:
        return float("nan")
    m = _mean(xs)
    return float(math.sqrt(sum((x - m) ** 2 for x in xs) / len(xs)))


def _scopes(tasks: Sequence[str]) -> list[str]:
    """The tasks in sorted order, then ``all`` (unless a task is named so)."""
    return sorted(set(tasks)) + (["all"] if "all" not in tasks else [])


def generation_metrics(gens: list[dict]) -> dict[str, float]:
    """``<scope>/<metric>`` of a step's generation records (``StepRecorder.add_generation``'s,
    in order; at least one), then ``ema_baseline`` (the last record's, when any has one) and
    ``time/generation_s``, ``time/scoring_s`` (summed)."""
    cat = lambda key: [v for g in gens if g[key] is not None for v in g[key]]  # noqa: E731
    tasks = cat("tasks")
    cols = {k: (cat(k) if all(g[k] is not None for g in gens) else None) for k in _COLUMNS}
    # sampled groups (dynamic sampling), over all generation records of the step
    sampled = None
    if any(g.get("sampled_groups") for g in gens):
        sampled = {k: [v for g in gens if g.get("sampled_groups")
                       for v in g["sampled_groups"][k]] for k in _SAMPLED}
    # groups: (task, [rewards])
    groups = []
    for g in gens:
        G = g["group_size"]
        for i in range(0, len(g["tasks"]), G):
            groups.append((g["tasks"][i], g["rewards"][i:i + G]))
    metrics: dict[str, float] = {}
    for scope in _scopes(tasks):
        metrics.update(_scope_metrics(scope, tasks, cols))
        if sampled is None:
            sg = [rs for t, rs in groups if scope == "all" or t == scope]
            metrics[f"{scope}/zero_variance_groups"] = _mean(
                [float(max(rs) == min(rs)) for rs in sg])
    total = metrics.get("all/update_mass")
    if total is not None:
        for scope in sorted(set(tasks)):
            metrics[f"{scope}/update_mass_share"] = (
                metrics[f"{scope}/update_mass"] / total if total > 0 else float("nan"))
    if sampled is not None:
        metrics.update(_sampled_metrics(sampled))
    baselines = [g["baseline"] for g in gens if g["baseline"] is not None]
    if baselines:
        metrics["ema_baseline"] = float(baselines[-1])
    metrics["time/generation_s"] = float(sum(g["generation_s"] for g in gens))
    metrics["time/scoring_s"] = float(sum(g["scoring_s"] for g in gens))
    return metrics


def _scope_metrics(scope: str, tasks: list[str], cols: dict) -> dict[str, float]:
    """The per-completion metrics of ``scope`` (a task, or ``all``) over the step's columns."""
    idx = [i for i, t in enumerate(tasks) if scope == "all" or t == scope]
    pick = lambda col: [col[i] for i in idx]  # noqa: E731
    r = pick(cols["rewards"])
    m: dict[str, float] = {}
    m[f"{scope}/n_completions"] = float(len(idx))
    m[f"{scope}/reward_mean"] = _mean(r)
    m[f"{scope}/reward_std"] = _std(r)
    m[f"{scope}/accuracy"] = _mean([float(is_correct(tasks[i], cols["rewards"][i])) for i in idx])
    m[f"{scope}/completion_length"] = _mean(pick(cols["completion_lengths"]))
    m[f"{scope}/advantage_mean"] = _mean(pick(cols["advantages"]))
    w = pick(cols["weights"])
    m[f"{scope}/weight_mean"] = _mean(w)
    m[f"{scope}/weight_max"] = float(max(w)) if w else float("nan")
    if cols["advantages"] is not None and cols["weights"] is not None:
        m[f"{scope}/update_mass"] = float(sum(
            float(wi) * abs(float(ai)) for wi, ai in zip(w, pick(cols["advantages"]))))
    if cols["confidence"] is not None:
        m[f"{scope}/confidence_mean"] = _mean(pick(cols["confidence"]))
    if cols["ref_logprob"] is not None:
        m[f"{scope}/ref_logprob_mean"] = _mean(pick(cols["ref_logprob"]))
    return m


def _sampled_metrics(sampled: dict) -> dict[str, float]:
    """Dynamic sampling's per-scope zero-variance share, sampled and dropped groups, and the
    step's refill and unfilled groups, over every group sampled."""
    m: dict[str, float] = {}
    for scope in sorted(set(sampled["tasks"])) + ["all"]:
        idx = [i for i, t in enumerate(sampled["tasks"]) if scope == "all" or t == scope]
        zero = [sampled["zero_variance"][i] for i in idx]
        m[f"{scope}/zero_variance_groups"] = _mean([float(z) for z in zero])
        m[f"{scope}/sampled_groups"] = float(len(idx))
        m[f"{scope}/dropped_groups"] = float(sum(
            1 for i in idx if sampled["zero_variance"][i] and not sampled["kept"][i]))
    m["all/refill_groups"] = float(sum(sampled["refill"]))
    m["all/unfilled_groups"] = float(sum(
        1 for z, k in zip(sampled["zero_variance"], sampled["kept"]) if z and k))
    return m


def loss_metrics(losses: list[dict]) -> dict[str, float]:
    """``<scope>/<metric>`` (``clip_fraction``, ``kl``, ``adv_logprob``, ``adv_log_ratio``,
    each when every record has it) of a step's loss records (``StepRecorder.add_loss``'s)."""
    ltasks = [t for rec in losses for t in rec["tasks"]]
    lcols = {k: ([v for rec in losses for v in rec[k]]
                 if all(rec.get(k) is not None for rec in losses) else None)
             for k in ("clip_fraction", "kl", "adv_logprob", "adv_log_ratio")}
    metrics: dict[str, float] = {}
    for scope in _scopes(ltasks):
        idx = [i for i, t in enumerate(ltasks) if scope == "all" or t == scope]
        for k, col in lcols.items():
            if col is not None:
                metrics[f"{scope}/{k}"] = _mean([col[i] for i in idx])
    return metrics
