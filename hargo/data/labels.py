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


# ----------------------------------------------------------------------------- label-bearing names

# DataRaceBench names its programs after the answer (``DRB048_firstprivate_orig_no``,
# ``DRB001-antidep1-orig-yes.c``), and the upstream race prompts copy those names (and imitations
# of them) into the code: the label can be read off the prompt. One regex finds such a name;
# :func:`mask_label_names` removes the label from it; ``validate`` checks the prepared prompts
# with the same regex.
_C = r"[A-Za-z0-9]+"                              # one component of a name
_S = r"[_-]"                                      # the separators of a name's components
_LAB = r"(?:yes+|no)\d*(?![A-Za-z])"              # a label component: yes, no, YES, no2, yess
_END = r"(?![A-Za-z0-9_-])"
_UNIT = rf"(?:{_C}{_S})*?(?:{_C}{_S}{_LAB}|{_LAB}{_S}{_C})(?:{_S}{_C})*{_END}"
LABEL_NAME_REGEX = (
    # (c) a Fortran program/module name with a label component, where it is declared or used
    rf"(?i)(?<![A-Za-z0-9_])(?:program|module|use)[ \t]+(?P<unit>{_UNIT})"
    r"|(?<![A-Za-z0-9_-])(?P<name>"
    # (a) a DRB name: a component starting with DRB, and a label component before or after it
    rf"(?:{_C}{_S})*?(?:{_LAB}{_S}(?:{_C}{_S})*?DRB[A-Za-z0-9]*|DRB[A-Za-z0-9]*(?:{_S}{_C})*?{_S}{_LAB})(?:{_S}{_C})*{_END}"
    # (b) DataRaceBench's suffix: orig or var (then optionally gpu/cpu), then a label component
    rf"|(?:{_C}{_S})+(?:orig|var)\d*{_S}(?:[gc]pu{_S})?{_LAB}(?:{_S}{_C})*{_END}"
    r")"
)
LABEL_NAME = re.compile(LABEL_NAME_REGEX)
_LABEL_PART = re.compile(rf"(?i)^{_LAB}$")
_PARTS = re.compile(rf"({_S})")
MASK_RULE = ("race prompts: every name matching hargo.data.labels.LABEL_NAME_REGEX (a DRB name, an "
             "orig/var name or a Fortran program/module name carrying a yes/no component) loses its "
             "yes/no components, the same everywhere it occurs in the prompt")


def strip_label(name: str) -> str:
    """``name`` without its label components (``yes``/``no``, any case, digits after it allowed:
    ``yes2``, ``NO``, ``yess``), each removed with the separator (``_`` or ``-``) before it, or
    after it for a first component. A name left empty or not starting with a letter (no valid
    Fortran/C identifier) gets ``name_`` in front::

        strip_label("DRB048_firstprivate_orig_no") == "DRB048_firstprivate_orig"
        strip_label("DRB001-antidep1-orig-yes") == "DRB001-antidep1-orig"
        strip_label("No_DRB139_taskdeferred_no") == "DRB139_taskdeferred"
        strip_label("DRB040_truedepsingleelement_var_yes_2") == "DRB040_truedepsingleelement_var_2"
        strip_label("Yes_1") == "name_1"
    """
    parts = _PARTS.split(name)  # [component, sep, component, sep, ...]
    comps, seps = parts[0::2], parts[1::2]
    kept: list[str] = []
    for k, comp in enumerate(comps):
        if _LABEL_PART.match(comp):
            continue
        if kept:
            kept.append(seps[k - 1])
        kept.append(comp)
    out = "".join(kept)
    return out if out[:1].isalpha() else "name_" + out if out else "name"


def label_names(text: str) -> list[str]:
    """The label-bearing names in ``text`` (matches of :data:`LABEL_NAME`, the name only, in
    order, repeats included): ``label_names("program DRB048_x_orig_no") == ["DRB048_x_orig_no"]``."""
    return [m.group("unit") or m.group("name") for m in LABEL_NAME.finditer(text)]


