"""Loss aggregation: the ``AGGREGATIONS`` registry (``response_mean``, ``token_mean``),
:func:`aggregate`, and :func:`weighted_loss`, HARGO's per-response weighted form."""
from __future__ import annotations

from collections.abc import Callable

import torch

from hargo.losses._registry import lookup, register
from hargo.losses.masked import masked_mean, masked_token_mean

__all__ = ["AGGREGATIONS", "register_aggregation", "aggregate", "weighted_loss"]

#: name -> ``f(per_token_loss (B, T), mask (B, T)) -> scalar``.
AGGREGATIONS: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {}


def register_aggregation(name: str):
    """Decorator registering ``f(per_token_loss, mask) -> scalar`` under ``name`` in
    ``AGGREGATIONS``. Raises ValueError when the name is taken."""
    return register(AGGREGATIONS, "aggregation", name)


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
    return lookup(AGGREGATIONS, "aggregation", mode)(per_token_loss, mask)


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
