"""Every private TRL 1.16 / transformers 5.19 name hargo touches, in one module: the methods it
overrides, and the few private attributes and methods it reads, writes or calls.

TRL and transformers give no public hook for these steps; each override here is a short method
that calls hargo's own (public) trainer method and, where it wraps, the original through
``super()``. Why each is needed and the signature it was written against are declared in
:data:`hargo.training.trl_seam.OVERRIDES` (checked against the installed TRL when an RL trainer
is built, and in ``tests/test_trl_seam.py``, which also checks that no hargo class outside this
module overrides a private upstream method, and that no hargo module outside this one names a
private upstream attribute or method). The mixins go first among a trainer's bases:

:class:`GRPOOverrides`
    TRL 1.16's ``GRPOTrainer``: :class:`hargo.training.grpo.HargoGRPOTrainer` (and so
    :class:`hargo.training.ppo.HargoPPOTrainer`).
:class:`SFTOverrides`
    transformers 5.19's ``Trainer`` under TRL's ``SFTTrainer``: the SFT stage's length-bucketed
    trainer (:mod:`hargo.training.sft`).

The private attributes and methods used without overriding them (declared in
:data:`hargo.training.trl_seam.PRIVATE_USES`, their shape checked the same way, and on the
trainer itself when it is built: :func:`hargo.training.trl_seam.check_trainer_attributes`) are
touched only by the accessors of :class:`GRPOOverrides` named there: TRL's completions log
``GRPOTrainer._logs`` (:meth:`~GRPOOverrides.scored_with_logged_texts`,
:meth:`~GRPOOverrides.set_logged_texts`, :meth:`~GRPOOverrides.set_logged_advantages`) and
transformers' ``Trainer._get_output_dir`` (in :meth:`~GRPOOverrides._save_checkpoint`).

Where a public hook serves, hargo uses it instead of a private name: ``Trainer.compute_loss``
(the method's loss, :class:`hargo.training.grpo_loss.GroupWeightedLossMixin`; TRL's own loss on
its eval path through TRL's public ``compute_loss``), ``Trainer.log`` (hargo's metrics beside
TRL's, not written into TRL's ``_metrics``: :meth:`~hargo.training.grpo_loss.
GroupWeightedLossMixin.log`), ``Trainer.train`` (``method_state.json`` restored before training
resumes), a ``TrainerCallback``'s ``on_epoch_begin`` (the sampler's epoch; both
:mod:`hargo.training.resume`), ``Trainer.processing_class`` (the pad token of joined batches,
not TRL's ``_tokenizer``) and ``GRPOTrainer.entropy_coef`` / ``use_adaptive_entropy`` (not
TRL's ``_entropy_bonus_enabled``).

Nothing but the standard library is imported here: the SFT stage imports this module before
TRL is loaded.
"""
from __future__ import annotations

from collections import deque

__all__ = ["GRPOOverrides", "SFTOverrides"]


