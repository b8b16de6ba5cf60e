"""The LoRA configuration shared by the training stages (SFT, RL, preference, HPC-GPT)."""
from __future__ import annotations

from types import SimpleNamespace
from typing import TYPE_CHECKING, Mapping

if TYPE_CHECKING:
    from hargo.config import Lora

__all__ = ["lora_config"]


def lora_config(lora: "Lora | Mapping"):
    """A ``peft.LoraConfig`` for a causal LM from a ``sft.lora`` / ``rl.lora`` block (the typed
    :class:`hargo.config.Lora`, or a mapping with ``enabled, r, alpha, dropout,
    target_modules``: ``enabled`` missing is false, ``target_modules`` missing is
    ``all-linear``), or ``None`` when ``enabled`` is false (full fine-tuning)."""
    if isinstance(lora, Mapping):   # a params block: its keys as the typed block's fields
        lora = SimpleNamespace(**{"enabled": False, "target_modules": "all-linear", **lora})
    if not lora.enabled:
        return None
    from peft import LoraConfig

    targets = lora.target_modules
    return LoraConfig(r=int(lora.r), lora_alpha=float(lora.alpha),
                      lora_dropout=float(lora.dropout),
                      target_modules=targets if isinstance(targets, str) else list(targets),
                      bias="none", task_type="CAUSAL_LM")
