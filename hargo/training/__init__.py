"""Training stages: SFT (:mod:`hargo.training.sft`), online RL (:mod:`hargo.training.rl`, the
trainers in :mod:`~hargo.training.grpo` and :mod:`~hargo.training.ppo`), the preference trainers
(:mod:`hargo.training.preference_trainers`); LoRA settings in :mod:`hargo.training.common`. Model loading
is :mod:`hargo.models.loading`, device and precision :mod:`hargo.hardware`, the loss math
:mod:`hargo.losses` and :mod:`hargo.advantages`."""
