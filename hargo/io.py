"""Whole-or-nothing file output and strict JSON/JSONL input.

Every stage writes through these helpers so that an interrupted or failed stage never leaves a
half-written output: data goes to a temporary sibling first and is renamed into place only when
complete (``os.replace`` is atomic on POSIX within one file system).
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator


class HargoInputError(ValueError):
    """Bad input data. The message names the file, the record (0-based index, as in Python and
    in the ``source.index`` of prepared records; for a JSONL file also its 1-based ``line``, what
    an editor shows) and the field."""

    def __init__(self, path: str | os.PathLike, message: str, record: int | None = None,
                 field: str | None = None, line: int | None = None):
        self.path, self.record, self.field, self.line = str(path), record, field, line
        where = str(path)
        if record is not None:
            where += f", record {record}" + (f" (line {line})" if line is not None else "")
        if field is not None:
            where += f", field '{field}'"
        super().__init__(f"{where}: {message}")


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _tmp_sibling(path: Path, suffix: str = "") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=f"{suffix}.tmp", dir=path.parent)
    os.close(fd)
    # mkstemp makes the file 0600; give it the mode a plain open() would (0666 less the umask),
    # so results on a shared file system stay readable by the group.
    os.chmod(tmp, 0o666 & ~_umask())
    return Path(tmp)


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` whole or not at all."""
    return _replace_atomically(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """Write ``data`` to ``path`` whole or not at all."""
    return _replace_atomically(path, lambda tmp: tmp.write_bytes(data))


def _replace_atomically(path: str | os.PathLike, write) -> Path:
    """``write(tmp)`` into a sibling temporary file, then ``os.replace`` it onto ``path``; on any
    error the temporary file is removed and ``path`` is untouched."""
    path = Path(path)
    tmp = _tmp_sibling(path)
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def atomic_write_json(path: str | os.PathLike, obj: Any, indent: int = 2) -> Path:
    """Write ``obj`` as pretty JSON (sorted keys, trailing newline) atomically."""
    return atomic_write_text(path, _json_text(obj, indent, path))


def _json_text(obj: Any, indent: int, path: str | os.PathLike = "<json>") -> str:
    text = json.dumps(obj, indent=indent, sort_keys=True, ensure_ascii=False)
    _refuse_surrogate_pairs(text, obj, path, None)
    return _escape_breaks(text) + "\n"


# Characters json.dumps(ensure_ascii=False) leaves raw that some line readers break at (NEL, the
# Unicode line and paragraph separators: str.splitlines, JavaScript before ES2019) and the lone
# UTF-16 surrogates a Python str may hold but UTF-8 cannot encode. JSON allows each one as a
# \uXXXX escape, and in json.dumps output they can only stand inside a string.
_BREAKS = re.compile("[\u0085\u2028\u2029\ud800-\udfff]")


def _escape_breaks(text: str) -> str:
    return _BREAKS.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


# A lone high surrogate right before a lone low one: two code points of a Python str that JSON
# can only write as the escapes of a surrogate pair, which every JSON reader (json.loads
# included) takes for the one astral character they encode ("\ud83d\ude00" reads back as
# "\U0001f600"). json.dumps(ensure_ascii=False) leaves them raw, so in its output such a pair
# can only stand inside one string.
_SURROGATE_PAIR = re.compile("[\ud800-\udbff][\udc00-\udfff]")


def _pair_field(obj: Any, where: str = "") -> str | None:
    """The dotted path (``prompt[0].content``) of the first string in ``obj`` (a key or a value)
    that holds a :data:`_SURROGATE_PAIR`; None if none does."""
    if isinstance(obj, str):
        return where or "(the value)" if _SURROGATE_PAIR.search(obj) else None
    if isinstance(obj, dict):
        for k, v in obj.items():
            key = f"{where}.{k}" if where else str(k)
            if isinstance(k, str) and _SURROGATE_PAIR.search(k):
                return f"{key} (the key)"
            found = _pair_field(v, key)
            if found:
                return found
    if isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            found = _pair_field(v, f"{where}[{i}]")
            if found:
                return found
    return None


def _refuse_surrogate_pairs(text: str, obj: Any, path: str | os.PathLike,
                            record: int | None) -> None:
    """Raise where ``text`` (``json.dumps(obj, ensure_ascii=False)``) holds a
    :data:`_SURROGATE_PAIR`: the file would not read back as written.

    Raises:
        HargoInputError: naming ``path``, ``record`` and the field, and the two code points."""
    m = _SURROGATE_PAIR.search(text)
    if m:
        hi, lo = (ord(c) for c in m.group())
        astral = 0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00)
        raise HargoInputError(
            path, f"cannot write U+{hi:04X} followed by U+{lo:04X}: two lone UTF-16 surrogates "
            f"(not text, UTF-8 cannot encode them) that JSON can only write as one escaped "
            f"pair, which reads back as the single character U+{astral:X}; replace them "
            f"(e.g. s.encode('utf-16', 'surrogatepass').decode('utf-16') joins the pair, "
            f"s.encode('utf-8', 'replace').decode() makes each a '?')",
            record=record, field=_escape_surrogates(_pair_field(obj) or ""))


