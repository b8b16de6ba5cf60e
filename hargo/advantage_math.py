"""The pure tensor pieces of the group advantages and weights (docs/method.md steps 1-5), with
no estimator, config or registry around them: :mod:`hargo.advantages` composes them into the
estimators and re-exports each of them.

Shapes: rewards, advantages, log-probs and weights are ``(N, G)`` (``N`` groups of ``G``
responses, group-major); the maths runs and returns in float64 (``group_rewards`` only
reshapes).
"""
from __future__ import annotations

import torch

__all__ = ["STD_SCOPES", "group_rewards", "group_advantage", "confidence",
           "discrimination_weights", "batch_normalised_weights"]

#: Over what the std is taken (:class:`hargo.advantages.HargoConfig` ``std_scope``).
STD_SCOPES: tuple[str, ...] = ("group", "batch")


def group_rewards(flat: torch.Tensor, G: int) -> torch.Tensor:
    """Reshape rewards ``(B,)`` in group-major order (TRL's order: the G completions of a prompt
    are consecutive) to ``(B // G, G)``.

    Raises ValueError when ``flat`` is not 1-D, ``G < 1`` or ``B % G != 0``.
    """
    if flat.dim() != 1:
        raise ValueError(f"group_rewards: expected a 1-D tensor, got shape {tuple(flat.shape)}")
    if int(G) < 1:
        raise ValueError(f"group_rewards: G must be >= 1, got {G}")
    B = flat.shape[0]
    if B % G != 0:
        raise ValueError(f"group_rewards: {B} rewards do not split into groups of G={G} "
                         f"({B} % {G} = {B % G})")
    return flat.reshape(B // G, G)


def group_advantage(rewards: torch.Tensor, eps: float = 1e-6, unbiased: bool = False,
                    scale: bool = True, scope: str = "group") -> torch.Tensor:
    """Group-normalised advantage, docs/method.md step 1: ``A = (r - mean(r)) / (std(r) + eps)``.

    Args:
        rewards: (N, G), any float dtype; computed in float64.
        eps: added to the std.
        unbiased: False (default): population std (divide by G), as docs/method.md's worked example;
            True: sample std (divide by G - 1), as TRL.
        scale: False: return ``r - mean`` only (Dr. GRPO).
        scope: ``"group"``: each group's own std; ``"batch"``: one std over all ``N * G`` rewards
            (the centring stays per group; TRL 1.16 ``scale_rewards="batch"``, Dr. GRPO sec. 3).

    Returns:
        (N, G) float64. A group whose rewards are all equal gives exactly 0.

    Raises:
        ValueError: an unknown ``scope``.
    """
    if scope not in STD_SCOPES:
        raise ValueError(f"group_advantage: scope must be one of {', '.join(STD_SCOPES)}, got "
                         f"{scope!r}")
    r = rewards.to(torch.float64)
    centred = r - r.mean(dim=1, keepdim=True)
    # Equal rewards: force exact zeros (no rounding residue can turn into fake contrast).
    flat_group = (r.amax(dim=1, keepdim=True) == r.amin(dim=1, keepdim=True))
    centred = torch.where(flat_group, torch.zeros_like(centred), centred)
    if not scale:
        return centred
    correction = 1 if unbiased else 0
    if scope == "batch":
        std = r.reshape(-1).std(correction=correction) if r.numel() > correction \
            else r.new_zeros(())
    else:
        std = r.std(dim=1, keepdim=True, correction=correction)
    return centred / (std + eps)


def confidence(ref_logprob: torch.Tensor, g: float) -> torch.Tensor:
    """Reference-model confidence, docs/method.md step 2: ``c = sigmoid(l - g)``.

    Args:
        ref_logprob: (N, G) length-normalised sequence log-probs ``l`` (nats per token).
        g: the EMA baseline.

    Returns:
        (N, G) float64 in [0, 1].
    """
    return torch.sigmoid(ref_logprob.to(torch.float64) - float(g))


def discrimination_weights(modulated: torch.Tensor, eps: float = 1e-6, eps_w: float = 1e-6
                           ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """docs/method.md steps 4-5: ``d = |M| / (max_j |M_j| + eps)``, ``w = d / sum_j d_j``.

    Args:
        modulated: (N, G) modulated advantages ``M``.
        eps: added to ``max |M|``.
        eps_w: a group with ``sum d < eps_w`` (no contrast) gets ``w = 1/G``.

    Returns:
        ``(d, w, no_contrast)``: d and w (N, G) float64, no_contrast (N, 1) bool.
    """
    m = modulated.to(torch.float64).abs()
    d = m / (m.amax(dim=1, keepdim=True) + eps)
    s = d.sum(dim=1, keepdim=True)
    no_contrast = s < eps_w
    G = d.shape[1]
    w = torch.where(no_contrast, torch.full_like(d, 1.0 / G), d / torch.where(no_contrast, 1.0, s))
    return d, w, no_contrast


def batch_normalised_weights(d: torch.Tensor, eps_w: float = 1e-6) -> torch.Tensor:
    """Weights normalised over the whole batch instead of per group (hargo's own variants,
    docs/method.md "Variants that move weight between tasks"): ``w_ni = N d_ni / sum_mj d_mj``.

    The total weight stays ``N`` (one per group on average, as per-group weights), but a group's
    share is now its ``sum_i d_ni``: a group with more contrast weighs more, an all-equal group
    (``d = 0``) drops out. When the whole batch has ``sum d < eps_w``: ``1/G`` everywhere.

    Args:
        d: (N, G) non-negative discrimination values.
        eps_w: the no-contrast threshold of the batch's ``sum d``.

    Returns:
        (N, G) float64, summing to ``N``.
    """
    d = d.to(torch.float64)
    N, G = d.shape
    total = d.sum()
    if not total >= eps_w:
        return torch.full_like(d, 1.0 / G)
    return N * d / total
