"""Stage ``prepare``: the four raw HPC-GPT files -> prepared train/eval splits.

Inputs (``params["data"]["raw_dir"]``): four JSON arrays of ``{instruction, input, output}``
records (../shared/datasets/SOURCE.md). Outputs (``params["data"]["out_dir"]``), each written
whole or not at all, and only after every input has been read and checked:

- ``train.jsonl``, ``eval.jsonl``: one prepared record per line (schema in the module
  :func:`make_record`; TRL's conversational ``prompt`` format).
- ``rejects.jsonl``: quarantined raw records with a ``reason``.
- ``stats.json``: counts per task, split and label; how each kind of mess was handled; answer and
  prompt length statistics; the longest/shortest task mean answer-length ratio.
- ``answer_lengths.csv``: the per-task answer-length distribution for ``dvc plots``.

Two split strategies (``data.split.strategy``):

``grouped`` (default, a fair eval)
    1. Quarantine (-> rejects): an empty instruction; an empty mlperf/plp answer; a race output
       with no unambiguous yes/no label (:func:`hargo.data.labels.parse_label`); a race
       instruction whose code snippet is missing (the upstream fault that moved the code into the
       output, :func:`hargo.data.labels.snippet_missing`): its label refers to code the model
       never sees.
    2. Remove exact duplicate records (same instruction, input and output), counted.
    3. Group what is left by prompt text. Same prompt, same (normalised) answer: merged into one
       record (counted as ``merged_duplicates``). Same prompt, different answers (a conflict):
       ``data.conflicts: majority`` keeps the most frequent answer over the raw records (ties: the
       first seen) as ``answer`` and lists the other answers in ``alt_answers`` (shown to
       scorers, never the reference); ``drop`` sends the whole group to rejects. A race conflict
       whose top labels tie (one ``yes``, one ``no``) is rejected under both policies: a binary
       reference chosen by file order would be a coin flip.
    4. :func:`split_grouped` per task by instruction text, so that no instruction is in both
       splits.

``paper`` (the HPC-GPT/HARGO papers' split, 5,273 train / 584 eval on the real files)
    Every raw record kept, in file order: no de-duplication, no quarantine. ``answer`` is the raw
    output; race records still get the normalised ``label`` where one exists (else ``None``).
    :func:`split_paper` per file. Instructions repeated upstream then land in both splits; the
    ``validate`` stage measures that overlap instead of failing on it.

Token counts in the statistics are :func:`count_tokens` (a regex word/punctuation count), not
the model tokenizer's, which belongs to a later stage.
"""
from __future__ import annotations

import math
import random
import re
import statistics
from collections import Counter, OrderedDict
from pathlib import Path
from typing import Any, Callable, Iterable

from hargo.data import labels as L
from hargo.io import HargoInputError, atomic_write_json, atomic_write_jsonl, atomic_write_text
from hargo.vocab import RACE_TASKS, TASKS

# task -> upstream file name. Order: the order tables and statistics are printed in.
TASK_FILES: dict[str, str] = {
    "race_c": "task2_c_c++.json",
    "race_fortran": "task2_fortran.json",
    "mlperf": "task1_ml_perf.json",
    "plp": "task1_plp.json",
}
assert tuple(TASK_FILES) == TASKS, "TASK_FILES must list hargo.vocab.TASKS in order"
FIELDS: tuple[str, ...] = ("instruction", "input", "output")
STRATEGIES = ("grouped", "paper")
CONFLICT_POLICIES = ("majority", "drop")

# Reasons written to rejects.jsonl (besides the label reasons of hargo.data.labels).
EMPTY_INSTRUCTION = "empty_instruction"
EMPTY_ANSWER = "empty_answer"
MISSING_CODE = "missing_code"
CONFLICT_DROPPED = "conflicting_answers"
CONFLICT_TIE = "conflicting_labels_tie"

_JSON_WS = re.compile(r"[ \t\n\r]*")
_TOKEN = re.compile(r"\w+|[^\w\s]")


# ----------------------------------------------------------------------------- reading

def _line_col(text: str, pos: int) -> str:
    line = text.count("\n", 0, pos) + 1
    col = pos - (text.rfind("\n", 0, pos) + 1) + 1
    return f"line {line}, column {col}"


