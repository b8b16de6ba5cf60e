"""MLPerf factual-QA reward, the tiers of method.md ("mlperf"), one named function per rule.

References are short facts from an MLPerf Training v3.0 results table: ids (``3.0-2087``),
counts (``8``), system and processor names, comma-separated lists of them, or a sentence
(``"The submitter is Dell and the number of processors is 2."``).

Text normalisation (``normalise``): ``hargo.rewards.text.read_answer`` (NFKC, format characters
removed, so ``"４０９６"`` is ``"4096"``), Unicode casefold, whitespace runs collapsed to one space,
outer whitespace, quotes and trailing sentence punctuation (``. , ; : ! ?``) stripped.

Tiers, first that applies (``mlperf_reward``):

1. 1.0 ``reference_occurs``: the normalised reference occurs in the normalised completion as a
   whole phrase, delimited by the token-boundary rule below;
   or ``numeric_match``: the reference is a single number or id and the completion contains the
   same number token after normalisation (``1,024`` = ``1024`` = ``1024.0``; ids such as
   ``3.0-2087`` compare verbatim); or ``all_values_match``: every value of a multi-value
   reference is found (any order).
2. ``partial`` (default 0.5) ``partial_match``: a multi-value reference (values separated by
   ``;``, a newline, or a comma that is not between two digits) of which at least one but not
   all values are found (each by ``reference_occurs`` or ``numeric_match``).
3. ``overlap_high_reward`` (0.2) when ``keyword_overlap`` > ``overlap_high`` (0.7);
   ``overlap_low_reward`` (0.1) when > ``overlap_low`` (0.4); else 0. Keyword overlap is the
   fraction of the reference's keywords (tokens minus stop words) present in the completion.

Token-boundary rule (every test of whether a reference value occurs in the completion:
``reference_occurs``, ``numeric_match``, the values of ``all_values_match`` /
``partial_match``, the reference values of a segment in ``extra_candidates``, and the
completion's numbers there): a
number reference must match a whole number token, never a digit run inside a longer number, id
or name.

- Number boundary, at an edge of the reference that is a number (the reference starts, or ends,
  with a number token of ``numeric_tokens``: ``"8"``, ``"3.0-2087"``, ``"1,024"``, ``"... the
  number of processors is 2"``). Before the number: not a word character (letter, digit,
  ``_``), not a decimal point, not a hyphen that follows a word character (an id or name such as
  ``3.0-2018``, ``DGX-2``), not a comma that follows a digit (``1,024``). After it: not a word
  character, not ``.``, ``,`` or ``-`` followed by a digit (a decimal part, thousands group, or
  id continuation). So ``"2"`` is not in ``"2.00GHz"`` nor ``"12"`` nor ``"2.5"``, ``"0"`` not in
  ``"3.0-2018"``, ``"2087"`` not in ``"3.0-2087"``, ``"8"`` not in ``"0,1,2,4,8"`` (a comma
  between digits joins them, as in ``split_values`` and ``segments``); ``"2"`` is in
  ``"2 GPUs"``, ``"(2)"``, ``"2."`` (sentence end), ``"2/4"`` and ``"8-GPU"`` (a hyphen before a
  letter ends the number). ``"3.0"`` is *not* in ``"v3.0"``: a letter glued to a number makes
  a version or model name (like ``H100``, ``80GB``), which is not that number; a model that
  answers ``"v3.0"`` for ``"3.0"`` gets the keyword tiers, not 1.0. Numbers in the completion
  (``numeric_tokens``) are cut by the same rule, so ``numeric_match`` and the hedging count agree
  with ``reference_occurs``.
- Word boundary, at any other edge (a name: ``"Dell"``, ``"A100"``, ``"v3.0"``,
  ``"dgxh100_n8"``): not preceded or followed by a word character, as regex ``\\b`` but also
  for references that start or end with punctuation. ``"H3C"`` is not in ``"H3C8"``; ``"A100"``
  is in ``"A100-80GB"``.
- Keywords (tier 3) are whole tokens: ``\\w+`` joined by ``. - + /`` and by a comma between
  digits, so the keyword ``2`` is not found in ``2.00GHz`` or ``3.0-2018``.

Hedging (``extra_candidates``): the reference must be *the* answer, not one of
several offered. Whatever tier applies, the reward is multiplied by the share of the offered
candidates that are reference values, ``found / (found + extra)``: ``found`` is the number of
reference values found (1 for a single-value reference and for the keyword tiers), ``extra`` the
number of distinct other candidates the completion offers. A hedge over k candidates thus earns
1/k of its tier, what a uniform guess among them earns on average. The question (the prompt's
text, when the caller passes it) is never a hedge: its numbers and keywords are excused, so
restating it costs nothing. Other candidates, precisely:

- reference a single number or id (``"8"``, ``"3.0-2087"``): each distinct number of the same
  kind (integer, decimal, or hyphenated id) in the completion other than the reference's and
  the question's. ``"0 1 2 4 8 16 32 64 128"`` for ``"8"``: 8 others, reward 1/9; ``"8 GPUs"``,
  ``"ID 3.0-2020 has 8 accelerators with NGC 23.04"``: none. Words are not alternatives to a
  number.
- any other reference: each *segment* of the completion (cut at ``;``, ``|``, newlines, a comma
  not between two digits, `` / ``, and the words ``and``, ``or``, ``and/or``; ``segments``) that
  contains no reference value, names something new (a keyword outside the reference and the
  question; a lone number only when the reference holds a number) and is offered as an answer:
  it lies in the scope of an ``or``; or it is a bare value (no stop word such as ``is``,
  ``the``, ``which``); or it restates the reference or question with another name (a new
  keyword written with a digit or a capital inside, and at least as many known keywords as new
  ones: ``"The ID is 3.0-2063."`` on its own line beside ``"The ID is 3.0-2062."``).
  ``"Dell, NVIDIA, HPE, Lenovo, Supermicro, GIGABYTE"`` for ``"Dell"``: 5 others, reward 1/6;
  ``"Dell PowerEdge XE9680"``, ``"Dell, 8"``, ``"The submitter is Dell, which builds the
  XE9680."``: none.

Not caught (the rule reads structure, not meaning): alternatives run together with spaces only
(``"Dell HPE Lenovo"``), offered in a clause without ``or`` (``"Dell, but it might be HPE"``) or
behind a leading phrase the question does not contain (``"The submitter is NVIDIA, Dell"`` with
no question), and an alternative that extends the reference (``"R750xax4A100-PCIE-80GB-NVBRIDGE"``
contains ``"R750xax4A100-PCIE-80GB"``, so it reads as the answer). The MLPerf EM metric follows
the same rule (``mlperf_em``).

Constants come from params.yaml ``rewards.mlperf`` (``MLPerfConfig.from_params``).
"""
from __future__ import annotations