def labels_in_names(text: str) -> list[str]:
    """The labels the label-bearing names in ``text`` spell, normalised (``yes``/``no``), one per
    label component in order: what a reader of the names alone would answer.
    ``labels_in_names("program DRB048_x_orig_no") == ["no"]``."""
    return ["yes" if part.lower().startswith("y") else "no"
            for name in label_names(text) for part in _PARTS.split(name) if _LABEL_PART.match(part)]


def mask_label_names(text: str) -> tuple[str, int]:
    """Remove the race label from DataRaceBench-style names in a race prompt.

    A label-bearing name is a maximal run of letters, digits, ``_`` and ``-`` matching
    :data:`LABEL_NAME_REGEX` (case-insensitive), one of:

    (a) a *DRB name*: one component (``_``/``-`` separated) starts with ``DRB`` and another is a
        label component (``yes+`` or ``no``, digits after it allowed): ``DRB048_firstprivate_orig_no``,
        ``drb106_taskwaitmissing_orig_yes``, ``DRB001-antidep1-orig-yes`` (a C file name,
        ``.c`` kept), ``DRB064_outeronly2_new_no_1``, ``No_DRB139_taskdeferred_no``;
    (b) an *orig/var name*: at least one component, then ``orig`` or ``var`` (digits allowed),
        optionally ``gpu``/``cpu``, then a label component: ``LP5_targetparallelfor_orig_no``,
        ``reductionmissing_var_yes5``, ``SCALARS_CALC_ORIG_NO``;
    (c) a *Fortran program or module name* with a label component, right after
        ``program``, ``module`` or ``use`` and blanks: ``program ProgrammingModule_yes``,
        ``end program MOD917_threadsmissing_privacy_yes``, ``use Example_no``.

    The exact regex, :data:`LABEL_NAME_REGEX` (case-insensitive), written with ``C`` =
    ``[A-Za-z0-9]+`` (a component), ``S`` = ``[_-]``, ``L`` = ``(?:yes+|no)\\d*(?![A-Za-z])`` (a
    label component) and ``E`` = ``(?![A-Za-z0-9_-])`` (the name ends), blanks added here::

        (?<![A-Za-z0-9_])(?:program|module|use)[ \\t]+
            (?P<unit>(?:C S)*?(?:C S L|L S C)(?:S C)* E)
        | (?<![A-Za-z0-9_-])(?P<name>
            (?:C S)*?(?:L S (?:C S)*? DRB[A-Za-z0-9]* | DRB[A-Za-z0-9]* (?:S C)*? S L)(?:S C)* E
            | (?:C S)+ (?:orig|var)\\d* S (?:[gc]pu S)? L (?:S C)* E)

    Every such name loses its label components (:func:`strip_label`), and every occurrence of
    the name in ``text`` (as a whole name, the same case-insensitively, as Fortran reads it) is
    replaced by the same result, so a declaration and its uses stay consistent. Left alone: a
    name without a label component (``DRB048_firstprivate_orig``, ``DRB071_v2``), and an
    identifier that merely has a ``_no``/``_yes`` component outside (a)-(c) (``arr_length_no``,
    ``no_omp2``, ``flag_yes``). After masking, ``LABEL_NAME`` finds nothing in the text.

    Returns:
        ``(masked text, occurrences replaced)``; the text is unchanged when the count is 0.
    """
    names = {n.casefold(): n for n in label_names(text)}
    if not names:
        return text, 0
    alt = "|".join(sorted((re.escape(n) for n in names), key=len, reverse=True))
    any_name = re.compile(rf"(?i)(?<![A-Za-z0-9_-])(?:{alt})(?![A-Za-z0-9_-])")
    masked, count = any_name.subn(lambda m: strip_label(m.group(0)), text)
    return masked, count
