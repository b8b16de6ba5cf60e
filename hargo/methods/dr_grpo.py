"""``dr_grpo``: Dr. GRPO (Liu et al. 2025, "Understanding R1-Zero-Like Training") on TRL 1.16's
own code path: advantage ``r - mean`` (``scale_rewards="none"``), TRL's ``loss_type="dr_grpo"``
normalisation, the k3 KL term (coefficient ``rl.dr_grpo.beta``)."""
from __future__ import annotations

from hargo.method_config import GRPOParams
from hargo.methods import Method, register_method

DR_GRPO = register_method(Method(
    name="dr_grpo", label="Dr.GRPO", description="Dr. GRPO (TRL's loss)", family="grpo_family",
    rank=20, estimator="dr_grpo", loss="trl", policy_loss="clipped_surrogate", kl="k3",
    trl_settings={"loss_type": "dr_grpo", "scale_rewards": "none"}, params_class=GRPOParams))
