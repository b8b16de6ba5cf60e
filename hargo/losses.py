"""Loss math of every RL method in hargo, as pure torch functions (no trainer inside).

The trainers (:mod:`hargo.training.grpo`, :mod:`hargo.training.ppo`) only wire these together;
each formula is written once, here. Layout after verl's ``verl/trainer/ppo/core_algos.py``:
policy losses, KL estimators and loss aggregations are registered by name.

Conventions: ``B`` responses (completions) of at most ``T`` tokens, laid out ``(B, T)`` and
right-padded; ``mask`` is ``(B, T)``, nonzero/True on the tokens that count (padding 0). Unless a
docstring says otherwise, a function computes in its inputs' dtype, as TRL 1.16 does.

Masked means
    :func:`masked_mean` (per response, ``(B, T) -> (B,)``) and :func:`masked_token_mean` (one
    scalar over all valid tokens, optionally summed over processes). Every masked mean in the
    package is one of these two.
Aggregation (``AGGREGATIONS``, :func:`register_aggregation`, :func:`aggregate`)
    ``response_mean`` (TRL's ``loss_type="grpo"``: mean over a response's own tokens, then over
    responses) and ``token_mean`` (TRL's ``bnpo`` / old PPO: mean over all valid tokens);
    :func:`weighted_loss` is the per-response weighted form HARGO uses (``docs/method.md`` step 6).
Policy losses (``POLICY_LOSSES``, :func:`register_policy_loss`, :func:`policy_loss`)
    ``clipped_surrogate`` (:func:`clipped_surrogate`: PPO's / TRL 1.16 GRPO's clipped objective)
    and :func:`clip_fraction` (the clip indicators TRL logs).
KL estimators (``KL_ESTIMATORS``, :func:`register_kl`, :func:`kl_penalty`)
    ``k1``, ``k2``, ``k3`` of Schulman's note "Approximating KL Divergence" (2020).
PPO (classic, with a value head)
    :func:`token_rewards`, :func:`gae_advantages`, :func:`whiten`, :func:`clipped_policy_loss`,
    :func:`clipped_value_loss`, :func:`explained_variance` (TRL's old ``PPOTrainer`` and
    Schulman et al. 2016/2017).

The group advantages and per-response weights of the GRPO family live in
:mod:`hargo.advantages`.
"""
from __future__ import annotations

from collections.abc import Callable

import torch

__all__ = [
    "Reduce",
    "masked_mean", "masked_token_mean",
    "AGGREGATIONS", "register_aggregation", "aggregate", "weighted_loss",
    "importance_ratio", "clipped_surrogate", "clip_fraction",
    "POLICY_LOSSES", "register_policy_loss", "policy_loss",
    "KL_ESTIMATORS", "register_kl", "kl_penalty",
    "WHITEN_EPS", "token_rewards", "gae_advantages", "whiten", "clipped_policy_loss",
    "clipped_value_loss", "explained_variance",
]

#: Sums a statistics tensor over processes (e.g. ``lambda t: accelerator.reduce(t, "sum")``), so
#: several processes get the statistics of the whole batch; None stands for one process.
Reduce = Callable[[torch.Tensor], torch.Tensor]

#: TRL's old ``masked_whiten``: ``(x - mean) * rsqrt(var + 1e-8)``.
WHITEN_EPS = 1e-8


def _identity(t: torch.Tensor) -> torch.Tensor:
    return t


def _check_bt(name: str, x: torch.Tensor, mask: torch.Tensor) -> None:
    if x.dim() != 2 or x.shape != mask.shape:
        raise ValueError(f"{name}: expected (B, T) tensors of one shape, got {tuple(x.shape)} and "
                         f"mask {tuple(mask.shape)}")


def _acc_dtype(x: torch.Tensor) -> torch.dtype:
    """Accumulation dtype: float64 stays float64, everything else (bf16, fp16, fp32) is float32."""
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def _register(table: dict, kind: str, name: str):
    def deco(fn):
        if name in table:
            raise ValueError(f"{kind} {name!r} is already registered")
        table[name] = fn
        return fn
    return deco


def _lookup(table: dict, kind: str, name: str):
    try:
        return table[name]
    except KeyError:
        raise ValueError(f"unknown {kind} {name!r}; valid: {sorted(table)}") from None


