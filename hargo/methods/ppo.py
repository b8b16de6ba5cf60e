"""``ppo``: classic PPO with a learned value head, GAE and the k1 KL penalty in every token's
reward (coefficient ``rl.ppo.kl_coef``), run by ``hargo.training.ppo.HargoPPOTrainer`` on TRL
1.16's GRPO machinery (TRL's ``loss_type="grpo"``/``scale_rewards="group"`` only shape what TRL
logs; the advantages and the loss are PPO's)."""
from __future__ import annotations

from hargo.method_config import PPOParams
from hargo.methods import Method, register_method

PPO = register_method(Method(
    name="ppo", label="PPO", description="PPO with a value head, GAE, KL in the reward",
    family="value", rank=40, loss="ppo", kl="k1",
    trl_settings={"loss_type": "grpo", "scale_rewards": "group"}, params_class=PPOParams))
