"""Race-detection label normalisation and instruction sanity checks.

The upstream race files (HPC-GPT ``task2_*.json``) answer ``yes`` or ``no``, but 21 of the 1,858
C/C++ outputs are noisy: a label followed by code (``"no\\n#pragma omp ordered ..."``) or prose
(``"no\\n\\nplease note that ..."``), or no label at all (``"' marker are used ..."``). This
module turns such an output into a label when that is unambiguous and says why otherwise.

It also spots the upstream formatting fault behind most of the noisy outputs: the instruction's
code snippet is empty or a bare number (``"Given the code snippet: 1, help me ..."``) because the
code slid into the output. Such a record asks about code the model never sees, so its label
cannot be learned or scored; :mod:`hargo.data.prepare` quarantines it.
"""
from __future__ import annotations

import re

LABELS = ("yes", "no")

# Reasons returned by parse_label (stable strings: they are counted in stats.json).
CLEAN = "clean"                      # the output is exactly a label (case/space/punctuation aside)
LEADING_LABEL = "label_then_text"    # a label followed by code or prose, normalised to the label
NO_LABEL = "no_label"                # no yes/no at the start of the output
AMBIGUOUS = "ambiguous_label"        # starts with one label but names the other one later
EMPTY = "empty_output"

_LEAD = re.compile(r"^\s*[\"'`*(\[]*\s*(yes|no)\b[\s.,;:!)\]\"'`*-]*", re.IGNORECASE)
_WORD = re.compile(r"\b(yes|no)\b", re.IGNORECASE)
_SNIPPET = re.compile(r"code snippet:(.*),\s*help me detect", re.IGNORECASE | re.DOTALL)


def parse_label(output: str) -> tuple[str | None, str]:
    """Map a raw race-detection output to ``"yes"``/``"no"``.

    Rule: the output must start with the word ``yes`` or ``no`` (any case; optional quotes,
    brackets or trailing punctuation). If nothing follows it is :data:`CLEAN`. If code or prose
    follows, the label is kept (:data:`LEADING_LABEL`) unless the rest names the *other* label
    as a whole word (``"no ... yes"``), which is :data:`AMBIGUOUS`. A repeat of the same label is
    fine.

    Args:
        output: the raw ``output`` string of one record.

    Returns:
        ``(label, reason)``: ``label`` is ``"yes"``, ``"no"`` or ``None`` (then ``reason`` is
        :data:`NO_LABEL`, :data:`AMBIGUOUS` or :data:`EMPTY`).
    """
    if not output.strip():
        return None, EMPTY
    m = _LEAD.match(output)
    if m is None:
        return None, NO_LABEL
    label = m.group(1).lower()
    rest = output[m.end():]
    if not rest.strip():
        return label, CLEAN
    other = {w.lower() for w in _WORD.findall(rest)} - {label}
    if other:
        return None, AMBIGUOUS
    return label, LEADING_LABEL


def code_snippet(instruction: str) -> str | None:
    """The code between ``"code snippet:"`` and ``", help me detect"`` in a race instruction.

    Returns ``None`` when the instruction does not follow that template (then nothing can be
    said about its snippet).
    """
    m = _SNIPPET.search(instruction)
    return None if m is None else m.group(1).strip().strip("`").strip()


def snippet_missing(instruction: str) -> bool:
    """True when a race instruction's code snippet holds no code (empty or no letter at all,
    e.g. ``"1"``): the upstream fault where the code was moved into the output."""
    s = code_snippet(instruction)
    return s is not None and not re.search(r"[A-Za-z]", s)
