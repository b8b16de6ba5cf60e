"""The raw HPC-GPT files and their records: which file holds which task, the strict reader
(:func:`load_file`, :func:`load_raw`), and how one raw record becomes a prepared record
(:func:`make_record`: its id, prompt and source).
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Iterable

from hargo.io import HargoInputError
from hargo.vocab import TASKS

# task -> upstream file name. Order: the order tables and statistics are printed in.
TASK_FILES: dict[str, str] = {
    "race_c": "task2_c_c++.json",
    "race_fortran": "task2_fortran.json",
    "mlperf": "task1_ml_perf.json",
    "plp": "task1_plp.json",
}
assert tuple(TASK_FILES) == TASKS, "TASK_FILES must list hargo.vocab.TASKS in order"
FIELDS: tuple[str, ...] = ("instruction", "input", "output")

_JSON_WS = re.compile(r"[ \t\n\r]*")


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
