"""The raw records of each task: which file holds which task (or which function makes them), the
strict reader (:func:`load_file`, :func:`load_raw`), how one raw record becomes a prepared
record (:func:`make_record`: its id, prompt and source), and the one text normalisation that
decides when two instructions or two answers are the same (:func:`normalise_text`).

Where a task's raw records come from is the task's own (:class:`hargo.tasks.Task`): a
``raw_file`` in the raw data folder (HPC-GPT's four files), a ``raw_file`` path read where it
is, or a ``records`` function that makes them; the registry is asked when records are read, so
a task module added later is seen.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Iterable, NoReturn

from hargo.io import HargoInputError
from hargo.tasks import Task, get_task, tasks

__all__ = ["TASK_FILES", "FIELDS", "source_file", "raw_path", "load_file", "check_records",
           "load_raw", "normalise_text", "instruction_prompt", "make_id", "make_record"]

FIELDS: tuple[str, ...] = ("instruction", "input", "output")


def __getattr__(name: str):
    """``TASK_FILES``: task -> ``raw_file`` of each registered task with one (``hargo/tasks``),
    in the tasks' listing order (the order tables and statistics are printed in); read from the
    registry when asked."""
    if name == "TASK_FILES":
        return {t.name: t.raw_file for t in tasks() if t.raw_file}
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def source_file(task: str) -> str:
    """The ``source.file`` of a task's prepared records: its ``raw_file`` as the task names it,
    or ``<module>.<function>`` of its ``records`` function.

    Raises:
        UnknownTaskError: not a registered task; ValueError: it has no raw records."""
    t = get_task(task)
    if t.raw_file:
        return t.raw_file
    if t.records is not None:
        return f"{t.records.__module__}.{t.records.__qualname__}"
    raise ValueError(f"task {task!r} has no raw records (neither raw_file nor records)")


def raw_path(task: Task, raw_dir: str | Path) -> Path:
    """Where ``task``'s ``raw_file`` is: under ``raw_dir`` for a bare file name, else the path as
    given (relative to the working directory)."""
    p = Path(task.raw_file)
    return Path(raw_dir) / p if p.parent == Path(".") else p

_JSON_WS = re.compile(r"[ \t\n\r]*")


# ----------------------------------------------------------------------------- reading

def _line_col(text: str, pos: int) -> str:
    line = text.count("\n", 0, pos) + 1
    col = pos - (text.rfind("\n", 0, pos) + 1) + 1
    return f"line {line}, column {col}"


def _where(text: str, pos: int) -> tuple[int | None, str | None]:
    """Which record and field of a JSON array text the character offset ``pos`` lies in.

    Walks ``text`` up to ``pos`` (it need not parse past it): records are counted by the commas
    between the array's elements, and the field is the last key of the record object whose
    value ``pos`` is in or follows (reset by the comma before the next member).

    Returns:
        ``(record, field)``, 0-based record index; ``(None, None)`` outside the array or when
        the text is not an array; ``field`` is None between members or outside an object.
    """
    depth, record, field, key = 0, None, None, None
    i, n = 0, min(pos, len(text))
    while i < n:
        ch = text[i]
        if ch == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            if depth == 2 and j < n:
                key = text[i + 1:j]
            i = j + 1
            continue
        if ch in "[{":
            if depth == 0 and ch == "{":
                return None, None
            depth += 1
            if depth == 1:
                record = 0
            elif depth == 2:
                field = key = None
        elif ch in "]}":
            depth -= 1
        elif ch == "," and depth == 1:
            record += 1
        elif ch == "," and depth == 2:
            field = key = None
        elif ch == ":" and depth == 2:
            field = key
        i += 1
    if depth == 0:
        return None, None
    return record, field if depth >= 2 else None


def _fail(path: Path, text: str, pos: int, message: str, cause: Exception | None = None) -> NoReturn:
    """Raise a :class:`HargoInputError` naming the record and field at ``pos`` and its line."""
    record, field = _where(text, pos)
    raise HargoInputError(path, f"{message} ({_line_col(text, pos)})",
                          record=record, field=field) from cause


# A \\uXXXX escape of a UTF-16 surrogate (D800-DFFF), with the backslashes before it.
_SURROGATE_ESCAPE = re.compile(r"(?<!\\)(\\+)u([dD][89a-fA-F][0-9a-fA-F]{2})")


def _lone_surrogate(text: str) -> int | None:
    """Offset of the first JSON escape that encodes a lone UTF-16 surrogate (``"\\ud83d"`` not
    followed by a low-surrogate escape, or a low one alone), else None.

    Such an escape is valid JSON but no Unicode character: the string could never be written as
    UTF-8. Call it on text that parsed as JSON (every backslash is then inside a string); an
    even run of backslashes before the ``u`` is escaped backslashes, not an escape.
    """
    paired_low = -1
    for m in _SURROGATE_ESCAPE.finditer(text):
        if len(m.group(1)) % 2 == 0:
            continue
        start = m.end() - 6  # the backslash of the escape
        if start == paired_low:
            continue
        if m.group(2)[1].lower() in "89ab":  # high: must be followed by a low escape
            nxt = text[m.end():m.end() + 6]
            if re.fullmatch(r"\\u[dD][c-fC-F][0-9a-fA-F]{2}", nxt):
                paired_low = m.end()
                continue
        return start
    return None


def _parse_array(path: Path, text: str) -> list:
    """Parse a JSON array element by element.

    Raises:
        HargoInputError: not valid JSON, naming the record and field the error is in and its
            line and column (:func:`_where`); not an array.
    """
    import json

    dec = json.JSONDecoder()
    i = _JSON_WS.match(text, 0).end()
    if not text.startswith("[", i):
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as e:
            _fail(path, text, e.pos, f"not valid JSON: {e.msg}", e)
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
                _fail(path, text, e.pos, f"not valid JSON: {e.msg}", e)
            items.append(obj)
            i = _JSON_WS.match(text, end).end()
            if text.startswith(",", i):
                i = _JSON_WS.match(text, i + 1).end()
                continue
            if text.startswith("]", i):
                i += 1
                break
            _fail(path, text, i, "not valid JSON: expected ',' or ']' after the record")
    if _JSON_WS.match(text, i).end() != len(text):
        raise HargoInputError(path, f"not valid JSON: extra data after the array ({_line_col(text, i)})")
    return items


def _type_name(x: Any) -> str:
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean",
            int: "a number", float: "a number", type(None): "null"}.get(type(x), type(x).__name__)


def load_file(path: str | Path) -> list[dict]:
    """Read and strictly check one raw file: a non-empty JSON array of objects, each with string
    fields ``instruction``, ``input`` and ``output`` (other keys are ignored).

    Returns:
        The records as ``{"instruction", "input", "output"}`` dicts, in file order.

    Raises:
        HargoInputError: missing file, empty file, bytes that are not UTF-8, a JSON escape of a
            lone UTF-16 surrogate (``"\\ud83d"``: valid JSON, but no character, so it could never
            be written out), invalid JSON, not an array, an empty array, a record that is not an
            object, a missing field, or a field that is not a string. The first four name the
            record and field they are in (when they are inside one) and the line and column;
            the record index is 0-based.
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
        # The bad bytes decode to lone surrogates here, one character each: offsets stay exact.
        loose = data.decode("utf-8", errors="surrogateescape")
        _fail(path, loose, len(data[:e.start].decode("utf-8")),
              f"not valid UTF-8: byte 0x{data[e.start]:02x} at offset {e.start}", e)
    items = _parse_array(path, text)
    lone = _lone_surrogate(text)
    if lone is not None:
        _fail(path, text, lone, f"JSON escape {text[lone:lone + 6]} is a lone UTF-16 surrogate, "
              "not a Unicode character")
    return check_records(path, items)


