"""What the synthetic test bed (:mod:`hargo.compare.synthetic`) feeds its trainers: the typed
config of a stage (:func:`stage_params`), the RL prompt pool (:func:`rl_prompts`), the SFT
examples with their hedges (:func:`sft_records`), and a run's training reward and per-step task
quota (:func:`train_reward`, :func:`prompt_quota`). No torch at import."""
from __future__ import annotations

from typing import Mapping, Sequence

from hargo.compare.synthetic_plan import SyntheticPlan
from hargo.config import CHARS_PER_TOKEN_BOUND, Config, to_plain
from hargo.data.synthetic import SYNTHETIC_TASKS, SyntheticConfig

__all__ = ["stage_params", "rl_prompts", "sft_records", "train_reward", "prompt_quota"]


def stage_params(params: Config, p: SyntheticPlan, seed: int) -> Config:
    """The typed config (:class:`hargo.config.Config` of the synthetic tasks:
    ``Config.from_params(..., synthetic=True)``) for :func:`hargo.training.sft.train` and
    :func:`hargo.training.rl.build_trainer` on the tiny policy: ``params`` (the main typed
    config, :meth:`~hargo.config.Config.with_values`) with ``seed``, full
    fine-tuning (no LoRA: the policy is tiny), fp32 weights (with the main pipeline's
    ``train.bf16`` autocast where the hardware has native bf16, so results depend on the CPU:
    the report names it), no gradient checkpointing, transformers generation, dynamic sampling
    as ``synthetic.rl.dynamic_sampling`` says (default off; the main ``rl.dynamic_sampling``
    never reaches the bed), and ``synthetic.sft`` / ``synthetic.rl`` in place of ``sft`` /
    ``rl``'s shared keys. Each method's own knobs (``rl.<method>``: ``beta``, ``alpha``,
    ``rho``, the std convention ``std`` / ``std_eps`` / ``std_scope`` and ``aggregation``) and
    ``rl.clip_range`` stay the main pipeline's.

    Its per-task maps name the synthetic tasks, not the HPC-GPT ones: ``rl.max_new_tokens`` and
    ``evaluate.max_new_tokens`` are ``synthetic.rl`` / ``synthetic.evaluate``'s, no raw-file
    bounds (``validate.task_counts`` empty), ``rl.max_prompt_tokens`` null (the test bed
    selects no prompts by length: ``train.max_prompt_tokens``), ``rewards.answer.max_chars``
    :data:`hargo.config.CHARS_PER_TOKEN_BOUND` times a task's largest budget (the test bed's
    rewards are :class:`hargo.data.synthetic.SyntheticReward`, which do not read it), and no
    ``compare`` section (the test bed runs no comparison).

    ``p``: the plan (:func:`hargo.compare.synthetic_plan.plan` of ``params``); ``seed``: the
    run's seed.

    Raises:
        ParamsError: the derived config refuses a value (named by its dotted key)."""
    rl = p.rl
    rl_budgets = {t: n for t, n in rl.max_new_tokens.items()}
    eval_budgets = {t: n for t, n in p.evaluate.max_new_tokens.items()}
    return params.with_values({
        "seed": int(seed), "model.dtype": "float32", "model.trust_remote_code": False,
        "train.gradient_checkpointing": False,
        "sft.samples_per_task": None, "sft.max_steps": -1, "sft.grad_accum": 1,
        "sft.epochs": p.sft.epochs, "sft.learning_rate": p.sft.learning_rate,
        "sft.batch_size": p.sft.batch_size, "sft.max_length": p.sft.max_length,
        "sft.lora.enabled": False,
        "rl.steps": rl.steps, "rl.prompts_per_step": rl.prompts_per_step,
        "rl.num_generations": rl.num_generations,
        "rl.max_new_tokens": rl_budgets, "rl.max_prompt_tokens": None,
        "rl.temperature": rl.temperature, "rl.learning_rate": rl.learning_rate,
        "rl.lora.enabled": False, "rl.generation_backend": "transformers",
        "rl.dynamic_sampling": to_plain(rl.dynamic_sampling),
        "rl.save_steps": rl.steps + 1, "rl.log_completions_steps": 0,
        "validate.task_counts": {},
        "evaluate.max_new_tokens": eval_budgets,
        "rewards.answer.max_chars": {
            t: CHARS_PER_TOKEN_BOUND * max(rl_budgets.get(t, 1), eval_budgets.get(t, 1))
            for t in SYNTHETIC_TASKS},
        "compare": None}, synthetic=True)


def rl_prompts(train: Sequence[Mapping], p: SyntheticPlan, seed: int) -> list[dict]:
    """The RL prompt pool of one seed: ``synthetic.rl.prompts_per_task[t]`` train records of
    each task ``t``, drawn without replacement with ``seed`` (in task order, then drawn order)
    from the records SFT did not see (``synthetic.rl.pool: held_out``: those past
    ``synthetic.sft.examples_per_task[t]``) or from all of them (``all``)."""
    import random

    out = []
    for t in SYNTHETIC_TASKS:
        recs = [dict(r) for r in train if r["task"] == t]
        if p.rl.pool == "held_out":
            recs = recs[p.sft.examples_per_task[t]:]
        rng = random.Random(f"hargo.synthetic.rl:{seed}:{t}")
        out += rng.sample(recs, p.rl.prompts_per_task[t])
    return out


def sft_records(train: Sequence[Mapping], p: SyntheticPlan) -> list[dict]:
    """The SFT examples: the first ``synthetic.sft.examples_per_task[t]`` train records of each
    task ``t`` (in split order), ``round(hedge_share * n)`` of them (drawn per task, the same
    for every seed of RL) with their answer replaced by :func:`hargo.data.synthetic.hedge` in
    ``synthetic.sft.hedge_style``.
    The tokenizer is still trained on the whole train split; RL and evaluation score against
    the true answers."""
    import random

    from hargo.data.synthetic import hedge

    out = []
    for t in SYNTHETIC_TASKS:
        recs = [dict(r) for r in train if r["task"] == t][:p.sft.examples_per_task[t]]
        rng = random.Random(f"hargo.synthetic.hedge:{t}")
        k = round(p.sft.hedge_share * len(recs))
        for i in sorted(rng.sample(range(len(recs)), k)):
            recs[i]["answer"] = hedge(t, recs[i]["answer"], rng, p.sft.hedge_style)
        out += recs
    return out


def train_reward(config: SyntheticConfig, seed: int):
    """The reward function an RL run of seed ``seed`` trains on in reward configuration
    ``config``: :class:`hargo.data.synthetic.SyntheticReward`, plus each task's seeded Gaussian
    noise when ``synthetic.data.noise_*`` asks for it (:mod:`hargo.data.synthetic_noise`)."""
    from hargo.data.synthetic_noise import reward_function

    return reward_function(config, seed)


def prompt_quota(p: SyntheticPlan) -> dict[str, int] | None:
    """``synthetic.rl.prompts_per_step_per_task`` as the trainer's ``prompt_quota`` (task ->
    prompts of that task in every step), or None (a step draws from the pool's mix)."""
    q = p.rl.prompts_per_step_per_task
    return None if q is None else {t: int(q[t]) for t in SYNTHETIC_TASKS}