class GRPOOverrides:
    """The private ``trl.GRPOTrainer`` (1.16) methods :class:`~hargo.training.grpo.
    HargoGRPOTrainer` overrides, each delegating to the trainer's own method of the same step
    (:data:`hargo.training.trl_seam.OVERRIDES` says why). Two calls give hargo's code TRL's
    originals: :meth:`trl_generate_and_score_completions` and :meth:`trl_per_token_logps`."""

    # ------------------------------------------------------------------------- rollout

    def _generate(self, prompts):
        with self.timed_rollout():
            return super()._generate(prompts)

    def _generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations,
                              has_tool_images=False):
        with self.rollout_budgets(len(prompt_ids)) as cut:
            completion_ids, logprobs = super()._generate_single_turn(
                prompt_ids, images, multimodal_fields, num_generations, has_tool_images)
        return cut(completion_ids, logprobs)

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions,
                                                      completion_ids_list)
        self.keep_gathered_rewards(rewards_per_func)
        return rewards_per_func

    # ------------------------------------------------------------------------- scoring

    def _generate_and_score_completions(self, inputs):
        if not self.model.training:   # TRL's eval path, untouched
            return super()._generate_and_score_completions(inputs)
        return self.score_training_batch(inputs)

    def trl_generate_and_score_completions(self, inputs):
        """TRL's own ``_generate_and_score_completions`` of ``inputs`` (what hargo's scoring
        starts from); returns TRL's output dict."""
        return super()._generate_and_score_completions(inputs)

    def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep,
                                           *args, **kwargs):
        if self.skips_trl_reference_pass(model):
            return None, None, None   # what TRL keeps when it runs no reference pass
        logps, entropies, aux = super()._get_per_token_logps_and_entropies(
            model, input_ids, attention_mask, logits_to_keep, *args, **kwargs)
        self.keep_loss_logps(logps)
        return logps, entropies, aux

    def trl_per_token_logps(self, *args, **kwargs):
        """TRL's own ``_get_per_token_logps_and_entropies`` (same arguments and result), without
        hargo's override: for the reference pass hargo runs itself."""
        return super()._get_per_token_logps_and_entropies(*args, **kwargs)

    def per_token_logps(self, *args, **kwargs):
        """``_get_per_token_logps_and_entropies`` with hargo's override above (same arguments and
        result): the log-probs of hargo's loss and PPO's rollout pass."""
        return self._get_per_token_logps_and_entropies(*args, **kwargs)

    # ------------------------------------------------- TRL's completions log (``_logs``)
    # GRPOTrainer._logs holds the columns of TRL's completions table (``log_completions``: the
    # printed sample, completions/*.parquet, wandb/trackio), read by TRL's ``log``. TRL offers no
    # public way to read or set its prompt, completion or advantage columns (a reward function's
    # ``log_extra`` adds extra columns only), and they must show the groups hargo trains on (after
    # dynamic sampling) and the advantages its loss uses. trl_seam.PRIVATE_USES declares it.

    def scored_with_logged_texts(self, inputs):
        """TRL's own scoring of ``inputs`` (:meth:`trl_generate_and_score_completions`) and the
        gathered prompt and completion texts it logs: ``(output, prompts, completions)``, every
        text of the call (TRL's logged texts are bounded by one generation batch; a dynamic
        sampling refill can be larger). TRL's logged prompts and completions are left as they
        were before the call."""
        logs = self._logs
        saved = {k: logs[k] for k in ("prompt", "completion")}
        logs["prompt"], logs["completion"] = deque(), deque()
        try:
            output = self.trl_generate_and_score_completions(inputs)
            return output, list(logs["prompt"]), list(logs["completion"])
        finally:
            logs.update(saved)

    def set_logged_texts(self, prompts: list, completions: list) -> None:
        """Make ``prompts`` and ``completions`` (gathered, aligned) the prompt and completion
        columns of TRL's completions log (bounded as TRL bounds them)."""
        logs = self._logs
        for key, texts in (("prompt", prompts), ("completion", completions)):
            logs[key] = deque(texts, maxlen=logs[key].maxlen)

    def set_logged_advantages(self, advantages: list) -> None:
        """Make ``advantages`` (gathered, one per completion) the advantage column of TRL's
        completions log, in place of the group advantages TRL logged."""
        column = self._logs["advantages"]
        column.clear()
        column.extend(advantages)

    # ------------------------------------------------------------------ resume, checkpoints

    def _get_train_sampler(self, dataset=None):
        return self.train_sampler(dataset)

    def _save_checkpoint(self, model, trial):
        # before transformers' trainer_state.json (last), into the folder transformers saves in
        self.write_method_state(self._get_output_dir(trial=trial))
        super()._save_checkpoint(model, trial)


class SFTOverrides:
    """The private transformers ``Trainer`` (5.19) method the SFT stage's trainer overrides."""

    def _get_train_sampler(self, train_dataset=None):
        sampler = self.length_bucket_sampler(train_dataset)
        return sampler if sampler is not None else super()._get_train_sampler(train_dataset)
