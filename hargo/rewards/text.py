"""How every reward and metric reads a completion: one rule for the characters, one for a
degenerate answer.

**Characters** (``read_answer``): Unicode NFKC normalisation (compatibility forms to their plain
equivalents: fullwidth ``"４０９６"`` -> ``"4096"``, ``"Ｙｅｓ"`` -> ``"Yes"``, the ligature ``"ﬁ"``
-> ``"fi"``, a no-break space -> a space), then every format character (Unicode category ``Cf``:
zero-width space and joiners, word joiner, soft hyphen, byte-order mark, bidirectional marks)
removed, so ``"ye\\u200bs"`` reads ``"yes"``. One caveat of NFKC is kept as it is: superscript and
subscript digits become plain digits (``"10²"`` reads ``"102"``). The race, MLPerf and synthetic
rewards and the Data Race F1 and MLPerf EM metrics all read through this function, and so do the
references they compare with (Unicode TR15, https://unicode.org/reports/tr15/).

**Degenerate answers** (``degenerate``): a completion is degenerate when it is longer than its
task's character budget (``rewards.answer.max_chars``; a budget several times what the task's
generation budget can produce, so only runaway or pasted text crosses it), or when it is made of
one repeated unit (``is_repetitive``: fewer than ``min_distinct`` of its word n-grams distinct,
or one non-space character repeated more than ``max_char_run`` times in a row):
``"yes " * 250000`` and ``"4096 " * 100000`` are both. ``TaskReward`` pays a degenerate
completion ``rewards.answer.degenerate_scale`` times its reward when that reward is positive (a
negative reward is kept), so it earns less than the plain answer; the metrics give it no
prediction (race), no exact match (MLPerf) and count it as not correct (every task).
"""
from __future__ import annotations

import functools
import re
import sys
import unicodedata

from hargo.config.rewards import AnswerRule

__all__ = ["read_answer", "is_repetitive", "degenerate", "AnswerConfig"]


@functools.cache
def _format_table() -> dict[int, None]:
    """``str.translate`` table deleting every Unicode ``Cf`` code point (built once, ~0.2 s)."""
    return {cp: None for cp in range(sys.maxunicode + 1)
            if unicodedata.category(chr(cp)) == "Cf"}


def read_answer(text: str) -> str:
    """``text`` as every reward and metric reads it: NFKC, then format characters (``Cf``)
    removed (module docstring). Idempotent; linear in ``len(text)``; never raises on a ``str``
    (lone surrogates are kept as they are)."""
    if text.isascii():
        return text
    return unicodedata.normalize("NFKC", text).translate(_format_table())


_WORD = re.compile(r"\w+")


def is_repetitive(text: str, ngram: int = 3, min_distinct: float = 0.5,
                  max_char_run: int = 16) -> bool:
    """Whether ``text`` is degenerate repetition: one non-space character repeated more than
    ``max_char_run`` times in a row, or fewer than ``min_distinct`` of its casefolded word
    ``ngram``-grams distinct (``"yes yes yes yes yes"``: 1 distinct 3-gram of 3). A text with
    fewer than ``ngram + 1`` words is never repetitive by the n-gram test."""
    if re.search(r"(\S)\1{%d,}" % int(max_char_run), text):
        return True
    words = _WORD.findall(text.casefold())
    k = len(words) - ngram + 1
    if k < 2:
        return False
    distinct = len({tuple(words[i:i + ngram]) for i in range(k)})
    return distinct / k < min_distinct


#: The degenerate-answer rule: the typed config's ``rewards.answer`` block, one definition
#: (:class:`hargo.config.rewards.AnswerRule`: fields, defaults, checks, ``from_params``).
AnswerConfig = AnswerRule


def degenerate(text: str, task: str, config: AnswerConfig | None = None) -> str | None:
    """Why ``text`` (already ``read_answer``-ed) is a degenerate answer to ``task``:
    ``"over_budget"`` (longer than ``config.max_chars[task]``; a task without a budget has none),
    ``"repetitive"`` (``is_repetitive`` with the config's constants), or None.

    The budget is tested first, so a megabyte of text is never scanned for n-grams."""
    config = config or AnswerConfig()
    budget = config.max_chars.get(task)
    if budget is not None and len(text) > budget:
        return "over_budget"
    if is_repetitive(text, config.repetition_ngram, config.repetition_min_distinct,
                     config.repetition_max_char_run):
        return "repetitive"
    return None


def scale_degenerate(reward: float, reason: str | None, config: AnswerConfig) -> float:
    """``reward`` of a completion whose ``degenerate`` reason is ``reason``: unchanged when None
    or when the reward is not positive, else ``config.degenerate_scale * reward``."""
    if reason is None or reward <= 0:
        return reward
    return config.degenerate_scale * reward
