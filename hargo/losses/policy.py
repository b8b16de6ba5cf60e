"""Policy losses: the token-level importance ratio, the clipped surrogate (registered in
``POLICY_LOSSES``) and the clip fractions TRL logs."""
from __future__ import annotations

from collections.abc import Callable

import torch

from hargo.losses._registry import lookup, register

__all__ = ["importance_ratio", "clipped_surrogate", "clip_fraction",
           "POLICY_LOSSES", "register_policy_loss", "policy_loss"]

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
