"""The settings of one RL run (stage ``rl``, :mod:`hargo.training.rl`): TRL's ``GRPOConfig`` from
params.yaml, the prompt caps, the rollout backend's checks, the prepared train split as a
dataset, and the method's estimator constants and task reward.

Everything here reads the typed config (:class:`hargo.config.Config`; a caller holding a params
mapping converts it once, :func:`hargo.config.as_config`) and builds values; no model is loaded.
:mod:`hargo.training.rl` re-exports the public names.
"""
from __future__ import annotations

import dataclasses
import os
from typing import Any, Mapping

from hargo.config import Config, ParamsError
from hargo.data.records import read_prepared
from hargo.generation_budget import max_budget
from hargo.methods import RL_FAMILIES, get_method

__all__ = ["prompt_cap", "prompt_cap_name", "build_grpo_config", "vllm_max_len",
           "load_rl_records", "to_dataset", "dynamic_sampling_config",
           "check_generation_backend", "VLLM_GPU_MEMORY_UTILIZATION"]

#: GPU share of TRL's colocated vLLM engine (GPU only; on CPU the KV cache is
#: ``VLLM_CPU_KVCACHE_SPACE`` GiB, default 1 here).
VLLM_GPU_MEMORY_UTILIZATION = 0.3


def _hargo_config(cfg: Config, method: str):
    """The estimator constants of a GRPO-family method (``rl.<method>``); PPO: the defaults
    (its advantages are GAE's)."""
    from hargo.advantages import HargoConfig

    return HargoConfig.of(cfg.rl.method(method), get_method(method).estimator)


def _check_method(method: str):
    """The registered RL method ``method`` (:mod:`hargo.methods`). Raises ParamsError naming
    the valid ones."""
    try:
        return get_method(method, *RL_FAMILIES)
    except ParamsError as e:
        raise ParamsError(f"rl method: {e}") from None


def prompt_cap(params: Config) -> int | dict[str, int]:
    """Longest prompt RL trains on, in chat-templated tokens: ``rl.max_prompt_tokens`` when set
    (one int, or a plain dict task -> int, checked by the typed config), else
    ``train.max_prompt_tokens``. :func:`hargo.generation_budget.max_budget` gives the longest.

    ``params``: the typed config (:class:`hargo.config.Config`). Raises nothing: the config
    was checked when it was built."""
    cap = params.rl.max_prompt_tokens
    return int(params.train.max_prompt_tokens) if cap is None else _plain(cap)


def prompt_cap_name(params: Config) -> str:
    """The params.yaml name of :func:`prompt_cap`'s value (the one a user should change) for
    the typed config ``params``."""
    return "rl.max_prompt_tokens" if params.rl.max_prompt_tokens is not None \
        else "train.max_prompt_tokens"


def _plain(budget):
    """A budget of the typed config (an int or a read-only task map) as the int or plain dict
    :mod:`hargo.generation_budget` and the run records take."""
    return dict(budget) if isinstance(budget, Mapping) else int(budget)


def load_rl_records(path: str | os.PathLike) -> list[dict]:
    """The prepared train split, checked (:func:`hargo.data.records.read_prepared`).

    Raises:
        HargoInputError: missing file or a bad record (names file, record, field).
    """
    return read_prepared(path)


def to_dataset(records: list[dict]):
    """A ``datasets.Dataset`` with TRL's ``prompt`` column plus ``task``, ``answer``, ``label``
    (forwarded by TRL to the reward function as keyword lists)."""
    from datasets import Dataset

    return Dataset.from_list([{"prompt": r["prompt"], "task": r["task"], "answer": r["answer"],
                               "label": r.get("label")} for r in records])


