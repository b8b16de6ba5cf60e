"""Per-task diagnostics of :class:`~hargo.training.grpo.HargoGRPOTrainer`, as pure functions (no
trainer): each response's task, carried through TRL's batch as an index into the trainer's
``task_names``, and the per-response KL, clip fraction and advantage-weighted log-prob / log-ratio
of one loss micro-batch (:func:`loss_diagnostics`). The trainer gathers them and hands them to the
recorder (:class:`hargo.training.rl_logging.StepRecorder`) with those tasks
(``HargoGRPOTrainer._record_loss_diagnostics``). The weighting never reads them."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from hargo.losses import (advantage_weighted_logprob, clip_fraction, importance_ratio, kl_penalty,
                          masked_mean)

__all__ = ["dataset_tasks", "task_index", "LossDiagnostics", "loss_diagnostics"]


def dataset_tasks(dataset, task_column: str) -> list[str]:
    """The sorted task names in ``dataset``'s ``task_column``; ``["all"]`` when it has none."""
    tasks = []
    if dataset is not None and task_column in getattr(dataset, "column_names", []):
        tasks = sorted({str(t) for t in dataset[task_column]})
    return tasks or ["all"]


def task_index(task_names: list[str], task) -> int:
    """The index of ``task`` (None counts as ``"all"``) in ``task_names``, appended when new."""
    name = "all" if task is None else str(task)
    if name not in task_names:
        task_names.append(name)
    return task_names.index(name)


@dataclass(frozen=True)
class LossDiagnostics:
    """Per-response diagnostics of one micro-batch, each (B,) on this process.

    Attributes:
        kl: token-averaged k3 KL to the reference model; None without reference log-probs.
        clip_fraction: the fraction of the response's tokens whose ratio was clipped.
        adv_logprob: ``G w_i mean_t A_i log pi(y_t)``.
        adv_log_ratio: ``G w_i mean_t A_i (log pi - log pi_ref)(y_t)``; None without reference.
    """

    kl: torch.Tensor | None
    clip_fraction: torch.Tensor
    adv_logprob: torch.Tensor
    adv_log_ratio: torch.Tensor | None


def loss_diagnostics(logps: torch.Tensor, mask: torch.Tensor, advantages: torch.Tensor,
                     group_size: int, eps_low: float, eps_high: float, delta: float | None = None,
                     ref_logps: torch.Tensor | None = None, old_logps: torch.Tensor | None = None,
                     weights: torch.Tensor | None = None) -> LossDiagnostics:
    """Per response of a loss micro-batch: KL (k3, token-averaged), clip fraction, the
    advantage-weighted log-prob ``G w_i mean_t A_i log pi(y_t)`` (the surrogate's gradient-carrying
    part, :func:`~hargo.losses.advantage_weighted_logprob`) and, when ``ref_logps`` is given, the
    advantage-weighted log-ratio ``G w_i mean_t A_i (log pi - log pi_ref)(y_t)``.

    Args:
        logps: (B, T) policy log-probs of the completion tokens (nats; the loss forward's).
        mask: (B, T) tokens the loss counts.
        advantages: (B,), (B, 1) or (B, T) (PPO's per-token) advantages.
        group_size: G, completions per prompt.
        eps_low, eps_high, delta: the clipping of :func:`~hargo.losses.clip_fraction`.
        ref_logps: (B, T) reference-model log-probs, or None (no KL, no log-ratio).
        old_logps: (B, T) log-probs of the rollout policy; None: ``logps`` (ratio 1).
        weights: (B,) response weights ``w_i``; None as in ``advantage_weighted_logprob``.

    Returns:
        :class:`LossDiagnostics`.
    """
    kl = None if ref_logps is None else masked_mean(kl_penalty(logps, ref_logps, "k3"), mask)
    adv_logp = advantage_weighted_logprob(logps, advantages, mask, weights, group_size)
    adv_lr = None if ref_logps is None else advantage_weighted_logprob(
        logps - ref_logps, advantages, mask, weights, group_size)
    ratio = importance_ratio(logps, logps if old_logps is None else old_logps)
    _, _, clipped = clip_fraction(ratio, advantages, eps_low, eps_high, delta)
    return LossDiagnostics(kl=kl, clip_fraction=masked_mean(clipped.float(), mask),
                           adv_logprob=adv_logp, adv_log_ratio=adv_lr)
