"""``dr_grpo``: Dr. GRPO (Liu et al. 2025, "Understanding R1-Zero-Like Training") on hargo's one
GRPO-family loss: advantage ``r - mean`` (``rl.dr_grpo.std: none``), uniform ``1/G`` weights, the
k3 KL term (``rl.dr_grpo.beta``), and the constant ``completions x max_completion_length``
denominator (``constant_length``, TRL 1.16's ``loss_type="dr_grpo"``). Its loss and gradients
equal TRL 1.16's own (tests/test_loss_path.py)."""
from __future__ import annotations

from hargo.method_config import DrGRPOParams
from hargo.methods import Method, register_method

DR_GRPO = register_method(Method(
    name="dr_grpo", label="Dr.GRPO", description="Dr. GRPO (no std, constant denominator)",
    family="grpo_family", rank=20, estimator="dr_grpo", loss="weighted",
    policy_loss="clipped_surrogate", kl="k3", params_class=DrGRPOParams))
