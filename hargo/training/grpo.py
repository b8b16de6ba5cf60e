"""``HargoGRPOTrainer``: TRL's ``GRPOTrainer`` extended for the HARGO family of RL methods.

This module only wires hargo's math (``docs/method.md``) into TRL's trainer. The math lives
elsewhere, as pure functions: group advantages and per-response weights in
:mod:`hargo.advantages`; the clipped surrogate, the KL estimators, the clip fractions, the
masked means and the weighted loss in :mod:`hargo.losses`. Pinned to **TRL 1.16.0**
(``pyproject.toml``: ``trl==1.16.0``). The private ``GRPOTrainer`` methods hargo overrides
all sit in :class:`hargo.training.trl_overrides.GRPOOverrides` (first among the bases), each
calling this trainer's own step; :mod:`hargo.training.trl_seam` declares them with why no
public API serves and the signature written against, and the trainer checks it when built.
Re-run ``tests/test_rl.py`` and ``tests/test_loss_path.py`` before moving the pin.
The steps:

rollout
    :meth:`~HargoGRPOTrainer.timed_rollout`, :meth:`~HargoGRPOTrainer.rollout_budgets`
    (transformers sampling under the policy forward's bf16 autocast, up to the batch's largest
    task budget through :attr:`~HargoGRPOTrainer.generation_config`; each completion cut at
    its task's budget), :meth:`~HargoGRPOTrainer.keep_gathered_rewards` (all processes').
scoring
    :meth:`HargoGRPOTrainer.score_training_batch`: TRL's scored batch (with dynamic sampling,
    :mod:`hargo.training.grpo_batches`), then the method's group statistics over the *whole
    gathered batch*, re-sliced to this process (see below), the per-task diagnostics, and two
    per-response tensors, ``response_weights`` and ``task_ids``, that TRL's shuffle/split of
    the generation batch carries along. TRL's own reference pass is skipped where hargo runs
    its own (:meth:`~HargoGRPOTrainer.skips_trl_reference_pass`).
loss, exact resume
    :class:`hargo.training.grpo_loss.GroupWeightedLossMixin` (transformers' public
    ``compute_loss``), :class:`hargo.training.resume.ResumeMixin`.

Methods: the trainer asks the method's :class:`hargo.methods.Method` (``family="grpo_family"``)
what to do -- its advantage ``estimator``, whether it ``needs_reference``, its ``policy_loss``
and ``kl`` estimator (looked up by name in :mod:`hargo.advantages` and :mod:`hargo.losses`) --
and its params block for the std convention (``std``, ``std_eps``, ``std_scope``: the
estimator's :class:`~hargo.advantages.HargoConfig`) and the ``aggregation``. Nothing branches
on method names: two methods differ only in what they declare. Today's methods:

``grpo``, ``dr_grpo``
    uniform ``1/G`` weights; GRPO's sample std + 1e-4 and ``response_mean``, Dr. GRPO's no std
    and ``constant_length``: with these, loss and gradients equal TRL 1.16's own
    ``loss_type="grpo"`` / ``"dr_grpo"`` (tests/test_loss_path.py).
``uniform_sample``, ``uniform_pop``
    the uniform-weight controls on HARGO's estimator path, at GRPO's and HARGO's std convention.
``hargo``, ``hargo_b1``, ``hargo_b2``, ``hargo_batch``, ``hargo_contrast``
    ``docs/method.md``. The group statistics -- rewards, the reference model's length-normalised
    log-prob ``l_i`` of each response and the EMA baseline ``g`` -- are computed over the whole
    batch gathered from all processes *before* it is split per process, so that 1 process and N
    processes give the same weights even when TRL places one prompt's group across processes.
    ``l_i`` is the frozen SFT model's own log-prob (temperature 1; computed even when
    ``beta = 0``); the same reference pass gives the log-probs at the sampling temperature that
    the KL term uses, as TRL computes them (``HargoGRPOTrainer._reference_logps``, over
    :mod:`hargo.training.reference`; TRL's own reference pass is skipped for the methods that
    need the reference). The weight multiplies the whole per-response term (the policy loss
    and the KL estimator). Supported TRL options on this path:
    token-level importance sampling, TRL's clipping (``epsilon``, ``epsilon_high``, ``delta``),
    ``use_bias_correction_kl``, the vLLM importance-sampling correction; anything else raises
    ``ValueError`` at construction.
``ppo``
    classic PPO with a learned value head, in the subclass ``hargo.training.ppo.HargoPPOTrainer``
    (it overrides the two hooks ``_response_advantages`` and ``_method_compute_loss``).

Beside this module: :mod:`hargo.training.trl_options`, :mod:`hargo.training.reference`,
:mod:`hargo.training.task_diagnostics`, :mod:`hargo.training.checkpoints`.
"""
from __future__ import annotations

