"""Step 0 of every strategy (:mod:`hargo.data.prepare`): the race label removed from
DataRaceBench-style names in the race prompts (:func:`mask_race_raws`); steps 1-3 of the
``grouped`` strategy: quarantine, duplicates, and one record per prompt with the
conflicting-answer policy ``data.conflicts`` (:func:`clean_task`).

Every comparison goes through the one key :func:`hargo.data.raw.normalise_text` (whitespace runs
and line ends, case, surrounding blanks), the key the grouped split and ``validate``'s leak check
use too. Two records are *duplicates* when instruction, input and output are equal after it (a
copy with CRLF line ends or a trailing space is a duplicate). They are the *same prompt* when
instruction and input are equal after it: with the empty inputs of every upstream record this is
exactly the split's key, so a near-duplicate instruction (the same kernel indented differently)
cannot keep a contradictory answer inside one split. Answers are compared after it too (race:
the parsed label), so ``"H100"`` and ``"H100 "`` are one answer. A prompt whose raw records give
different answers is a conflict. The rule is the same for every task:

- a *strict majority* (the most frequent answer, counted over the raw records, beats every
  other) decides the reference under ``majority``; ``drop`` rejects the group;
- a *tie* at the top (``yes`` x1 / ``no`` x1; two paraphrases once each) is rejected under both
  policies, reason :data:`CONFLICT_TIE`: the data gives no reference, and picking one by file
  order would make it a coin flip. (Accepting every tied answer is no way out: no scorer reads
  ``alt_answers``, SFT trains on one ``answer``, and for race it would accept both labels.)
"""
from __future__ import annotations

from collections import Counter, OrderedDict
from typing import Any

from hargo.data import labels as L
from hargo.data.raw import FIELDS, make_id, make_record, normalise_text, source_file
from hargo import vocab  # its task lists read when used (a task module added later counts)

CONFLICT_POLICIES = ("majority", "drop")

# Reasons written to rejects.jsonl (besides the label reasons of hargo.data.labels).
EMPTY_INSTRUCTION = "empty_instruction"
EMPTY_ANSWER = "empty_answer"
MISSING_CODE = "missing_code"
CONFLICT_DROPPED = "conflicting_answers"
CONFLICT_TIE = "conflicting_answers_tie"

PROMPT_FIELDS: tuple[str, ...] = ("instruction", "input")


