"""Loss aggregation of the GRPO family: per-response weights times a per-token loss, reduced to
the scalar the optimiser sees. One function, :func:`group_weighted_aggregate`, with the modes of
the ``AGGREGATIONS`` registry; every GRPO-family method (GRPO, Dr. GRPO, HARGO and its variants)
trains through it (``hargo.training.grpo``), so two methods differ only in their advantages,
weights and mode.

Every mode scales response ``i``'s tokens by ``G w_i`` (1 under GRPO's uniform ``w = 1/G``; HARGO's
weights of docs/method.md step 6 otherwise), then:

``response_mean``
    ``(1/B) sum_i G w_i mean_t L_it``: each response's mean over its own tokens, then the mean
    over responses (TRL 1.16 ``loss_type="grpo"``, Shao et al. 2024 eq. 3). Equal to
    ``(1/N) sum_i w_i mean_t L_it`` over ``N = B/G`` groups: docs/method.md step 6.
``token_mean``
    ``sum_it G w_i L_it / n_tokens``: every token of the batch counts the same, so a long
    completion pushes more than a short one (DAPO, Yu et al. 2025, eq. 8; TRL 1.16
    ``loss_type="dapo"`` when ``n_tokens`` counts the whole generation batch, ``"bnpo"`` when it
    counts the micro-batch).
``constant_length``
    ``sum_it G w_i L_it / (B * T_max)``: a constant denominator, no length normalisation at all
    (Dr. GRPO, Liu et al. 2025, sec. 3.1; TRL 1.16 ``loss_type="dr_grpo"``).

A registered mode is ``f(per_token_loss, mask, scale, *, max_completion_length, num_tokens)``;
:func:`weighted_loss` is the ``response_mean`` mode written as docs/method.md step 6.
"""
from __future__ import annotations

from collections.abc import Callable

import torch

from hargo.losses._registry import lookup, register
from hargo.losses.masked import _acc_dtype, check_bt, masked_mean

__all__ = ["AGGREGATIONS", "register_aggregation", "aggregate", "group_weighted_aggregate",
           "weighted_loss"]

#: name -> ``f(per_token_loss (B, T), mask (B, T), scale (B,), *, max_completion_length,
#: num_tokens) -> scalar``; ``scale`` is ``G w_i`` per response.
AGGREGATIONS: dict[str, Callable[..., torch.Tensor]] = {}


def register_aggregation(name: str):
    """Decorator registering an aggregation mode ``f(per_token_loss, mask, scale, *,
    max_completion_length, num_tokens) -> scalar`` under ``name`` in ``AGGREGATIONS``.
    Raises ValueError when the name is taken."""
    return register(AGGREGATIONS, "aggregation", name)


def _masked_sum(per_token_loss: torch.Tensor, mask: torch.Tensor, scale: torch.Tensor
                ) -> torch.Tensor:
    """``sum_it scale_i L_it`` over the mask, in the accumulation dtype."""
    dtype = _acc_dtype(per_token_loss)
    m = mask.to(torch.bool)
    x = torch.where(m, per_token_loss.to(dtype), torch.zeros((), dtype=dtype,
                                                             device=per_token_loss.device))
    return (scale.to(dtype) * x.sum(dim=1)).sum()


@register_aggregation("response_mean")
def _response_mean(per_token_loss, mask, scale, *, max_completion_length=None, num_tokens=None):
    """``(1/B) sum_i scale_i mean_t L_it`` (TRL 1.16 ``loss_type="grpo"`` at ``scale = 1``)."""
    per_response = masked_mean(per_token_loss, mask)
    return (scale.to(per_response.dtype) * per_response).mean()


