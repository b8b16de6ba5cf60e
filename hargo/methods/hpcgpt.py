"""``hpcgpt``: the HPC-GPT LoRA SFT recipe (r=8, alpha=16, lr 2e-5) applied to the base model with
SFT's data budget, a baseline of the comparison (``hargo.compare.train``; its ``compare.hpcgpt``
block)."""
from __future__ import annotations

from hargo.methods import Method, register_method

HPCGPT = register_method(Method(
    name="hpcgpt", label="HPC-GPT", description="the HPC-GPT LoRA SFT recipe on the base model",
    family="sft", rank=60,
    param_rules=(("learning_rate", {"lo": 0, "lo_open": True}),
                 ("lora_r", {"lo": 1, "integer": True}),
                 ("lora_alpha", {"lo": 0, "lo_open": True}))))