def _parse_array(path: Path, text: str) -> list:
    """Parse a JSON array element by element, so a syntax error names the record it is in.

    Raises:
        HargoInputError: not valid JSON (with the index of the record being read and the
            line/column), or not an array.
    """
    import json

    dec = json.JSONDecoder()
    i = _JSON_WS.match(text, 0).end()
    if not text.startswith("[", i):
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as e:
            raise HargoInputError(path, f"not valid JSON: {e.msg} ({_line_col(text, e.pos)})") from e
        raise HargoInputError(path, f"expected a JSON array of records, got {_type_name(obj)}")
    i = _JSON_WS.match(text, i + 1).end()
    items: list = []
    if text.startswith("]", i):
        i += 1
    else:
        while True:
            try:
                obj, end = dec.raw_decode(text, i)
            except json.JSONDecodeError as e:
                raise HargoInputError(path, f"not valid JSON: {e.msg} ({_line_col(text, e.pos)})",
                                      record=len(items)) from e
            items.append(obj)
            i = _JSON_WS.match(text, end).end()
            if text.startswith(",", i):
                i = _JSON_WS.match(text, i + 1).end()
                continue
            if text.startswith("]", i):
                i += 1
                break
            raise HargoInputError(path, "not valid JSON: expected ',' or ']' after the record "
                                  f"({_line_col(text, i)})", record=len(items) - 1)
    if _JSON_WS.match(text, i).end() != len(text):
        raise HargoInputError(path, f"not valid JSON: extra data after the array ({_line_col(text, i)})")
    return items


def _type_name(x: Any) -> str:
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean",
            int: "a number", float: "a number", type(None): "null"}.get(type(x), type(x).__name__)


def _has_surrogate(s: str) -> bool:
    return any("\udc80" <= ch <= "\udcff" for ch in s)


def load_file(path: str | Path) -> list[dict]:
    """Read and strictly check one raw file: a non-empty JSON array of objects, each with string
    fields ``instruction``, ``input`` and ``output`` (other keys are ignored).

    Returns:
        The records as ``{"instruction", "input", "output"}`` dicts, in file order.

    Raises:
        HargoInputError: missing file, empty file, non-UTF-8 bytes (naming the record and field
            that hold them when the rest parses), invalid JSON (naming the record being read), not
            an array, an empty array, a record that is not an object, a missing field, or a field
            that is not a string. Index is 0-based.
    """
    path = Path(path)
    if not path.is_file():
        raise HargoInputError(path, "file not found")
    data = path.read_bytes()
    if not data.strip():
        raise HargoInputError(path, "empty file (expected a JSON array of records)")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        # Locate the bad bytes: decode them to lone surrogates and find the string holding them.
        msg = f"not valid UTF-8: byte 0x{data[e.start]:02x} at offset {e.start}"
        try:
            items = _parse_array(path, data.decode("utf-8", errors="surrogateescape"))
        except HargoInputError:
            raise HargoInputError(path, msg) from e
        for i, rec in enumerate(items):
            if isinstance(rec, dict):
                for k, v in rec.items():
                    if (isinstance(v, str) and _has_surrogate(v)) or _has_surrogate(str(k)):
                        raise HargoInputError(path, msg, record=i, field=str(k)) from e
        raise HargoInputError(path, msg) from e
    items = _parse_array(path, text)
    if not items:
        raise HargoInputError(path, "no records (empty JSON array)")
    out = []
    for i, rec in enumerate(items):
        if not isinstance(rec, dict):
            raise HargoInputError(path, f"expected a JSON object, got {_type_name(rec)}", record=i)
        for f in FIELDS:
            if f not in rec:
                raise HargoInputError(path, "missing required field", record=i, field=f)
            if not isinstance(rec[f], str):
                raise HargoInputError(path, f"expected a string, got {_type_name(rec[f])}",
                                      record=i, field=f)
        out.append({f: rec[f] for f in FIELDS})
    return out


def load_raw(raw_dir: str | Path) -> dict[str, list[dict]]:
    """Read the four raw files of ``raw_dir`` (names in :data:`TASK_FILES`), all checked by
    :func:`load_file` before anything is returned.

    Returns:
        ``{task: [raw record, ...]}`` in :data:`TASKS` order.

    Raises:
        HargoInputError: see :func:`load_file` (a missing file is named).
    """
    raw_dir = Path(raw_dir)
    return {task: load_file(raw_dir / name) for task, name in TASK_FILES.items()}


# ----------------------------------------------------------------------------- records

def instruction_prompt(instruction: str, input_: str) -> str:
    """The user turn: the instruction, plus a blank line and the input when the input is not
    blank (upstream inputs are all empty)."""
    return f"{instruction}\n\n{input_}" if input_.strip() else instruction


