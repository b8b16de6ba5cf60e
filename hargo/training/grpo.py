"""``HargoGRPOTrainer``: TRL's ``GRPOTrainer`` extended for the HARGO family of RL methods.

This module only wires hargo's math into TRL's trainer. The math lives elsewhere, as pure
functions: group advantages and per-response weights in :mod:`hargo.advantages`; the clipped
surrogate, the KL estimators, the clip fractions, the masked means and the weighted loss in
:mod:`hargo.losses`. The method itself is specified in ``docs/method.md``.

Pinned to **TRL 1.16.0** (``pyproject.toml``: ``trl==1.16.0``). The extension overrides these
*private* methods of TRL 1.16's ``trl.trainer.grpo_trainer.GRPOTrainer``, whose layout changes
between TRL minors; each is declared, with why no public API serves and the signature it was
written against, in :mod:`hargo.training.trl_seam`, which the trainer checks when it is built
(``tests/test_trl_seam.py``). Re-read them and re-run ``tests/test_rl.py`` and
``tests/test_loss_path.py`` before moving the pin:

``_calculate_rewards``
    calls TRL's and keeps the rewards it returns, already gathered from every process.
``_generate`` / ``_generate_single_turn``
    call TRL's; time the rollout and run transformers sampling under the bf16 autocast the
    policy forward uses (TRL samples in full precision otherwise).
``_generate_and_score_completions``
    calls TRL's, then recomputes the group statistics of the method's estimator over the *whole
    gathered batch* and re-slices them to this process (see below); records the per-task
    diagnostics and adds two per-response tensors, ``response_weights`` and ``task_ids``, that
    TRL's shuffle/split of the generation batch carries along.
``_get_per_token_logps_and_entropies``
    calls TRL's; keeps a detached copy of the policy log-probs of the loss forward for the per-task
    KL and clip-fraction diagnostics (no extra forward pass).
``_compute_loss``
    every GRPO-family method: hargo's one loss, ``_group_weighted_loss`` (below), which calls
    :func:`hargo.losses.group_weighted_aggregate`; TRL's own loss only for batches scored outside
    training (TRL's eval path, no weights).
``_get_train_sampler`` / ``_run_epoch`` / ``_save_checkpoint`` / ``_load_optimizer_and_scheduler``
    exact resume (the prompt order of the right epoch, and ``method_state.json`` with the EMA
    baseline and the per-step history in every checkpoint): :class:`hargo.training.resume.
    ResumeMixin`, first among the bases.

Methods: the trainer asks the method's :class:`hargo.methods.Method` (``family="grpo_family"``)
what to do -- its advantage ``estimator``, whether it ``needs_reference``, its ``policy_loss``
and ``kl`` estimator (looked up by name in :mod:`hargo.advantages` and :mod:`hargo.losses`) --
and its params block for the std convention (``std``, ``std_eps``, ``std_scope``: the
estimator's :class:`~hargo.advantages.HargoConfig`) and the ``aggregation``; nothing here
branches on method names. Every GRPO-family method runs the same code: two methods differ only
in what they declare. Today's methods:

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
    ``l_i`` is the reference model's own log-prob (temperature 1) of the frozen SFT model (LoRA
    adapter off, or a separate reference copy for full fine-tuning; computed even when
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

Beside this module: :mod:`hargo.training.trl_options` (the methods' TRL loss settings, the TRL
options hargo's losses do not implement), :mod:`hargo.training.reference` (the reference model
when TRL builds none, and its log-probs), :mod:`hargo.training.task_diagnostics` (per-task KL and
clip fraction for the recorder) and :mod:`hargo.training.checkpoints` (finding and reading the
checkpoint folders ``_save_checkpoint`` writes).
"""
from __future__ import annotations

import contextlib
import json
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

import torch
from accelerate.utils import gather_object
from trl import GRPOTrainer
from trl.models.utils import disable_gradient_checkpointing

from hargo.advantages import EMABaseline, HargoConfig, estimate, group_rewards
from hargo.methods import get_method
from hargo.methods._check import check_method_names
from hargo.training.dynamic_sampling import (DynamicSamplingConfig, draw_refill_indices,
                                             informative_groups, join_rows, refill_prompt_count,
                                             select_groups)
from hargo.losses import (clip_fraction, group_weighted_aggregate, kl_penalty, masked_mean,
                          masked_token_mean, policy_loss)
from hargo.training.reference import (build_reference_model, check_temperatures, lm_head_scaling,
                                      logps_at_temperatures, reference_lm)
