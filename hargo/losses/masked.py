"""Masked means over ``(B, T)`` tensors: :func:`masked_mean` (per response) and
:func:`masked_token_mean` (one scalar over all valid tokens, optionally summed over processes).
Every masked mean in :mod:`hargo.losses` is one of these two."""
from __future__ import annotations

from collections.abc import Callable

import torch

__all__ = ["Reduce", "no_reduce", "check_bt", "masked_totals", "masked_mean", "masked_token_mean"]

#: Sums a statistics tensor over processes (e.g. ``lambda t: accelerator.reduce(t, "sum")``), so
#: several processes get the statistics of the whole batch; None stands for one process.
Reduce = Callable[[torch.Tensor], torch.Tensor]


def no_reduce(t: torch.Tensor) -> torch.Tensor:
    """The :data:`Reduce` of a single process: ``t`` unchanged."""
    return t


def check_bt(name: str, x: torch.Tensor, mask: torch.Tensor) -> None:
    """Check that ``x`` and ``mask`` are (B, T) tensors of one shape.

    Raises:
        ValueError: naming ``name`` and both shapes.
    """
    if x.dim() != 2 or x.shape != mask.shape:
        raise ValueError(f"{name}: expected (B, T) tensors of one shape, got {tuple(x.shape)} and "
                         f"mask {tuple(mask.shape)}")


def _acc_dtype(x: torch.Tensor) -> torch.dtype:
    """Accumulation dtype: float64 stays float64, everything else (bf16, fp16, fp32) is float32."""
    return torch.float64 if x.dtype == torch.float64 else torch.float32


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


def masked_totals(x: torch.Tensor, mask: torch.Tensor, reduce: Reduce | None
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(x with padding zeroed, bool mask, reduce([sum of x, token count]))`` in ``_acc_dtype``."""
    dtype = _acc_dtype(x)
    m = mask.to(torch.bool)
    xs = torch.where(m, x.to(dtype), torch.zeros((), dtype=dtype, device=x.device))
    totals = (reduce or no_reduce)(torch.stack([xs.sum(), m.sum().to(dtype)]))
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
    check_bt("masked_token_mean", x, mask)
    _, _, totals = masked_totals(x, mask, reduce)
    return totals[0] / totals[1].clamp(min=1.0)