# --------------------------------------------------------------------------- masked means

def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of each row over its unmasked positions (one value per response).

    Args:
        x: (B, T) values (any float dtype; padding positions may hold anything, even NaN/inf).
        mask: (B, T), nonzero/True where a token counts.

    Returns:
        (B,) float32 (computed in float32 for bf16/fp16 input; float64 input stays float64).
        Rows with no unmasked position give 0. Differentiable w.r.t. ``x``.

    Raises:
        ValueError: ``x`` and ``mask`` are not the same (B, T) shape.
    """
    if x.shape != mask.shape or x.dim() != 2:
        raise ValueError(f"masked_mean: x {tuple(x.shape)} and mask {tuple(mask.shape)} must be "
                         f"the same (B, T) shape")
    dtype = _acc_dtype(x)
    m = mask.to(torch.bool)
    xs = torch.where(m, x.to(dtype), torch.zeros((), dtype=dtype, device=x.device))
    n = m.sum(dim=1).to(dtype)
    return xs.sum(dim=1) / n.clamp(min=1.0)


def _masked_totals(x: torch.Tensor, mask: torch.Tensor, reduce: Reduce | None
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(x with padding zeroed, bool mask, reduce([sum of x, token count]))`` in ``_acc_dtype``."""
    dtype = _acc_dtype(x)
    m = mask.to(torch.bool)
    xs = torch.where(m, x.to(dtype), torch.zeros((), dtype=dtype, device=x.device))
    totals = (reduce or _identity)(torch.stack([xs.sum(), m.sum().to(dtype)]))
    return xs, m, totals


def masked_token_mean(x: torch.Tensor, mask: torch.Tensor,
                      reduce: Reduce | None = None) -> torch.Tensor:
    """Scalar mean of ``x`` over all valid tokens of the batch (every token weighs the same).

    Args:
        x: (B, T) values (padding may hold anything).
        mask: (B, T) valid tokens.
        reduce: sums ``[sum, count]`` over processes (:data:`Reduce`) so the mean is over the
            tokens of all processes; None: this batch alone.

    Returns:
        0-d tensor, float32 (float64 for float64 input); 0 when no token is valid.
        Differentiable w.r.t. ``x`` when ``reduce`` is.

    Raises:
        ValueError: ``x`` and ``mask`` are not the same (B, T) shape.
    """
    _check_bt("masked_token_mean", x, mask)
    _, _, totals = _masked_totals(x, mask, reduce)
    return totals[0] / totals[1].clamp(min=1.0)


# ---------------------------------------------------------------------------- aggregation

#: name -> ``f(per_token_loss (B, T), mask (B, T)) -> scalar``.
AGGREGATIONS: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {}


def register_aggregation(name: str):
    """Decorator registering ``f(per_token_loss, mask) -> scalar`` under ``name`` in
    ``AGGREGATIONS``. Raises ValueError when the name is taken."""
    return _register(AGGREGATIONS, "aggregation", name)


