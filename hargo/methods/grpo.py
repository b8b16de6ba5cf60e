"""``grpo``: GRPO (Shao et al. 2024, DeepSeekMath) on hargo's one GRPO-family loss: the group
advantage ``(r - mean) / (std + 1e-4)`` with the sample std (TRL 1.16's), uniform ``1/G``
response weights, the clipped surrogate plus ``rl.grpo.beta`` x the k3 KL, each completion's
token mean then the mean (``response_mean``, TRL's ``loss_type="grpo"``). Its loss and every
parameter's gradient equal TRL 1.16's own (tests/test_loss_path.py)."""
from __future__ import annotations

from hargo.method_config import GRPOParams
from hargo.methods import Method, register_method

GRPO = register_method(Method(
    name="grpo", label="GRPO", description="GRPO (uniform 1/G weights, sample std)",
    family="grpo_family", rank=10, estimator="grpo", loss="weighted",
    policy_loss="clipped_surrogate", kl="k3", params_class=GRPOParams))
