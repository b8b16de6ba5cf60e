"""Stage ``rl``: RL post-training from the SFT model with one method, on TRL 1.16's GRPO trainer.

``run(params, method)`` (called by ``hargo rl --method M`` and the Prefect flow):

1. validates params and method, reads ``data/prepared/train.jsonl`` and draws
   ``rl.samples_per_task`` prompts per task (prompts over :func:`prompt_cap` tokens --
   ``rl.max_prompt_tokens``, one cap or one per task, or ``train.max_prompt_tokens`` when that
   is absent or null -- are skipped and counted, never truncated, since a cut kernel may lose
   its race; ``hargo.data.records.select_subset``). RL pads every prompt of a step to the
   longest one, so this cap bounds the cost of a step; a per-task cap keeps the longer Fortran
   kernels in the mix without letting every task's prompts grow;
2. builds :class:`hargo.training.grpo.HargoGRPOTrainer` on the SFT model (``sft.out_dir``, also
   the frozen reference model) with the task rewards (``hargo.rewards.TaskReward``) through
   TRL's ``reward_funcs``; LoRA (``rl.lora``) or full fine-tuning;
3. trains ``rl.steps`` steps of ``rl.prompts_per_step`` prompts x ``rl.num_generations``
   completions, checkpointing (weights/adapter, optimizer, scheduler, RNG, EMA baseline, step
   history) every ``rl.save_steps`` steps into ``checkpoints/rl/<method>/``. Re-running after an
   interruption resumes from the last complete checkpoint, provided the run's inputs (params
   that shape training, SFT model, train data) are unchanged; otherwise the stale checkpoints are
   removed and training starts over. A resumed run ends where the uninterrupted one would have
   (prompt order -- also past an epoch boundary, :mod:`hargo.training.sampling` --, RNG,
   optimizer, EMA baseline, PPO's value head; ``tests/test_rl.py`` resumes every method after
   each checkpoint of a run);
4. writes ``models/rl/<method>/`` (adapter rounded to ``rl.lora.adapter_dtype``, then merged,
   and kept in ``adapter/`` for the registry; whole or not at all) and
   ``metrics/rl/<method>.json`` (final reward statistics, per-task share of zero-variance
   groups, the learning signals -- loss, grad_norm, adv_logprob, adv_log_ratio, kl --, steps,
   wall time and its split, the prompts skipped per task and the caps), and
   logs per-step per-task metrics, completion tables and plots to the MLflow child run
   ``rl-<method>`` (see ``hargo.training.rl_logging``).

Several processes (``accelerate launch --num_processes N -m hargo.cli rl --method M``, or
torchrun): every process trains; ``rl.prompts_per_step * rl.num_generations`` stays the *global*
batch of a step (each process holds ``1/N`` of it, which must divide evenly), so a step means the
same on 1 process or N. Only the main process prepares the checkpoint folder (the others wait,
then read it), opens the MLflow run, merges and saves the model (after all processes finished
training), writes the metrics file and prints; see :mod:`hargo.training.launch`.

Rollouts are sampled by TRL's own transformers generation, with ``rl.generation_backend:
vllm`` by TRL's colocated vLLM engine (``use_vllm=True, vllm_mode="colocate"``), or with
``vllm-server`` by a vLLM server started apart (``use_vllm=True, vllm_mode="server"`` at
``rl.vllm_server``'s host and port; ``hargo vllm-serve`` serves the SFT model). In server mode
only the sampling moves: the reference log-probs, the EMA baseline and HARGO's weights are
computed here, in the trainer processes, from the completions the server returns
(:mod:`hargo.training.vllm_rollout`).
"""
from __future__ import annotations

import contextlib
import math
import os
import tempfile
import time
from pathlib import Path
from typing import Mapping

from hargo.config import Config
from hargo.generation_budget import budget_record, describe_budget, max_budget
from hargo.io import HargoInputError, atomic_write_json
from hargo.methods import get_method
# the run's settings, re-exported here where the stage and its callers import them
from hargo.training.rl_config import (VLLM_GPU_MEMORY_UTILIZATION, _check_method,
                                      _check_vllm_usable, _hargo_config, _plain, _task_reward,
                                      build_grpo_config, check_generation_backend,
                                      dynamic_sampling_config, load_rl_records, prompt_cap,
                                      prompt_cap_name, to_dataset, vllm_max_len)