import functools
import re

from hargo.config.rewards import MLPerfReward
from hargo.rewards.text import read_answer

__all__ = [
    "MLPerfConfig", "normalise", "normalise_number", "numeric_tokens", "split_values",
    "keywords", "reference_occurs", "exact_match", "numeric_match", "all_values_match",
    "partial_match", "keyword_overlap", "segments", "extra_candidates", "mlperf_em",
    "mlperf_reward", "EXACT_REWARD",
]

#: reward of tier 1 (method.md: "1.0 exact or numeric match")
EXACT_REWARD = 1.0


#: The tier constants: the typed config's ``rewards.mlperf`` block, one definition
#: (:class:`hargo.config.rewards.MLPerfReward`; its defaults are method.md's).
MLPerfConfig = MLPerfReward


_WS = re.compile(r"\s+")
_STRIP = " \t\n\r\"'`“”‘’.,;:!?"


def normalise(text: str) -> str:
    """``read_answer``, casefold, collapse whitespace, strip outer whitespace/quotes/trailing
    punctuation."""
    return _WS.sub(" ", read_answer(text).casefold()).strip(_STRIP)


# The number boundary (module docstring, "Number boundary"): the one rule for where a number
# token starts and ends, shared by the number tokenizer ``_NUM`` and by ``reference_occurs`` at a
# reference edge that is a number. Before a number: no word character (``H100``, ``v3.0``), no
# decimal point (``3.0``), no hyphen glued to a word character (``3.0-2018``, ``DGX-2``), no
# comma after a digit (``1,024``). After it: no word character (``80GB``, ``2.00GHz``), no ``.``,
# ``,`` or ``-`` followed by a digit (``2.00``, ``1,024``, ``3.0-2018``).
_NUM_BEFORE = r"(?<![\w.])(?<!\w-)(?<!\d,)"
_NUM_AFTER = r"(?!\w|[.,\-]\d)"
_WORD_BEFORE = r"(?<!\w)"
_WORD_AFTER = r"(?!\w)"

