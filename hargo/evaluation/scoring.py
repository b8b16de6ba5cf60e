"""Threshold-free race scores: how much a model prefers "yes" over "no" as its first answer token.

For each race prompt the score is ``log P(yes) - log P(no)`` of the model's next token right
after the chat-templated prompt with the generation prompt (``hargo.evaluation.generate.
render_prompts``, the exact token ids both generation backends see), where ``P(yes)`` is the
summed probability of the *yes variants* and ``P(no)`` that of the *no variants*
(:func:`answer_token_ids`). The ROC AUC of this score against the labels
(``hargo.metrics.race_auc``) says whether the model ranks racy kernels above race-free ones,
whatever threshold (or prior towards "yes") its greedy answer applies.

Variants, defined here and only here: every single vocabulary token (special tokens excluded)
whose decoded text, with surrounding whitespace removed and casefolded, is exactly ``yes``
(resp. ``no``): e.g. ``yes``, ``Yes``, ``YES``, `` yes``, `` Yes``, ``\\nNo``. Each of them, as a
whole completion, is what ``hargo.rewards.race.extract_yes_no`` reads as that answer. Tokens
that merely start a longer word (``Yesterday``) or carry punctuation (``Yes,``) are left out.

The score comes from one transformers forward pass per prompt (batched, no generation), on
either evaluation backend: vLLM only returns the top-k log-probs of a position, so the sum over
all variants would not be exact there. Prompts are left-padded with explicit position ids
(``cumsum(attention_mask) - 1``), so a padded row computes what the unpadded prompt does, and
only the last position's logits are formed (``logits_to_keep=1``); the log-softmax is taken in
float32.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Mapping, Sequence

from hargo.rewards.race import extract_yes_no

__all__ = ["ANSWER_WORDS", "answer_token_ids", "first_token_log_probs", "score_yes_no"]

ANSWER_WORDS = ("yes", "no")


def answer_token_ids(tokenizer) -> dict[str, list[int]]:
    """The yes and no variants of ``tokenizer`` (module docstring for the rule).

    Returns:
        ``{"yes": sorted ids, "no": sorted ids}``.

    Raises:
        ValueError: the vocabulary has no single-token variant of "yes" or of "no".
    """
    special = set(tokenizer.all_special_ids)
    out: dict[str, list[int]] = {w: [] for w in ANSWER_WORDS}
    for tok, i in tokenizer.get_vocab().items():
        # cheap pre-filter on the raw token (byte-level BPE: Ġ/Ċ prefixes; SentencePiece: ▁)
        low = tok.lower()
        if i in special or len(tok) > 12 or not ("yes" in low or "no" in low):
            continue
        word = tokenizer.decode([i]).strip().casefold()
        if word in out:
            assert extract_yes_no(word) == word
            out[word].append(int(i))
    for w, ids in out.items():
        if not ids:
            raise ValueError(f"the tokenizer has no single token that decodes to {w!r}: the "
                             "first-token yes/no score is undefined for this model")
        ids.sort()
    return out


def first_token_log_probs(model, ids: Sequence[Sequence[int]], variants: Mapping[str, Sequence[int]],
                          batch_size: int = 8, pad_id: int = 0) -> list[tuple[float, float]]:
    """``(log P(yes), log P(no))`` of the next token after each prompt.

    Args:
        model: a transformers causal LM (on its device, eval mode).
        ids: N prompts' token ids (already chat-templated, generation prompt included).
        variants: :func:`answer_token_ids`' dict.
        batch_size: prompts per forward pass (>= 1).
        pad_id: the id put in padded positions (masked, so any valid id).

    Returns:
        N pairs of natural-log probabilities (each the log of the summed probability of the
        word's variants, from a float32 log-softmax over the whole vocabulary).

    Raises:
        ValueError: ``batch_size < 1`` or an empty prompt.
    """
    import torch

    if batch_size < 1:
        raise ValueError(f"batch_size: must be >= 1, got {batch_size}")
    if any(len(x) == 0 for x in ids):
        raise ValueError("first_token_log_probs: an empty prompt has no next-token distribution")
    device = next(model.parameters()).device
    yes = torch.tensor(list(variants["yes"]), dtype=torch.long, device=device)
    no = torch.tensor(list(variants["no"]), dtype=torch.long, device=device)
    order = sorted(range(len(ids)), key=lambda i: -len(ids[i]))  # less padding
    out: list[tuple[float, float] | None] = [None] * len(ids)
    with torch.inference_mode():
        for start in range(0, len(order), batch_size):
            batch = order[start:start + batch_size]
            width = max(len(ids[i]) for i in batch)
            input_ids = torch.full((len(batch), width), int(pad_id), dtype=torch.long)
            mask = torch.zeros((len(batch), width), dtype=torch.long)
            for row, i in enumerate(batch):  # left padding: the last position is the prompt's
                input_ids[row, width - len(ids[i]):] = torch.tensor(list(ids[i]))
                mask[row, width - len(ids[i]):] = 1
            pos = (mask.cumsum(-1) - 1).clamp(min=0)
            logits = model(input_ids=input_ids.to(device), attention_mask=mask.to(device),
                           position_ids=pos.to(device), logits_to_keep=1).logits[:, -1, :]
            logp = torch.log_softmax(logits.float(), dim=-1)
            ly = torch.logsumexp(logp[:, yes], dim=-1).tolist()
            ln = torch.logsumexp(logp[:, no], dim=-1).tolist()
            for row, i in enumerate(batch):
                out[i] = (float(ly[row]), float(ln[row]))
    return out  # type: ignore[return-value]


def score_yes_no(model_dir: str | Path, prompts: Sequence[Sequence[Mapping]],
                 params_evaluate: Mapping) -> tuple[list[dict], float]:
    """The first-token yes/no scores of a model folder on conversational prompts.

    Args:
        model_dir: a complete model folder (weights + tokenizer with a chat template).
        prompts: N conversational prompts (the race prompts of the eval set).
        params_evaluate: params.yaml ``evaluate``: ``dtype`` (as generation; auto = bf16 where
            native, else fp32) and ``batch_size`` (prompts per forward pass; default 8).

    Returns:
        ``(rows, seconds)``: per prompt ``{"log_p_yes", "log_p_no", "yes_no_score"}``
        (``yes_no_score = log_p_yes - log_p_no``, natural log), and the wall time of loading
        plus scoring. No prompt: ``([], 0.0)`` without loading the model.

    Raises:
        FileNotFoundError: ``model_dir`` missing or half-written.
        ValueError: the tokenizer has no yes or no variant; a malformed prompt.
    """
    if not prompts:
        return [], 0.0
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from hargo.evaluation.generate import render_prompts
    from hargo.hardware import detect_profile, generation_dtype
    from hargo.io import require_complete_dir

    t0 = time.perf_counter()
    model_dir = require_complete_dir(model_dir, "model folder")
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    variants = answer_token_ids(tokenizer)
    ids = render_prompts(tokenizer, prompts)
    dtype = generation_dtype(params_evaluate.get("dtype", "auto"))
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=getattr(torch, dtype))
    model.to(detect_profile().device).eval()
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    lp = first_token_log_probs(model, ids, variants, int(params_evaluate.get("batch_size", 8)),
                               pad)
    del model
    rows = [{"log_p_yes": y, "log_p_no": n, "yes_no_score": y - n} for y, n in lp]
    return rows, time.perf_counter() - t0