__all__ = ["run", "prompt_cap", "prompt_cap_name", "build_grpo_config", "vllm_max_len",
           "load_rl_records", "to_dataset", "build_trainer", "dynamic_sampling_config", "CHECKPOINT_ROOT", "METRICS_ROOT"]

#: ``checkpoints/rl/<method>`` (the stage's own resume state, not a dvc.yaml output) and
#: ``metrics/rl/<method>.json`` (a dvc.yaml output).
CHECKPOINT_ROOT = Path("checkpoints") / "rl"
METRICS_ROOT = Path("metrics") / "rl"
#: Completions-table rows logged per table.
TABLE_ROWS = 32


def build_trainer(params: Config, method: str, model_dir: str | os.PathLike,
                  records: list[dict],
                  output_dir: str | os.PathLike, recorder=None, callbacks=(), tokenizer=None,
                  reward_funcs=None, trainer_kwargs: Mapping | None = None, **config_overrides):
    """A ready :class:`~hargo.training.grpo.HargoGRPOTrainer` for ``method`` on ``records``
    (the trainer of the method's family, :mod:`hargo.methods`: ``grpo_family`` that class,
    ``value`` -- ``ppo`` -- its subclass :class:`~hargo.training.ppo.HargoPPOTrainer`, with the
    method's ``rl.<method>`` knobs, :class:`hargo.method_config.PPOParams`).

    ``model_dir``: a complete model folder (the SFT model), loaded in float32 as the policy;
    with ``rl.lora.enabled`` a fresh LoRA adapter is trained and the reference model is the
    folder's weights with the adapter switched off. ``reward_funcs`` defaults to
    ``[TaskReward(RewardConfig)]`` of the ``rewards`` section. ``trainer_kwargs`` go to the
    trainer (e.g. TRL's ``rollout_func``); ``config_overrides`` to :func:`build_grpo_config`.

    ``params``: the typed config, :class:`hargo.config.Config` (the synthetic test bed's too:
    :func:`hargo.compare.synthetic.stage_params`).

    Raises:
        ParamsError: unknown method (names the registered ones).
        hargo.training.vllm_rollout.UnsupportedVLLMError: a vLLM backend that cannot run
            here (:func:`build_grpo_config`).
    """
    from hargo.training.vllm_rollout import import_trl_for

    cfg = params
    rl = cfg.rl
    import_trl_for(rl.generation_backend)   # without vLLM when it is not used
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    from hargo.models.loading import load_model, load_tokenizer
    from hargo.training.common import lora_config
    from hargo.training.divergence import DivergenceBounds, DivergenceGuard
    from hargo.training.grpo import HargoGRPOTrainer

    if tokenizer is None:
        tokenizer = load_tokenizer(model_dir)
    tokenizer.padding_side = "left"
    if reward_funcs is None:
        reward_funcs = [_task_reward(cfg)]
    trainer_cls, extra = HargoGRPOTrainer, {"dynamic_sampling": rl.dynamic_sampling,
                                            "aggregation": getattr(rl.method(method),
                                                                   "aggregation", "response_mean")}
    if isinstance(rl.max_new_tokens, Mapping):   # per-task completion budgets
        trainer_kwargs = {"task_budgets": _plain(rl.max_new_tokens),
                          **dict(trainer_kwargs or {})}
    if _check_method(method).family == "value":   # the family decides the trainer
        from hargo.training.ppo import HargoPPOTrainer

        trainer_cls, extra = HargoPPOTrainer, {"ppo_config": rl.method(method)}
    args = build_grpo_config(cfg, method, output_dir, **config_overrides)
    if args.use_vllm:
        _check_vllm_usable(rl.generation_backend)
    model = load_model(model_dir, dtype="float32",
                       trust_remote_code=bool(cfg.model.trust_remote_code))
    trainer = trainer_cls(
        model=model, reward_funcs=reward_funcs, args=args, train_dataset=to_dataset(records),
        processing_class=tokenizer, peft_config=lora_config(rl.lora), callbacks=list(callbacks),
        method=method, hargo_config=_hargo_config(cfg, method), recorder=recorder,
        **extra, **dict(trainer_kwargs or {}))
    trainer.add_callback(DivergenceGuard(DivergenceBounds.of(cfg.train.divergence),
                                         f"rl ({method})"))
    # One concise line per step comes from RLLoggingCallback; drop transformers' dict printer.
    trainer.remove_callback(PrinterCallback)
    trainer.remove_callback(ProgressCallback)
    return trainer