def make_id(task: str, index: int) -> str:
    """Stable record id from the task and the 0-based index in its raw file: ``race_c-00012``."""
    return f"{task}-{index:05d}"


def make_record(task: str, index: int, raw: dict, answer: str, label: str | None,
                alt_answers: Iterable[str] = ()) -> dict:
    """One prepared record (the schema every later stage reads)::

        {"id": "race_c-00012", "task": "race_c",
         "prompt": [{"role": "user", "content": "<instruction>[\\n\\n<input>]"}],
         "answer": "...", "label": "yes" | "no" | None, "alt_answers": [...],
         "source": {"file": "task2_c_c++.json", "index": 12}}
    """
    return {
        "id": make_id(task, index),
        "task": task,
        "prompt": [{"role": "user", "content": instruction_prompt(raw["instruction"], raw["input"])}],
        "answer": answer,
        "label": label,
        "alt_answers": list(alt_answers),
        "source": {"file": TASK_FILES[task], "index": index},
    }


def count_tokens(text: str) -> int:
    """A deterministic, tokenizer-free token count: runs of word characters plus single
    punctuation characters (regex ``\\w+|[^\\w\\s]``). ``"a[i] = 1;"`` -> 7."""
    return len(_TOKEN.findall(text))


def _reject(task: str, index: int, raw: dict, reason: str, detail: str = "") -> dict:
    return {"id": make_id(task, index), "task": task,
            "source": {"file": TASK_FILES[task], "index": index},
            "reason": reason, "detail": detail,
            "instruction": raw["instruction"], "input": raw["input"], "output": raw["output"]}


def clean_task(task: str, raws: list[dict], conflicts: str = "majority") -> tuple[list[dict], list[dict], dict]:
    """Steps 1-3 of the ``grouped`` strategy (module docstring) for one task.

    Args:
        task: one of :data:`TASKS`.
        raws: the task's raw records in file order (index = source index).
        conflicts: ``"majority"`` or ``"drop"``.

    Returns:
        ``(records, rejects, counts)``: prepared records in file order, reject rows, and counts
        with ``raw == quarantined + exact_duplicates + merged_duplicates + conflict_merged +
        conflict_dropped + kept``; ``label_forms`` counts the normalisation reasons of all race
        outputs.
    """
    race = task in RACE_TASKS
    rejects: list[dict] = []
    c: dict[str, Any] = {"raw": len(raws), "quarantined": Counter(), "exact_duplicates": 0,
                         "merged_duplicates": 0, "conflict_groups": 0, "conflict_records": 0,
                         "conflict_merged": 0, "conflict_dropped": 0, "label_forms": Counter()}
    # 1. quarantine
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
    # 2. exact duplicates (multiplicity kept for the majority vote)
    mult: dict[int, int] = {}
    first_of: dict[tuple, int] = {}
    uniq: list[tuple[int, str, str | None]] = []
    for i, ans, lab in cands:
        key = tuple(raws[i][f] for f in FIELDS)
        if key in first_of:
            mult[first_of[key]] += 1
            c["exact_duplicates"] += 1
            continue
        first_of[key] = i
        mult[i] = 1
        uniq.append((i, ans, lab))
    # 3. one record per prompt
    groups: "OrderedDict[str, list[tuple[int, str, str | None]]]" = OrderedDict()
    for cand in uniq:
        r = raws[cand[0]]
        groups.setdefault(instruction_prompt(r["instruction"], r["input"]), []).append(cand)
    kept: list[dict] = []
    for members in groups.values():
        votes: "OrderedDict[str, int]" = OrderedDict()
        for i, ans, _ in members:
            votes[ans] = votes.get(ans, 0) + mult[i]
        if len(votes) == 1:
            i, ans, lab = members[0]
            c["merged_duplicates"] += len(members) - 1
            kept.append(make_record(task, i, raws[i], ans, lab))
            continue
        c["conflict_groups"] += 1
        c["conflict_records"] += len(members)
        ranked = sorted(votes.items(), key=lambda kv: -kv[1])  # stable: ties keep first-seen order
        tie = ranked[0][1] == ranked[1][1]
        if conflicts == "drop" or (race and tie):
            reason = CONFLICT_TIE if (race and tie) else CONFLICT_DROPPED
            detail = "answers given for this prompt: " + "; ".join(f"{a!r} x{n}" for a, n in votes.items())
            for i, _, _ in members:
                rejects.append(_reject(task, i, raws[i], reason, detail))
            c["conflict_dropped"] += len(members)
            continue
        best = ranked[0][0]
        i, ans, lab = next(m for m in members if m[1] == best)
        kept.append(make_record(task, i, raws[i], ans, lab, [a for a in votes if a != best]))
        c["conflict_merged"] += len(members) - 1
    kept.sort(key=lambda r: r["source"]["index"])
    rejects.sort(key=lambda r: r["source"]["index"])
    c["kept"] = len(kept)
    c["quarantined"] = dict(sorted(c["quarantined"].items()))
    c["label_forms"] = dict(sorted(c["label_forms"].items()))
    return kept, rejects, c


