"""Which modules a LoRA adapter may target (``sft.lora.target_modules``,
``rl.lora.target_modules``), checked at the params stage.

A LoRA on a weight the model ties to another one is not the model it is saved as: SmolLM2 (and
the tests' tiny Llama) tie the input embedding ``embed_tokens`` to the output head ``lm_head``
(``tie_word_embeddings``). PEFT trains the adapter beside the shared weight, but
``merge_and_unload`` adds it into that one tensor, so the merged folder (what ``evaluate``
scores, and SFT's reference model) changes both the embedding and the head, while the base plus
the stored adapter (what ``register`` stores) changes one: their logits differed by up to 1.53
on SmolLM2 (issue 42), and PEFT only warns. The allowed sets are therefore the ones whose merge
is exactly base + adapter: ``all-linear`` (PEFT's every linear layer but the output head) or any
non-empty subset of the attention and MLP projections of a Llama-family decoder
(:data:`PROJECTIONS`), the names SmolLM2, Llama, Qwen and Mistral share; a model with other
module names trains with ``all-linear``. ``register`` checks the result as well
(:func:`hargo.registered_models.check_adapter_agrees`).

A string other than ``all-linear`` is refused too: PEFT reads it as a regular expression over
the full module path (``q_proj`` alone matches nothing; ``.*`` matches the tied embedding).
"""
from __future__ import annotations

from typing import Any

from hargo.param_values import ParamsError

__all__ = ["ALL_LINEAR", "PROJECTIONS", "TIED", "check_target_modules"]

ALL_LINEAR = "all-linear"
#: the attention and MLP projections of a Llama-family decoder layer
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
#: the tied pair (input embedding, output head) of a model with ``tie_word_embeddings``
TIED = ("embed_tokens", "lm_head")


def check_target_modules(key: str, value: Any) -> None:
    """Check a ``target_modules`` value: ``all-linear`` or a non-empty list of distinct names
    from :data:`PROJECTIONS`.

    Raises:
        ParamsError: anything else; the message names ``key``, the offending entry and why
            (a tied weight, a regular-expression string, an unknown module, a repeat).
    """
    allowed = f"use {ALL_LINEAR} or a subset of [{', '.join(PROJECTIONS)}]"
    if value == ALL_LINEAR:
        return
    if isinstance(value, str):
        raise ParamsError(f"{key}: a string other than {ALL_LINEAR} is a regular expression "
                          f"over full module paths for PEFT, got {value!r}; {allowed} "
                          f"(a list: [{value}])")
    if not isinstance(value, (list, tuple)) or not value:
        raise ParamsError(f"{key}: expected {ALL_LINEAR} or a non-empty list of module names, "
                          f"got {value!r}")
    seen = set()
    for name in value:
        if name in TIED:
            raise ParamsError(
                f"{key}: {name!r} is one of the tied weights ({' = '.join(TIED)}, "
                "tie_word_embeddings): a LoRA on it is merged into both, so the merged model "
                "that is evaluated is not the base + adapter that is registered; "
                f"{allowed}")
        if name not in PROJECTIONS:
            raise ParamsError(f"{key}: {name!r} is not an attention or MLP projection; {allowed}")
        if name in seen:
            raise ParamsError(f"{key}: {name!r} is listed twice")
        seen.add(name)