def build_grpo_config(params: Config, method: str, output_dir: str | os.PathLike,
                      world_size: int = 1, **overrides):
    """The ``trl.GRPOConfig`` of one RL run from params.yaml (``params``: the typed config,
    :class:`hargo.config.Config`; ``output_dir``: the checkpoint folder; ``world_size``: the
    number of training processes).

    Mapping: ``num_generations=G``, ``per_device_train_batch_size = prompts_per_step * G /
    world_size`` (TRL counts completions), ``max_completion_length`` = the largest of
    ``max_new_tokens`` (an int, or per task: the trainer cuts each completion at its task's),
    ``epsilon=clip_range``, ``max_steps=steps``, ``beta`` = the method's KL coefficient
    (``rl.<method>.beta``, PPO's ``rl.ppo.kl_coef``), ``temperature``, ``learning_rate``
    (constant schedule), device and precision from :func:`hargo.hardware.trainer_precision_kwargs`,
    ``gradient_checkpointing`` (``train``), checkpoints every ``save_steps``. The loss settings
    come from :func:`hargo.training.trl_options.trl_loss_settings`. The rollout backend
    (``rl.generation_backend``): ``vllm`` adds TRL's colocated engine (``use_vllm=True,
    vllm_mode="colocate"``); ``vllm-server`` adds ``use_vllm=True, vllm_mode="server"``,
    ``vllm_server_base_url``/``host``/``port``/``timeout`` from ``rl.vllm_server``
    (:func:`hargo.training.vllm_rollout.server_config_kwargs`). ``overrides`` replace any field.

    Raises:
        ParamsError: unknown method, or prompts_per_step * G not divisible by ``world_size``.
        UnsupportedVLLMError: a vLLM backend that cannot run here (checked before any model
            loads; the message names what is missing, :mod:`hargo.training.vllm_rollout`).
    """
    from trl import GRPOConfig

    from hargo.hardware import trainer_precision_kwargs
    from hargo.training.trl_options import trl_loss_settings

    _check_method(method)
    cfg = params
    rl = cfg.rl
    G = int(rl.num_generations)
    completions = int(rl.prompts_per_step) * G
    if completions % world_size:
        raise ParamsError(f"rl.prompts_per_step: {rl.prompts_per_step} prompts x G={G} "
                          f"completions do not split over {world_size} processes")
    kw: dict[str, Any] = dict(
        output_dir=str(output_dir), seed=int(cfg.seed),
        **trainer_precision_kwargs(cfg),
        gradient_checkpointing=bool(cfg.train.gradient_checkpointing),
        per_device_train_batch_size=completions // world_size, gradient_accumulation_steps=1,
        num_generations=G, max_completion_length=max_budget(_plain(rl.max_new_tokens)),
        temperature=float(rl.temperature), beta=float(rl.method(method).kl_coef),
        epsilon=float(rl.clip_range), learning_rate=float(rl.learning_rate),
        lr_scheduler_type="constant", warmup_steps=0, max_steps=int(rl.steps),
        num_iterations=1, shuffle_dataset=True, disable_dropout=True,
        logging_steps=1, report_to="none", disable_tqdm=True, log_completions=False,
        logging_nan_inf_filter=False,      # the divergence guard must see a NaN loss
        save_strategy="steps", save_steps=int(rl.save_steps), save_total_limit=2,
        save_only_model=False, dataloader_num_workers=0, remove_unused_columns=False,
        **trl_loss_settings(method),
    )
    check_generation_backend(cfg)   # TRL's vLLM range, not vLLM's CPU build, CUDA for a server
    if rl.generation_backend == "vllm":
        kw.update(use_vllm=True, vllm_mode="colocate", vllm_max_model_length=vllm_max_len(cfg),
                  vllm_gpu_memory_utilization=VLLM_GPU_MEMORY_UTILIZATION,
                  vllm_enable_sleep_mode=False)
    elif rl.generation_backend == "vllm-server":
        from hargo.training.vllm_rollout import server_config_kwargs

        kw.update(server_config_kwargs(dataclasses.asdict(rl.vllm_server)))
    kw.update(overrides)
    return GRPOConfig(**kw)


def check_generation_backend(params: Config) -> None:
    """Refuse ``rl.generation_backend`` where it cannot run here (the colocated or the server
    vLLM rollout, :mod:`hargo.training.vllm_rollout`), before a stage touches anything: called
    by the ``rl`` and ``compare-train`` stages before their checkpoint folder is prepared (a
    backend change does not match a resumable checkpoint's fingerprint, which would otherwise be
    cleared first).

    ``params``: the typed config.

    Raises:
        hargo.training.vllm_rollout.UnsupportedVLLMError: the reason (names what is missing).
    """
    from hargo.training import vllm_rollout

    backend = params.rl.generation_backend
    if backend == "vllm":
        vllm_rollout.check_colocated_vllm()
    elif backend == "vllm-server":
        vllm_rollout.check_server_vllm()


def vllm_max_len(params: Config) -> int:
    """The longest sequence a vLLM rollout engine must hold: the longest prompt
    (:func:`prompt_cap`) + the largest completion budget + 8 (colocated engine's
    ``vllm_max_model_length``; the server's ``--max-model-len`` in ``hargo vllm-serve``), in
    tokens. ``params``: the typed config (:class:`hargo.config.Config`).

    Raises:
        ParamsError: a per-task budget map that leaves out a task without a default budget
            (names the key, :func:`hargo.generation_budget.max_budget`)."""
    # a per-task prompt-cap map's longest includes the task defaults of tasks it does not name
    return (max_budget(prompt_cap(params), prompt_cap_name(params))
            + max_budget(_plain(params.rl.max_new_tokens)) + 8)


def _check_vllm_usable(backend: str = "vllm") -> None:
    """Fail early, with the reason, when TRL's vLLM rollout (``backend``) cannot run here."""
    from trl.import_utils import is_vllm_available

    if not is_vllm_available():
        raise RuntimeError(f"rl.generation_backend is '{backend}' but vLLM is not importable in "
                           "this environment (install the cpu or gpu extra); use 'transformers'")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")       # GiB (stack.md: default ~21 GiB)
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # in-process engine


def dynamic_sampling_config(params: Config):
    """``rl.dynamic_sampling`` of the typed config, a :class:`hargo.config.DynamicSampling`
    (= :class:`hargo.training.dynamic_sampling.DynamicSamplingConfig`; missing: off). PPO
    ignores it (its value head learns from zero-variance groups too); the GRPO-family methods
    apply it."""
    return params.rl.dynamic_sampling


def _task_reward(cfg: Config):
    """:class:`hargo.rewards.TaskReward` of the typed ``rewards`` section."""
    from hargo.rewards import RewardConfig, TaskReward

    return TaskReward(RewardConfig.from_params(cfg.rewards))
