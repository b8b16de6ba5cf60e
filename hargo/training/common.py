"""The LoRA configuration shared by the training stages (SFT, RL, preference, HPC-GPT)."""
from __future__ import annotations

from typing import Mapping

__all__ = ["lora_config"]


def lora_config(lora_params: Mapping):
    """A ``peft.LoraConfig`` for a causal LM from a ``sft.lora`` / ``rl.lora`` params block
    (``enabled, r, alpha, dropout, target_modules``), or ``None`` when ``enabled`` is false
    (full fine-tuning)."""
    if not lora_params.get("enabled", False):
        return None
    from peft import LoraConfig

    targets = lora_params.get("target_modules", "all-linear")
    return LoraConfig(r=int(lora_params["r"]), lora_alpha=float(lora_params["alpha"]),
                      lora_dropout=float(lora_params["dropout"]),
                      target_modules=targets if isinstance(targets, str) else list(targets),
                      bias="none", task_type="CAUSAL_LM")