def _describe_dynamic_sampling(cfg) -> str:
    if cfg is None or not cfg.enabled:
        return "off"
    return f"on (refill x{cfg.refill_factor:g}, up to {cfg.max_refills} rounds)"


def run(params: Config, method: str, root: str | os.PathLike = ".", *,
        records: list[dict] | None = None, run_name: str | None = None,
        out_dir: str | os.PathLike | None = None, ckpt_dir: str | os.PathLike | None = None,
        metrics_path: str | os.PathLike | None = None, keep_history: bool = False) -> dict:
    """Run the ``rl`` stage for ``method``; returns the summary written to
    ``metrics/rl/<method>.json`` (on every process; only the main one writes and logs it).

    The comparison (:mod:`hargo.compare.train`) calls it with its own ``records`` (the prompts,
    already selected), ``run_name`` (the MLflow child run and log prefix, default ``method``),
    ``out_dir``/``ckpt_dir``/``metrics_path`` (default ``rl.out_dir/<method>``,
    ``checkpoints/rl/<method>``, ``metrics/rl/<method>.json``) and ``keep_history=True`` (the
    per-step per-task history goes into the metrics file, for the report's curves).

    ``params``: the typed config (:func:`hargo.config.load_config`).

    Raises:
        ParamsError: unknown method (before any work).
        FileNotFoundError: the SFT model folder is missing or incomplete.
        HargoInputError: bad or too few train records.
        RuntimeError: ``generation_backend: vllm`` or ``vllm-server`` where vLLM cannot run.
    """
    t_start = time.perf_counter()
    _check_method(method)
    cfg = params
    check_generation_backend(cfg)    # before the checkpoint folder is touched
    from hargo.hardware import setup_torch
    from hargo.models.loading import load_tokenizer, resolve_model_dir
    from hargo.training.launch import launch_state

    root = Path(root)
    model_dir = resolve_model_dir(root / cfg.sft.out_dir)
    data_path = root / cfg.data.out_dir / "train.jsonl"
    name = run_name or method
    out_dir = Path(out_dir) if out_dir is not None else root / cfg.rl.out_dir / method
    ckpt_dir = Path(ckpt_dir) if ckpt_dir is not None else root / CHECKPOINT_ROOT / method
    metrics_path = Path(metrics_path) if metrics_path is not None \
        else root / METRICS_ROOT / f"{method}.json"
    setup_torch(cfg)
    tok = load_tokenizer(model_dir)
    records, skipped, cap = _rl_prompts(cfg, tok, model_dir, data_path, records)
    launch = launch_state()
    trainer, recorder, resume, load_s = _trainer_and_checkpoint(
        cfg, method, name, root, model_dir, data_path, records, tok, ckpt_dir, launch)
    times = {"t_start": t_start, "load_s": load_s}   # train_s, save_s added by the run
    result = _train_and_record(cfg, method, name, run_name, root, trainer, recorder, resume,
                               launch, records, skipped, cap, tok, model_dir, out_dir,
                               metrics_path, keep_history, times)
    if not launch.is_main:
        return result
    print(f"[rl {name}] done: {result['steps']} steps, {times['train_s']:.1f}s training, "
          f"model -> {out_dir}", flush=True)
    return result


def _rl_prompts(cfg: Config, tok, model_dir: Path, data_path: Path,
                records: list[dict] | None) -> tuple[list[dict], dict, "int | dict[str, int]"]:
    """The run's prompts (``records``, or ``rl.samples_per_task`` per task of the train split
    within the prompt cap), the prompts skipped as too long per task, and the cap; checks that
    a step's prompts are there and that prompt + completion fit the policy's context.

    Raises:
        HargoInputError: bad or too few train records.
        ValueError: the longest prompt + completion budget exceed the model's context (names the
            knob to lower).
    """
    from hargo.data.records import prompt_tokens, select_subset
    from hargo.models.loading import check_context, context_length

    rl = cfg.rl
    cap = prompt_cap(cfg)
    if records is None:
        records, skipped = select_subset(load_rl_records(data_path), rl.samples_per_task,
                                         int(cfg.seed), tok, cap)
    else:
        skipped = {}
    if len(records) < int(rl.prompts_per_step):
        raise HargoInputError(data_path, f"only {len(records)} prompts left for RL after skipping "
                              f"{sum(skipped.values())} over {describe_budget(cap)} "
                              f"prompt tokens; "
                              f"rl.prompts_per_step needs {rl.prompts_per_step}")
    # prompt + completion must fit the policy's context; the error names the knob to lower
    # (with a cap per task: the cap of the longest prompt's task)
    lengths = [prompt_tokens(tok, r["prompt"]) for r in records]
    longest = lengths.index(max(lengths))             # the first of the longest
    n_tokens = lengths[longest]
    cap_name = prompt_cap_name(cfg) + (f".{records[longest]['task']}"
                                          if isinstance(cap, dict) else "")
    check_context(context_length(model_dir), n_tokens, max_budget(_plain(rl.max_new_tokens)),
                  cap_name, "rl.max_new_tokens")
    return records, skipped, cap