from hargo.training.resume import ResumeMixin
from hargo.training.task_diagnostics import dataset_tasks, loss_diagnostics, task_index
from hargo.training.trl_options import unsupported_trl_options

__all__ = ["HargoGRPOTrainer", "TRL_VERSION"]

#: The TRL release whose private methods this module overrides (pyproject pins it exactly).
TRL_VERSION = "1.16.0"


class HargoGRPOTrainer(ResumeMixin, GRPOTrainer):
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
        from hargo.training.trl_seam import check_seam

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
        super().__init__(*args, **kwargs)
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

    # ------------------------------------------------------------------------------ setup

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

    def _generate(self, prompts: list):
        t0 = time.perf_counter()
        try:
            return super()._generate(prompts)
        finally:
            self.timing["generation_s"] += time.perf_counter() - t0

    def _generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations,
                              has_tool_images=False):
        # TRL samples with transformers in full precision; run it under the same (bf16) autocast
        # as the policy forward, which is ~3x faster on a CPU with AMX (stack.md).
        ctx = self.accelerator.autocast() if not self.use_vllm else contextlib.nullcontext()
        budgets = self._row_budgets
        if budgets is not None and len(budgets) != len(prompt_ids):
            budgets = None     # not the rows of the batch being scored (e.g. TRL's eval path)
        cap = contextlib.nullcontext()
        if budgets is not None and not self.use_vllm:
            cap = _max_new_tokens(self.generation_config, max(budgets))   # the batch's largest
        with ctx, cap:
            completion_ids, logprobs = super()._generate_single_turn(
                prompt_ids, images, multimodal_fields, num_generations, has_tool_images)
        if budgets is not None:   # each completion stops at its own task's budget
            completion_ids = [list(c)[:b] for c, b in zip(completion_ids, budgets)]
            if logprobs is not None:
                logprobs = [list(lp)[:b] for lp, b in zip(logprobs, budgets)]
        return completion_ids, logprobs

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions,
                                                      completion_ids_list)
        self._gathered_rewards_per_func = rewards_per_func  # (B_total, n_funcs), all processes
        return rewards_per_func

    def _generate_and_score_completions(self, inputs):
        mode = "train" if self.model.training else "eval"
        t0 = time.perf_counter()
        gen_before = self.timing["generation_s"]
        self._gathered_rewards_per_func = None
        own_ref = self._needs_ref and mode == "train"
        if mode != "train":
            return super()._generate_and_score_completions(inputs)
        with self._trl_reference_pass_skipped() if own_ref else contextlib.nullcontext():
            scored = self._scored_batch(inputs)
            sampled = None
            if self.dynamic_sampling.enabled:
                scored, sampled = self._dynamic_sampling(scored)
        inputs, output = scored.inputs, scored.output
        self._gathered_rewards_per_func = scored.rewards_per_func
        for key, texts in (("prompt", scored.prompts), ("completion", scored.completions)):
            self._logs[key] = deque(texts, maxlen=self._logs[key].maxlen)
        device = self.accelerator.device
        G = self.num_generations
        B_local = output["completion_ids"].size(0)
        rank = self.accelerator.process_index
        local = slice(rank * B_local, (rank + 1) * B_local)
        mask = self._loss_mask(output)

        # Rewards of the whole gathered batch, combined as TRL does ("sum_then_normalize").
        rpf = self._gathered_rewards_per_func
        rewards = (rpf * self.reward_weights.to(rpf.device).unsqueeze(0)).nansum(dim=1)
        B_total = rewards.numel()

        l_all = None
        if own_ref:
            # One reference pass: log-probs at the sampling temperature for the KL term (TRL's
            # values; read by the per-task KL diagnostic even when beta == 0) and at T = 1 for
            # the confidence input l_i (docs/method.md).
            at_sampling_T, at_1 = self._reference_logps(output, (self.temperature, 1.0))
            output["ref_per_token_logps"] = at_sampling_T
            l_all = self.accelerator.gather(masked_mean(at_1, mask).float())  # (B_total,)

        conf_all, baseline = None, None
        if self._hargo_loss:
            if torch.isnan(rewards).any():
                raise ValueError(f"method {self.method}: a reward function returned None for some "
                                 "completions; HARGO needs a reward for every completion")
            est = estimate(self.spec.estimator, group_rewards(rewards, G),
                           None if l_all is None else group_rewards(l_all, G), self.ema,
                           self.hargo_config)
            adv_all = est.advantages.reshape(-1).to(device)
            w_all = est.weights.reshape(-1).to(device)
            if est.confidence is not None:
                conf_all = est.confidence.reshape(-1)
            baseline = est.baseline
            output["advantages"] = adv_all[local].to(output["advantages"].dtype)
            # TRL logged the stale group advantages; log the ones the loss uses instead.
            self._logs["advantages"].clear()
            self._logs["advantages"].extend(adv_all.tolist())
        else:
            adv_all = self._response_advantages(output, rewards, local, mask)
            w_all = torch.full((B_total,), 1.0 / G, device=device)
        output["response_weights"] = w_all[local].float()

        tasks_local = [x.get(self.task_column) if isinstance(x, dict) else None for x in inputs]
        tasks_all = [("all" if t is None else str(t)) for t in gather_object(tasks_local)]
        for t in tasks_all:  # global order first: the same task index on every process
            task_index(self.task_names, t)
        output["task_ids"] = torch.tensor([task_index(self.task_names, t) for t in tasks_local],
                                          dtype=torch.long, device=device)
        lengths_all = self.accelerator.gather(mask.sum(dim=1).float())
        gen_s = self.timing["generation_s"] - gen_before
        score_s = time.perf_counter() - t0 - gen_s
        self.timing["scoring_s"] += score_s
        if self.recorder is not None:
            prompts, completions = scored.prompts, scored.completions
            self.recorder.add_generation(
                tasks=tasks_all, rewards=rewards.tolist(), advantages=adv_all.tolist(),
                weights=w_all.tolist(), completion_lengths=lengths_all.tolist(), group_size=G,
                confidence=None if conf_all is None else conf_all.tolist(),
                ref_logprob=None if l_all is None else l_all.tolist(), baseline=baseline,
                prompts=prompts if len(prompts) == B_total else None,
                completions=completions if len(completions) == B_total else None,
                generation_s=gen_s, scoring_s=score_s, sampled_groups=sampled)
        return output

    # ------------------------------------------------------------------- dynamic sampling

    def _scored_batch(self, inputs: list) -> "_ScoredBatch":
        """TRL's ``_generate_and_score_completions`` on ``inputs`` (training), with the gathered
        rewards per function and the gathered prompt and completion texts of exactly this call
        (TRL's ``_logs`` deques are bounded by one generation batch; a refill can be larger)."""
        saved = {k: self._logs[k] for k in ("prompt", "completion")}
        self._logs["prompt"], self._logs["completion"] = deque(), deque()
        self._gathered_rewards_per_func = None
        if self.task_budgets is not None:
            from hargo.generation_budget import row_budgets

            self._row_budgets = row_budgets(
                self.task_budgets, [str(x.get(self.task_column)) for x in inputs],
                "rl.max_new_tokens")
        try:
            output = super()._generate_and_score_completions(inputs)
            texts = list(self._logs["prompt"]), list(self._logs["completion"])
        finally:
            self._logs.update(saved)
            self._row_budgets = None
        return _ScoredBatch(list(inputs), output, self._gathered_rewards_per_func, *texts)

    def _combined_rewards(self, rewards_per_func: torch.Tensor) -> torch.Tensor:
        """(B,) rewards from (B, n_funcs), combined as TRL does ("sum_then_normalize")."""
        rpf = rewards_per_func
        out = (rpf * self.reward_weights.to(rpf.device).unsqueeze(0)).nansum(dim=1)
        out[torch.isnan(rpf).all(dim=1)] = float("nan")
        return out

    def _refill_rows(self, n: int, round_: int, used: list) -> list[int]:
        """Train-split rows of a refill round (``draw_refill_indices``), avoiding the prompts in
        ``used`` (dataset rows)."""
        if self._prompt_rows is None:
            self._prompt_rows = {}
            for i, row in enumerate(self.train_dataset):
                self._prompt_rows.setdefault(_prompt_key(row["prompt"]), []).append(i)
        exclude = sorted({i for x in used for i in self._prompt_rows.get(_prompt_key(x["prompt"]),
                                                                          [])})
        return draw_refill_indices(len(self.train_dataset), n, seed=int(self.args.seed),
                                   step=int(self.state.global_step), round_=round_,
                                   process=self.accelerator.process_index, exclude=exclude)

    def _dynamic_sampling(self, own: "_ScoredBatch") -> tuple["_ScoredBatch", dict]:
        """Drop the zero-variance groups of the step and refill it (``hargo.training.
        dynamic_sampling``, DAPO). Returns the batch the step trains on (same size as ``own``) and
        what was sampled, per group of all processes: ``tasks``, ``zero_variance``, ``kept``,
        ``refill`` (for the recorder).

        Every process runs the same number of refill rounds of the same size (TRL gathers inside
        each call): a round runs while any process misses informative groups."""
        G, world = self.num_generations, self.accelerator.num_processes
        rank = self.accelerator.process_index
        cfg = self.dynamic_sampling
        batches = [own]
        flags = [informative_groups(self._combined_rewards(own.rewards_per_func), G).tolist()]
        needed = own.output["completion_ids"].size(0) // G

        def local(flag_list: list, n_local: int, p: int) -> list:
            return flag_list[p * n_local:(p + 1) * n_local]

        for round_ in range(1, cfg.max_refills + 1):
            have = [sum(sum(local(f, len(f) // world, p)) for f in flags) for p in range(world)]
            missing = max(needed - h for h in have)
            if missing <= 0:
                break
            n = refill_prompt_count(missing, cfg.refill_factor)
            used = [x for b in batches for x in b.inputs[::G]]
            rows = self._refill_rows(n, round_, used)
            extra = [dict(self.train_dataset[i]) for i in rows for _ in range(G)]
            batch = self._scored_batch(extra)
            batches.append(batch)
            flags.append(informative_groups(self._combined_rewards(batch.rewards_per_func),
                                            G).tolist())

        local_flags = [local(f, len(f) // world, rank) for f in flags]
        sel = select_groups(local_flags, needed)
        kept = set(sel.keep)
        tasks_local = [[str(x.get(self.task_column, "all")) for x in b.inputs[::G]]
                       for b in batches]
        sampled_local = [(tasks_local[b][i], not local_flags[b][i], (b, i) in kept, b > 0)
                         for b in range(len(batches)) for i in range(len(local_flags[b]))]
        sampled_all = [s for part in gather_object([sampled_local]) for s in part]
        sampled = {k: [s[j] for s in sampled_all]
                   for j, k in enumerate(("tasks", "zero_variance", "kept", "refill"))}
        if len(batches) == 1 and sel.keep == [(0, i) for i in range(needed)]:
            return own, sampled   # nothing dropped: the step's own batch, untouched

        rows = [(b, i * G + j) for b, i in sel.keep for j in range(G)]
        joined = join_rows([b.output for b in batches], rows,
                           pad_token_id=int(self._tokenizer.pad_token_id or 0))
        mask = self._loss_mask(joined)
        joined["num_items_in_batch"] = self.accelerator.gather(mask.sum()).sum()
        inputs = [batches[b].inputs[r] for b, r in rows]

        def local_rows(b: int) -> slice:
            n = batches[b].output["completion_ids"].size(0)
            return slice(rank * n, (rank + 1) * n)

        rpf_local = torch.stack([batches[b].rewards_per_func[local_rows(b)][r] for b, r in rows])
        texts = []
        for attr in ("prompts", "completions"):
            mine = [getattr(batches[b], attr)[local_rows(b)][r] for b, r in rows] \
                if all(len(getattr(x, attr)) == x.rewards_per_func.size(0) for x in batches) \
                else []
            texts.append([t for part in gather_object([mine]) for t in part])
        return _ScoredBatch(inputs, joined, self.accelerator.gather(rpf_local), *texts), sampled

    @contextlib.contextmanager
    def _trl_reference_pass_skipped(self):
        """TRL 1.16's ``_generate_and_score_completions`` runs its reference forward only when
        ``self.beta != 0`` (and reads ``beta`` nowhere else); the HARGO methods that need the
        reference run it themselves (:meth:`_reference_logps`, both temperatures from one pass),
        so TRL's is skipped by hiding ``beta`` for the call."""
        beta, self.beta = self.beta, 0.0
        try:
            yield
        finally:
            self.beta = beta

    def _response_advantages(self, output: dict, rewards: torch.Tensor, local: slice,
                             mask: torch.Tensor) -> torch.Tensor:
        """(B_total,) per-response advantages of the gathered batch, for the recorder.

        ``grpo``/``dr_grpo``: TRL's own ``output["advantages"]``, gathered. A subclass with its own
        advantages (``HargoPPOTrainer``) computes them here from ``rewards`` (B_total,) gathered
        task rewards, ``local`` (this process's rows of them) and ``mask`` (B_local, T) completion
        mask, and may add tensors to ``output`` for its loss.
        """
        return self.accelerator.gather(output["advantages"].float())

    # ---------------------------------------------------------------------------- loss

    @staticmethod
    def _loss_mask(batch: dict) -> torch.Tensor:
        """(B, T) tokens the loss counts: the completion mask, times TRL's tool mask if any."""
        mask = batch["completion_mask"]
        return mask * batch["tool_mask"] if "tool_mask" in batch else mask

    def _completion_logps(self, model, batch: dict, **kwargs):
        """TRL's ``(logps, entropies, aux)`` of ``batch``'s completion tokens under ``model``
        (``kwargs`` go to ``_get_per_token_logps_and_entropies``)."""
        input_ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
        attention_mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
        return self._get_per_token_logps_and_entropies(model, input_ids, attention_mask,
                                                       batch["completion_ids"].size(1), **kwargs)

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
                at_sampling_T = self._completion_logps(call_model, output, batch_size=bs)[0]
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

    def _reduce_sum(self, t: torch.Tensor) -> torch.Tensor:
        return self.accelerator.reduce(t, reduction="sum")

    def _global_token_mean(self, x: torch.Tensor, mask: torch.Tensor) -> float:
        """Mean of ``x`` over the valid tokens of all processes (a logged metric)."""
        return float(masked_token_mean(x.detach(), mask, reduce=self._reduce_sum))

    def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep,
                                           *args, **kwargs):
        logps, entropies, aux = super()._get_per_token_logps_and_entropies(
            model, input_ids, attention_mask, logits_to_keep, *args, **kwargs)
        if self._capture_logps:
            self._captured_logps = logps.detach()
        return logps, entropies, aux

    def _compute_loss(self, model, inputs):
        self._capture_logps, self._captured_logps = True, None
        try:
            loss = self._method_compute_loss(model, inputs)
        finally:
            self._capture_logps = False
        if self.model.training:
            self._record_loss_diagnostics(inputs)
        return loss

    def _record_loss_diagnostics(self, inputs: dict) -> None:
        """Per response of the micro-batch ``inputs``, from the policy log-probs its loss forward
        captured: :func:`~hargo.training.task_diagnostics.loss_diagnostics` (KL, clip fraction,
        advantage-weighted log-prob and log-ratio), gathered from all processes and handed to
        the recorder with the responses' tasks. Nothing without captured log-probs or task ids."""
        logps = self._captured_logps
        if logps is None or "task_ids" not in inputs:
            return
        d = loss_diagnostics(logps, self._loss_mask(inputs), inputs["advantages"],
                             self.num_generations, self.epsilon_low, self.epsilon_high,
                             self.args.delta, ref_logps=inputs.get("ref_per_token_logps"),
                             old_logps=inputs.get("old_per_token_logps"),
                             weights=inputs.get("response_weights"))
        clip = self.accelerator.gather(d.clip_fraction)
        task_ids = self.accelerator.gather(inputs["task_ids"])
        gather = lambda x: None if x is None else self.accelerator.gather(x).tolist()  # noqa: E731
        kl, adv_logp, adv_lr = gather(d.kl), gather(d.adv_logprob), gather(d.adv_log_ratio)
        if self.recorder is not None:
            self.recorder.add_loss(tasks=[self.task_names[i] for i in task_ids.tolist()],
                                   kl=kl, clip_fraction=clip.tolist(), adv_logprob=adv_logp,
                                   adv_log_ratio=adv_lr)

    def _method_compute_loss(self, model, inputs) -> torch.Tensor:
        """The loss of ``self.method`` on one micro-batch (a subclass with its own loss overrides
        this; the diagnostics around it stay in ``_compute_loss``)."""
        # Batches scored outside training (TRL's eval path) carry no group weights: TRL's loss.
        if self._hargo_loss and "response_weights" in inputs:
            return self._group_weighted_loss(model, inputs)
        return super()._compute_loss(model, inputs)

    def _aggregation_kwargs(self, inputs, mode: str) -> dict:
        """What the aggregation needs beyond the batch: ``max_completion_length`` (Dr. GRPO's
        constant) and, for ``token_mean``, the token count of this process's share of the
        optimiser step, as TRL 1.16's ``dapo`` normaliser: the generation batch's tokens over all
        processes (``num_items_in_batch``) / processes x accumulation steps / steps per
        generation. (Returns the count already divided for accumulation: the caller does not
        divide ``token_mean`` again.)"""
        kw: dict[str, Any] = {"max_completion_length": self.max_completion_length}
        if self.aggregation == "token_mean":
            n = inputs["num_items_in_batch"].clamp(min=1.0) / self.accelerator.num_processes
            if mode == "train":
                n = n * self.current_gradient_accumulation_steps / self.args.steps_per_generation
            kw["num_tokens"] = n
        return kw

    def _group_weighted_loss(self, model, inputs) -> torch.Tensor:
        """The GRPO family's one loss on this process's micro-batch (docs/method.md step 6):
        ``hargo.losses.group_weighted_aggregate`` of the per-token loss with the batch's
        ``response_weights`` in the method's ``aggregation`` mode.

        The per-token loss is the method's ``policy_loss`` (``clipped_surrogate``, written
        operation for operation as TRL 1.16's) with the estimator's advantages, times the vLLM
        importance-sampling ratio when on, plus ``beta`` x the method's ``kl`` estimator (k3,
        times the ratio under ``use_bias_correction_kl``). ``response_mean`` and
        ``constant_length`` are divided by the accumulation steps, as TRL does; ``token_mean``'s
        token count already spans the optimiser step. With the gradient averaging across
        processes this is the global ``(1/N) sum w_i L_i`` (the sum is linear, so groups split
        across processes or micro-batches add up). With weights ``1/G`` it is TRL 1.16's
        ``grpo`` / ``dr_grpo`` / ``dapo`` loss, value and gradients (tests/test_loss_path.py).
        """
        mask = self._loss_mask(inputs)
        logps, entropies, _ = self._completion_logps(model, inputs, compute_entropy=True)
        old = inputs.get("old_per_token_logps")
        old = logps.detach() if old is None else old
        advantages = inputs["advantages"]
        per_token_loss, ratio = policy_loss(self.spec.policy_loss)(
            logps, old, advantages, self.epsilon_low, self.epsilon_high, self.args.delta)
        if self.use_vllm and self.vllm_importance_sampling_correction:
            per_token_loss = per_token_loss * inputs["importance_sampling_ratio"]
        per_token_kl = None
        if self.beta != 0.0:
            per_token_kl = kl_penalty(logps, inputs["ref_per_token_logps"], self.spec.kl)
            if self.args.use_bias_correction_kl:
                per_token_kl = per_token_kl * ratio
            per_token_loss = per_token_loss + self.beta * per_token_kl

        mode = "train" if self.model.training else "eval"
        loss = group_weighted_aggregate(per_token_loss, mask, inputs["response_weights"],
                                        self.num_generations, self.aggregation,
                                        **self._aggregation_kwargs(inputs, mode))
        if mode == "train" and self.aggregation != "token_mean":
            loss = loss / self.current_gradient_accumulation_steps
        # The metrics TRL's own loss logs (same names), so its log lines stay comparable.
        metrics = self._metrics[mode]
        if per_token_kl is not None:
            metrics["kl"].append(self._global_token_mean(per_token_kl, mask))
        metrics["entropy"].append(self._global_token_mean(entropies, mask))
        clipped = clip_fraction(ratio, advantages, self.epsilon_low, self.epsilon_high,
                                self.args.delta)
        for name, x in zip(("low_mean", "high_mean", "region_mean"), clipped):
            metrics[f"clip_ratio/{name}"].append(self._global_token_mean(x.float(), mask))
        return loss


@dataclass
class _ScoredBatch:
    """One call of TRL's ``_generate_and_score_completions`` in training: this process's
    ``inputs`` rows and ``output`` (B_local rows), and, gathered from every process,
    ``rewards_per_func`` (B_total, n_funcs) and the prompt and completion texts."""

    inputs: list
    output: dict
    rewards_per_func: torch.Tensor
    prompts: list
    completions: list


def _prompt_key(prompt: Any) -> str:
    """A hashable identity of a dataset prompt (text, or a chat as JSON)."""
    return prompt if isinstance(prompt, str) else json.dumps(prompt, sort_keys=True, default=str)


@contextlib.contextmanager
def _max_new_tokens(generation_config, n: int):
    """``generation_config.max_new_tokens = n`` for the duration (TRL 1.16's transformers path
    reads it in ``_generate_single_turn``)."""
    old = generation_config.max_new_tokens
    generation_config.max_new_tokens = int(n)
    try:
        yield
    finally:
        generation_config.max_new_tokens = old
