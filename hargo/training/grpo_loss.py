"""The GRPO family's loss in :class:`hargo.training.grpo.HargoGRPOTrainer`: hargo's one loss,
``group_weighted_aggregate`` of the method's per-token loss with the batch's per-response weights
(``docs/method.md`` step 6), and the per-task loss diagnostics handed to the recorder.

:class:`GroupWeightedLossMixin` overrides transformers' public ``Trainer.compute_loss`` (the
documented place for a custom loss); batches scored outside training (TRL's eval path, no
weights) get TRL's own loss through TRL's public ``compute_loss``. With weights ``1/G`` the loss
is TRL 1.16's ``grpo`` / ``dr_grpo`` / ``dapo`` loss, value and gradients
(``tests/test_loss_path.py``). The math lives in :mod:`hargo.losses`.

The metrics hargo logs beside TRL's (the loss's ``kl``, ``entropy``, ``clip_ratio/*`` under TRL's
names, PPO's ``ppo/*``) go through :meth:`GroupWeightedLossMixin.record_metric` into the
trainer's own :attr:`hargo_metrics` and reach the log through transformers' public
``Trainer.log`` (:meth:`GroupWeightedLossMixin.log`), averaged as TRL averages its own: no write
to TRL's private ``_metrics``.
"""
from __future__ import annotations

import math
from typing import Any

import torch
from trl.extras.profiling import profiling_decorator

from hargo.losses import (clip_fraction, group_weighted_aggregate, kl_penalty, masked_token_mean,
                          policy_loss)
from hargo.training.task_diagnostics import loss_diagnostics

__all__ = ["GroupWeightedLossMixin"]


class GroupWeightedLossMixin:
    """The loss of a :class:`~hargo.training.grpo.HargoGRPOTrainer` (see the module docstring).

    The trainer provides TRL's attributes (``num_generations``, ``epsilon_low``/``_high``,
    ``beta``...) and ``spec``, ``aggregation``, ``recorder``, ``task_names``, ``hargo_metrics``,
    ``_hargo_loss``, ``_capture_logps`` and ``_captured_logps``. A subclass with its own loss
    (``HargoPPOTrainer``) overrides :meth:`_method_compute_loss`.
    """

    def record_metric(self, name: str, value: float, mode: str = "train") -> None:
        """One value of a metric hargo logs beside TRL's (``mode``: ``"train"`` or ``"eval"``);
        :meth:`log` reports the mean of the logging window's values under ``name``."""
        self.hargo_metrics[mode][name].append(value)

    def log(self, logs: dict, start_time: float | None = None) -> None:
        """transformers' public ``Trainer.log`` (TRL's adds its own metrics), with hargo's
        metrics of the logging window added to ``logs`` first: each the mean of its values,
        NaN left out (None when nothing is left), ``eval_``-prefixed in evaluation, exactly as
        TRL 1.16's ``log`` averages its ``_metrics``; then cleared, as TRL clears its own.
        hargo's keys are not TRL's in the same window: TRL's loss does not run on a batch
        hargo's loss computes."""
        mode = "train" if self.model.training else "eval"
        prefix = "eval_" if mode == "eval" else ""
        for key, values in self.hargo_metrics[mode].items():
            valid = [v for v in values if not math.isnan(v)]
            logs[prefix + key] = sum(valid) / len(valid) if valid else None
        super().log(logs, start_time)
        self.hargo_metrics[mode].clear()

    @profiling_decorator
    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        """The loss of ``self.method`` on the micro-batch ``inputs`` (transformers' public loss
        hook, as TRL's ``compute_loss``: a scalar tensor, no outputs), and, in training, the
        per-task loss diagnostics from the log-probs its forward pass computed.

        Raises:
            ValueError: ``return_outputs`` (TRL's GRPO trainer returns no outputs).
        """
        if return_outputs:
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        self._capture_logps, self._captured_logps = True, None
        try:
            loss = self._method_compute_loss(model, inputs)
        finally:
            self._capture_logps = False
        if self.model.training:
            self._record_loss_diagnostics(inputs)
        return loss

    def keep_loss_logps(self, logps: torch.Tensor) -> None:
        """Keep a detached copy of the (B, T) policy log-probs of a forward pass while
        :meth:`compute_loss` runs (for the diagnostics: no second forward)."""
        if self._capture_logps:
            self._captured_logps = logps.detach()

    @staticmethod
    def _loss_mask(batch: dict) -> torch.Tensor:
        """(B, T) tokens the loss counts: the completion mask, times TRL's tool mask if any."""
        mask = batch["completion_mask"]
        return mask * batch["tool_mask"] if "tool_mask" in batch else mask

    def _completion_logps(self, model, batch: dict, *, upstream: bool = False, **kwargs):
        """TRL's ``(logps, entropies, aux)`` of ``batch``'s completion tokens under ``model``
        (``kwargs`` go to TRL's ``_get_per_token_logps_and_entropies``, through
        :meth:`~hargo.training.trl_overrides.GRPOOverrides.per_token_logps`; ``upstream``: TRL's
        own, without hargo's override, for hargo's own reference pass)."""
        input_ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
        attention_mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
        fn = self.trl_per_token_logps if upstream else self.per_token_logps
        return fn(model, input_ids, attention_mask, batch["completion_ids"].size(1), **kwargs)

    def _reduce_sum(self, t: torch.Tensor) -> torch.Tensor:
        return self.accelerator.reduce(t, reduction="sum")

    def _global_token_mean(self, x: torch.Tensor, mask: torch.Tensor) -> float:
        """Mean of ``x`` over the valid tokens of all processes (a logged metric)."""
        return float(masked_token_mean(x.detach(), mask, reduce=self._reduce_sum))

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
        this; the diagnostics around it stay in :meth:`compute_loss`)."""
        # Batches scored outside training (TRL's eval path) carry no group weights: TRL's loss,
        # through TRL's public compute_loss (it calls TRL's _compute_loss, which hargo does not
        # override; the profiling timer around it reports to report_to, "none" in hargo).
        if self._hargo_loss and "response_weights" in inputs:
            return self._group_weighted_loss(model, inputs)
        return super().compute_loss(model, inputs)

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
        if per_token_kl is not None:
            self.record_metric("kl", self._global_token_mean(per_token_kl, mask), mode)
        self.record_metric("entropy", self._global_token_mean(entropies, mask), mode)
        clipped = clip_fraction(ratio, advantages, self.epsilon_low, self.epsilon_high,
                                self.args.delta)
        for name, x in zip(("low_mean", "high_mean", "region_mean"), clipped):
            self.record_metric(f"clip_ratio/{name}", self._global_token_mean(x.float(), mask),
                               mode)
        return loss
