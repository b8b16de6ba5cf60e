"""PPO baseline (method ``ppo``): classic PPO with a learned value head, on hargo's GRPO trainer.

TRL 1.16 (pinned) ships no ``PPOTrainer`` any more (moved to ``trl.experimental`` in 1.10, removed
in TRL PR #7020), so :class:`HargoPPOTrainer` extends :class:`hargo.training.grpo.HargoGRPOTrainer`:
TRL's GRPO machinery samples the rollouts, scores them with the shared task reward
(``hargo.rewards.TaskReward`` through ``reward_funcs``) and computes the reference model's
per-token log-probs; the advantage and the loss are replaced by those of TRL's old
``PPOTrainer`` (``AutoModelForCausalLMWithValueHead``, TRL <= 0.x ``ppo_trainer.py``). This
module holds the configuration and the trainer; the math is in :mod:`hargo.losses`:

1. value head ``V = Linear(hidden_size, 1)`` on the policy's last hidden state (shared backbone),
   zero-initialised, so ``V = 0`` before training;
2. per-token rewards (``token_rewards``): ``-beta * (log pi(y_t) - log pi_ref(y_t))`` on each
   completion token (the KL penalty in the reward, TRL PPO's ``kl_coef``; ``rl.ppo.kl_coef``) plus
   the sequence's task reward on its last completion token;
3. GAE (``gae_advantages``, Schulman et al. 2016 eq. 16) with ``gamma``, ``lam`` from the
   detached values; returns ``R = A + V``; advantages whitened over the batch's completion tokens
   (``whiten``) when ``whiten_advantages``;
4. loss = clipped policy surrogate (``clipped_policy_loss``, ``epsilon = rl.clip_range``) +
   ``vf_coef`` x clipped value loss (``clipped_value_loss``), both token-averaged over the
   valid completion tokens of the batch.

The PPO knobs live in params.yaml ``rl.ppo`` (:class:`hargo.method_config.PPOParams`); the shared
settings (G, temperature, clip range, learning rate, LoRA, steps) are ``rl.*`` as for every RL
method.
"""
from __future__ import annotations

import contextlib

import torch
from trl.models.utils import disable_gradient_checkpointing

from hargo.losses import (clipped_policy_loss, clipped_value_loss, explained_variance,
                          gae_advantages, kl_penalty, masked_mean, token_rewards, whiten)
from hargo.method_config import PPOParams
from hargo.training.grpo import HargoGRPOTrainer
from hargo.training.trl_options import unsupported_trl_options

__all__ = ["HargoPPOTrainer", "VALUE_HEAD_NAME"]

#: Attribute name of the value head on the policy module while training (TRL's old ``v_head``).
VALUE_HEAD_NAME = "v_head"


# -------------------------------------------------------------------------------- trainer

