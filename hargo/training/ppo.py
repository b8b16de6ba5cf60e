"""PPO baseline (method ``ppo``): classic PPO with a learned value head, on hargo's GRPO trainer.

TRL 1.16 (pinned) ships no ``PPOTrainer`` any more (moved to ``trl.experimental`` in 1.10, removed
in TRL PR #7020), so :class:`HargoPPOTrainer` extends :class:`hargo.training.grpo.HargoGRPOTrainer`:
TRL's GRPO machinery samples the rollouts, scores them with the shared task reward
(``hargo.rewards.TaskReward`` through ``reward_funcs``) and computes the reference model's
per-token log-probs; the advantage and the loss are replaced by those of TRL's old
``PPOTrainer`` (``AutoModelForCausalLMWithValueHead``, TRL <= 0.x ``ppo_trainer.py``):

1. value head ``V = Linear(hidden_size, 1)`` on the policy's last hidden state (shared backbone),
   zero-initialised, so ``V = 0`` before training;
2. per-token rewards (:func:`token_rewards`): ``-beta * (log pi(y_t) - log pi_ref(y_t))`` on each
   completion token (the KL penalty in the reward, TRL PPO's ``kl_coef``; ``beta = rl.beta``) plus
   the sequence's task reward on its last completion token;
3. GAE (:func:`gae_advantages`, Schulman et al. 2016 eq. 16) with ``gamma``, ``lam`` from the
   detached values; returns ``R = A + V``; advantages whitened over the batch's completion tokens
   (:func:`whiten`) when ``whiten_advantages``;
4. loss = clipped policy surrogate (:func:`clipped_policy_loss`, ``epsilon = rl.clip_range``) +
   ``vf_coef`` x clipped value loss (:func:`clipped_value_loss`), both token-averaged over the
   valid completion tokens of the batch.

The PPO knobs live in params.yaml ``compare.ppo`` (:class:`PPOConfig`); the other settings (G,
temperature, beta, clip range, learning rate, LoRA, steps) are ``rl.*`` as for every RL method.
"""
from __future__ import annotations

import contextlib
from dataclasses import asdict, dataclass
from typing import Any, Callable, Mapping

import torch
from trl.models.utils import disable_gradient_checkpointing

from hargo.advantages import masked_mean
from hargo.params import ParamsError
from hargo.training.grpo import HargoGRPOTrainer

__all__ = ["PPOConfig", "token_rewards", "gae_advantages", "whiten", "clipped_policy_loss",
           "clipped_value_loss", "explained_variance", "HargoPPOTrainer", "VALUE_HEAD_NAME"]

#: Attribute name of the value head on the policy module while training (TRL's old ``v_head``).
VALUE_HEAD_NAME = "v_head"
#: TRL's ``masked_whiten``: ``(x - mean) * rsqrt(var + 1e-8)``.
WHITEN_EPS = 1e-8