# A number (optionally with thousands commas and a fraction) or an id made of numbers joined by
# hyphens (``3.0-2087``), delimited by the number boundary: ``80GB``, ``H100``, ``8x``, ``DGX-2``
# hold no number, nor does any part of ``2.40GHz``, and ``3.0-2018`` is one token, not 3, 0, 2018.
_NUM = re.compile(_NUM_BEFORE + r"((?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?)((?:-\d+(?:\.\d+)?)*)"
                  + _NUM_AFTER)


def normalise_number(token: str) -> str:
    """Canonical form of a number token: commas dropped, leading zeros of the integer part and
    trailing zeros of the fraction dropped (``"1,024"``, ``"1024.0"``, ``"01024"`` -> ``"1024"``;
    ``"1.50"`` -> ``"1.5"``). An id with hyphens (``"3.0-2087"``) is kept verbatim minus commas."""
    t = token.replace(",", "")
    if "-" in t:
        return t
    if "." in t:
        t = t.rstrip("0").rstrip(".")
    t = t.lstrip("0")
    if not t or t.startswith("."):
        t = "0" + t
    return t


def numeric_tokens(text: str) -> list[str]:
    """Normalised number/id tokens of ``text`` (read by ``read_answer``) in order of appearance."""
    return [normalise_number(m.group(1) + m.group(2)) for m in _NUM.finditer(read_answer(text))]


_VALUE_SPLIT = re.compile(r"\s*(?:;|\n|,(?!\d)|(?<!\d),)\s*")


def split_values(answer: str) -> list[str]:
    """The values of a multi-value reference: split at ``;``, newlines and commas that are not
    between two digits (so ``1,024`` stays one value); empty parts dropped."""
    return [p for p in (normalise(x) for x in _VALUE_SPLIT.split(answer)) if p]


_TOKEN = re.compile(r"\w+(?:(?:[.\-+/]|(?<=\d),(?=\d))\w+)*")
_STOP = frozenset(
    "a an the is are was were be of and or if for with to in on at by as that this it its what "
    "which who how many much used uses use has have had does do when system's".split())


def keywords(text: str) -> set[str]:
    """Keyword set: casefolded tokens (``\\w+`` joined by ``. - + /`` and by a comma between two
    digits, so ``3.0-2087``, ``2.00GHz`` and ``H100-SXM5-80GB`` are single tokens and a
    keyword ``2`` is not found in them), numbers normalised first (``1,024`` -> ``1024``), stop
    words removed."""
    text = _NUM.sub(lambda m: normalise_number(m.group(1) + m.group(2)),
                    read_answer(text).casefold())
    out = set()
    for tok in _TOKEN.findall(text):
        if tok not in _STOP:
            out.add(tok)
    return out


class _Prepared:
    """A completion's derived forms, each computed once (casefolded text, numbers, keywords);
    ``text`` is the completion as ``read_answer`` reads it."""

    def __init__(self, text: str):
        self.text = read_answer(text)

    @functools.cached_property
    def folded(self) -> str:
        return _WS.sub(" ", self.text.casefold())

    @functools.cached_property
    def numbers(self) -> set[str]:
        return set(numeric_tokens(self.text))

    @functools.cached_property
    def keywords(self) -> set[str]:
        return keywords(self.text)


def _prep(completion) -> _Prepared:
    return completion if isinstance(completion, _Prepared) else _Prepared(completion)


@functools.lru_cache(maxsize=4096)
def _reference_pattern(a: str) -> re.Pattern:
    """The search pattern of a normalised reference: each edge takes the number boundary when
    the reference starts (ends) with a number token of ``_NUM``, else the word boundary."""
    toks = list(_NUM.finditer(a))
    before = _NUM_BEFORE if toks and toks[0].start() == 0 else _WORD_BEFORE
    after = _NUM_AFTER if toks and toks[-1].end() == len(a) else _WORD_AFTER
    return re.compile(before + re.escape(a) + after)


