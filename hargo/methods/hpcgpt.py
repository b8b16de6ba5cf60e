"""``hpcgpt``: the HPC-GPT LoRA SFT recipe (r=8, alpha=16, lr 2e-5) applied to the base model with
SFT's data budget, a baseline of the comparison (``hargo.compare.train``; its ``compare.hpcgpt``
block: :class:`hargo.config.compare.HPCGPTParams`)."""
from __future__ import annotations

from hargo.config.compare import HPCGPTParams
from hargo.methods import Method, register_method

HPCGPT = register_method(Method(
    name="hpcgpt", label="HPC-GPT", description="the HPC-GPT LoRA SFT recipe on the base model",
    family="sft", rank=60,
    params_class=HPCGPTParams))