def _escape_surrogates(text: str) -> str:
    """``text`` with each surrogate as ``\\uXXXX`` (printable: a key may hold them)."""
    return re.sub("[\ud800-\udfff]", lambda m: f"\\u{ord(m.group()):04x}", text)


def jsonl_line(record: Any, path: str | os.PathLike = "<jsonl>", index: int | None = None) -> str:
    """One JSONL line for ``record`` (no newline): ``json.dumps`` with non-ASCII characters kept
    as they are, except NEL (U+0085), U+2028, U+2029 and lone surrogates, written as ``\\uXXXX``
    escapes. The line then holds no character any line splitter breaks at, is valid UTF-8, and
    :func:`read_jsonl` gives back ``record`` for any strings in it. The one string JSON cannot
    write so that it reads back is refused: a lone high surrogate directly before a lone low
    one (``"\\ud83d\\ude00"`` would read back as ``"😀"``; the error names ``path``, the
    record ``index`` and the field).

    Raises:
        HargoInputError: a string of ``record`` holds a high surrogate then a low one."""
    text = json.dumps(record, ensure_ascii=False)
    _refuse_surrogate_pairs(text, record, path, index)
    return _escape_breaks(text)


def jsonl_lines(text: str) -> Iterator[str]:
    """The non-blank lines of a JSONL text: split at ``\\n`` only (the JSON Lines separator; a
    ``\\r`` before it is JSON whitespace), never at the other breaks ``str.splitlines`` knows
    (U+2028, U+2029, U+0085, form feed...), which may stand raw inside a JSON string."""
    return (line for _, line in numbered_jsonl_lines(text))


def numbered_jsonl_lines(text: str) -> Iterator[tuple[int, str]]:
    """``(1-based line number, line)`` of :func:`jsonl_lines`' lines (blank lines counted)."""
    return ((n, line) for n, line in enumerate(text.split("\n"), 1) if line.strip(" \t\r"))


def atomic_write_jsonl(path: str | os.PathLike, records: Iterable[dict]) -> Path:
    """Write one JSON object per line atomically (:func:`jsonl_line`; nothing is written where
    a record is refused); returns the path."""
    return _replace_atomically(path, lambda tmp: _write_jsonl(tmp, records, path))


def write_json(path: str | os.PathLike, obj: Any, indent: int = 2) -> Path:
    """Write ``obj`` as :func:`atomic_write_json` does, but in place: for a path staged by
    :func:`atomic_files` (which makes it whole or not at all)."""
    path = Path(path)
    path.write_text(_json_text(obj, indent, path), encoding="utf-8")
    return path


def write_jsonl(path: str | os.PathLike, records: Iterable[dict]) -> Path:
    """Write one JSON object per line, in place: for a path staged by :func:`atomic_files`."""
    return _write_jsonl(path, records, path)


def _write_jsonl(path: str | os.PathLike, records: Iterable[dict],
                 name: str | os.PathLike) -> Path:
    """:func:`write_jsonl` into ``path``, naming ``name`` (the file it becomes) in errors."""
    path = Path(path)
    with path.open("w", encoding="utf-8") as f:
        for i, r in enumerate(records):
            f.write(jsonl_line(r, name, i) + "\n")
    return path


