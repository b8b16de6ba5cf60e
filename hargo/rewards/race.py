"""Data-race detection reward (tasks race_c and race_fortran), method.md "race (both)".

The answer is the yes/no word of the completion as ``hargo.rewards.text.read_answer`` reads it
(NFKC, zero-width and other format characters removed), found with word boundaries:

- case-insensitive (``YES``, ``No``), any leading whitespace, any punctuation around the word
  (``"Yes."``, ``"**no**"``, ``"(yes)"``);
- phrases count by their yes/no word: ``"Yes, there is a data race"`` -> yes,
  ``"No data race"`` -> no;
- words that merely contain the letters do not count: ``"not"``, ``"none"``, ``"nobody"``,
  ``"eyes"``, ``"yesterday"``, ``"yes_no"`` (``_`` is a word character);
- a completion with both words, or with neither, has no answer (``None``) and scores 0.

Hedging rule: naming both labels is a hedge, not an answer, wherever the words
stand (``"yes or no"``, ``"yes/no"``, ``"No. ... Yes."``, ``"Yes, no data race"``), so a hedge
scores 0 against either label while the precise label scores 1. The flip side: a "yes" answer
that also uses "no" as a determiner (``"Yes: no lock guards a[i]"``) counts as a hedge too.

The reward is 1.0 when the extracted answer equals the sample's label, else 0.0. The same
extraction serves the Data Race F1 metric (hargo.metrics).
"""
from __future__ import annotations

import re

from hargo.rewards.text import read_answer

__all__ = ["extract_yes_no", "race_reward", "canonical_label", "LABELS"]

LABELS = ("yes", "no")

# \b is Unicode-aware in Python's re: a yes/no run of letters not adjacent to another word
# character (letter, digit or underscore).
_YES = re.compile(r"\byes\b", re.IGNORECASE)
_NO = re.compile(r"\bno\b", re.IGNORECASE)


def extract_yes_no(text: str) -> str | None:
    """The yes/no answer of a completion: ``"yes"``, ``"no"``, or ``None`` when the text holds
    both words or neither (see the module docstring for the exact rules).

    The text is read by ``hargo.rewards.text.read_answer`` first (NFKC, format characters
    removed: ``"ｙｅｓ"`` and ``"ye\u200bs"`` read ``"yes"``). Linear in ``len(text)``; never
    raises on a ``str``.
    """
    text = read_answer(text)
    has_yes = _YES.search(text) is not None
    has_no = _NO.search(text) is not None
    if has_yes == has_no:
        return None
    return "yes" if has_yes else "no"


def canonical_label(label) -> str:
    """A race label as ``"yes"``/``"no"`` (case and surrounding whitespace ignored).

    Raises ValueError for anything else (bad data, not a bad completion).
    """
    if isinstance(label, str):
        v = label.strip().lower()
        if v in LABELS:
            return v
    raise ValueError(f"race label must be 'yes' or 'no', got {label!r}")


def race_reward(completion: str, label: str) -> float:
    """1.0 when ``extract_yes_no(completion)`` equals ``label`` ("yes"/"no"), else 0.0.

    Raises ValueError for a label other than yes/no; never raises because of the completion.
    """
    return 1.0 if extract_yes_no(completion) == canonical_label(label) else 0.0