def reference_occurs(completion: str, answer: str) -> bool:
    """Tier 1's test (the MLPerf EM metric adds the hedging rule: ``exact_match``): the
    normalised reference occurs in the normalised
    completion as a whole phrase, by the token-boundary rule (module docstring): an edge of the
    reference that is a number must meet the number boundary (``"2"`` is not in ``"2.00GHz"``,
    ``"0"`` not in ``"3.0-2018"``, ``"3.0"`` not in ``"v3.0"``; ``"2"`` is in ``"2 GPUs"``), any
    other edge a word boundary (``"H3C"`` is not in ``"H3C8"``). An empty reference never
    matches."""
    a = normalise(answer)
    if not a:
        return False
    return _reference_pattern(a).search(_prep(completion).folded) is not None


def _single_number(answer: str) -> str | None:
    toks = numeric_tokens(answer)
    if len(toks) != 1 or normalise(_NUM.sub("", answer)):
        return None
    return toks[0]


def numeric_match(completion: str, answer: str) -> bool:
    """Tier 1: the reference is one number or id (nothing else but whitespace/punctuation) and
    the completion contains that number after ``normalise_number`` on both sides."""
    num = _single_number(answer)
    return num is not None and num in _prep(completion).numbers


def _values_found(completion, answer: str) -> tuple[int, int]:
    values = split_values(answer)
    if len(values) < 2:
        return 0, len(values)
    c = _prep(completion)
    return sum(reference_occurs(c, v) or numeric_match(c, v) for v in values), len(values)


def all_values_match(completion: str, answer: str) -> bool:
    """Tier 1: a multi-value reference (>= 2 values, see ``split_values``) all of whose values
    are found in the completion, in any order."""
    found, n = _values_found(completion, answer)
    return n >= 2 and found == n


def partial_match(completion: str, answer: str) -> bool:
    """Tier 2: a multi-value reference of which at least one value but not all are found."""
    found, n = _values_found(completion, answer)
    return n >= 2 and 0 < found < n


def keyword_overlap(completion: str, answer: str) -> float:
    """Tier 3: ``|kw(answer) & kw(completion)| / |kw(answer)|`` in [0, 1]; 0 when the reference
    has no keywords."""
    ka = keywords(answer)
    if not ka:
        return 0.0
    return len(ka & _prep(completion).keywords) / len(ka)


# Segment separators: list punctuation, a comma not between two digits, a spaced slash, and the
# conjunctions (captured, so that a segment after "or" is known).
_SEP = re.compile(r"(;|\n|\||,(?!\d)|(?<!\d),|\s/\s|\band/or\b|\bor\b|\band\b)", re.IGNORECASE)
_DISJUNCTIONS = frozenset({"or", "and/or", "/"})


def segments(text: str) -> list[tuple[str, bool]]:
    """The completion cut at list separators (see the module docstring), each segment stripped
    (case kept), with whether it lies in the scope of a disjunction: after ``or``, ``and/or`` or
    `` / ``, up to the next separator other than ``and`` (so ``"A or B and C, D"`` puts B and C
    in it, not D). Empty segments are dropped:
    ``"Dell, or HPE"`` -> ``[("Dell", False), ("HPE", True)]``."""
    out, in_or = [], False
    for i, part in enumerate(_SEP.split(text)):
        if i % 2:  # a separator
            sep = part.strip().casefold()
            if sep in _DISJUNCTIONS:
                in_or = True
            elif sep != "and" and out and out[-1][1] == in_or:
                in_or = False  # a list separator ends the disjunction's scope
            continue
        seg = part.strip().strip(_STRIP)
        if seg:
            out.append((seg, in_or))
    return out


def _names(segment: str) -> set[str]:
    """The casefolded tokens of ``segment`` written as names: with a digit, or an upper-case
    letter other than a segment-initial capital (``HugeCTR``, ``3.0-2063``, ``A100``; not the
    ``The`` of ``"The ID is"``)."""
    toks = _TOKEN.findall(segment)
    return {t.casefold() for i, t in enumerate(toks)
            if any(ch.isdigit() or ch.isupper() for ch in (t if i else t[1:]))}


def _number_kind(token: str) -> str:
    """``"id"`` (hyphenated, ``3.0-2087``), ``"decimal"`` (``23.04``) or ``"integer"`` (a
    normalised token: ``8.0`` is already ``8``)."""
    return "id" if "-" in token else ("decimal" if "." in token else "integer")