def paper_records(task: str, raws: list[dict]) -> list[dict]:
    """Every raw record of one task as a prepared record (the ``paper`` strategy): the raw
    output as ``answer``; for race tasks the normalised label, or ``None`` where there is none."""
    out = []
    for i, r in enumerate(raws):
        label = L.parse_label(r["output"])[0] if task in RACE_TASKS else None
        out.append(make_record(task, i, r, r["output"], label))
    return out


# ----------------------------------------------------------------------------- splits

def eval_size(n: int, eval_fraction: float) -> int:
    """floor(n * eval_fraction), robust to float error (``0.29 * 100`` -> 29, not 28)."""
    return math.floor(round(n * eval_fraction, 9))


def _rng(kind: str, seed: int, task: str) -> random.Random:
    # A string seed is hashed with SHA-512 by random.Random: the same on every run and platform.
    return random.Random(f"hargo-split:{kind}:{seed}:{task}")


def _by_task(records: list[dict]) -> "OrderedDict[str, list[int]]":
    out: "OrderedDict[str, list[int]]" = OrderedDict()
    for k, r in enumerate(records):
        out.setdefault(r["task"], []).append(k)
    return out


def _check_fraction(eval_fraction: float) -> None:
    if not 0.0 < float(eval_fraction) < 1.0:
        raise ValueError(f"data.split.eval_fraction must be in (0, 1), got {eval_fraction!r}")


def split_grouped(records: list[dict], eval_fraction: float, seed: int,
                  key: Callable[[dict], str] | None = None) -> tuple[list[dict], list[dict]]:
    """Seeded per-task split that keeps every group (same ``key``, default the prompt text)
    wholly in one split.

    Per task: the groups, in first-seen order, are shuffled by a ``random.Random`` seeded from
    ``(seed, task)``; walking that order, a group goes to eval while it fits in the eval target
    ``floor(n * eval_fraction)`` records, else to train. With one record per group (the prepared
    grouped data) eval has exactly the target size; with larger groups at most the target.

    Returns:
        ``(train, eval)``, each in the input order.

    Raises:
        ValueError: ``eval_fraction`` not in (0, 1).
    """
    _check_fraction(eval_fraction)
    key = key or (lambda r: r["prompt"][0]["content"])
    in_eval = [False] * len(records)
    for task, idx in _by_task(records).items():
        groups: "OrderedDict[str, list[int]]" = OrderedDict()
        for k in idx:
            groups.setdefault(key(records[k]), []).append(k)
        order = list(groups)
        _rng("grouped", seed, task).shuffle(order)
        target, n_eval = eval_size(len(idx), eval_fraction), 0
        for g in order:
            if n_eval + len(groups[g]) <= target:
                n_eval += len(groups[g])
                for k in groups[g]:
                    in_eval[k] = True
    return ([r for r, e in zip(records, in_eval) if not e],
            [r for r, e in zip(records, in_eval) if e])


def split_paper(records: list[dict], eval_fraction: float, seed: int) -> tuple[list[dict], list[dict]]:
    """The papers' split: per task (= per raw file) a seeded random permutation, the first
    ``floor(n * eval_fraction)`` records to eval, the rest to train. Repeated instructions may
    land in both splits. On the real files: 5,273 train / 584 eval.

    Returns:
        ``(train, eval)``, each in the input order.

    Raises:
        ValueError: ``eval_fraction`` not in (0, 1).
    """
    _check_fraction(eval_fraction)
    in_eval = [False] * len(records)
    for task, idx in _by_task(records).items():
        perm = list(idx)
        _rng("paper", seed, task).shuffle(perm)
        for k in perm[:eval_size(len(idx), eval_fraction)]:
            in_eval[k] = True
    return ([r for r, e in zip(records, in_eval) if not e],
            [r for r, e in zip(records, in_eval) if e])


