"""hargo's vocabulary: the tasks and the methods, defined once.

Everything that lists tasks or methods (params validation, the CLI's help, the trainers, the
metrics, the report, the DVC stage matrix) imports them from here.

Tasks (the four HPC-GPT fine-tuning files):

``race_c``, ``race_fortran``
    yes/no data-race detection on C and Fortran kernels (the *race tasks*: a 0/1 reward).
``mlperf``
    short facts about MLPerf benchmarks (tiered partial credit).
``plp``
    sentence-length answers about programming-language processing (embedding similarity).

Methods, by family (the family decides which trainer runs a method):

``grpo_family``
    online RL on TRL's GRPO machinery with per-response weights: ``grpo`` and ``dr_grpo``
    (TRL's own losses, uniform 1/G weights) and ``hargo``, ``hargo_b1``, ``hargo_b2`` (HARGO
    and its ablations; ``hargo.advantages``).
``value``
    ``ppo``: online RL with a learned value head (``hargo.training.ppo``).
``preference``
    ``dpo``, ``kto``, ``simpo``: offline, on ranked pairs (TRL's preference trainers).
``sft``
    ``hpcgpt``: the HPC-GPT LoRA SFT recipe (a baseline of the comparison).
"""
from __future__ import annotations

__all__ = ["TASKS", "RACE_TASKS", "TASK_DESCRIPTIONS", "STOCK_GRPO_METHODS", "HARGO_METHODS",
           "GRPO_FAMILY", "VALUE_METHODS", "RL_METHODS", "PREFERENCE_METHODS", "SFT_BASELINES",
           "COMPARE_METHODS", "METHOD_DESCRIPTIONS", "family", "is_race"]

TASKS: tuple[str, ...] = ("race_c", "race_fortran", "mlperf", "plp")
RACE_TASKS: tuple[str, ...] = ("race_c", "race_fortran")
TASK_DESCRIPTIONS: dict[str, str] = {
    "race_c": "data race yes/no, C kernels",
    "race_fortran": "data race yes/no, Fortran kernels",
    "mlperf": "MLPerf facts, short answers",
    "plp": "programming-language processing, sentence-length answers",
}

#: TRL's own GRPO losses, uniform 1/G response weights.
STOCK_GRPO_METHODS: tuple[str, ...] = ("grpo", "dr_grpo")
#: Per-response weighted loss (docs/method.md).
HARGO_METHODS: tuple[str, ...] = ("hargo", "hargo_b1", "hargo_b2")
GRPO_FAMILY: tuple[str, ...] = STOCK_GRPO_METHODS + HARGO_METHODS
#: Online RL with a learned value head.
VALUE_METHODS: tuple[str, ...] = ("ppo",)
#: Every online RL method: an ``rl@<method>`` stage can run any of them.
RL_METHODS: tuple[str, ...] = GRPO_FAMILY + VALUE_METHODS
PREFERENCE_METHODS: tuple[str, ...] = ("dpo", "kto", "simpo")
SFT_BASELINES: tuple[str, ...] = ("hpcgpt",)
#: Every method of the comparison (``compare.methods``).
COMPARE_METHODS: tuple[str, ...] = RL_METHODS + PREFERENCE_METHODS + SFT_BASELINES

METHOD_DESCRIPTIONS: dict[str, str] = {
    "grpo": "GRPO (TRL's loss)",
    "dr_grpo": "Dr. GRPO (TRL's loss)",
    "hargo": "HARGO: discrimination x confidence response weights",
    "hargo_b1": "HARGO ablation B1: discrimination only",
    "hargo_b2": "HARGO ablation B2: confidence only",
    "ppo": "PPO with a value head, GAE, KL in the reward",
    "dpo": "DPO on ranked SFT pairs (TRL)",
    "kto": "KTO on ranked SFT pairs (TRL)",
    "simpo": "SimPO on ranked SFT pairs (TRL CPO, loss_type=simpo)",
    "hpcgpt": "the HPC-GPT LoRA SFT recipe on the base model",
}


def family(method: str) -> str:
    """``"grpo_family"``, ``"value"``, ``"preference"`` or ``"sft"``.

    Raises:
        ValueError: not a known method (the message lists them).
    """
    for name, members in (("grpo_family", GRPO_FAMILY), ("value", VALUE_METHODS),
                          ("preference", PREFERENCE_METHODS), ("sft", SFT_BASELINES)):
        if method in members:
            return name
    raise ValueError(f"unknown method {method!r}; valid: {', '.join(COMPARE_METHODS)}")


def is_race(task: str) -> bool:
    """Whether ``task`` is a yes/no race task."""
    return task in RACE_TASKS
