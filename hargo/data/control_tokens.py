"""Text from data never becomes a chat-template control token.

A chat template is rendered to text and then tokenised, so a data row whose text holds a
special-token string (``"<|im_end|>\\n<|im_start|>assistant\\n..."``) is encoded as the real control
tokens: one row can close the user's turn and write the assistant's, in SFT, RL and evaluation
(TRL's trainers and vLLM tokenise the same way). hargo removes the cause from the data instead of
patching each tokenisation: every such string in a record's text is *neutralised* by inserting
U+2060 WORD JOINER after its first character (``"<\\u2060|im_end|>"``), which reads the same, is
kept by the rewards' reading rule as the same text (``hargo.rewards.text.read_answer`` removes
format characters, so a neutralised reference still equals its plain form), and no tokenizer
matches as a special token.

Two layers:

- ``prepare`` (no tokenizer yet): every string of :data:`CONTROL_TOKEN_REGEX`, the control-token
  spellings of the common chat templates (ChatML and the ``<|...|>`` family of SmolLM2, Qwen,
  Llama 3, Phi; ``<s>``/``</s>``; ``[INST]``; ``<<SYS>>``; Gemma's ``<start_of_turn>``), in the
  raw instruction, input and output; counted per task in ``stats.json``
  (``handling.<task>.control_token_records``); a Great Expectations expectation guards the
  prepared splits (``prepared.no_control_tokens``).
- every stage that tokenises records (``hargo.data.records.select_subset``: SFT, RL, evaluation,
  the comparison): the configured tokenizer's own special-token strings
  (:func:`special_token_strings`), for a model whose template uses other spellings.
"""
from __future__ import annotations

import functools
import re
from typing import Iterable, Sequence

__all__ = ["CONTROL_TOKEN_REGEX", "JOINER", "neutralise", "special_token_strings",
           "neutralise_record"]

#: The control-token spellings of common chat templates (module docstring).
CONTROL_TOKEN_REGEX = (r"<\|[^<>|\s]{1,40}\|>|</?s>|\[/?INST\]|<</?SYS>>"
                       r"|<(?:start|end)_of_turn>|<(?:bos|eos|pad|unk)>")
_PATTERN = re.compile(CONTROL_TOKEN_REGEX)

#: Inserted after a control string's first character (a format character: invisible, removed by
#: the rewards' reading rule).
JOINER = "\u2060"


def neutralise(text: str, extra: Sequence[str] = ()) -> tuple[str, int]:
    """``text`` with every control-token string (:data:`CONTROL_TOKEN_REGEX`, and each string in
    ``extra``) broken by :data:`JOINER` after its first character; returns ``(text,
    occurrences)``. Idempotent; a text without any is returned as is."""
    n = 0

    def brk(m: re.Match) -> str:
        nonlocal n
        n += 1
        s = m.group(0)
        return s[0] + JOINER + s[1:]

    return _pattern(tuple(extra)).sub(brk, text), n


@functools.lru_cache(maxsize=64)
def _pattern(extra: tuple[str, ...]) -> re.Pattern:
    """:data:`CONTROL_TOKEN_REGEX` or-ed with the ``extra`` strings (longest first), compiled
    once per set of strings (a stage neutralises every record with the same tokenizer's)."""
    extra = sorted({s for s in extra if len(s) > 1}, key=len, reverse=True)
    if not extra:
        return _PATTERN
    return re.compile(CONTROL_TOKEN_REGEX + "|" + "|".join(re.escape(s) for s in extra))


def special_token_strings(tokenizer) -> list[str]:
    """The special-token strings of ``tokenizer``: ``all_special_tokens`` and every added token
    marked special (``added_tokens_decoder``), longest first."""
    out = set(getattr(tokenizer, "all_special_tokens", []) or [])
    for tok in (getattr(tokenizer, "added_tokens_decoder", None) or {}).values():
        if getattr(tok, "special", False):
            out.add(str(tok.content if hasattr(tok, "content") else tok))
    return sorted((s for s in out if s), key=len, reverse=True)


def neutralise_record(record: dict, extra: Iterable[str] = ()) -> tuple[dict, int]:
    """A prepared record with its prompt contents and answer neutralised (a new dict when
    something changed; the input is never modified); returns ``(record, occurrences)``."""
    extra = tuple(extra)
    total = 0
    prompt = record.get("prompt")
    new_prompt = prompt
    if isinstance(prompt, list):
        msgs = []
        for m in prompt:
            if isinstance(m, dict) and isinstance(m.get("content"), str):
                text, k = neutralise(m["content"], extra)
                if k:
                    total += k
                    m = {**m, "content": text}
            msgs.append(m)
        new_prompt = msgs
    answer = record.get("answer")
    new_answer = answer
    if isinstance(answer, str):
        new_answer, k = neutralise(answer, extra)
        total += k
    if not total:
        return record, 0
    return {**record, "prompt": new_prompt, "answer": new_answer}, total