def _trainer_and_checkpoint(cfg: Config, method: str, name: str, root: Path, model_dir: Path,
                            data_path: Path, records: list[dict], tok, ckpt_dir: Path, launch):
    """The trainer with its recorder and logging callback, and the checkpoint to resume from
    (None: start over; the main process prepares the folder, the others then read it).
    Returns ``(trainer, recorder, resume, load_s)``."""
    from hargo import tracking
    from hargo.training.checkpoints import (prepare_checkpoint_dir, resumable_checkpoint,
                                            run_fingerprint)
    from hargo.training.rl_logging import RLLoggingCallback, StepRecorder

    fingerprint = run_fingerprint(cfg, method, model_dir, data_path)
    if launch.is_main:
        # an unusable MLflow store or experiment fails here, before the checkpoint folder (an
        # output) changes
        tracking.setup(cfg, root)
    recorder = StepRecorder(max_table_rows=TABLE_ROWS)
    callback = RLLoggingCallback(recorder, name, int(cfg.rl.log_completions_steps or 0))
    # The trainer is built before the checkpoint folder is prepared (which clears a finished or
    # stale run): what PEFT, TRL and the trainer refuse (a target module the model lacks, a
    # batch that does not split over the processes...) then fails with the checkpoints intact.
    t0 = time.perf_counter()
    trainer = build_trainer(cfg, method, model_dir, records, ckpt_dir, recorder=recorder,
                            callbacks=[callback], tokenizer=tok,
                            world_size=launch.num_processes)
    load_s = time.perf_counter() - t0
    if launch.is_main:
        resume = prepare_checkpoint_dir(ckpt_dir, fingerprint)
    launch.wait_for_everyone()    # the others read the folder the main process prepared
    if not launch.is_main:
        resume = resumable_checkpoint(ckpt_dir, fingerprint)
    return trainer, recorder, resume, load_s