def _key(raw: dict, fields: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(normalise_text(raw[f]) for f in fields)


def _reject(task: str, index: int, raw: dict, reason: str, detail: str = "") -> dict:
    return {"id": make_id(task, index), "task": task,
            "source": {"file": source_file(task), "index": index},
            "reason": reason, "detail": detail,
            "instruction": raw["instruction"], "input": raw["input"], "output": raw["output"]}


def _rewrite_fields(raws: list[dict], fields: tuple[str, ...], fn) -> tuple[list[dict], int, int]:
    """Apply ``fn(text) -> (text, occurrences)`` to the string ``fields`` of every raw record:
    ``(records, records changed, occurrences)``, a new dict for each changed record (the input
    records are never modified)."""
    out, changed, occurrences = [], 0, 0
    for r in raws:
        fixed = {f: fn(r[f]) for f in fields if isinstance(r.get(f), str)}
        n = sum(k for _, k in fixed.values())
        if n:
            changed, occurrences = changed + 1, occurrences + n
            r = {**r, **{f: text for f, (text, _) in fixed.items()}}
        out.append(r)
    return out, changed, occurrences


def mask_race_raws(task: str, raws: list[dict]) -> tuple[list[dict], dict]:
    """Step 0 of every strategy: the race label removed from DataRaceBench-style names in the
    prompt fields (instruction and input) of a race task's raw records
    (:func:`hargo.data.labels.mask_label_names`, rule :data:`hargo.data.labels.LABEL_NAME_REGEX`);
    the output (the answer) is left as it is. mlperf and plp records are returned unchanged.

    Returns:
        ``(raws, counts)``: new dicts for the changed records (the input list is not modified)
        and ``{"label_name_records": raw records changed, "label_name_occurrences": names
        replaced}`` (both 0 for mlperf/plp).
    """
    if task not in vocab.RACE_TASKS:
        return list(raws), {"label_name_records": 0, "label_name_occurrences": 0}
    out, changed, occurrences = _rewrite_fields(raws, PROMPT_FIELDS, L.mask_label_names)
    return out, {"label_name_records": changed, "label_name_occurrences": occurrences}


def neutralise_raws(raws: list[dict]) -> tuple[list[dict], dict]:
    """Step 0 of every strategy, for every task: control-token strings in the instruction,
    input and output of each raw record broken (:func:`hargo.data.control_tokens.neutralise`), so
    no data row can forge a chat turn.

    Returns:
        ``(raws, counts)``: new dicts for the changed records (the input list is not modified)
        and ``{"control_token_records": raw records changed, "control_token_occurrences":
        strings broken}``.
    """
    from hargo.data.control_tokens import neutralise

    out, changed, occurrences = _rewrite_fields(raws, PROMPT_FIELDS + ("output",), neutralise)
    return out, {"control_token_records": changed, "control_token_occurrences": occurrences}


def clean_task(task: str, raws: list[dict], conflicts: str = "majority") -> tuple[list[dict], list[dict], dict]:
    """Steps 1-3 of the ``grouped`` strategy (:mod:`hargo.data.prepare`) for one task.

    Args:
        task: one of :data:`TASKS`.
        raws: the task's raw records in file order (index = source index).
        conflicts: ``"majority"`` or ``"drop"`` (the module docstring has the rule).

    Returns:
        ``(records, rejects, counts)``: prepared records in file order, reject rows, and counts
        with ``raw == quarantined + exact_duplicates + merged_duplicates + conflict_merged +
        conflict_dropped + kept`` (``exact_duplicates``: records equal to an earlier one after
        :func:`~hargo.data.raw.normalise_text`, field by field; ``merged_duplicates``: the same
        prompt and answer but not a duplicate, i.e. race outputs that differ beyond the label,
        so 0 for mlperf and plp); ``conflict_groups == conflict_majority + conflict_ties``
        (groups; ``conflict_records`` their records after de-duplication);
        ``near_duplicate_groups``: the prompts (after quarantine) whose raw records write the
        instruction or input in more than one way, ``near_duplicate_records`` those raw records
        (duplicates included); ``label_forms`` counts the normalisation reasons of all race
        outputs. A kept record is
        the first record (file order) giving the winning answer, as written (its instruction
        too); ``alt_answers`` the other answers, each as first written, in first-seen order.
    """
    race = task in vocab.RACE_TASKS
    rejects: list[dict] = []
    c: dict[str, Any] = {"raw": len(raws), "quarantined": Counter(), "exact_duplicates": 0,
                         "merged_duplicates": 0, "conflict_groups": 0, "conflict_records": 0,
                         "conflict_majority": 0, "conflict_ties": 0,
                         "conflict_merged": 0, "conflict_dropped": 0, "near_duplicate_groups": 0,
                         "near_duplicate_records": 0, "label_forms": Counter()}
    cands = _quarantine(task, raws, race, c, rejects)
    _count_near_duplicates(raws, cands, c)
    uniq, mult = _deduplicate(raws, cands, c)
    kept = _one_per_prompt(task, raws, uniq, mult, conflicts, c, rejects)
    kept.sort(key=lambda r: r["source"]["index"])
    rejects.sort(key=lambda r: r["source"]["index"])
    c["kept"] = len(kept)
    c["quarantined"] = dict(sorted(c["quarantined"].items()))
    c["label_forms"] = dict(sorted(c["label_forms"].items()))
    return kept, rejects, c


def _quarantine(task: str, raws: list[dict], race: bool, c: dict, rejects: list[dict]
                ) -> list[tuple[int, str, str | None]]:
    """Step 1 of :func:`clean_task`: the candidates ``(index, answer, label)`` left after the
    quarantine; the quarantined records go into ``rejects``, their reasons (and the race
    outputs' label forms) into the counts ``c``."""
    cands: list[tuple[int, str, str | None]] = []  # (index, answer, label)
    for i, r in enumerate(raws):
        label = None
        if race:
            label, form = L.parse_label(r["output"])
            c["label_forms"][form] += 1
        if not r["instruction"].strip():
            reason, detail = EMPTY_INSTRUCTION, ""
        elif race and label is None:
            reason, detail = form, "race output has no unambiguous yes/no label"
        elif race and L.snippet_missing(r["instruction"]):
            reason = MISSING_CODE
            detail = (f"the instruction's code snippet is {L.code_snippet(r['instruction'])!r}; "
                      "upstream put the code into the output")
        elif not race and not r["output"].strip():
            reason, detail = EMPTY_ANSWER, ""
        else:
            cands.append((i, label if race else r["output"], label))
            continue
        c["quarantined"][reason] += 1
        rejects.append(_reject(task, i, raws[i], reason, detail))
    return cands


def _count_near_duplicates(raws: list[dict], cands: list[tuple], c: dict) -> None:
    """Near-duplicates: prompts the same after normalise_text but not as written (counted into
    ``c``)."""
    written: dict[tuple, list[tuple]] = {}
    for i, _, _ in cands:
        written.setdefault(_key(raws[i], PROMPT_FIELDS), []).append(tuple(raws[i][f] for f in PROMPT_FIELDS))
    near = [v for v in written.values() if len(set(v)) > 1]
    c["near_duplicate_groups"], c["near_duplicate_records"] = len(near), sum(map(len, near))


def _deduplicate(raws: list[dict], cands: list[tuple[int, str, str | None]], c: dict
                 ) -> tuple[list[tuple[int, str, str | None]], dict[int, int]]:
    """Step 2 of :func:`clean_task`: duplicates, every field compared after normalise_text
    (multiplicity kept for the vote): ``(the first of each, {index: multiplicity})``."""
    mult: dict[int, int] = {}
    first_of: dict[tuple, int] = {}
    uniq: list[tuple[int, str, str | None]] = []
    for i, ans, lab in cands:
        key = _key(raws[i], FIELDS)
        if key in first_of:
            mult[first_of[key]] += 1
            c["exact_duplicates"] += 1
            continue
        first_of[key] = i
        mult[i] = 1
        uniq.append((i, ans, lab))
    return uniq, mult


def _one_per_prompt(task: str, raws: list[dict], uniq: list[tuple[int, str, str | None]],
                    mult: dict[int, int], conflicts: str, c: dict, rejects: list[dict]
                    ) -> list[dict]:
    """Step 3 of :func:`clean_task`: one record per prompt (instruction and input after
    normalise_text), conflicting answers decided by ``conflicts``; the kept records, in group
    order (the rejected groups go into ``rejects``)."""
    groups: "OrderedDict[tuple, list[tuple[int, str, str | None]]]" = OrderedDict()
    for cand in uniq:
        groups.setdefault(_key(raws[cand[0]], PROMPT_FIELDS), []).append(cand)
    kept: list[dict] = []
    for members in groups.values():
        votes: "OrderedDict[str, int]" = OrderedDict()   # normalised answer -> raw records
        first: dict[str, tuple[int, str, str | None]] = {}  # normalised answer -> first member
        for m in members:
            norm = normalise_text(m[1])
            votes[norm] = votes.get(norm, 0) + mult[m[0]]
            first.setdefault(norm, m)
        if len(votes) == 1:
            i, ans, lab = members[0]
            c["merged_duplicates"] += len(members) - 1
            kept.append(make_record(task, i, raws[i], ans, lab))
            continue
        c["conflict_groups"] += 1
        c["conflict_records"] += len(members)
        ranked = sorted(votes.values(), reverse=True)
        tie = ranked[0] == ranked[1]
        c["conflict_ties" if tie else "conflict_majority"] += 1
        if tie or conflicts == "drop":
            reason = CONFLICT_TIE if tie else CONFLICT_DROPPED
            detail = "answers given for this prompt: " + "; ".join(
                f"{first[a][1]!r} x{n}" for a, n in votes.items())
            for i, _, _ in members:
                rejects.append(_reject(task, i, raws[i], reason, detail))
            c["conflict_dropped"] += len(members)
            continue
        best = max(votes, key=votes.get)
        i, ans, lab = first[best]
        kept.append(make_record(task, i, raws[i], ans, lab, [first[a][1] for a in votes if a != best]))
        c["conflict_merged"] += len(members) - 1
    return kept
