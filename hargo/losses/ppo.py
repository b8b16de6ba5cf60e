"""Classic PPO with a value head: per-token rewards, GAE, whitening, the clipped policy and value
losses, explained variance (TRL's old ``PPOTrainer``; Schulman et al. 2016/2017)."""
from __future__ import annotations

import torch

from hargo.losses.aggregation import aggregate
from hargo.losses.kl import kl_penalty
from hargo.losses.masked import Reduce, check_bt, masked_token_mean, masked_totals, no_reduce
from hargo.losses.policy import clip_fraction, clipped_surrogate

__all__ = ["WHITEN_EPS", "token_rewards", "gae_advantages", "whiten", "clipped_policy_loss",
           "clipped_value_loss", "explained_variance"]

#: TRL's old ``masked_whiten``: ``(x - mean) * rsqrt(var + 1e-8)``.
WHITEN_EPS = 1e-8


def token_rewards(logps: torch.Tensor, ref_logps: torch.Tensor | None, scores: torch.Tensor,
                  mask: torch.Tensor, beta: float, kl: str = "k1") -> torch.Tensor:
    """Per-token PPO rewards: KL penalty on every token plus the task reward on the last one.

    ``r_t = -beta * k1_t = -beta * (logps_t - ref_logps_t)`` on each valid completion token (TRL's
    old ``PPOTrainer``: ``non_score_reward = -kl_coef * (logprobs - ref_logprobs)``), plus
    ``scores[b]`` added on row ``b``'s last valid token (``rewards[[range(B), last]] += scores``).

    Args:
        logps: (B, T) policy log-probs of the sampled completion tokens (rollout time).
        ref_logps: (B, T) reference-model log-probs of the same tokens; may be None when
            ``beta == 0`` (no KL penalty).
        scores: (B,) sequence (task) rewards.
        mask: (B, T) nonzero/True on valid completion tokens (padding excluded).
        beta: KL coefficient (``rl.ppo.kl_coef``); 0 gives no KL term.
        kl: the KL estimator's name in ``KL_ESTIMATORS`` (the method's ``kl``; k1 is TRL's old
            PPO penalty, the formula above).

    Returns:
        (B, T) float32 rewards, 0 on masked positions. A row with no valid token gets no reward
        at all (its score has no token to sit on).

    Raises:
        ValueError: shapes disagree, ``beta != 0`` without ``ref_logps``, or an unknown ``kl``.
    """
    check_bt("token_rewards", logps, mask)
    if scores.shape != (logps.size(0),):
        raise ValueError(f"token_rewards: scores {tuple(scores.shape)} must be ({logps.size(0)},)")
    m = mask.to(torch.bool)
    rewards = torch.zeros(logps.shape, dtype=torch.float32, device=logps.device)
    if beta != 0.0:
        if ref_logps is None:
            raise ValueError("token_rewards: beta != 0 needs the reference log-probs")
        check_bt("token_rewards", ref_logps, mask)
        penalty = kl_penalty(logps.float(), ref_logps.float(), kl)
        rewards = torch.where(m, -beta * penalty, rewards)
    T = logps.size(1)
    positions = torch.arange(T, device=logps.device).expand_as(m)
    last = torch.where(m, positions, torch.full_like(positions, -1)).max(dim=1).values  # (B,)
    has = last >= 0
    rows = torch.arange(logps.size(0), device=logps.device)[has]
    rewards[rows, last[has]] += scores.to(rewards.device).float()[has]
    return rewards


