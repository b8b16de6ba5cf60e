"""Training stages: SFT (:mod:`hargo.training.sft`) and RL (:mod:`hargo.training.rl`), with the
helpers they share in :mod:`hargo.training.common`."""
