"""The reference model HARGO's confidence needs (``docs/method.md``), as pure functions over a
model, tensors and plain values (no trainer): the reference model built as TRL 1.16 builds its
own when TRL built none (``beta == 0``), which model to call as the reference, and the per-token
log-probs of the sampled completions at more temperatures from the last hidden states of *one*
reference forward pass (:func:`logps_at_temperatures`). The trainer that drives them,
:meth:`hargo.training.grpo.HargoGRPOTrainer._reference_logps`, lives in ``grpo.py``."""
from __future__ import annotations

import contextlib
from typing import Callable, Sequence

import torch
from trl.kernels import ChunkedLogProbFunction
from trl.trainer.utils import (add_fused_lm_head, create_model_from_path, disable_dropout_in_model,
                               get_config_model_id, use_adapter)

__all__ = ["build_reference_model", "reference_lm", "is_reference_call", "logps_at_temperatures",
           "lm_head_scaling", "check_temperatures"]

#: Vocabulary columns per projection tile (TRL 1.16's ``_CHUNKED_LOGPROB_CHUNK_SIZE``).
_VOCAB_CHUNK = 32768


def build_reference_model(args, model, temperature: float, accelerator):
    """A frozen copy of ``model``'s starting weights, built as TRL 1.16's ``GRPOTrainer`` builds
    its reference model (for the trainer's ``ref_model`` when TRL built none: ``beta == 0``).

    Args:
        args: the trainer's ``GRPOConfig`` (``model_init_kwargs``, ``trust_remote_code``,
            ``disable_dropout``, ``cast_lm_head_to_fp32``).
        model: the policy; its config names the checkpoint (a local folder or a hub model id)
            and gives the default dtype and attention implementation.
        temperature: the sampling temperature, for TRL's fused LM head.
        accelerator: the trainer's ``accelerate.Accelerator``; the copy is prepared on its
            device for evaluation.

    Returns:
        the prepared reference model.
    """
    kw = dict(args.model_init_kwargs or {})
    kw.setdefault("trust_remote_code", args.trust_remote_code)
    kw.setdefault("dtype", model.dtype)
    kw.setdefault("attn_implementation", model.config._attn_implementation)
    ref = create_model_from_path(get_config_model_id(model.config), **kw)
    if args.disable_dropout:
        disable_dropout_in_model(ref)
    add_fused_lm_head(ref, temperature=temperature,
                      cast_lm_head_to_fp32=args.cast_lm_head_to_fp32)
    return accelerator.prepare_model(ref, evaluation_mode=True)


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


def reference_lm(ref_model, model, unwrap: Callable):
    """``(model to call, causal LM inside it, context that makes it the reference)``: the
    separate ``ref_model`` when there is one, else the policy ``model`` with its LoRA adapter off
    (TRL's ``"ref"`` adapter when it has one), as TRL 1.16 chooses. ``unwrap`` is the
    accelerator's ``unwrap_model``."""
    if ref_model is not None:
        return ref_model, unwrap(ref_model), contextlib.nullcontext()
    peft = unwrap(model)
    name = "ref" if "ref" in getattr(peft, "peft_config", {}) else None
    return model, peft.get_base_model(), use_adapter(peft, adapter_name=name)


def is_reference_call(model, ref_model, unwrap: Callable) -> bool:
    """Whether calling ``model`` now computes the reference model's log-probs, as TRL 1.16's
    reference pass calls it (:func:`reference_lm`): ``model`` is the separate ``ref_model``
    when there is one; else it is the PEFT policy with TRL's ``"ref"`` adapter active, or with
    its adapters switched off (PEFT's ``has_active_enabled_adapter`` is False inside
    ``disable_adapter()``). ``unwrap`` is the accelerator's ``unwrap_model``."""
    if ref_model is not None:
        return model is ref_model
    peft = unwrap(model)
    configs = getattr(peft, "peft_config", None)
    if not configs:
        return False
    if "ref" in configs:
        return peft.active_adapter == "ref"
    return not peft.has_active_enabled_adapter


def check_temperatures(temperatures: Sequence[float]) -> list[float]:
    """``temperatures`` as floats.

    Raises:
        ValueError: a temperature <= 0.
    """
    temps = [float(t) for t in temperatures]
    if any(t <= 0 for t in temps):
        raise ValueError(f"reference log-probs: temperatures must be > 0, got {temps}")
    return temps


def logps_at_temperatures(hidden: torch.Tensor, head: torch.nn.Module, labels: torch.Tensor,
                          mask: torch.Tensor, temperatures: Sequence[float],
                          softcap: float | None = None, scale: float = 1.0,
                          fp32_head: bool = False,
                          autocast: Callable[[], contextlib.AbstractContextManager] | None = None
                          ) -> list[torch.Tensor]:
    """Per-token log-probs ``log softmax(z / T)[y_t]`` of ``labels`` for each ``T``, from the
    hidden states that predict them, ``z`` the LM ``head``'s logits of ``hidden`` (times
    ``scale``, then softcapped by ``softcap`` when set, as TRL 1.16's fused LM head).

    The projection runs in vocabulary tiles with TRL's chunked log-prob kernel
    (``trl.kernels.ChunkedLogProbFunction``), so the (B, T, V) logits never exist at once;
    ``T = 1`` gives the model's own distribution (HARGO's ``l_i``, ``docs/method.md``).

    Args:
        hidden: (B, T, H) last hidden states at the positions predicting ``labels``.
        head: the output embedding (``weight`` (V, H), ``bias`` (V,) or None).
        labels: (B, T) token ids.
        mask: (B, T) 1 on completion tokens, 0 on padding.
        temperatures: the temperatures (> 0).
        softcap, scale: :func:`lm_head_scaling` of the model.
        fp32_head: project in float32 with autocast off (``GRPOConfig.cast_lm_head_to_fp32``).
        autocast: a context factory for the projection when not ``fp32_head`` (the
            accelerator's ``autocast``); None: no context.

    Returns:
        one (B, T) float tensor per temperature, in nats; 0 on padding (as TRL's).

    Raises:
        ValueError: a temperature <= 0.
    """
    temps = check_temperatures(temperatures)
    h = hidden.to(head.weight.device)
    flat = h.reshape(-1, h.size(-1))
    if fp32_head:
        flat = flat.float()
    valid = mask.to(torch.bool)
    out = []
    for t in temps:
        if fp32_head:
            ctx = torch.autocast(flat.device.type, enabled=False)
        else:
            ctx = autocast() if autocast is not None else contextlib.nullcontext()
        with ctx:
            lp = ChunkedLogProbFunction.apply(flat, head.weight, head.bias,
                                              labels.reshape(-1).to(flat.device), t,
                                              _VOCAB_CHUNK, softcap, scale, ("log_probs",))[0]
        out.append(lp.view(labels.shape).masked_fill(~valid.to(lp.device), 0.0))
    return out
