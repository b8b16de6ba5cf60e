"""The reference model HARGO's confidence needs (``docs/method.md``): built as TRL 1.16 builds
its own when TRL built none (``beta == 0``), and its per-token log-probs of the sampled
completions -- at the sampling temperature for TRL's KL term and, from the *same* forward pass,
at temperature 1 for the confidence input ``l_i``, for
:class:`~hargo.training.grpo.HargoGRPOTrainer`."""
from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Sequence

import torch
from trl.kernels import ChunkedLogProbFunction
from trl.models.utils import disable_gradient_checkpointing
from trl.trainer.utils import (add_fused_lm_head, create_model_from_path, disable_dropout_in_model,
                               get_config_model_id, use_adapter)

if TYPE_CHECKING:
    from trl import GRPOTrainer

    from hargo.training.grpo import HargoGRPOTrainer

__all__ = ["build_reference_model", "reference_per_token_logps", "lm_head_scaling"]

#: Vocabulary columns per projection tile (TRL 1.16's ``_CHUNKED_LOGPROB_CHUNK_SIZE``).
_VOCAB_CHUNK = 32768


def build_reference_model(trainer: GRPOTrainer):
    """A frozen copy of ``trainer``'s starting model, built as TRL 1.16 builds its reference
    model (for ``trainer.ref_model`` when TRL built none: ``beta == 0``)."""
    args = trainer.args
    kw = dict(args.model_init_kwargs or {})
    kw.setdefault("trust_remote_code", args.trust_remote_code)
    kw.setdefault("dtype", trainer.model.dtype)
    kw.setdefault("attn_implementation", trainer.model.config._attn_implementation)
    ref = create_model_from_path(get_config_model_id(trainer.model.config), **kw)
    if args.disable_dropout:
        disable_dropout_in_model(ref)
    add_fused_lm_head(ref, temperature=trainer.temperature,
                      cast_lm_head_to_fp32=args.cast_lm_head_to_fp32)
    return trainer.accelerator.prepare_model(ref, evaluation_mode=True)


def lm_head_scaling(config) -> tuple[float | None, float]:
    """``(final_logit_softcapping, logit_scale)`` of a causal LM's logits, read from its (text)
    config exactly as TRL 1.16's ``add_fused_lm_head`` reads them (``None``/``1.0``: none; the
    Llama/Qwen2 models hargo trains have neither). Source: ``trl/trainer/utils.py``,
    ``add_fused_lm_head``."""
    text = config.get_text_config()
    softcap = getattr(text, "final_logit_softcapping", None)
    scale = getattr(text, "logit_scale", None)
    if scale is None:
        scale = getattr(text, "output_multiplier", None)
    if scale is None:
        scale = getattr(text, "lm_head_multiplier", None)
    if scale is None and getattr(text, "logits_scaling", None) is not None:
        scale = text.logits_scaling if text.model_type == "hyperclovax" else 1 / text.logits_scaling
    return softcap, 1.0 if scale is None else scale


def _reference_lm(trainer: HargoGRPOTrainer):
    """``(model to call, causal LM inside it, context that makes it the reference)``: the
    separate ``trainer.ref_model``, or the policy with its LoRA adapter off (TRL's ``"ref"``
    adapter when it has one), as TRL 1.16 chooses."""
    if trainer.ref_model is not None:
        return trainer.ref_model, trainer.accelerator.unwrap_model(trainer.ref_model), \
            contextlib.nullcontext()
    peft = trainer.accelerator.unwrap_model(trainer.model)
    name = "ref" if "ref" in getattr(peft, "peft_config", {}) else None
    return trainer.model, peft.get_base_model(), use_adapter(peft, adapter_name=name)


@torch.no_grad()
def reference_per_token_logps(trainer: HargoGRPOTrainer, output: dict,
                              temperatures: Sequence[float] = (1.0,)) -> list[torch.Tensor]:
    """Reference-model log-probs of the completions in ``output``, one reference forward pass
    for all ``temperatures``.

    ``log softmax(z / T)[y_t]`` per completion token, ``z`` the reference model's logits
    (after its softcapping/logit scale, as TRL's fused head), for each ``T`` in
    ``temperatures``. At ``T = trainer.temperature`` the values are TRL 1.16's own reference
    log-probs (the same call TRL makes when ``beta != 0``: its fused LM head at the sampling
    temperature), the input of the KL term. For every other ``T`` the backbone's last hidden
    states of that same pass are projected once more through the LM head, with TRL's chunked
    log-prob kernel (``trl.kernels.ChunkedLogProbFunction``), so no second backbone forward runs.
    ``T = 1`` gives the reference model's own distribution, HARGO's ``l_i`` (``docs/method.md``).

    The reference is ``trainer.ref_model``, or the policy with the LoRA adapter off (TRL's
    ``"ref"`` adapter when it has one).

    Args:
        trainer: the trainer (its ``ref_model``/``model``, ``temperature``, ``args``).
        output: a scored batch with ``prompt_ids``/``prompt_mask`` (B, P) and
            ``completion_ids``/``completion_mask`` (B, T).
        temperatures: the temperatures (> 0) wanted.

    Returns:
        one (B, T) float tensor per temperature, in nats; 0 on padding (as TRL's).

    Raises:
        ValueError: a temperature <= 0.
    """
    temps = [float(t) for t in temperatures]
    if any(t <= 0 for t in temps):
        raise ValueError(f"reference_per_token_logps: temperatures must be > 0, got {temps}")
    sampling_T = float(trainer.temperature)
    call_model, lm, as_reference = _reference_lm(trainer)
    extra = [t for t in dict.fromkeys(temps) if t != sampling_T]
    hidden: list[torch.Tensor] = []
    K = output["completion_ids"].size(1)

    def keep_hidden(_module, _args, out):
        hidden.append(out.last_hidden_state[:, -K - 1:-1])   # the positions predicting y_t

    hook = lm.base_model.register_forward_hook(keep_hidden) if extra else None
    bs = trainer.args.per_device_train_batch_size
    try:
        with disable_gradient_checkpointing(trainer.model,
                                            trainer.args.gradient_checkpointing_kwargs), \
                as_reference:
            at_sampling_T = trainer._completion_logps(call_model, output, batch_size=bs)[0]
    finally:
        if hook is not None:
            hook.remove()
    result = {sampling_T: at_sampling_T}
    if extra:
        h = torch.cat(hidden, dim=0)                          # (B, T, H)
        labels = output["completion_ids"]
        head = lm.get_output_embeddings()
        softcap, scale = lm_head_scaling(lm.config)
        h = h.to(head.weight.device)
        flat = h.reshape(-1, h.size(-1))
        fp32_head = bool(trainer.args.cast_lm_head_to_fp32)
        if fp32_head:
            flat = flat.float()
        valid = output["completion_mask"].to(torch.bool)
        for t in extra:
            with (torch.autocast(flat.device.type, enabled=False) if fp32_head
                  else trainer.accelerator.autocast()):
                lp = ChunkedLogProbFunction.apply(flat, head.weight, head.bias,
                                                  labels.reshape(-1).to(flat.device), t,
                                                  _VOCAB_CHUNK, softcap, scale, ("log_probs",))[0]
            result[t] = lp.view(labels.shape).to(at_sampling_T.device).masked_fill(~valid, 0.0)
    return [result[t] for t in temps]