@register_aggregation("token_mean")
def _token_mean(per_token_loss, mask, scale, *, max_completion_length=None, num_tokens=None):
    """``sum_it scale_i L_it / num_tokens`` (``num_tokens`` None: this batch's valid tokens;
    TRL 1.16 ``dapo``/``bnpo`` at ``scale = 1``)."""
    n = mask.to(torch.bool).sum() if num_tokens is None else num_tokens
    n = torch.as_tensor(n, device=per_token_loss.device).to(_acc_dtype(per_token_loss))
    return _masked_sum(per_token_loss, mask, scale) / n.clamp(min=1.0)


@register_aggregation("constant_length")
def _constant_length(per_token_loss, mask, scale, *, max_completion_length=None,
                     num_tokens=None):
    """``sum_it scale_i L_it / (B * max_completion_length)`` (TRL 1.16 ``dr_grpo`` at
    ``scale = 1``)."""
    if max_completion_length is None or int(max_completion_length) < 1:
        raise ValueError("aggregation constant_length needs max_completion_length >= 1, got "
                         f"{max_completion_length!r}")
    return _masked_sum(per_token_loss, mask, scale) / (per_token_loss.size(0)
                                                       * int(max_completion_length))


def group_weighted_aggregate(per_token_loss: torch.Tensor, mask: torch.Tensor,
                             weights: torch.Tensor, group_size: int, mode: str, *,
                             max_completion_length: int | None = None,
                             num_tokens: "int | torch.Tensor | None" = None) -> torch.Tensor:
    """The GRPO family's loss of one batch: per-response weights, then the ``mode``'s reduction
    (see the module docstring for each formula).

    Args:
        per_token_loss: (B, T) float, the policy loss plus ``beta`` x KL per token (bf16/fp16
            are summed in float32).
        mask: (B, T) the tokens that count (padding 0).
        weights: (B,) per-response weights ``w_i`` (each group's sum to 1 for per-group weights;
            ``1/G`` reproduces the unweighted loss exactly).
        group_size: ``G`` >= 1.
        mode: a key of :data:`AGGREGATIONS`: ``response_mean``, ``token_mean``,
            ``constant_length``.
        max_completion_length: ``T_max`` of ``constant_length`` (TRL's
            ``max_completion_length``).
        num_tokens: the token count ``token_mean`` divides by (None: ``mask.sum()``).

    Returns:
        0-d float32 tensor (float64 for float64 input), differentiable w.r.t. ``per_token_loss``.

    Raises:
        ValueError: unknown mode (lists the valid ones), ``weights`` not (B,), ``group_size < 1``,
            ``per_token_loss``/``mask`` shapes disagree, ``constant_length`` without
            ``max_completion_length``.
    """
    check_bt("group_weighted_aggregate", per_token_loss, mask)
    fn = lookup(AGGREGATIONS, "aggregation", mode)
    if weights.dim() != 1 or weights.shape[0] != per_token_loss.shape[0]:
        raise ValueError(f"group_weighted_aggregate: weights {tuple(weights.shape)} must be (B,) "
                         f"with B={per_token_loss.shape[0]}")
    if int(group_size) < 1:
        raise ValueError(f"group_weighted_aggregate: group_size must be >= 1, got {group_size}")
    scale = weights * int(group_size)
    return fn(per_token_loss, mask, scale, max_completion_length=max_completion_length,
              num_tokens=num_tokens)


def aggregate(per_token_loss: torch.Tensor, mask: torch.Tensor, mode: str, **kwargs
              ) -> torch.Tensor:
    """The unweighted ``mode`` reduction of a (B, T) per-token loss (every ``w_i = 1/G``), e.g.
    PPO's ``token_mean``. ``kwargs``: ``max_completion_length``, ``num_tokens``.

    Returns:
        0-d float32 tensor (float64 for float64 input), differentiable.

    Raises:
        ValueError: as :func:`group_weighted_aggregate`.
    """
    check_bt("aggregate", per_token_loss, mask)
    ones = torch.ones(per_token_loss.shape[0], dtype=per_token_loss.dtype,
                      device=per_token_loss.device)
    return group_weighted_aggregate(per_token_loss, mask, ones, 1, mode, **kwargs)


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
