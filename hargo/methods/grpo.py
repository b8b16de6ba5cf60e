"""``grpo``: GRPO (Shao et al. 2024, DeepSeekMath) on TRL 1.16's own code path: TRL's group
advantage ``(r - mean) / (std + 1e-4)`` with the sample std, uniform 1/G response weights, TRL's
``loss_type="grpo"`` loss with the k3 KL term (coefficient ``rl.grpo.beta``)."""
from __future__ import annotations

from hargo.method_config import GRPOParams
from hargo.methods import Method, register_method

GRPO = register_method(Method(
    name="grpo", label="GRPO", description="GRPO (TRL's loss)", family="grpo_family", rank=10,
    estimator="grpo", loss="trl", policy_loss="clipped_surrogate", kl="k3",
    trl_settings={"loss_type": "grpo", "scale_rewards": "group"}, params_class=GRPOParams))