def check_records(where: str | Path, items: list) -> list[dict]:
    """Check raw records (a file's parsed array, or a task's ``records()``): a non-empty list
    of objects with string ``instruction``, ``input`` and ``output`` (other keys ignored).

    Returns:
        The records as ``{"instruction", "input", "output"}`` dicts, in order.

    Raises:
        HargoInputError: naming ``where``, the 0-based record and the field: an empty list, not
            a list, a record that is not an object, a missing field or one not a string.
    """
    if not isinstance(items, list):
        raise HargoInputError(where, f"expected a list of records, got {_type_name(items)}")
    if not items:
        raise HargoInputError(where, "no records (empty JSON array)")
    out = []
    for i, rec in enumerate(items):
        if not isinstance(rec, dict):
            raise HargoInputError(where, f"expected a JSON object, got {_type_name(rec)}", record=i)
        for f in FIELDS:
            if f not in rec:
                raise HargoInputError(where, "missing required field", record=i, field=f)
            if not isinstance(rec[f], str):
                raise HargoInputError(where, f"expected a string, got {_type_name(rec[f])}",
                                      record=i, field=f)
        out.append({f: rec[f] for f in FIELDS})
    return out


def load_raw(raw_dir: str | Path) -> dict[str, list[dict]]:
    """The raw records of every registered HPC-GPT task that has some, all checked before
    anything is returned: a ``raw_file`` read by :func:`load_file` (a bare name under
    ``raw_dir``: HPC-GPT's four files; a path as given, :func:`raw_path`), or the task's
    ``records()`` checked by :func:`check_records` (named by :func:`source_file`).

    Returns:
        ``{task: [raw record, ...]}`` in the tasks' listing order.

    Raises:
        HargoInputError: see :func:`load_file` (a missing file is named) and
            :func:`check_records`.
    """
    out = {}
    for t in tasks():
        if t.raw_file:
            out[t.name] = load_file(raw_path(t, raw_dir))
        elif t.records is not None:
            out[t.name] = check_records(f"{source_file(t.name)}()", list(t.records()))
    return out


# ----------------------------------------------------------------------------- records

_WS_RUN = re.compile(r"\s+")


def normalise_text(text: str) -> str:
    """The form two texts are compared in: every whitespace run (line ends of any kind, CRLF,
    CR or LF, included; Unicode whitespace too) as one space, surrounding blanks stripped, case
    folded (``str.casefold``).

    The one key for "the same instruction" (the grouped split, :mod:`hargo.data.split`, and the
    ``validate`` leak expectation, :mod:`hargo.data.validate`) and "the same answer" (the
    conflict vote, :mod:`hargo.data.conflicts`)::

        normalise_text("Is  X\r\nracy? ") == normalise_text("is x\nRACY?") == "is x racy?"
    """
    return _WS_RUN.sub(" ", text).strip().casefold()


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

    (``source.file``: :func:`source_file`.)
    """
    return {
        "id": make_id(task, index),
        "task": task,
        "prompt": [{"role": "user", "content": instruction_prompt(raw["instruction"], raw["input"])}],
        "answer": answer,
        "label": label,
        "alt_answers": list(alt_answers),
        "source": {"file": source_file(task), "index": index},
    }