def _train_and_record(cfg: Config, method: str, name: str, run_name: str | None, root: Path,
                      trainer, recorder, resume, launch, records: list[dict], skipped: dict, cap,
                      tok, model_dir: Path, out_dir: Path, metrics_path: Path,
                      keep_history: bool, times: dict) -> dict:
    """Inside the stage's MLflow run (main process): train (resuming at ``resume``), save the
    merged model, then build the run's summary and, on the main process, write and log it."""
    import mlflow

    from hargo import tracking
    from hargo.training.checkpoints import checkpoint_step

    stage = tracking.stage_run("rl" if run_name is None else "compare", cfg, root=root,
                               extra_tags={"hargo.method": method,
                                           **({"hargo.run": run_name} if run_name else {})},
                               run_name=None if run_name is None else f"compare-{run_name}") \
        if launch.is_main else contextlib.nullcontext()
    with stage:
        if launch.is_main:
            mlflow.log_params({"rl.method": method, "rl.prompts_used": len(records)})
            tracking.log_split("train", "training", cfg, root)
        resumed_step = checkpoint_step(resume) if resume is not None else 0
        if launch.is_main:
            _announce(cfg, method, name, trainer, launch, records, skipped, resume, resumed_step)
        t0 = time.perf_counter()
        trainer.train(resume_from_checkpoint=str(resume) if resume is not None else None)
        times["train_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        _save_model(cfg, trainer, tok, model_dir, out_dir, launch)
        times["save_s"] = time.perf_counter() - t0
        result = _result(cfg, method, trainer, recorder, records, skipped, cap, resume,
                         resumed_step, times)
        if keep_history:
            result["history"] = recorder.history
        if launch.is_main:
            _log_result(result, recorder, metrics_path, name, times["train_s"])
    return result


def _announce(cfg: Config, method: str, name: str, trainer, launch, records: list[dict],
              skipped: dict, resume, resumed_step: int) -> None:
    """The stage's first console line: prompts, steps, batch, backend, budgets, dynamic
    sampling, processes, the step it resumes at."""
    rl = cfg.rl
    print(f"[rl {name}] {len(records)} prompts ({dict(skipped)} skipped as too long), "
          f"{rl.steps} steps x {rl.prompts_per_step} prompts x "
          f"G={rl.num_generations}, backend {rl.generation_backend}, "
          f"new tokens {describe_budget(_plain(rl.max_new_tokens))}, "
          f"bf16 {trainer.args.bf16}, dynamic sampling "
          + (_describe_dynamic_sampling(getattr(trainer, "dynamic_sampling", None))
             if get_method(method).family == "grpo_family"
             else "off (GRPO family only)")
          + (f", {launch.num_processes} processes" if launch.num_processes > 1 else "")
          + (f", resuming at step {resumed_step}" if resume else ""), flush=True)


def _save_model(cfg: Config, trainer, tok, model_dir: Path, out_dir: Path, launch) -> None:
    """``models/rl/<method>/`` from the trained policy, after every process finished training
    (main process only: atomic_dir's rename would race between processes); the LoRA adapter is
    kept beside the merged weights (the registry stores it)."""
    from hargo.models.loading import save_merged

    if launch.num_processes > 1:
        trainer.accelerator.wait_for_everyone()
    if launch.is_main:
        from hargo.training.divergence import DivergenceBounds, training_record

        save_merged(trainer.accelerator.unwrap_model(trainer.model), tok, out_dir,
                    dtype=cfg.model.dtype, adapter_base=model_dir,
                    adapter_dtype=cfg.rl.lora.adapter_dtype,
                    training_record=training_record(trainer.state.log_history,
                                                    DivergenceBounds.of(cfg.train.divergence)))


def _result(cfg: Config, method: str, trainer, recorder, records: list[dict], skipped: dict, cap,
            resume, resumed_step: int, times: dict) -> dict:
    """The run's summary (``metrics/rl/<method>.json``, module docstring step 4)."""
    from hargo.training.rl_logging import summarize_history

    rl = cfg.rl
    summary = summarize_history(recorder.history)
    train_s = times["train_s"]
    steps_run = int(trainer.state.global_step) - resumed_step
    return {
        "method": method, "steps": int(trainer.state.global_step),
        "max_steps": int(rl.steps),
        "resumed_from_step": resumed_step if resume is not None else None,
        "steps_this_run": steps_run, "prompts": len(records), "skipped_prompts": skipped,
        "max_prompt_tokens": budget_record(cap),
        "completions_per_step": int(rl.prompts_per_step) * int(rl.num_generations),
        "generation_backend": rl.generation_backend, "bf16": bool(trainer.args.bf16),
        "lora": bool(rl.lora.enabled),
        "ema_baseline": trainer.ema.value,
        "rewards": summary.get("rewards", {}),
        "zero_variance_groups": summary.get("zero_variance_groups", {}),
        **({"dynamic_sampling": summary["dynamic_sampling"]}
           if "dynamic_sampling" in summary else {}),
        "learning": summary.get("learning", {}),
        "time": {"total_s": round(time.perf_counter() - times["t_start"], 3),
                 "load_s": round(times["load_s"], 3), "train_s": round(train_s, 3),
                 "save_s": round(times["save_s"], 3),
                 "s_per_step": round(train_s / steps_run, 3) if steps_run else None,
                 "steps_split_s": {k: round(v, 3) for k, v in summary.get("time", {}).items()}},
    }


def _log_result(result: dict, recorder, metrics_path: Path, name: str, train_s: float) -> None:
    """Write the summary to ``metrics_path`` and log it, the history's plots, the history and
    the final reward means to the active MLflow run (main process)."""
    import mlflow

    from hargo.training.rl_logging import plot_history

    atomic_write_json(metrics_path, result)
    with tempfile.TemporaryDirectory() as tmp:
        for p in plot_history(recorder.history, tmp, title=name):
            mlflow.log_artifact(str(p), artifact_path="plots")
    mlflow.log_dict(recorder.state_dict(), "rl_history.json")
    mlflow.log_artifact(str(metrics_path))
    final = {f"final/{scope}_reward_mean": float(v["final_reward_mean"])
             for scope, v in result["rewards"].items()
             if v.get("final_reward_mean") is not None
             and not math.isnan(float(v["final_reward_mean"]))}
    final.update({"time/total_s": result["time"]["total_s"], "time/train_s": train_s})
    mlflow.log_metrics(final)