@contextlib.contextmanager
def atomic_files() -> Iterator[Callable[[str | os.PathLike], Path]]:
    """Write several files whole or not at all, as one set.

    Yields ``stage(path)``, which returns a new temporary sibling of ``path`` to write (with
    :func:`write_json`, :func:`write_jsonl`, ``Path.write_text``...). On normal exit every
    temporary replaces its ``path`` (``os.replace``, in the order staged): the only step left
    once everything was written. On any exception inside the block every temporary is deleted
    and no ``path`` is touched, so a failure partway never leaves a mix of old and new files::

        with atomic_files() as stage:
            write_jsonl(stage(out / "train.jsonl"), train)
            write_json(stage(out / "stats.json"), stats)

    The replaces themselves are one rename each, not one for the set: a crash between two of
    them (or a rename that fails, its temporary and the later ones are then deleted) can still
    leave the earlier paths new; only a directory swap (:func:`atomic_dir`) avoids that.

    Raises:
        ValueError: the same path staged twice.
    """
    staged: dict[Path, Path] = {}

    def stage(path: str | os.PathLike) -> Path:
        path = Path(path)
        if path in staged:
            raise ValueError(f"{path} is already staged in this atomic_files block")
        staged[path] = _tmp_sibling(path)
        return staged[path]

    try:
        yield stage
        for path, tmp in list(staged.items()):
            os.replace(tmp, path)
            del staged[path]
    finally:
        for tmp in staged.values():
            tmp.unlink(missing_ok=True)


def sha256_files(paths: Iterable[str | os.PathLike], name_separator: bytes = b"") -> str:
    """SHA-256 (hex) over files by name and content: for each file in path order, its name
    (``Path.name``, UTF-8) followed by ``name_separator``, then its bytes (read in 4 MiB chunks).

    Raises:
        FileNotFoundError: a path does not exist.
    """
    import hashlib

    h = hashlib.sha256()
    for p in sorted(Path(x) for x in paths):
        h.update(p.name.encode() + name_separator)
        with open(p, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 22), b""):
                h.update(chunk)
    return h.hexdigest()


def read_jsonl(path: str | os.PathLike) -> list[dict]:
    """Read a JSONL file of objects.

    Raises:
        HargoInputError: the file is missing, not UTF-8, or a line is not a JSON object
            (the message names the file, the 0-based record index and the 1-based line).
    """
    path = Path(path)
    if not path.exists():
        raise HargoInputError(path, "file not found")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise HargoInputError(path, f"not valid UTF-8 at byte {e.start}") from e
    out = []
    for i, (n, line) in enumerate(numbered_jsonl_lines(text)):
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            raise HargoInputError(path, f"not valid JSON: {e.msg}", record=i, line=n) from e
        if not isinstance(rec, dict):
            raise HargoInputError(path, f"expected a JSON object, got {type(rec).__name__}",
                                  record=i, line=n)
        out.append(rec)
    return out


@contextlib.contextmanager
def atomic_dir(path: str | os.PathLike) -> Iterator[Path]:
    """Build a directory whole or not at all.

    Yields a temporary sibling directory to fill; on normal exit it replaces ``path`` (an old
    ``path`` is removed only then), on any exception it is deleted and ``path`` is untouched.
    A ``.complete`` marker file is written last, so readers can tell a finished folder from a
    folder left by a crash of some other tool (see :func:`require_complete_dir`).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    os.chmod(tmp, 0o777 & ~_umask())  # mkdtemp makes 0700; a plain mkdir would honour the umask
    try:
        yield tmp
        (tmp / ".complete").write_text("ok\n")
        if path.exists():
            old = path.with_name(f".{path.name}.old")
            shutil.rmtree(old, ignore_errors=True)
            os.replace(path, old)
            os.replace(tmp, path)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def require_complete_dir(path: str | os.PathLike, what: str = "model folder") -> Path:
    """Check that ``path`` is a folder finished by :func:`atomic_dir`.

    Raises:
        FileNotFoundError: missing, or missing its ``.complete`` marker (half-written).
    """
    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"{what} {path} does not exist; run the stage that makes it")
    if not (path / ".complete").exists():
        raise FileNotFoundError(f"{what} {path} is incomplete (no .complete marker): it was "
                                "half-written by an interrupted run; re-run the stage")
    return path
