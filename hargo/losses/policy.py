"""Policy losses: the token-level importance ratio, the clipped surrogate (registered in
``POLICY_LOSSES``) and the clip fractions TRL logs."""
from __future__ import annotations

from collections.abc import Callable

import torch

from hargo.losses._registry import lookup, register
from hargo.losses.masked import masked_mean

__all__ = ["importance_ratio", "clipped_surrogate", "clip_fraction",
           "advantage_weighted_logprob", "POLICY_LOSSES", "register_policy_loss", "policy_loss"]

#: name -> ``f(logps, old_logps, advantages, eps_low, eps_high, **kw) -> (per_token_loss, ratio)``.
POLICY_LOSSES: dict[str, Callable[..., tuple[torch.Tensor, torch.Tensor]]] = {}


def register_policy_loss(name: str):
    """Decorator registering a policy loss ``f(logps, old_logps, advantages, eps_low, eps_high,
    **kw) -> (per_token_loss, ratio)`` under ``name`` in ``POLICY_LOSSES`` (verl's
    ``register_policy_loss``). Raises ValueError when the name is taken."""
    return register(POLICY_LOSSES, "policy loss", name)


def policy_loss(name: str) -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
    """The registered policy loss ``name``. Raises ValueError for an unknown name (lists the
    valid ones)."""
    return lookup(POLICY_LOSSES, "policy loss", name)


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
        :func:`~hargo.losses.masked.masked_mean` / :func:`~hargo.losses.masked.masked_token_mean`).

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


def advantage_weighted_logprob(logps: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
                               weights: torch.Tensor | None = None, group_size: int = 1
                               ) -> torch.Tensor:
    """Per response, ``G w_i (1/|y_i|) sum_t A_{i,t} logps_{i,t}``: the part of the clipped
    surrogate that carries its gradient, as a value (a diagnostic; no grad is kept).

    With one optimisation pass per rollout (TRL's ``num_iterations = 1``) the ratio
    ``r_t = exp(logps - old_logps)`` is 1 in value and nothing is clipped, so the surrogate's value
    is ``-(1/N) sum_i w_i A_i`` -- exactly 0 for GRPO (uniform ``w = 1/G``, group advantages of
    mean 0) -- while its gradient is ``-(1/N) sum_i w_i (1/|y_i|) sum_t A_i grad log pi(y_t)``
    (``grad r_t = r_t grad log pi = grad log pi`` at ``r = 1``): minus the gradient of the mean over
    the ``N G`` responses of this function's values (``docs/method.md``, "The loss"). Its value moves
    as the policy shifts probability towards the responses with positive advantage.

    Pass ``logps - ref_logps`` as ``logps`` for the advantage-weighted log-ratio to the reference
    model (0 while the policy equals the reference).

    Args:
        logps: (B, T) per-token log-probs (policy, or policy minus reference), nats.
        advantages: (B,), (B, 1) or (B, T) (PPO's per-token advantages).
        mask: (B, T) the tokens that count.
        weights: (B,) per-response loss weights ``w_i`` (each group's sum to 1); None: ``1/G``.
        group_size: ``G``; ``G w_i`` is 1 under uniform weights.

    Returns:
        (B,) float32 (float64 for float64 input), detached.

    Raises:
        ValueError: shapes that do not match, ``group_size < 1``.
    """
    if group_size < 1:
        raise ValueError(f"advantage_weighted_logprob: group_size must be >= 1, got {group_size}")
    logps = logps.detach()
    adv = _advantages_bt(advantages.detach(), logps.size(0), logps.size(1),
                         "advantage_weighted_logprob")
    per_response = masked_mean(adv * logps, mask)
    if weights is None:
        return per_response
    if weights.shape != per_response.shape:
        raise ValueError(f"advantage_weighted_logprob: weights {tuple(weights.shape)} must be "
                         f"({per_response.numel()},)")
    return group_size * weights.detach().to(per_response.dtype) * per_response