def gae_advantages(rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float,
                   lam: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalized advantage estimation over completion tokens.

    Schulman et al. 2016, "High-Dimensional Continuous Control Using Generalized Advantage
    Estimation", eq. 16: ``delta_t = r_t + gamma V_{t+1} - V_t``, ``A_t = sum_l (gamma lam)^l
    delta_{t+l}``, computed backwards as ``A_t = delta_t + gamma lam A_{t+1}``, with ``V = 0`` and
    ``A = 0`` after the last valid token; returns ``R_t = A_t + V_t`` (TRL's old ``PPOTrainer``,
    "compute advantages and returns"). Masked positions are skipped: the recursion runs over each
    row's valid tokens in order, so right padding (and any masked hole) changes nothing.

    Args:
        rewards: (B, T) per-token rewards (:func:`token_rewards`).
        values: (B, T) value estimates ``V_t`` of the state before token t (detached).
        mask: (B, T) nonzero/True on valid completion tokens.
        gamma: discount in [0, 1].
        lam: GAE lambda in [0, 1].

    Returns:
        ``(advantages, returns)``, both (B, T) float32, 0 on masked positions.

    Raises:
        ValueError: shapes disagree.
    """
    check_bt("gae_advantages", rewards, mask)
    check_bt("gae_advantages", values, mask)
    r, v, m = rewards.float(), values.float(), mask.to(torch.bool)
    B, T = r.shape
    adv = torch.zeros_like(v)
    next_value = v.new_zeros(B)
    next_adv = v.new_zeros(B)
    for t in reversed(range(T)):
        valid = m[:, t]
        a = r[:, t] + gamma * next_value - v[:, t] + gamma * lam * next_adv
        adv[:, t] = torch.where(valid, a, torch.zeros_like(a))
        next_value = torch.where(valid, v[:, t], next_value)
        next_adv = torch.where(valid, a, next_adv)
    returns = torch.where(m, adv + v, torch.zeros_like(v))
    return adv, returns


def whiten(x: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True,
           reduce: Reduce | None = None) -> torch.Tensor:
    """Whiten ``x`` over the valid tokens of the batch: ``(x - mean) / sqrt(var + 1e-8)``.

    TRL's old ``masked_whiten`` (``trl/core.py``): mean and *unbiased* (n - 1) variance over the
    valid tokens; with ``shift_mean=False`` the mean is added back.

    Args:
        x: (B, T) values (computed in float32 whatever the dtype).
        mask: (B, T) nonzero/True on valid tokens.
        shift_mean: subtract the mean (True) or only rescale (False).
        reduce: :data:`Reduce`, so that several processes whiten with the statistics of the
            whole batch; None: this batch alone.

    Returns:
        (B, T) float32, 0 on masked positions.

    Raises:
        ValueError: shapes disagree, or fewer than 2 valid tokens (no variance).
    """
    check_bt("whiten", x, mask)
    xs, m, totals = masked_totals(x.float(), mask, reduce)
    n = float(totals[1])
    if n < 2:
        raise ValueError(f"whiten: needs at least 2 valid tokens, got {n:g}")
    mean = totals[0] / totals[1]
    centered = torch.where(m, xs - mean, torch.zeros((), device=x.device))
    var = (reduce or no_reduce)((centered ** 2).sum().reshape(1))[0] / (totals[1] - 1)
    out = centered * torch.rsqrt(var + WHITEN_EPS)
    if not shift_mean:
        out = out + mean
    return torch.where(m, out, torch.zeros((), device=x.device))


def clipped_policy_loss(logps: torch.Tensor, old_logps: torch.Tensor, advantages: torch.Tensor,
                        mask: torch.Tensor, clip_low: float, clip_high: float | None = None,
                        token_weights: torch.Tensor | None = None
                        ) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO's policy loss: :func:`clipped_surrogate`, ``token_mean``-aggregated.

    Per token ``max(-A r, -A clip(r, 1 - clip_low, 1 + clip_high))`` (Schulman et al. 2017, eq. 7,
    as a loss; TRL's old ``PPOTrainer`` ``pg_loss``, which is :func:`clipped_surrogate` without
    ``delta``), averaged over the batch's valid tokens.

    Args:
        logps: (B, T) policy log-probs (with grad).
        old_logps: (B, T) rollout-time log-probs (detached).
        advantages: (B, T) per-token advantages (or (B,) / (B, 1)).
        mask: (B, T) valid tokens.
        clip_low, clip_high: clip range (``clip_high`` defaults to ``clip_low``).
        token_weights: optional (B, T) or (B, 1) factors on the per-token loss (TRL's vLLM
            importance-sampling ratio).

    Returns:
        ``(loss, clip_fraction)``: 0-d float32 tensors; the clip fraction is the share of valid
        tokens where the clip binds (``region`` of :func:`clip_fraction`).

    Raises:
        ValueError: shapes disagree.
    """
    check_bt("clipped_policy_loss", logps, mask)
    clip_high = clip_low if clip_high is None else clip_high
    per_token, ratio = clipped_surrogate(logps, old_logps, advantages, clip_low, clip_high)
    if token_weights is not None:
        per_token = per_token * token_weights
    _, _, clipped = clip_fraction(ratio, advantages, clip_low, clip_high)
    return aggregate(per_token, mask, "token_mean"), masked_token_mean(clipped.float(), mask)


def clipped_value_loss(values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor,
                       mask: torch.Tensor, cliprange_value: float
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO's clipped value loss, ``token_mean``-aggregated over the batch's valid tokens.

    ``0.5 * max((V - R)^2, (clip(V, V_old - c, V_old + c) - R)^2)`` (TRL's old ``PPOTrainer``
    ``vf_loss``; ``c = cliprange_value``).

    Args:
        values: (B, T) value predictions (with grad).
        old_values: (B, T) rollout-time values (detached).
        returns: (B, T) GAE returns.
        mask: (B, T) valid tokens.
        cliprange_value: ``c`` (> 0).

    Returns:
        ``(loss, clip_fraction)``: 0-d float32 tensors; the clip fraction is the share of valid
        tokens whose clipped term is the larger one.

    Raises:
        ValueError: shapes disagree.
    """
    check_bt("clipped_value_loss", values, mask)
    clipped = torch.clamp(values, old_values - cliprange_value, old_values + cliprange_value)
    loss1 = (values - returns) ** 2
    loss2 = (clipped - returns) ** 2
    loss = 0.5 * aggregate(torch.max(loss1, loss2), mask, "token_mean")
    return loss, masked_token_mean((loss2 > loss1).float(), mask)


def explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor,
                       reduce: Reduce | None = None) -> float:
    """``1 - Var(R - V) / Var(R)`` over the valid tokens (population variances, float64); 1 is a
    perfect value function, 0 no better than the mean return (the diagnostic of TRL's old
    ``PPOTrainer`` and of stable-baselines3).

    Args:
        values, returns, mask: (B, T).
        reduce: :data:`Reduce` (statistics of all processes); None: this batch alone.

    Returns:
        A Python float; NaN when no token is valid or ``Var(R) = 0``.

    Raises:
        ValueError: shapes disagree.
    """
    check_bt("explained_variance", values, mask)
    reduce = reduce or no_reduce
    m = mask.to(torch.bool)
    z = torch.zeros((), device=values.device)
    r = torch.where(m, returns.float(), z)
    d = torch.where(m, returns.float() - values.float(), z)
    s = reduce(torch.stack([r.sum(), (r ** 2).sum(), d.sum(), (d ** 2).sum(),
                            m.sum().float()]).double())
    n = float(s[4])
    if n < 1:
        return float("nan")
    var_r = float(s[1]) / n - (float(s[0]) / n) ** 2
    var_d = float(s[3]) / n - (float(s[2]) / n) ** 2
    return float("nan") if var_r <= 0 else 1.0 - var_d / var_r