@register_aggregation("response_mean")
def _response_mean(per_token_loss: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """TRL 1.16 ``loss_type="grpo"`` (``((l * mask).sum(-1) / mask.sum(-1).clamp(min=1)).mean()``,
    Shao et al. 2024, DeepSeekMath eq. 3): each response's mean over its own tokens, then the mean
    over responses."""
    return masked_mean(per_token_loss, mask).mean()


@register_aggregation("token_mean")
def _token_mean(per_token_loss: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """TRL 1.16 ``loss_type="bnpo"`` and TRL's old ``PPOTrainer`` (``masked_mean``): the mean over
    every valid token of the batch."""
    return masked_token_mean(per_token_loss, mask)


def aggregate(per_token_loss: torch.Tensor, mask: torch.Tensor, mode: str) -> torch.Tensor:
    """Reduce a (B, T) per-token loss to the scalar loss by the named ``AGGREGATIONS`` mode.

    Args:
        per_token_loss: (B, T) float (bf16/fp16 are summed in float32).
        mask: (B, T) valid tokens.
        mode: ``"response_mean"`` or ``"token_mean"`` (or a registered name).

    Returns:
        0-d float32 tensor (float64 for float64 input), differentiable.

    Raises:
        ValueError: unknown mode (lists the valid ones), or shapes disagree.
    """
    return _lookup(AGGREGATIONS, "aggregation", mode)(per_token_loss, mask)


def weighted_loss(per_token_loss: torch.Tensor, mask: torch.Tensor, weights: torch.Tensor,
                  num_groups: int) -> torch.Tensor:
    """Weighted GRPO-family loss, ``docs/method.md`` step 6: ``(1/N) sum_i w_i masked_mean(L_i)``.

    ``L_i`` (one row of ``per_token_loss``) is response i's per-token loss (clipped surrogate
    plus ``beta`` times the k3 KL, computed by the trainer), averaged over its own tokens. Dividing
    by the number of groups ``N`` makes the value a mean over groups; with uniform weights 1/G it
    equals the ``response_mean`` aggregation (TRL's ``loss_type="grpo"``).

    Args:
        per_token_loss: (B, T) float (bf16 is summed in float32).
        mask: (B, T) completion mask (padding 0).
        weights: (B,) per-response weights (``EstimatorOutput.weights.reshape(-1)``).
        num_groups: N > 0, the number of groups the B responses come from.

    Returns:
        Scalar float32 tensor (float64 for float64 input), differentiable w.r.t. per_token_loss.

    Raises:
        ValueError: ``weights`` not (B,), ``num_groups <= 0``, or ``per_token_loss``/``mask``
            shapes disagree.
    """
    if weights.dim() != 1 or weights.shape[0] != per_token_loss.shape[0]:
        raise ValueError(f"weighted_loss: weights {tuple(weights.shape)} must be (B,) with "
                         f"B={per_token_loss.shape[0]}")
    if int(num_groups) <= 0:
        raise ValueError(f"weighted_loss: num_groups must be > 0, got {num_groups}")
    per_response = masked_mean(per_token_loss, mask)
    return (weights.to(per_response.dtype) * per_response).sum() / int(num_groups)


# -------------------------------------------------------------------------- policy losses

#: name -> ``f(logps, old_logps, advantages, eps_low, eps_high, **kw) -> (per_token_loss, ratio)``.
POLICY_LOSSES: dict[str, Callable[..., tuple[torch.Tensor, torch.Tensor]]] = {}


def register_policy_loss(name: str):
    """Decorator registering a policy loss ``f(logps, old_logps, advantages, eps_low, eps_high,
    **kw) -> (per_token_loss, ratio)`` under ``name`` in ``POLICY_LOSSES`` (verl's
    ``register_policy_loss``). Raises ValueError when the name is taken."""
    return _register(POLICY_LOSSES, "policy loss", name)


def policy_loss(name: str) -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
    """The registered policy loss ``name``. Raises ValueError for an unknown name (lists the
    valid ones)."""
    return _lookup(POLICY_LOSSES, "policy loss", name)


def _advantages_bt(advantages: torch.Tensor, B: int, T: int, name: str) -> torch.Tensor:
    """(B,) -> (B, 1), as TRL 1.16's ``_compute_loss`` does; (B, 1) and (B, T) pass."""
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(1)
    if advantages.dim() != 2 or advantages.size(0) != B or advantages.size(1) not in (1, T):
        raise ValueError(f"{name}: advantages {tuple(advantages.shape)} must be (B,), (B, 1) or "
                         f"(B, T) with B={B}, T={T}")
    return advantages


def importance_ratio(logps: torch.Tensor, old_logps: torch.Tensor) -> torch.Tensor:
    """Token-level importance ratio ``exp(logps - old_logps)`` (TRL 1.16
    ``importance_sampling_level="token"``), in the inputs' dtype.

    Raises:
        ValueError: the shapes differ.
    """
    if logps.shape != old_logps.shape:
        raise ValueError(f"importance_ratio: logps {tuple(logps.shape)} and old_logps "
                         f"{tuple(old_logps.shape)} differ")
    return torch.exp(logps - old_logps)


@register_policy_loss("clipped_surrogate")
def clipped_surrogate(logps: torch.Tensor, old_logps: torch.Tensor, advantages: torch.Tensor,
                      eps_low: float, eps_high: float, delta: float | None = None
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """The clipped surrogate objective as a per-token loss.

    ``r = exp(logps - old_logps)``; ``L = -min(r' A, clip(r, 1 - eps_low, 1 + eps_high) A)`` with
    ``r' = min(r, delta)`` when ``delta`` is given (INTELLECT-2's two-sided clip: a very large
    ratio is capped even for a negative advantage), else ``r' = r``. This is PPO's clipped
    objective (Schulman et al. 2017, eq. 7; with ``eps_low != eps_high``, DAPO's clip-higher),
    written operation for operation as TRL 1.16's ``GRPOTrainer._compute_loss``
    (``trl/trainer/grpo_trainer.py``, loss types grpo/bnpo/dr_grpo/dapo), so it gives the same bits.

    Args:
        logps: (B, T) log-probs of the sampled tokens under the current policy (with grad).
        old_logps: (B, T) log-probs at sampling time (detached); ``logps.detach()`` when the policy
            has not moved since (TRL's ``num_iterations == 1``).
        advantages: (B,) one per response, or (B, 1) / (B, T) per token.
        eps_low, eps_high: the clip range ``[1 - eps_low, 1 + eps_high]``.
        delta: TRL's ``GRPOConfig.delta`` (None: off).

    Returns:
        ``(per_token_loss, ratio)``: (B, T) in the dtype of ``logps``/``advantages`` (torch's type
        promotion; padding is not masked: aggregate with the mask); ``ratio`` is the unclamped
        ``r`` (TRL's ``coef_1`` before the ``delta`` cap: what its KL bias correction multiplies).

    Raises:
        ValueError: ``logps``/``old_logps`` shapes differ or ``advantages`` does not broadcast.
    """
    ratio = importance_ratio(logps, old_logps)
    advantages = _advantages_bt(advantages, ratio.size(0), ratio.size(1), "clipped_surrogate")
    coef_2 = torch.clamp(ratio, 1 - eps_low, 1 + eps_high)
    coef_1 = ratio if delta is None else torch.clamp(ratio, max=delta)
    per_token_loss = -torch.min(coef_1 * advantages, coef_2 * advantages)
    return per_token_loss, ratio


def clip_fraction(ratio: torch.Tensor, advantages: torch.Tensor, eps_low: float, eps_high: float,
                  delta: float | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Where the clip of :func:`clipped_surrogate` binds, as TRL 1.16 logs it
    (``clip_ratio/low_mean``, ``high_mean``, ``region_mean``).

    ``low = (r < 1 - eps_low) & (A < 0)``, ``high = (r > 1 + eps_high) & (A > 0)``,
    ``region = low | high``: exactly the tokens where the clipped term is the one ``min`` picks
    (and its gradient is 0). ``r`` is capped at ``delta`` first when given, as TRL does before
    logging.

    Args:
        ratio: (B, T) importance ratio (the second output of :func:`clipped_surrogate`).
        advantages: (B,), (B, 1) or (B, T).
        eps_low, eps_high, delta: as :func:`clipped_surrogate`.

    Returns:
        ``(low, high, region)``: (B, T) bool each, padding not masked (average them with
        :func:`masked_mean` / :func:`masked_token_mean`).

    Raises:
        ValueError: ``advantages`` does not broadcast to ``ratio``.
    """
    if ratio.dim() != 2:
        raise ValueError(f"clip_fraction: ratio must be (B, T), got {tuple(ratio.shape)}")
    advantages = _advantages_bt(advantages, ratio.size(0), ratio.size(1), "clip_fraction")
    if delta is not None:
        ratio = torch.clamp(ratio, max=delta)
    low = (ratio < 1 - eps_low) & (advantages < 0)
    high = (ratio > 1 + eps_high) & (advantages > 0)
    return low, high, low | high


# -------------------------------------------------------------------------- KL estimators

#: name -> ``f(logps, ref_logps) -> (B, T) per-token estimate of KL(pi_theta || pi_ref)``.
KL_ESTIMATORS: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {}


def register_kl(name: str):
    """Decorator registering ``f(logps, ref_logps) -> per-token KL estimate`` under ``name`` in
    ``KL_ESTIMATORS``. Raises ValueError when the name is taken."""
    return _register(KL_ESTIMATORS, "KL estimator", name)


@register_kl("k1")
def _k1(logps: torch.Tensor, ref_logps: torch.Tensor) -> torch.Tensor:
    """``log pi - log pi_ref``: unbiased, high variance, can be negative (TRL's old PPO reward
    penalty)."""
    return logps - ref_logps


@register_kl("k2")
def _k2(logps: torch.Tensor, ref_logps: torch.Tensor) -> torch.Tensor:
    """``0.5 (log pi - log pi_ref)^2``: biased, low variance, >= 0."""
    return 0.5 * (logps - ref_logps) ** 2


@register_kl("k3")
def _k3(logps: torch.Tensor, ref_logps: torch.Tensor) -> torch.Tensor:
    """``exp(d) - d - 1`` with ``d = log pi_ref - log pi``: unbiased, low variance, >= 0 (TRL 1.16
    GRPO's ``per_token_kl``, the same operations)."""
    d = ref_logps - logps
    return torch.exp(d) - d - 1


def kl_penalty(logps: torch.Tensor, ref_logps: torch.Tensor, kind: str = "k3") -> torch.Tensor:
    """Per-token estimate of ``KL(pi_theta || pi_ref)`` from the sampled tokens' log-probs.

    The estimators of J. Schulman, "Approximating KL Divergence" (2020,
    http://joschu.net/blog/kl-approx.html) with ``r = pi_ref / pi_theta`` and tokens sampled from
    ``pi_theta``: ``k1 = -log r``, ``k2 = (log r)^2 / 2``, ``k3 = (r - 1) - log r`` (DeepSeekMath
    eq. 4; TRL 1.16 GRPO's KL term).

    Args:
        logps: (B, T) (or any shape) policy log-probs.
        ref_logps: reference-model log-probs, same shape.
        kind: ``"k1"``, ``"k2"``, ``"k3"`` (or a registered name).

    Returns:
        Tensor of the inputs' shape and dtype; padding not masked.

    Raises:
        ValueError: unknown kind (lists the valid ones) or the shapes differ.
    """
    fn = _lookup(KL_ESTIMATORS, "KL estimator", kind)
    if logps.shape != ref_logps.shape:
        raise ValueError(f"kl_penalty: logps {tuple(logps.shape)} and ref_logps "
                         f"{tuple(ref_logps.shape)} differ")
    return fn(logps, ref_logps)


# ------------------------------------------------------------------------------------ PPO

def token_rewards(logps: torch.Tensor, ref_logps: torch.Tensor | None, scores: torch.Tensor,
                  mask: torch.Tensor, beta: float) -> torch.Tensor:
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
        beta: KL coefficient (``rl.beta``); 0 gives no KL term.

    Returns:
        (B, T) float32 rewards, 0 on masked positions. A row with no valid token gets no reward
        at all (its score has no token to sit on).

    Raises:
        ValueError: shapes disagree, or ``beta != 0`` without ``ref_logps``.
    """
    _check_bt("token_rewards", logps, mask)
    if scores.shape != (logps.size(0),):
        raise ValueError(f"token_rewards: scores {tuple(scores.shape)} must be ({logps.size(0)},)")
    m = mask.to(torch.bool)
    rewards = torch.zeros(logps.shape, dtype=torch.float32, device=logps.device)
    if beta != 0.0:
        if ref_logps is None:
            raise ValueError("token_rewards: beta != 0 needs the reference log-probs")
        _check_bt("token_rewards", ref_logps, mask)
        kl = kl_penalty(logps.float(), ref_logps.float(), "k1")
        rewards = torch.where(m, -beta * kl, rewards)
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
    _check_bt("gae_advantages", rewards, mask)
    _check_bt("gae_advantages", values, mask)
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
    _check_bt("whiten", x, mask)
    xs, m, totals = _masked_totals(x.float(), mask, reduce)
    n = float(totals[1])
    if n < 2:
        raise ValueError(f"whiten: needs at least 2 valid tokens, got {n:g}")
    mean = totals[0] / totals[1]
    centered = torch.where(m, xs - mean, torch.zeros((), device=x.device))
    var = (reduce or _identity)((centered ** 2).sum().reshape(1))[0] / (totals[1] - 1)
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
    _check_bt("clipped_policy_loss", logps, mask)
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
    _check_bt("clipped_value_loss", values, mask)
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
    _check_bt("explained_variance", values, mask)
    reduce = reduce or _identity
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
