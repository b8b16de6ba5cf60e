"""Every private TRL 1.16 / transformers 5.19 method hargo overrides, in one module.

TRL and transformers give no public hook for these steps; each override here is a short method
that calls hargo's own (public) trainer method and, where it wraps, the original through
``super()``. Why each is needed and the signature it was written against are declared in
:data:`hargo.training.trl_seam.OVERRIDES` (checked against the installed TRL when an RL trainer
is built, and in ``tests/test_trl_seam.py``, which also checks that no hargo class outside this
module overrides a private upstream method). The mixins go first among a trainer's bases:

:class:`GRPOOverrides`
    TRL 1.16's ``GRPOTrainer``: :class:`hargo.training.grpo.HargoGRPOTrainer` (and so
    :class:`hargo.training.ppo.HargoPPOTrainer`).
:class:`SFTOverrides`
    transformers 5.19's ``Trainer`` under TRL's ``SFTTrainer``: the SFT stage's length-bucketed
    trainer (:mod:`hargo.training.sft`).

Where a public hook serves, hargo uses it instead of a private override: ``Trainer.compute_loss``
(the method's loss, :class:`hargo.training.grpo_loss.GroupWeightedLossMixin`), ``Trainer.train``
(``method_state.json`` restored before training resumes) and a ``TrainerCallback``'s
``on_epoch_begin`` (the sampler's epoch; both :mod:`hargo.training.resume`).

Nothing is imported here: the SFT stage imports this module before TRL is loaded.
"""
from __future__ import annotations

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

    # ------------------------------------------------------------------ resume, checkpoints

    def _get_train_sampler(self, dataset=None):
        return self.train_sampler(dataset)

    def _save_checkpoint(self, model, trial):
        self.write_method_state(trial)   # before transformers' trainer_state.json (last)
        super()._save_checkpoint(model, trial)


class SFTOverrides:
    """The private transformers ``Trainer`` (5.19) method the SFT stage's trainer overrides."""

    def _get_train_sampler(self, train_dataset=None):
        sampler = self.length_bucket_sampler(train_dataset)
        return sampler if sampler is not None else super()._get_train_sampler(train_dataset)
