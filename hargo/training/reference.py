"""The reference model HARGO's confidence needs (``docs/method.md``): built as TRL 1.16 builds
its own when TRL built none (``beta == 0``), and its per-token log-probs of the sampled
completions, for :class:`~hargo.training.grpo.HargoGRPOTrainer`."""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from trl.models.utils import disable_gradient_checkpointing
from trl.trainer.utils import (add_fused_lm_head, create_model_from_path, disable_dropout_in_model,
                               get_config_model_id, use_adapter)

if TYPE_CHECKING:
    from trl import GRPOTrainer

    from hargo.training.grpo import HargoGRPOTrainer

__all__ = ["build_reference_model", "reference_per_token_logps"]


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


@torch.no_grad()
def reference_per_token_logps(trainer: HargoGRPOTrainer, output: dict) -> torch.Tensor:
    """(B_local, T) reference-model log-probs of the completions in ``output`` (as TRL 1.16
    computes them when beta != 0): ``trainer.ref_model``, or the policy with the LoRA adapter off
    (TRL's ``"ref"`` adapter when it has one)."""
    bs = trainer.args.per_device_train_batch_size
    with disable_gradient_checkpointing(trainer.model, trainer.args.gradient_checkpointing_kwargs):
        if trainer.ref_model is not None:
            return trainer._completion_logps(trainer.ref_model, output, batch_size=bs)[0]
        model = trainer.accelerator.unwrap_model(trainer.model)
        name = "ref" if "ref" in getattr(model, "peft_config", {}) else None
        with use_adapter(model, adapter_name=name):
            return trainer._completion_logps(trainer.model, output, batch_size=bs)[0]