# ----------------------------------------------------------------------------- statistics

def _summary(values: list[int]) -> dict:
    if not values:
        return {"n": 0, "mean": 0.0, "median": 0.0, "min": 0, "max": 0}
    return {"n": len(values), "mean": round(statistics.fmean(values), 4),
            "median": float(statistics.median(values)), "min": min(values), "max": max(values)}


def length_ratio(means: dict[str, float]) -> dict:
    """Longest over shortest task mean answer length (the papers report 58x for the raw data).

    Args:
        means: ``{task: mean answer length}`` (characters).
    """
    pos = {t: m for t, m in means.items() if m > 0}
    if len(pos) < 2:
        return {"longest_task": None, "shortest_task": None, "ratio": None}
    hi, lo = max(pos, key=pos.get), min(pos, key=pos.get)
    return {"longest_task": hi, "shortest_task": lo, "ratio": round(pos[hi] / pos[lo], 2)}


def answer_length_table(records: list[dict]) -> str:
    """CSV for ``dvc plots``: the share (percent) of each task's answers per character-length
    bin. Bins are powers of two: the row ``answer_chars = b`` counts lengths in ``[b, 2b)``
    (``0`` counts empty answers). Columns: ``answer_chars`` then one per task."""
    per: dict[str, Counter] = {t: Counter() for t in TASKS}
    for r in records:
        n = len(r["answer"])
        per[r["task"]][0 if n == 0 else 1 << (n.bit_length() - 1)] += 1
    top = max((b for c in per.values() for b in c), default=1)
    bins = [0] + [1 << k for k in range(max(top, 1).bit_length())]
    lines = ["answer_chars," + ",".join(TASKS)]
    for b in bins:
        cells = []
        for t in TASKS:
            tot = sum(per[t].values())
            cells.append(f"{100.0 * per[t][b] / tot:.2f}" if tot else "0.00")
        lines.append(f"{b}," + ",".join(cells))
    return "\n".join(lines) + "\n"


def compute_stats(train: list[dict], eval_: list[dict], raw: dict[str, list[dict]],
                  handling: dict[str, dict], params: dict) -> dict:
    """The content of ``stats.json`` (see the module docstring)."""
    data = params["data"]
    out: dict[str, Any] = {
        "strategy": data["split"]["strategy"], "eval_fraction": data["split"]["eval_fraction"],
        "seed": params["seed"], "conflicts": data.get("conflicts", "majority"),
        "token_count": "regex \\w+|[^\\w\\s] (words and punctuation), not the model tokenizer",
        "counts": {}, "handling": handling, "answer_length": {}, "prompt_length": {},
    }
    means, raw_means = {}, {}
    for t in TASKS:
        tr = [r for r in train if r["task"] == t]
        ev = [r for r in eval_ if r["task"] == t]
        entry: dict[str, Any] = {"raw": len(raw.get(t, [])), "train": len(tr), "eval": len(ev),
                                 "total": len(tr) + len(ev)}
        if t in RACE_TASKS:
            entry["labels"] = {name: dict(sorted(Counter(str(r["label"]) for r in rs).items()))
                               for name, rs in (("train", tr), ("eval", ev))}
        out["counts"][t] = entry
        both = tr + ev
        chars = [len(r["answer"]) for r in both]
        out["answer_length"][t] = {"chars": _summary(chars),
                                   "tokens": _summary([count_tokens(r["answer"]) for r in both])}
        out["prompt_length"][t] = {"chars": _summary([len(r["prompt"][0]["content"]) for r in both])}
        means[t] = out["answer_length"][t]["chars"]["mean"]
        raw_means[t] = statistics.fmean(len(r["output"]) for r in raw[t]) if raw.get(t) else 0.0
    out["counts"]["total"] = {"train": len(train), "eval": len(eval_),
                              "total": len(train) + len(eval_),
                              "raw": sum(len(v) for v in raw.values())}
    out["answer_length_ratio"] = length_ratio(means)
    out["answer_length_ratio_raw"] = length_ratio(raw_means)
    return out


# ----------------------------------------------------------------------------- the stage