import contextlib
import copy
import time
from collections import defaultdict
from typing import Any

import torch
from accelerate.utils import gather_object
from trl import GRPOTrainer
from trl.models.utils import disable_gradient_checkpointing

from hargo.advantages import EMABaseline, HargoConfig, estimate, group_rewards
from hargo.losses import masked_mean
from hargo.methods import get_method
from hargo.methods._check import check_method_names
from hargo.training.dynamic_sampling import DynamicSamplingConfig
from hargo.training.grpo_batches import DynamicSamplingMixin, _ScoredBatch
from hargo.training.grpo_loss import GroupWeightedLossMixin
from hargo.training.reference import (build_reference_model, check_temperatures,
                                      is_reference_call, lm_head_scaling, logps_at_temperatures,
                                      reference_lm)
from hargo.training.resume import ResumeMixin
from hargo.training.task_diagnostics import dataset_tasks, task_index
from hargo.training.trl_options import unsupported_trl_options
from hargo.training.trl_overrides import GRPOOverrides

__all__ = ["HargoGRPOTrainer", "TRL_VERSION"]

#: The TRL release whose private methods this module overrides (pyproject pins it exactly).
TRL_VERSION = "1.16.0"


class HargoGRPOTrainer(GRPOOverrides, ResumeMixin, DynamicSamplingMixin, GroupWeightedLossMixin,
                       GRPOTrainer):
    """TRL 1.16 ``GRPOTrainer`` running a method of the ``grpo_family`` (:mod:`hargo.methods`).

    Args:
        *args, **kwargs: as ``trl.GRPOTrainer`` (model, reward_funcs, args, train_dataset,
            processing_class, peft_config, callbacks, ...). ``args.per_device_train_batch_size``
            counts completions (prompts x G).
        method: the name of a registered method of the trainer's :attr:`family` (see the module
            docstring); the trainer reads what to do from it (:attr:`spec`).
        hargo_config: HARGO constants (alpha, rho, eps, eps_w); default ``HargoConfig()``.
        recorder: an object with ``add_generation(**kw)`` and ``add_loss(**kw)`` (see
            ``hargo.training.rl_logging.StepRecorder``) that receives, on every process, the
            gathered per-response values of each step; None: nothing is recorded.
        task_column: dataset column naming each sample's task (for the diagnostics only; the
            weighting never reads it). Samples without it count as task ``"all"``.

    Attributes:
        spec: the method's :class:`hargo.methods.Method`.
        ema: the EMA baseline ``g`` of ``l`` (``hargo.advantages.EMABaseline``); trainer state,
            saved in each checkpoint and restored on resume.
        timing: cumulative seconds spent in rollouts (``generation_s``) and in scoring them
            (``scoring_s``: reference/old log-probs, rewards, advantages) since construction.
        hargo_metrics: per mode, the logging window's values of hargo's metrics (``log``).

    Raises:
        ValueError: not a method of :attr:`family`; a method whose ``needs_reference``
            disagrees with its estimator's (``hargo.advantages.needs_reference``); an unknown
            estimator, policy loss or KL estimator name; a TRL option the HARGO loss does not
            implement.
        RuntimeError: the installed TRL is not the pinned ``TRL_VERSION``.
    """

    #: The method family this class runs (:data:`hargo.methods.FAMILIES`; a subclass with its
    #: own loss names its own).
    family: str = "grpo_family"

    def __init__(self, *args, method: str, hargo_config: HargoConfig | None = None,
                 recorder: Any = None, task_column: str = "task",
                 dynamic_sampling: DynamicSamplingConfig | None = None,
                 task_budgets: dict[str, int] | None = None,
                 aggregation: str = "response_mean", **kwargs):
        spec = get_method(method, self.family)
        self._check_method_names(spec)
        import trl

        if trl.__version__ != TRL_VERSION:
            raise RuntimeError(f"HargoGRPOTrainer overrides private methods of TRL {TRL_VERSION}; "
                               f"TRL {trl.__version__} is installed. Re-check the overrides "
                               "(hargo/training/grpo.py) and tests/test_rl.py before moving "
                               "the pin")
        from hargo.training.trl_seam import check_seam, check_trainer_attributes

        check_seam()     # each overridden private method as written against (readable error)
        self.method = method
        self.spec = spec
        self.hargo_config = hargo_config or HargoConfig()
        self.ema = EMABaseline(self.hargo_config.rho)
        self.recorder = recorder
        self.task_column = task_column
        self.dynamic_sampling = dynamic_sampling or DynamicSamplingConfig()
        self._prompt_rows: dict[str, list[int]] | None = None
        self.task_budgets = dict(task_budgets) if task_budgets else None
        self._row_budgets: list[int] | None = None
        self.timing = {"generation_s": 0.0, "scoring_s": 0.0}
        self._hargo_loss = spec.loss == "weighted"
        self.aggregation = aggregation
        self._needs_ref = spec.needs_reference
        self._capture_logps = False
        self._captured_logps: torch.Tensor | None = None
        self._gathered_rewards_per_func: torch.Tensor | None = None
        self.hargo_metrics = {"train": defaultdict(list), "eval": defaultdict(list)}  # log()
        super().__init__(*args, **kwargs)
        check_trainer_attributes(self)   # TRL's private attributes hargo uses (readable error)
        if self._hargo_loss:
            self._check_weighted_loss_supported()
            from hargo.losses.aggregation import AGGREGATIONS
            from hargo.losses._registry import lookup

            lookup(AGGREGATIONS, "aggregation", aggregation)
        if self.dynamic_sampling.enabled:
            self._check_dynamic_sampling_supported()
        if self._needs_ref and self.ref_model is None and not self._is_peft():
            # TRL builds no reference model when beta == 0; HARGO's confidence still needs one.
            self.ref_model = build_reference_model(self.args, self.model, self.temperature,
                                                   self.accelerator)
        self.task_names: list[str] = dataset_tasks(self.train_dataset, task_column)

    def _is_peft(self) -> bool:
        from accelerate.utils import is_peft_model

        return bool(is_peft_model(self.accelerator.unwrap_model(self.model)))

    @staticmethod
    def _check_method_names(spec) -> None:
        """:func:`hargo.methods.check_method_names` (also run by ``hargo check-params``)."""
        check_method_names(spec)

    def _check_weighted_loss_supported(self) -> None:
        problems = unsupported_trl_options(self)
        if self.loss_type != "grpo":
            problems.append(f"loss_type={self.loss_type!r} (hargo computes the GRPO family's "
                            "loss itself; the method's aggregation knob chooses its form)")
        if problems:
            raise ValueError(f"method {self.method}: the weighted HARGO loss does not implement "
                             f"these TRL options: {', '.join(problems)}")

    def _check_dynamic_sampling_supported(self) -> None:
        G, local = self.num_generations, self.args.generation_batch_size \
            // self.accelerator.num_processes
        if local % G:
            raise ValueError(f"dynamic sampling keeps or drops whole groups on each process: "
                             f"{local} completions per process do not form groups of G={G} "
                             "(make rl.prompts_per_step a multiple of the process count)")

    # ------------------------------------------------------------------------- rollout

    @contextlib.contextmanager
    def timed_rollout(self):
        """Add the seconds spent inside to ``timing["generation_s"]`` (TRL's ``_generate``)."""
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.timing["generation_s"] += time.perf_counter() - t0

    @property
    def generation_config(self):
        """The ``GenerationConfig`` TRL 1.16's transformers path reads in ``_generate_single_turn``:
        TRL's own (built in its ``__init__``, never changed here) or, while a training batch with
        per-task budgets is scored, a copy whose ``max_new_tokens`` is the batch's largest."""
        base, budgets = self.__dict__.get("_trl_generation_config"), self._row_budgets
        if base is None or budgets is None or self.use_vllm:
            return base
        cap = int(max(budgets))
        if cap not in self._capped_generation_configs:
            self._capped_generation_configs[cap] = copy.deepcopy(base)
            self._capped_generation_configs[cap].max_new_tokens = cap
        return self._capped_generation_configs[cap]

    @generation_config.setter
    def generation_config(self, value) -> None:
        self._trl_generation_config, self._capped_generation_configs = value, {}

    @contextlib.contextmanager
    def rollout_budgets(self, n_rows: int):
        """Context of TRL's ``_generate_single_turn`` for ``n_rows`` prompts: the policy's
        (bf16) autocast on the transformers path (~3x faster on a CPU with AMX, stack.md).
        Yields ``cut(completion_ids, logprobs)``, which stops each completion (and its
        log-probs, when not None) at its own task's budget (unchanged without budgets)."""
        ctx = self.accelerator.autocast() if not self.use_vllm else contextlib.nullcontext()
        budgets = self._row_budgets
        if budgets is not None and len(budgets) != n_rows:
            budgets = None     # not the rows of the batch being scored (e.g. TRL's eval path)

        def cut(completion_ids, logprobs):
            if budgets is None:
                return completion_ids, logprobs
            completion_ids = [list(c)[:b] for c, b in zip(completion_ids, budgets)]
            if logprobs is not None:
                logprobs = [list(lp)[:b] for lp, b in zip(logprobs, budgets)]
            return completion_ids, logprobs

        with ctx:
            yield cut

    def keep_gathered_rewards(self, rewards_per_func: torch.Tensor) -> None:
        """Keep TRL's (B_total, n_funcs) rewards per function, gathered from all processes."""
        self._gathered_rewards_per_func = rewards_per_func

    # ------------------------------------------------------------------------- scoring

    def score_training_batch(self, inputs: list) -> dict:
        """TRL's ``_generate_and_score_completions`` of the training rows ``inputs``, with the
        method's advantages and ``response_weights``, ``task_ids`` (and, for a method that needs
        the reference, ``ref_per_token_logps`` from hargo's own reference pass) in the returned
        dict; with dynamic sampling, of the step's kept groups. Hands the gathered per-response
        values to the recorder.

        Raises:
            ValueError: a weighted method got a None reward (TRL's NaN) for some completion.
        """
        t0, gen_before = time.perf_counter(), self.timing["generation_s"]
        self._gathered_rewards_per_func = None
        scored, sampled = self._scored_batch(inputs), None
        if self.dynamic_sampling.enabled:
            scored, sampled = self._dynamic_sampling(scored)
        output = scored.output
        self._gathered_rewards_per_func = scored.rewards_per_func
        self.set_logged_texts(scored.prompts, scored.completions)   # the kept groups' texts
        B_local = output["completion_ids"].size(0)
        rank = self.accelerator.process_index
        local = slice(rank * B_local, (rank + 1) * B_local)
        mask = self._loss_mask(output)
        # Rewards of the whole gathered batch, combined as TRL does ("sum_then_normalize").
        rpf = self._gathered_rewards_per_func
        rewards = (rpf * self.reward_weights.to(rpf.device).unsqueeze(0)).nansum(dim=1)
        l_all = self._own_reference_pass(output, mask) if self._needs_ref else None
        stats = self._estimator_stats(output, rewards, l_all, local, mask)
        output["response_weights"] = stats["weights"][local].float()
        tasks_all = self._tag_tasks(output, scored.inputs)
        lengths_all = self.accelerator.gather(mask.sum(dim=1).float())
        gen_s = self.timing["generation_s"] - gen_before
        score_s = time.perf_counter() - t0 - gen_s
        self.timing["scoring_s"] += score_s
        if self.recorder is not None:
            self._record_generation(scored, sampled, tasks_all, rewards, l_all, stats,
                                    lengths_all, gen_s, score_s)
        return output

    def skips_trl_reference_pass(self, model) -> bool:
        """Whether a log-prob call is TRL 1.16's reference pass inside the scoring of a training
        batch, for a method that runs its own (:meth:`_reference_logps`, both temperatures from
        one pass): ``model`` is the reference (``self.ref_model``, or the policy with its LoRA
        adapter off: :func:`~hargo.training.reference.is_reference_call`) while the policy
        trains. TRL then keeps no reference log-probs, exactly as with ``beta = 0``."""
        return bool(self._needs_ref and self.model.training
                    and is_reference_call(model, self.ref_model, self.accelerator.unwrap_model))

    def _own_reference_pass(self, output: dict, mask: torch.Tensor) -> torch.Tensor:
        """One reference pass: log-probs at the sampling temperature for the KL term (TRL's
        values, into ``output["ref_per_token_logps"]``; read by the per-task KL diagnostic even
        when beta == 0) and at T = 1 for the confidence input: (B_total,) gathered ``l_i``
        (docs/method.md)."""
        at_sampling_T, at_1 = self._reference_logps(output, (self.temperature, 1.0))
        output["ref_per_token_logps"] = at_sampling_T
        return self.accelerator.gather(masked_mean(at_1, mask).float())  # (B_total,)

    def _estimator_stats(self, output: dict, rewards: torch.Tensor, l_all, local: slice,
                         mask: torch.Tensor) -> dict:
        """The method's (B_total,) ``advantages`` and ``weights`` over the gathered batch, with
        ``confidence`` (or None) and the EMA ``baseline``; writes this process's advantages into
        ``output`` (weighted methods) and TRL's advantage log."""
        device, G = self.accelerator.device, self.num_generations
        if not self._hargo_loss:
            adv_all = self._response_advantages(output, rewards, local, mask)
            return {"advantages": adv_all, "confidence": None, "baseline": None,
                    "weights": torch.full((rewards.numel(),), 1.0 / G, device=device)}
        if torch.isnan(rewards).any():
            raise ValueError(f"method {self.method}: a reward function returned None for some "
                             "completions; HARGO needs a reward for every completion")
        est = estimate(self.spec.estimator, group_rewards(rewards, G),
                       None if l_all is None else group_rewards(l_all, G), self.ema,
                       self.hargo_config)
        adv_all = est.advantages.reshape(-1).to(device)
        output["advantages"] = adv_all[local].to(output["advantages"].dtype)
        # TRL logged the stale group advantages; log the ones the loss uses instead.
        self.set_logged_advantages(adv_all.tolist())
        return {"advantages": adv_all, "weights": est.weights.reshape(-1).to(device),
                "confidence": None if est.confidence is None else est.confidence.reshape(-1),
                "baseline": est.baseline}

    def _tag_tasks(self, output: dict, inputs: list) -> list[str]:
        """Every process's tasks of the batch, in global order (registering each task's index
        in that order, so it is the same on every process), and this process's task indices
        into ``output["task_ids"]``."""
        tasks_local = [x.get(self.task_column) if isinstance(x, dict) else None for x in inputs]
        tasks_all = [("all" if t is None else str(t)) for t in gather_object(tasks_local)]
        for t in tasks_all:  # global order first: the same task index on every process
            task_index(self.task_names, t)
        output["task_ids"] = torch.tensor([task_index(self.task_names, t) for t in tasks_local],
                                          dtype=torch.long, device=self.accelerator.device)
        return tasks_all

    def _record_generation(self, scored: "_ScoredBatch", sampled, tasks_all, rewards, l_all,
                           stats: dict, lengths_all, gen_s: float, score_s: float) -> None:
        """Hand the recorder the gathered per-response values of the scored batch."""
        B_total = rewards.numel()
        prompts, completions = scored.prompts, scored.completions
        conf = stats["confidence"]
        self.recorder.add_generation(
            tasks=tasks_all, rewards=rewards.tolist(), advantages=stats["advantages"].tolist(),
            weights=stats["weights"].tolist(), completion_lengths=lengths_all.tolist(),
            group_size=self.num_generations,
            confidence=None if conf is None else conf.tolist(),
            ref_logprob=None if l_all is None else l_all.tolist(), baseline=stats["baseline"],
            prompts=prompts if len(prompts) == B_total else None,
            completions=completions if len(completions) == B_total else None,
            generation_s=gen_s, scoring_s=score_s, sampled_groups=sampled)

    def _response_advantages(self, output: dict, rewards: torch.Tensor, local: slice,
                             mask: torch.Tensor) -> torch.Tensor:
        """(B_total,) per-response advantages of the gathered batch, for the recorder.

        ``grpo``/``dr_grpo``: TRL's own ``output["advantages"]``, gathered. A subclass with its own
        advantages (``HargoPPOTrainer``) computes them here from ``rewards`` (B_total,) gathered
        task rewards, ``local`` (this process's rows of them) and ``mask`` (B_local, T) completion
        mask, and may add tensors to ``output`` for its loss.
        """
        return self.accelerator.gather(output["advantages"].float())

    @torch.no_grad()
    def _reference_logps(self, output: dict, temperatures=(1.0,)) -> list[torch.Tensor]:
        """Reference-model log-probs of the completions in ``output``, one reference forward pass
        for all ``temperatures``.

        ``log softmax(z / T)[y_t]`` per completion token, ``z`` the reference model's logits
        (after its softcapping/logit scale, as TRL's fused head), for each ``T`` in
        ``temperatures``. At ``T = self.temperature`` the values are TRL 1.16's own reference
        log-probs (the same call TRL makes when ``beta != 0``: its fused LM head at the sampling
        temperature), the input of the KL term. For every other ``T`` the backbone's last hidden
        states of that same pass are projected once more through the LM head
        (:func:`~hargo.training.reference.logps_at_temperatures`), so no second backbone forward
        runs. ``T = 1`` gives the reference model's own distribution, HARGO's ``l_i``
        (``docs/method.md``).

        The reference is ``self.ref_model``, or the policy with the LoRA adapter off (TRL's
        ``"ref"`` adapter when it has one): :func:`~hargo.training.reference.reference_lm`.

        Args:
            output: a scored batch with ``prompt_ids``/``prompt_mask`` (B, P) and
                ``completion_ids``/``completion_mask`` (B, T).
            temperatures: the temperatures (> 0) wanted.

        Returns:
            one (B, T) float tensor per temperature, in nats; 0 on padding (as TRL's).

        Raises:
            ValueError: a temperature <= 0.
        """
        temps = check_temperatures(temperatures)
        sampling_T = float(self.temperature)
        call_model, lm, as_reference = reference_lm(self.ref_model, self.model,
                                                    self.accelerator.unwrap_model)
        extra = [t for t in dict.fromkeys(temps) if t != sampling_T]
        hidden: list[torch.Tensor] = []
        K = output["completion_ids"].size(1)

        def keep_hidden(_module, _args, out):
            hidden.append(out.last_hidden_state[:, -K - 1:-1])   # the positions predicting y_t

        hook = lm.base_model.register_forward_hook(keep_hidden) if extra else None
        bs = self.args.per_device_train_batch_size
        try:
            with disable_gradient_checkpointing(self.model,
                                                self.args.gradient_checkpointing_kwargs), \
                    as_reference:
                at_sampling_T = self._completion_logps(call_model, output, upstream=True,
                                                       batch_size=bs)[0]
        finally:
            if hook is not None:
                hook.remove()
        result = {sampling_T: at_sampling_T}
        if extra:
            softcap, scale = lm_head_scaling(lm.config)
            lps = logps_at_temperatures(torch.cat(hidden, dim=0), lm.get_output_embeddings(),
                                        output["completion_ids"], output["completion_mask"],
                                        extra, softcap, scale,
                                        bool(self.args.cast_lm_head_to_fp32),
                                        self.accelerator.autocast)
            result.update({t: lp.to(at_sampling_T.device) for t, lp in zip(extra, lps)})
        return [result[t] for t in temps]