Reduce = Callable[[torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class PPOConfig:
    """PPO constants (params.yaml ``compare.ppo``; defaults are the committed values).

    Attributes:
        vf_coef: weight of the value loss in the total loss (TRL's old ``PPOConfig`` default 0.1).
        gamma: discount over completion tokens, in [0, 1].
        lam: GAE lambda, in [0, 1].
        cliprange_value: the value prediction may move at most this far from the rollout's value
            before its loss is clipped (> 0).
        whiten_advantages: whiten the advantages over the batch's completion tokens.

    Raises:
        ValueError: a value out of range (names the field).
    """

    vf_coef: float = 0.1
    gamma: float = 1.0
    lam: float = 0.95
    cliprange_value: float = 0.2
    whiten_advantages: bool = True

    def __post_init__(self):
        if not self.vf_coef >= 0:
            raise ValueError(f"compare.ppo.vf_coef: must be >= 0, got {self.vf_coef}")
        for name in ("gamma", "lam"):
            v = getattr(self, name)
            if not 0.0 <= v <= 1.0:
                raise ValueError(f"compare.ppo.{name}: must be in [0, 1], got {v}")
        if not self.cliprange_value > 0:
            raise ValueError(f"compare.ppo.cliprange_value: must be > 0, got "
                             f"{self.cliprange_value}")

    @classmethod
    def from_params(cls, params: Mapping) -> "PPOConfig":
        """Read ``params["compare"]["ppo"]`` (the whole params dict: ``rl.methods: [ppo]`` in the
        plain rl stage reads the same block).

        Raises:
            ParamsError: the block or one of its keys is missing, or a value has the wrong type
                or range (names ``compare.ppo.<key>``).
        """
        block = (params.get("compare") or {}).get("ppo")
        if not isinstance(block, Mapping):
            raise ParamsError("compare.ppo: missing (vf_coef, gamma, lam, cliprange_value, "
                              "whiten_advantages); method ppo needs it")
        kw: dict[str, Any] = {}
        for name in ("vf_coef", "gamma", "lam", "cliprange_value"):
            v = block.get(name)
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise ParamsError(f"compare.ppo.{name}: expected a number, got {v!r}")
            kw[name] = float(v)
        if not isinstance(block.get("whiten_advantages"), bool):
            raise ParamsError(f"compare.ppo.whiten_advantages: expected true or false, got "
                              f"{block.get('whiten_advantages')!r}")
        kw["whiten_advantages"] = block["whiten_advantages"]
        try:
            return cls(**kw)
        except ValueError as e:
            raise ParamsError(str(e)) from e

    def to_dict(self) -> dict:
        return asdict(self)


# ------------------------------------------------------------------------------ pure math

def _check_bt(name: str, x: torch.Tensor, mask: torch.Tensor) -> None:
    if x.dim() != 2 or x.shape != mask.shape:
        raise ValueError(f"{name}: expected (B, T) tensors of one shape, got {tuple(x.shape)} and "
                         f"mask {tuple(mask.shape)}")


def _token_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Scalar mean of ``x`` over the valid tokens of the whole batch (0 when none)."""
    m = mask.to(torch.bool)
    xs = torch.where(m, x, torch.zeros((), dtype=x.dtype, device=x.device))
    return xs.sum() / m.sum().clamp(min=1).to(x.dtype)


def token_rewards(logps: torch.Tensor, ref_logps: torch.Tensor | None, scores: torch.Tensor,
                  mask: torch.Tensor, beta: float) -> torch.Tensor:
    """Per-token PPO rewards: KL penalty on every token plus the task reward on the last one.

    ``r_t = -beta * (logps_t - ref_logps_t)`` on each valid completion token (TRL's old
    ``PPOTrainer``: ``non_score_reward = -kl_coef * (logprobs - ref_logprobs)``), plus
    ``scores[b]`` added on row ``b``'s last valid token (``rewards[[range(B), last]] += scores``).

    Args:
        logps: (B, T) policy log-probs of the sampled completion tokens (rollout time).
        ref_logps: (B, T) reference-model log-probs of the same tokens; may be None when
            ``beta == 0`` (no KL penalty).
        scores: (B,) sequence (task) rewards.
        mask: (B, T) nonzero/True on valid completion tokens (padding excluded).
        beta: KL coefficient (``rl.beta``); 0 gives no KL term.

    Returns:
        (B, T) float32 rewards, 0 on masked positions. A row with no valid token gets no reward
        at all (its score has no token to sit on).

    Raises:
        ValueError: shapes disagree, or ``beta != 0`` without ``ref_logps``.
    """
    _check_bt("token_rewards", logps, mask)
    if scores.shape != (logps.size(0),):
        raise ValueError(f"token_rewards: scores {tuple(scores.shape)} must be ({logps.size(0)},)")
    m = mask.to(torch.bool)
    rewards = torch.zeros(logps.shape, dtype=torch.float32, device=logps.device)
    if beta != 0.0:
        if ref_logps is None:
            raise ValueError("token_rewards: beta != 0 needs the reference log-probs")
        _check_bt("token_rewards", ref_logps, mask)
        kl = logps.float() - ref_logps.float()
        rewards = torch.where(m, -beta * kl, rewards)
    T = logps.size(1)
    positions = torch.arange(T, device=logps.device).expand_as(m)
    last = torch.where(m, positions, torch.full_like(positions, -1)).max(dim=1).values  # (B,)
    has = last >= 0
    rows = torch.arange(logps.size(0), device=logps.device)[has]
    rewards[rows, last[has]] += scores.to(rewards.device).float()[has]
    return rewards


def gae_advantages(rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float,
                   lam: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalized advantage estimation over completion tokens.

    Schulman et al. 2016, "High-Dimensional Continuous Control Using Generalized Advantage
    Estimation", eq. 16: ``delta_t = r_t + gamma V_{t+1} - V_t``, ``A_t = sum_l (gamma lam)^l
    delta_{t+l}``, computed backwards as ``A_t = delta_t + gamma lam A_{t+1}``, with ``V = 0`` and
    ``A = 0`` after the last valid token; returns ``R_t = A_t + V_t`` (TRL's old ``PPOTrainer``,
    "compute advantages and returns"). Masked positions are skipped: the recursion runs over each
    row's valid tokens in order, so right padding (and any masked hole) changes nothing.

    Args:
        rewards: (B, T) per-token rewards (:func:`token_rewards`).
        values: (B, T) value estimates ``V_t`` of the state before token t (detached).
        mask: (B, T) nonzero/True on valid completion tokens.
        gamma: discount in [0, 1].
        lam: GAE lambda in [0, 1].

    Returns:
        ``(advantages, returns)``, both (B, T) float32, 0 on masked positions.

    Raises:
        ValueError: shapes disagree.
    """
    _check_bt("gae_advantages", rewards, mask)
    _check_bt("gae_advantages", values, mask)
    r, v, m = rewards.float(), values.float(), mask.to(torch.bool)
    B, T = r.shape
    adv = torch.zeros_like(v)
    next_value = v.new_zeros(B)
    next_adv = v.new_zeros(B)
    for t in reversed(range(T)):
        valid = m[:, t]
        a = r[:, t] + gamma * next_value - v[:, t] + gamma * lam * next_adv
        adv[:, t] = torch.where(valid, a, torch.zeros_like(a))
        next_value = torch.where(valid, v[:, t], next_value)
        next_adv = torch.where(valid, a, next_adv)
    returns = torch.where(m, adv + v, torch.zeros_like(v))
    return adv, returns


def _identity(t: torch.Tensor) -> torch.Tensor:
    return t


def whiten(x: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True,
           reduce: Reduce | None = None) -> torch.Tensor:
    """Whiten ``x`` over the valid tokens of the batch: ``(x - mean) / sqrt(var + 1e-8)``.

    TRL's old ``masked_whiten``: mean and *unbiased* (n - 1) variance over the valid tokens; with
    ``shift_mean=False`` the mean is added back.

    Args:
        x: (B, T) values.
        mask: (B, T) nonzero/True on valid tokens.
        shift_mean: subtract the mean (True) or only rescale (False).
        reduce: sums the given statistics tensor over processes (e.g. ``accelerator.reduce(t,
            "sum")``) so that several processes whiten with the statistics of the whole batch;
            None: this batch alone.

    Returns:
        (B, T) float32, 0 on masked positions.

    Raises:
        ValueError: shapes disagree, or fewer than 2 valid tokens (no variance).
    """
    _check_bt("whiten", x, mask)
    reduce = reduce or _identity
    m = mask.to(torch.bool)
    xs = torch.where(m, x.float(), torch.zeros((), device=x.device))
    totals = reduce(torch.stack([xs.sum(), m.sum().float()]))
    n = float(totals[1])
    if n < 2:
        raise ValueError(f"whiten: needs at least 2 valid tokens, got {n:g}")
    mean = totals[0] / totals[1]
    centered = torch.where(m, xs - mean, torch.zeros((), device=x.device))
    var = reduce((centered ** 2).sum().reshape(1))[0] / (totals[1] - 1)
    out = centered * torch.rsqrt(var + WHITEN_EPS)
    if not shift_mean:
        out = out + mean
    return torch.where(m, out, torch.zeros((), device=x.device))


def clipped_policy_loss(logps: torch.Tensor, old_logps: torch.Tensor, advantages: torch.Tensor,
                        mask: torch.Tensor, clip_low: float, clip_high: float | None = None,
                        token_weights: torch.Tensor | None = None
                        ) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO's clipped surrogate, token-averaged over the batch's valid tokens.

    ``rho = exp(logps - old_logps)``; per token ``max(-A rho, -A clip(rho, 1 - clip_low,
    1 + clip_high))`` (Schulman et al. 2017, eq. 7, as a loss; TRL's old ``PPOTrainer``
    ``pg_loss``).

    Args:
        logps: (B, T) policy log-probs (with grad).
        old_logps: (B, T) rollout-time log-probs (detached).
        advantages: (B, T) per-token advantages.
        mask: (B, T) valid tokens.
        clip_low, clip_high: clip range (``clip_high`` defaults to ``clip_low``).
        token_weights: optional (B, T) or (B, 1) factors on the per-token loss (TRL's vLLM
            importance-sampling ratio).

    Returns:
        ``(loss, clip_fraction)``: scalars; the clip fraction is the share of valid tokens whose
        clipped term is the larger one.
    """
    _check_bt("clipped_policy_loss", logps, mask)
    clip_high = clip_low if clip_high is None else clip_high
    ratio = torch.exp(logps - old_logps)
    loss1 = -advantages * ratio
    loss2 = -advantages * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    per_token = torch.max(loss1, loss2)
    if token_weights is not None:
        per_token = per_token * token_weights
    return _token_mean(per_token, mask), _token_mean((loss2 > loss1).float(), mask)


def clipped_value_loss(values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor,
                       mask: torch.Tensor, cliprange_value: float
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO's clipped value loss, token-averaged over the batch's valid tokens.

    ``0.5 * max((V - R)^2, (clip(V, V_old - c, V_old + c) - R)^2)`` (TRL's old ``PPOTrainer``
    ``vf_loss``; ``c = cliprange_value``).

    Args:
        values: (B, T) value predictions (with grad).
        old_values: (B, T) rollout-time values (detached).
        returns: (B, T) GAE returns.
        mask: (B, T) valid tokens.
        cliprange_value: ``c`` (> 0).

    Returns:
        ``(loss, clip_fraction)``: scalars; the clip fraction is the share of valid tokens whose
        clipped term is the larger one.
    """
    _check_bt("clipped_value_loss", values, mask)
    clipped = torch.clamp(values, old_values - cliprange_value, old_values + cliprange_value)
    loss1 = (values - returns) ** 2
    loss2 = (clipped - returns) ** 2
    loss = 0.5 * _token_mean(torch.max(loss1, loss2), mask)
    return loss, _token_mean((loss2 > loss1).float(), mask)


def explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor,
                       reduce: Reduce | None = None) -> float:
    """``1 - Var(R - V) / Var(R)`` over the valid tokens (population variances); 1 is a perfect
    value function, 0 no better than the mean return. NaN when ``Var(R) = 0``.

    Args: (B, T) ``values``, ``returns``, ``mask``; ``reduce`` as in :func:`whiten`.
    """
    _check_bt("explained_variance", values, mask)
    reduce = reduce or _identity
    m = mask.to(torch.bool)
    z = torch.zeros((), device=values.device)
    r = torch.where(m, returns.float(), z)
    d = torch.where(m, returns.float() - values.float(), z)
    s = reduce(torch.stack([r.sum(), (r ** 2).sum(), d.sum(), (d ** 2).sum(),
                            m.sum().float()]).double())
    n = float(s[4])
    if n < 1:
        return float("nan")
    var_r = float(s[1]) / n - (float(s[0]) / n) ** 2
    var_d = float(s[3]) / n - (float(s[2]) / n) ** 2
    return float("nan") if var_r <= 0 else 1.0 - var_d / var_r


# -------------------------------------------------------------------------------- trainer

class HargoPPOTrainer(HargoGRPOTrainer):
    """PPO with a learned value head on TRL 1.16's GRPO machinery (method ``ppo``).

    Rollouts, task rewards (``reward_funcs``), reference log-probs (when ``rl.beta != 0``),
    checkpoints and the per-task recorder diagnostics are those of
    :class:`~hargo.training.grpo.HargoGRPOTrainer`. At scoring time one extra no-grad forward of
    the policy gives the rollout log-probs and values; rewards per token
    (:func:`token_rewards`), GAE (:func:`gae_advantages`) and whitening (:func:`whiten`, over the
    whole batch of all processes) follow. The recorder receives, per response, the mean of its
    tokens' advantages. The loss is :func:`clipped_policy_loss` + ``vf_coef`` x
    :func:`clipped_value_loss` (no separate KL term: the KL penalty is in the reward).

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
    it stays trainable under LoRA; its weights are saved in ``hargo_state.json`` of every
    checkpoint (a LoRA checkpoint holds only the adapter) and restored on resume. ``train()``
    removes it from the policy when it returns, so the model saved afterwards
    (``hargo.training.common.save_merged``) is a plain causal LM; it stays available as
    :attr:`value_head`.

    Args:
        *args, **kwargs: as :class:`~hargo.training.grpo.HargoGRPOTrainer` (``method`` must be
            ``"ppo"``).
        ppo_config: the PPO constants; default ``PPOConfig()``.

    Logged into TRL's metrics (``self._metrics``): ``ppo/value_loss``, ``ppo/value_clipfrac``,
    ``ppo/policy_loss``, ``ppo/explained_variance``, ``ppo/value_mean``, ``ppo/return_mean``,
    ``ppo/kl`` (mean ``log pi - log pi_ref`` per token), ``entropy`` and TRL's ``clip_ratio/*``.

    Raises:
        ValueError: method not ``ppo``; more than one update per rollout (``num_iterations`` or
            ``steps_per_generation`` > 1); a TRL option this loss does not implement.
    """

    accepted_methods = ("ppo",)

    def __init__(self, *args, method: str = "ppo", ppo_config: PPOConfig | None = None,
                 **kwargs):
        self.ppo_config = ppo_config or PPOConfig()
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
        problems = self._unsupported_trl_options()
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

    def _reduce_sum(self, t: torch.Tensor) -> torch.Tensor:
        return self.accelerator.reduce(t, reduction="sum")

    def _global_token_mean(self, x: torch.Tensor, mask: torch.Tensor) -> float:
        m = mask.to(torch.bool)
        xs = torch.where(m, x.detach().float(), torch.zeros((), device=x.device))
        totals = self._reduce_sum(torch.stack([xs.sum(), m.sum().float()]))
        return float(totals[0] / totals[1].clamp(min=1.0))

    # ---------------------------------------------------------------- advantages

    @torch.no_grad()
    def _rollout_logps_and_values(self, output: dict) -> tuple[torch.Tensor, torch.Tensor]:
        ids = torch.cat([output["prompt_ids"], output["completion_ids"]], dim=1)
        attn = torch.cat([output["prompt_mask"], output["completion_mask"]], dim=1)
        keep = output["completion_ids"].size(1)
        bs = self.args.per_device_train_batch_size
        with disable_gradient_checkpointing(self.model, self.args.gradient_checkpointing_kwargs), \
                self._capturing_hidden() as chunks:
            logps, _, _ = self._get_per_token_logps_and_entropies(self.model, ids, attn, keep,
                                                                  batch_size=bs)
        return logps.float(), self._values(chunks, keep).float()

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
        r = token_rewards(logps, ref, scores, mask, self.beta)
        adv, returns = gae_advantages(r, values, mask, cfg.gamma, cfg.lam)
        if cfg.whiten_advantages:
            adv = whiten(adv, mask, reduce=self._reduce_sum)
        output["old_per_token_logps"] = logps
        output["ppo_values"] = values
        output["ppo_returns"] = returns
        output["advantages"] = adv
        per_response = self.accelerator.gather(masked_mean(adv, mask))
        # TRL logged its group advantages; log the ones the loss uses instead (as HARGO does).
        self._logs["advantages"].clear()
        self._logs["advantages"].extend(per_response.tolist())
        metrics = self._metrics["train"]
        metrics["ppo/explained_variance"].append(
            explained_variance(values, returns, mask, reduce=self._reduce_sum))
        metrics["ppo/value_mean"].append(self._global_token_mean(values, mask))
        metrics["ppo/return_mean"].append(self._global_token_mean(returns, mask))
        if ref is not None:
            metrics["ppo/kl"].append(self._global_token_mean(logps - ref.float(), mask))
        return per_response.float()

    # ------------------------------------------------------------------------- loss

    def _method_compute_loss(self, model, inputs) -> torch.Tensor:
        """PPO loss on one micro-batch: clipped surrogate + ``vf_coef`` x clipped value loss.

        Batches without PPO scoring (TRL's eval path) get TRL's loss."""
        if "ppo_returns" not in inputs:
            return super()._method_compute_loss(model, inputs)
        cfg = self.ppo_config
        prompt_ids, completion_ids = inputs["prompt_ids"], inputs["completion_ids"]
        input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
        attention_mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
        keep = completion_ids.size(1)
        mask = inputs["completion_mask"]
        if "tool_mask" in inputs:
            mask = mask * inputs["tool_mask"]
        with self._capturing_hidden() as chunks:
            logps, entropies, _ = self._get_per_token_logps_and_entropies(
                model, input_ids, attention_mask, keep, compute_entropy=True)
        values = self._values(chunks, keep).float()
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
        m = self._metrics[mode]
        avg = lambda x: float(self._reduce_sum(x.detach().reshape(1).float())[0]  # noqa: E731
                              / self.accelerator.num_processes)
        m["ppo/policy_loss"].append(avg(pg_loss))
        m["ppo/value_loss"].append(avg(vf_loss))
        m["ppo/value_clipfrac"].append(avg(vf_clip))
        m["clip_ratio/region_mean"].append(avg(pg_clip))
        m["entropy"].append(self._global_token_mean(entropies, mask))
        return loss

    # ------------------------------------------------------------------ checkpoints

    def hargo_state_dict(self) -> dict:
        """The parent's state plus the value head's weights (``value_head``: ``weight`` as a
        list of ``hidden_size`` floats, ``bias`` one float)."""
        state = super().hargo_state_dict()
        state["value_head"] = {"weight": self.value_head.weight.detach().cpu().reshape(-1).tolist(),
                               "bias": float(self.value_head.bias.detach().cpu()[0])}
        return state

    def load_hargo_state(self, state: dict) -> None:
        """Restore :meth:`hargo_state_dict` output, the value head included.

        Raises:
            ValueError: another method's checkpoint, or no/ill-shaped ``value_head``.
        """
        super().load_hargo_state(state)
        vh = state.get("value_head")
        n = self.value_head.weight.numel()
        if not isinstance(vh, dict) or len(vh.get("weight") or []) != n:
            raise ValueError(f"checkpoint hargo_state.json: value_head missing or not {n} weights")
        with torch.no_grad():
            w = self.value_head.weight
            w.copy_(torch.tensor(vh["weight"], dtype=w.dtype, device=w.device).reshape(w.shape))
            self.value_head.bias.fill_(float(vh["bias"]))