def _print_table(stats: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    tab = Table(title=f"prepared data ({stats['strategy']} split)")
    for col in ("task", "raw", "rejected", "duplicates", "conflicts", "train", "eval", "yes/no train", "yes/no eval"):
        tab.add_column(col, justify="left" if col == "task" else "right", no_wrap=True,
                       min_width=12 if col == "task" else None)
    for t in TASKS:
        c, h = stats["counts"][t], stats["handling"].get(t, {})
        lab = c.get("labels", {})
        yn = lambda d: f"{d.get('yes', 0)}/{d.get('no', 0)}" if d is not None else "-"
        tab.add_row(t, str(c["raw"]),
                    str(sum(h.get("quarantined", {}).values()) + h.get("conflict_dropped", 0)),
                    str(h.get("exact_duplicates", 0) + h.get("merged_duplicates", 0)),
                    str(h.get("conflict_groups", 0)), str(c["train"]), str(c["eval"]),
                    yn(lab.get("train")), yn(lab.get("eval")))
    tot = stats["counts"]["total"]
    tab.add_row("total", str(tot["raw"]), "", "", "", str(tot["train"]), str(tot["eval"]), "", "")
    console = Console(width=max(Console().width, 100))  # 80 columns (a pipe) would cut names
    console.print(tab)
    r = stats["answer_length_ratio"]
    console.print(f"mean answer length: {r['longest_task']} / {r['shortest_task']} = {r['ratio']}x")


def run(params: dict) -> dict:
    """Run the ``prepare`` stage inside its MLflow child run (counts logged as metrics); see
    :func:`prepare`."""
    import mlflow

    from hargo import tracking

    with tracking.stage_run("prepare", params):
        out = prepare(params)
        mlflow.log_metrics({"train": out["train"], "eval": out["eval"], "rejects": out["rejects"],
                            **{f"{s}_{t}": n for t, c in out["per_task"].items()
                               for s, n in c.items() if isinstance(n, (int, float))}})
        return out


def prepare(params: dict) -> dict:
    """Run the ``prepare`` stage.

    Args:
        params: the loaded params.yaml; reads ``seed`` and ``data`` (``raw_dir``, ``out_dir``,
            ``split.strategy`` (grouped | paper), ``split.eval_fraction``, ``conflicts``
            (majority | drop)). Paths are relative to the working directory.

    Returns:
        ``{"strategy", "train", "eval", "rejects", "per_task": {task: {"train", "eval"}}}``.

    Raises:
        HargoInputError: a bad raw file (nothing is written).
        ValueError: a bad ``data`` param.
    """
    data = params["data"]
    strategy = data["split"]["strategy"]
    fraction = data["split"]["eval_fraction"]
    conflicts = data.get("conflicts", "majority")
    seed = int(params["seed"])
    if strategy not in STRATEGIES:
        raise ValueError(f"data.split.strategy must be one of {STRATEGIES}, got {strategy!r}")
    if conflicts not in CONFLICT_POLICIES:
        raise ValueError(f"data.conflicts must be one of {CONFLICT_POLICIES}, got {conflicts!r}")
    _check_fraction(fraction)

    raw = load_raw(data["raw_dir"])
    records: list[dict] = []
    rejects: list[dict] = []
    handling: dict[str, dict] = {}
    instruction: dict[str, str] = {}
    for task, raws in raw.items():
        if strategy == "paper":
            recs = paper_records(task, raws)
            forms = Counter(L.parse_label(r["output"])[1] for r in raws) if task in RACE_TASKS else {}
            handling[task] = {"raw": len(raws), "kept": len(recs), "label_forms": dict(sorted(forms.items())),
                              "unlabelled": sum(r["label"] is None for r in recs) if task in RACE_TASKS else 0}
        else:
            recs, rej, handling[task] = clean_task(task, raws, conflicts)
            rejects += rej
        for r in recs:
            instruction[r["id"]] = raws[r["source"]["index"]]["instruction"]
        records += recs

    if strategy == "paper":
        train, eval_ = split_paper(records, fraction, seed)
    else:
        train, eval_ = split_grouped(records, fraction, seed, key=lambda r: instruction[r["id"]])
    stats = compute_stats(train, eval_, raw, handling, params)
    table = answer_length_table(train + eval_)

    out = Path(data["out_dir"])
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_jsonl(out / "train.jsonl", train)
    atomic_write_jsonl(out / "eval.jsonl", eval_)
    atomic_write_jsonl(out / "rejects.jsonl", rejects)
    atomic_write_text(out / "answer_lengths.csv", table)
    atomic_write_json(out / "stats.json", stats)
    _print_table(stats)
    return {"strategy": strategy, "train": len(train), "eval": len(eval_), "rejects": len(rejects),
            "per_task": {t: {"train": stats["counts"][t]["train"], "eval": stats["counts"][t]["eval"]}
                         for t in TASKS}}
