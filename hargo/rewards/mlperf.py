"""MLPerf factual-QA reward, the tiers of method.md ("mlperf"), one named function per rule.

References are short facts from an MLPerf Training v3.0 results table: ids (``3.0-2087``),
counts (``8``), system and processor names, comma-separated lists of them, or a sentence
(``"The submitter is Dell and the number of processors is 2."``).

Text normalisation (``normalise``): Unicode casefold, whitespace runs collapsed to one space,
outer whitespace, quotes and trailing sentence punctuation (``. , ; : ! ?``) stripped.

Tiers, first that applies (``mlperf_reward``):

1. 1.0 ``exact_match``: the normalised reference occurs in the normalised completion as a whole
   phrase, i.e. not preceded or followed by a word character (regex word boundaries,
   generalised with lookarounds so references that start or end with punctuation work);
   or ``numeric_match``: the reference is a single number or id and the completion contains the
   same number after normalisation (``1,024`` = ``1024`` = ``1024.0``; ids such as ``3.0-2087``
   compare verbatim); or ``all_values_match``: every value of a multi-value reference is found
   (any order).
2. ``partial`` (default 0.5) ``partial_match``: a multi-value reference (values separated by
   ``;``, a newline, or a comma that is not between two digits) of which at least one but not
   all values are found (each by ``exact_match`` or ``numeric_match``).
3. ``overlap_high_reward`` (0.2) when ``keyword_overlap`` > ``overlap_high`` (0.7);
   ``overlap_low_reward`` (0.1) when > ``overlap_low`` (0.4); else 0. Keyword overlap is the
   fraction of the reference's keywords (tokens minus stop words) present in the completion.

Constants come from params.yaml ``rewards.mlperf`` (``MLPerfConfig.from_params``).
"""
from __future__ import annotations

import functools
import re
from dataclasses import dataclass

__all__ = [
    "MLPerfConfig", "normalise", "normalise_number", "numeric_tokens", "split_values",
    "keywords", "exact_match", "numeric_match", "all_values_match", "partial_match",
    "keyword_overlap", "mlperf_reward", "EXACT_REWARD",
]

#: reward of tier 1 (method.md: "1.0 exact or numeric match")
EXACT_REWARD = 1.0


@dataclass(frozen=True)
class MLPerfConfig:
    """Tier constants (params.yaml ``rewards.mlperf``); defaults are method.md's."""

    partial: float = 0.5
    overlap_high: float = 0.7
    overlap_high_reward: float = 0.2
    overlap_low: float = 0.4
    overlap_low_reward: float = 0.1

    @classmethod
    def from_params(cls, d: dict | None) -> "MLPerfConfig":
        """From ``params["rewards"]["mlperf"]``; missing keys keep the defaults."""
        d = d or {}
        return cls(**{k: float(d[k]) for k in cls.__dataclass_fields__ if k in d})


_WS = re.compile(r"\s+")
_STRIP = " \t\n\r\"'`“”‘’.,;:!?"


def normalise(text: str) -> str:
    """Casefold, collapse whitespace, strip outer whitespace/quotes/trailing punctuation."""
    return _WS.sub(" ", text.casefold()).strip(_STRIP)


# A number (optionally with thousands commas and a fraction) or an id made of numbers joined by
# hyphens (``3.0-2087``); not part of a longer word (``80GB``, ``H100``, ``8x`` are not numbers).
_NUM = re.compile(r"(?<![\w.])((?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?)((?:-\d+(?:\.\d+)?)*)(?!\w)")


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
    """Normalised number/id tokens of ``text`` in order of appearance."""
    return [normalise_number(m.group(1) + m.group(2)) for m in _NUM.finditer(text)]


_VALUE_SPLIT = re.compile(r"\s*(?:;|\n|,(?!\d)|(?<!\d),)\s*")


def split_values(answer: str) -> list[str]:
    """The values of a multi-value reference: split at ``;``, newlines and commas that are not
    between two digits (so ``1,024`` stays one value); empty parts dropped."""
    return [p for p in (normalise(x) for x in _VALUE_SPLIT.split(answer)) if p]


_TOKEN = re.compile(r"\w+(?:[.\-+/]\w+)*")
_STOP = frozenset(
    "a an the is are was were be of and or if for with to in on at by as that this it its what "
    "which who how many much used uses use has have had does do when system's".split())


def keywords(text: str) -> set[str]:
    """Keyword set: casefolded tokens (``\\w+`` joined by ``. - + /``, so ``3.0-2087`` and
    ``H100-SXM5-80GB`` are single tokens), numbers normalised first (``1,024`` -> ``1024``),
    stop words removed."""
    text = _NUM.sub(lambda m: normalise_number(m.group(1) + m.group(2)), text.casefold())
    out = set()
    for tok in _TOKEN.findall(text):
        if tok not in _STOP:
            out.add(tok)
    return out


class _Prepared:
    """A completion's derived forms, each computed once (casefolded text, numbers, keywords)."""

    def __init__(self, text: str):
        self.text = text

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


def exact_match(completion: str, answer: str) -> bool:
    """Tier 1 (and the MLPerf EM metric): the normalised reference occurs in the normalised
    completion with no word character immediately before or after it. An empty reference never
    matches."""
    a = normalise(answer)
    if not a:
        return False
    pattern = r"(?<!\w)" + re.escape(a) + r"(?!\w)"
    return re.search(pattern, _prep(completion).folded) is not None


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
    return sum(exact_match(c, v) or numeric_match(c, v) for v in values), len(values)


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


def mlperf_reward(completion: str, answer: str, config: MLPerfConfig | None = None) -> float:
    """The MLPerf reward of one completion against its reference (tiers in the module docstring).

    Never raises on any ``str`` completion; deterministic.
    """
    config = config or MLPerfConfig()
    c = _Prepared(completion)
    if exact_match(c, answer) or numeric_match(c, answer):
        return EXACT_REWARD
    found, n = _values_found(c, answer)
    if n >= 2 and found == n:  # all_values_match
        return EXACT_REWARD
    if n >= 2 and found > 0:  # partial_match
        return config.partial
    overlap = keyword_overlap(c, answer)
    if overlap > config.overlap_high:
        return config.overlap_high_reward
    if overlap > config.overlap_low:
        return config.overlap_low_reward
    return 0.0
