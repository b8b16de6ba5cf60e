"""Loss math of every RL method in hargo, as pure torch functions (no trainer inside).

The trainers (:mod:`hargo.training.grpo`, :mod:`hargo.training.ppo`) only wire these together;
each formula is written once, here. Layout after verl's ``verl/trainer/ppo/core_algos.py``:
policy losses, KL estimators and loss aggregations are registered by name. One module
per concern, the sections below in order: :mod:`~hargo.losses.masked`,
:mod:`~hargo.losses.aggregation`, :mod:`~hargo.losses.policy`, :mod:`~hargo.losses.kl`,
:mod:`~hargo.losses.ppo`; import the names from ``hargo.losses`` itself.

Conventions: ``B`` responses (completions) of at most ``T`` tokens, laid out ``(B, T)`` and
right-padded; ``mask`` is ``(B, T)``, nonzero/True on the tokens that count (padding 0). Unless a
docstring says otherwise, a function computes in its inputs' dtype, as TRL 1.16 does.

Masked means
    :func:`masked_mean` (per response, ``(B, T) -> (B,)``) and :func:`masked_token_mean` (one
    scalar over all valid tokens, optionally summed over processes). Every masked mean in the
    package is one of these two.
Aggregation (``AGGREGATIONS``, :func:`register_aggregation`, :func:`group_weighted_aggregate`)
    the one loss of every GRPO-family method: per-response weights ``w_i`` times the per-token
    loss, reduced by ``response_mean`` (TRL's ``loss_type="grpo"``: mean over a response's own
    tokens, then over responses), ``token_mean`` (DAPO / TRL's ``dapo``, ``bnpo``: mean over all
    valid tokens) or ``constant_length`` (Dr. GRPO: a constant ``B * T_max`` denominator);
    :func:`aggregate` is the unweighted form, :func:`weighted_loss` docs/method.md step 6.
Policy losses (``POLICY_LOSSES``, :func:`register_policy_loss`, :func:`policy_loss`)
    ``clipped_surrogate`` (:func:`clipped_surrogate`: PPO's / TRL 1.16 GRPO's clipped objective)
    and :func:`clip_fraction` (the clip indicators TRL logs); :func:`advantage_weighted_logprob`
    (the surrogate's gradient-carrying part as a value, a diagnostic).
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

from hargo.losses.aggregation import (AGGREGATIONS, aggregate, group_weighted_aggregate,
                                      register_aggregation, weighted_loss)
from hargo.losses.kl import KL_ESTIMATORS, kl_penalty, register_kl
from hargo.losses.masked import Reduce, masked_mean, masked_token_mean
from hargo.losses.policy import (POLICY_LOSSES, advantage_weighted_logprob, clip_fraction,
                                 clipped_surrogate, importance_ratio, policy_loss,
                                 register_policy_loss)
from hargo.losses.ppo import (WHITEN_EPS, clipped_policy_loss, clipped_value_loss,
                              explained_variance, gae_advantages, token_rewards, whiten)

__all__ = [
    "Reduce",
    "masked_mean", "masked_token_mean",
    "AGGREGATIONS", "register_aggregation", "aggregate", "group_weighted_aggregate",
    "weighted_loss",
    "importance_ratio", "clipped_surrogate", "clip_fraction", "advantage_weighted_logprob",
    "POLICY_LOSSES", "register_policy_loss", "policy_loss",
    "KL_ESTIMATORS", "register_kl", "kl_penalty",
    "WHITEN_EPS", "token_rewards", "gae_advantages", "whiten", "clipped_policy_loss",
    "clipped_value_loss", "explained_variance",
]
