"""How hargo's RL methods map onto TRL 1.16's ``GRPOTrainer`` options: the ``GRPOConfig`` loss
fields a method sets (:func:`trl_loss_settings`, from the method's own
:attr:`hargo.methods.Method.trl_settings`), and the TRL options hargo's own losses do not
implement (:func:`unsupported_trl_options`, checked when a trainer is built)."""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trl import GRPOTrainer

from hargo.methods import RL_FAMILIES, get_method

__all__ = ["trl_loss_settings", "unsupported_trl_options"]


def trl_loss_settings(method: str) -> dict[str, str]:
    """The ``GRPOConfig`` fields that select a method's loss in TRL 1.16.

    :data:`hargo.methods.base.DEFAULT_TRL_SETTINGS` (``loss_type="grpo"``,
    ``scale_rewards="group"``) updated by the method's own
    :attr:`~hargo.methods.Method.trl_settings`. hargo computes every RL method's advantages and
    loss (the GRPO family's one loss, PPO's), so these only shape what TRL logs.

    Raises:
        ValueError: not a registered RL method (the message lists them).
    """
    from hargo.methods.base import DEFAULT_TRL_SETTINGS

    return {**DEFAULT_TRL_SETTINGS, **get_method(method, *RL_FAMILIES).trl_settings}


def unsupported_trl_options(trainer: GRPOTrainer) -> list[str]:
    """TRL 1.16 options, set on a built ``trainer``, that hargo's own losses (the weighted HARGO
    loss, PPO's) do not implement, as readable names; empty when the config is supported."""
    a = trainer.args
    problems = []
    if a.importance_sampling_level != "token":
        problems.append(f"importance_sampling_level={a.importance_sampling_level!r} "
                        "(need 'token')")
    if trainer.off_policy_mask_threshold is not None:
        problems.append("off_policy_mask_threshold")
    if trainer.top_entropy_quantile < 1.0:
        problems.append("top_entropy_quantile < 1")
    if a.entropy_coef != 0.0 or a.use_adaptive_entropy:   # TRL 1.16's entropy bonus is on
        problems.append("entropy bonus (entropy_coef / use_adaptive_entropy)")
    if trainer.aux_loss_enabled:
        problems.append("MoE router aux loss")
    if trainer.multi_objective_aggregation != "sum_then_normalize":
        problems.append(f"multi_objective_aggregation={trainer.multi_objective_aggregation!r}")
    return problems