class HargoPPOTrainer(HargoGRPOTrainer):
    """PPO with a learned value head on TRL 1.16's GRPO machinery (method ``ppo``).

    Rollouts, task rewards (``reward_funcs``), reference log-probs (when ``rl.ppo.kl_coef != 0``),
    checkpoints and the per-task recorder diagnostics are those of
    :class:`~hargo.training.grpo.HargoGRPOTrainer`. At scoring time one extra no-grad forward of
    the policy gives the rollout log-probs and values; rewards per token
    (:func:`~hargo.losses.token_rewards`), GAE (:func:`~hargo.losses.gae_advantages`) and
    whitening (:func:`~hargo.losses.whiten`, over the whole batch of all processes) follow. The
    recorder receives, per response, the mean of its tokens' advantages. The loss is
    :func:`~hargo.losses.clipped_policy_loss` + ``vf_coef`` x
    :func:`~hargo.losses.clipped_value_loss` (no separate KL term: the KL penalty is in the
    reward).

    One optimizer step per rollout batch: hargo runs ``num_iterations=1`` and
    ``steps_per_generation=1``, so the policy is not updated between the rollout-time forward and
    the loss forward, and the "old" log-probs and values are the detached current ones (up to
    floating-point rounding): the ratio is 1 and neither clip binds on that single update; they
    are kept so the loss is PPO's own. A TRL config that would make more than one update per
    rollout raises ``ValueError`` at construction.

    Value head: ``torch.nn.Linear(hidden_size, 1)``, zero-initialised (``V = 0`` at the start),
    float32, on the policy's last hidden state (the backbone's output, read by a forward hook;
    the value of completion token t is read at the state that predicts it, as TRL's old
    ``PPOTrainer``). It is registered as the submodule ``v_head`` of the policy (the PEFT model
    with LoRA), so the optimizer created in ``train()``, gradient clipping and DDP include it and
    it stays trainable under LoRA; its weights are saved in ``method_state.json`` of every
    checkpoint (a LoRA checkpoint holds only the adapter) and restored on resume. ``train()``
    removes it from the policy when it returns, so the model saved afterwards
    (``hargo.training.loading.save_merged``) is a plain causal LM; it stays available as
    :attr:`value_head`.

    Args:
        *args, **kwargs: as :class:`~hargo.training.grpo.HargoGRPOTrainer` (``method``: a
            method of family ``value``, ``"ppo"``; its ``kl`` estimator, k1, is the one in the
            reward and in ``ppo/kl``).
        ppo_config: the PPO knobs (``rl.ppo``); default ``PPOParams()``.

    Logged beside TRL's metrics (``record_metric``): ``ppo/value_loss``, ``ppo/value_clipfrac``,
    ``ppo/policy_loss``, ``ppo/explained_variance``, ``ppo/value_mean``, ``ppo/return_mean``,
    ``ppo/kl`` (mean ``log pi - log pi_ref`` per token), ``entropy`` and TRL's ``clip_ratio/*``.

    Raises:
        ValueError: not a ``value``-family method; more than one update per rollout (``num_iterations`` or
            ``steps_per_generation`` > 1); a TRL option this loss does not implement.
    """

    family = "value"

    def __init__(self, *args, method: str = "ppo", ppo_config: PPOParams | None = None,
                 **kwargs):
        self.ppo_config = ppo_config or PPOParams()
        self._hidden_chunks: list[torch.Tensor] | None = None
        super().__init__(*args, method=method, **kwargs)
        self._check_ppo_supported()
        lm = self._causal_lm()
        hidden_size = int(lm.config.get_text_config().hidden_size)
        head = torch.nn.Linear(hidden_size, 1)
        torch.nn.init.zeros_(head.weight)
        torch.nn.init.zeros_(head.bias)
        self.value_head = head.to(device=next(lm.parameters()).device, dtype=torch.float32)
        self._attach_value_head()
        backbone = lm.base_model
        if backbone is lm:
            raise ValueError(f"{type(lm).__name__}: no backbone module (base_model_prefix) to "
                             "read the last hidden state from")
        self._hidden_hook = backbone.register_forward_hook(self._on_backbone_output)

    # ------------------------------------------------------------------------ setup

    def _check_ppo_supported(self) -> None:
        a = self.args
        if self.num_iterations != 1 or a.steps_per_generation != 1:
            raise ValueError(f"method ppo: hargo makes one optimizer step per rollout batch; got "
                             f"num_iterations={self.num_iterations}, "
                             f"steps_per_generation={a.steps_per_generation} (need 1 and 1)")
        problems = unsupported_trl_options(self)
        if problems:
            raise ValueError(f"method ppo: the PPO loss does not implement these TRL options: "
                             f"{', '.join(problems)}")

    def _policy_module(self):
        return self.accelerator.unwrap_model(self.model)

    def _causal_lm(self):
        """The causal LM under the policy (inside the PEFT wrapper when LoRA is on)."""
        m = self._policy_module()
        return m.get_base_model() if self._is_peft() else m

    def _attach_value_head(self) -> None:
        policy = self._policy_module()
        if getattr(policy, VALUE_HEAD_NAME, None) is not self.value_head:
            setattr(policy, VALUE_HEAD_NAME, self.value_head)
        self.value_head.requires_grad_(True)

    def _detach_value_head(self) -> None:
        policy = self._policy_module()
        if VALUE_HEAD_NAME in policy._modules:
            delattr(policy, VALUE_HEAD_NAME)

    def train(self, *args, **kwargs):
        """``Trainer.train`` with the value head attached to the policy; removed on return."""
        self._attach_value_head()
        try:
            return super().train(*args, **kwargs)
        finally:
            self._detach_value_head()

    # ------------------------------------------------------------------ value forward

    def _on_backbone_output(self, module, args, output) -> None:
        if self._hidden_chunks is not None:
            h = output.last_hidden_state if hasattr(output, "last_hidden_state") else output[0]
            self._hidden_chunks.append(h)

    @contextlib.contextmanager
    def _capturing_hidden(self):
        self._hidden_chunks = []
        try:
            yield self._hidden_chunks
        finally:
            self._hidden_chunks = None

    def _values(self, chunks: list[torch.Tensor], logits_to_keep: int) -> torch.Tensor:
        """(B, T) values of the completion tokens from the captured (B, P + T, H) hidden states:
        token t's value is read at position ``P + t - 1`` (the state that predicts it)."""
        if not chunks:
            raise RuntimeError("method ppo: the policy forward produced no hidden state")
        hidden = torch.cat(chunks, dim=0)[:, -logits_to_keep - 1:-1]
        w = self.value_head.weight
        return self.value_head(hidden.to(device=w.device, dtype=w.dtype)).squeeze(-1)

    # ---------------------------------------------------------------- advantages

    @torch.no_grad()
    def _rollout_logps_and_values(self, output: dict) -> tuple[torch.Tensor, torch.Tensor]:
        bs = self.args.per_device_train_batch_size
        with disable_gradient_checkpointing(self.model, self.args.gradient_checkpointing_kwargs), \
                self._capturing_hidden() as chunks:
            logps, _, _ = self._completion_logps(self.model, output, batch_size=bs)
        return logps.float(), self._values(chunks, output["completion_ids"].size(1)).float()

    def _response_advantages(self, output: dict, rewards: torch.Tensor, local: slice,
                             mask: torch.Tensor) -> torch.Tensor:
        """Rollout-time PPO scoring of this process's rows (see the class docstring).

        Adds to ``output``: ``old_per_token_logps`` and ``ppo_values`` (rollout-time log-probs
        and values), ``ppo_returns``, and replaces ``advantages`` by the (B_local, T) per-token
        PPO advantages. Returns the (B_total,) per-response mean advantage for the recorder.
        """
        cfg = self.ppo_config
        logps, values = self._rollout_logps_and_values(output)
        scores = rewards[local].to(logps.device).float()
        ref = output.get("ref_per_token_logps")
        r = token_rewards(logps, ref, scores, mask, self.beta, kl=self.spec.kl)
        adv, returns = gae_advantages(r, values, mask, cfg.gamma, cfg.lam)
        if cfg.whiten_advantages:
            adv = whiten(adv, mask, reduce=self._reduce_sum)
        output["old_per_token_logps"] = logps
        output["ppo_values"] = values
        output["ppo_returns"] = returns
        output["advantages"] = adv
        per_response = self.accelerator.gather(masked_mean(adv, mask))
        # TRL logged its group advantages; log the ones the loss uses instead (as HARGO does).
        self.set_logged_advantages(per_response.tolist())
        self.record_metric("ppo/explained_variance",
                           explained_variance(values, returns, mask, reduce=self._reduce_sum))
        self.record_metric("ppo/value_mean", self._global_token_mean(values, mask))
        self.record_metric("ppo/return_mean", self._global_token_mean(returns, mask))
        if ref is not None:
            self.record_metric("ppo/kl", self._global_token_mean(
                kl_penalty(logps, ref.float(), self.spec.kl), mask))
        return per_response.float()

    # ------------------------------------------------------------------------- loss

    def _method_compute_loss(self, model, inputs) -> torch.Tensor:
        """PPO loss on one micro-batch: clipped surrogate + ``vf_coef`` x clipped value loss.

        Batches without PPO scoring (TRL's eval path) get TRL's loss."""
        if "ppo_returns" not in inputs:
            return super()._method_compute_loss(model, inputs)
        cfg = self.ppo_config
        mask = self._loss_mask(inputs)
        with self._capturing_hidden() as chunks:
            logps, entropies, _ = self._completion_logps(model, inputs, compute_entropy=True)
        values = self._values(chunks, inputs["completion_ids"].size(1)).float()
        is_ratio = None
        if self.use_vllm and self.vllm_importance_sampling_correction:
            is_ratio = inputs["importance_sampling_ratio"]
        pg_loss, pg_clip = clipped_policy_loss(logps.float(), inputs["old_per_token_logps"],
                                               inputs["advantages"], mask, self.epsilon_low,
                                               self.epsilon_high, token_weights=is_ratio)
        vf_loss, vf_clip = clipped_value_loss(values, inputs["ppo_values"], inputs["ppo_returns"],
                                              mask, cfg.cliprange_value)
        loss = pg_loss + cfg.vf_coef * vf_loss
        mode = "train" if self.model.training else "eval"
        if mode == "train":
            loss = loss / self.current_gradient_accumulation_steps
        avg = lambda x: float(self._reduce_sum(x.detach().reshape(1).float())[0]  # noqa: E731
                              / self.accelerator.num_processes)
        for name, value in (("ppo/policy_loss", avg(pg_loss)), ("ppo/value_loss", avg(vf_loss)),
                            ("ppo/value_clipfrac", avg(vf_clip)),
                            ("clip_ratio/region_mean", avg(pg_clip)),
                            ("entropy", self._global_token_mean(entropies, mask))):
            self.record_metric(name, value, mode)
        return loss

    # ------------------------------------------------------------------ checkpoints

    def method_state_dict(self) -> dict:
        """The parent's state plus the value head's weights (``value_head``: ``weight`` as a
        list of ``hidden_size`` floats, ``bias`` one float)."""
        state = super().method_state_dict()
        state["value_head"] = {"weight": self.value_head.weight.detach().cpu().reshape(-1).tolist(),
                               "bias": float(self.value_head.bias.detach().cpu()[0])}
        return state

    def load_method_state(self, state: dict) -> None:
        """Restore :meth:`method_state_dict` output, the value head included.

        Raises:
            ValueError: another method's checkpoint, or no/ill-shaped ``value_head``.
        """
        super().load_method_state(state)
        vh = state.get("value_head")
        n = self.value_head.weight.numel()
        if not isinstance(vh, dict) or len(vh.get("weight") or []) != n:
            raise ValueError(f"checkpoint method_state.json: value_head missing or not {n} weights")
        with torch.no_grad():
            w = self.value_head.weight
            w.copy_(torch.tensor(vh["weight"], dtype=w.dtype, device=w.device).reshape(w.shape))
            self.value_head.bias.fill_(float(vh["bias"]))
