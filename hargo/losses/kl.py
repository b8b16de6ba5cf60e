"""KL estimators of ``KL(pi_theta || pi_ref)`` from sampled tokens' log-probs (``k1``, ``k2``,
``k3``, registered in ``KL_ESTIMATORS``) and :func:`kl_penalty`."""
from __future__ import annotations

from collections.abc import Callable

import torch

from hargo.losses._registry import lookup, register

__all__ = ["KL_ESTIMATORS", "register_kl", "kl_penalty"]

#: name -> ``f(logps, ref_logps) -> (B, T) per-token estimate of KL(pi_theta || pi_ref)``.
KL_ESTIMATORS: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {}


def register_kl(name: str):
    """Decorator registering ``f(logps, ref_logps) -> per-token KL estimate`` under ``name`` in
    ``KL_ESTIMATORS``. Raises ValueError when the name is taken."""
    return register(KL_ESTIMATORS, "KL estimator", name)


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
    fn = lookup(KL_ESTIMATORS, "KL estimator", kind)
    if logps.shape != ref_logps.shape:
        raise ValueError(f"kl_penalty: logps {tuple(logps.shape)} and ref_logps "
                         f"{tuple(ref_logps.shape)} differ")
    return fn(logps, ref_logps)