def extra_candidates(completion: str, answer: str, question: str = "") -> list[str]:
    """The candidates a completion offers besides the reference's values (rule in the module
    docstring): the other numbers of the reference's kind for a single-number/id reference,
    else the offered segments that name something outside the reference and the question.

    Args:
        completion: the model's answer.
        answer: the reference.
        question: the prompt's text ("" when unknown: then nothing is excused as restated).

    Returns:
        The extra candidates, in order of appearance, each once (empty: no hedging).
    """
    c = _prep(completion)
    num = _single_number(answer)
    if num is not None:
        kind = _number_kind(num)
        asked = set(numeric_tokens(question))
        return list(dict.fromkeys(t for t in numeric_tokens(c.text)
                                  if t != num and t not in asked and _number_kind(t) == kind))
    values = split_values(answer)
    values = values if len(values) >= 2 else [answer]
    known = keywords(answer) | keywords(question)
    numbers_count = bool(numeric_tokens(answer))
    out: dict[str, None] = {}
    for original, after_or in segments(c.text):
        seg = normalise(original)
        if seg in out or any(reference_occurs(seg, v) or numeric_match(seg, v) for v in values):
            continue  # the segment gives a reference value: it is the answer, not another one
        kw = keywords(seg)
        lone_number = len(kw) == 1 and _NUM.fullmatch(next(iter(kw))) is not None
        new = kw - known if numbers_count or not lone_number else set()
        if not new:
            continue  # restates the reference or the question, or is a lone number for a name
        bare = not set(_TOKEN.findall(seg)) & _STOP
        swapped = bool(new & _names(original)) and len(kw & known) >= len(new)
        if after_or or bare or swapped:
            out[seg] = None  # an alternative after "or", a bare value, or a swapped name
    return list(out)


def exact_match(completion: str, answer: str, question: str = "") -> bool:
    """Whether ``completion`` is an exact match of ``answer`` (the MLPerf EM metric): the
    reference occurs in it (``reference_occurs``) and no other candidate is offered
    (``extra_candidates`` empty), so a hedge that contains the reference is not an exact match:
    ``exact_match("0 1 2 4 8 16 32 64 128", "8")`` and
    ``exact_match("Dell, HPE, Lenovo, NVIDIA, Supermicro, Inspur", "Dell")`` are False.
    ``question``: the prompt's text, whose own values are excused ("" when unknown)."""
    return reference_occurs(completion, answer) and not extra_candidates(completion, answer,
                                                                         question)


def mlperf_em(completion: str, answer: str, question: str = "") -> bool:
    """The MLPerf EM metric of one completion: ``exact_match`` (the metric's name for it)."""
    return exact_match(completion, answer, question)


def _tier(c: _Prepared, answer: str, config: MLPerfConfig) -> tuple[float, int]:
    """(tier reward, number of reference values found; 1 for a single-value reference)."""
    found, n = _values_found(c, answer)
    if reference_occurs(c, answer) or numeric_match(c, answer):
        return EXACT_REWARD, n if n >= 2 else 1
    if n >= 2 and found == n:  # all_values_match
        return EXACT_REWARD, n
    if n >= 2 and found > 0:  # partial_match
        return config.partial, found
    overlap = keyword_overlap(c, answer)
    if overlap > config.overlap_high:
        return config.overlap_high_reward, 1
    if overlap > config.overlap_low:
        return config.overlap_low_reward, 1
    return 0.0, 1


def mlperf_reward(completion: str, answer: str, config: MLPerfConfig | None = None,
                  question: str = "") -> float:
    """The MLPerf reward of one completion against its reference: the tier (module docstring)
    times the hedging share ``found / (found + len(extra_candidates(...)))``.

    Args:
        completion, answer: the model's answer and the reference.
        config: tier constants (default ``MLPerfConfig()``).
        question: the prompt's text; its numbers and keywords are never counted as offered
            candidates ("" when unknown).

    Never raises on any ``str`` completion; deterministic.
    """
    config = config or MLPerfConfig()
    c = _Prepared(completion)
    base, found = _tier(c, answer, config)
    if base == 0.0:
        return 0.0
    extra = len(extra_candidates(c, answer, question))
    return base if extra == 0 else base * found / (found + extra)
