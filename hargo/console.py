"""What a stage prints: hargo's own progress, and each distinct library warning once.

Libraries repeat themselves: TRL warns about the installed vLLM version from five modules when
it is imported, in every process that imports it, so an ``rl`` stage printed the same paragraph
five times and the synthetic stage once per worker as well. :func:`warnings_once` shows each
distinct warning (category and text) the first time it is raised, counts the repeats and, when
the block ends, prints one line saying how many were not shown again. Processes started inside
the block (DVC, multiprocessing workers) inherit ``PYTHONWARNINGS=once::UserWarning``: each of
them shows a given warning text once (Python's ``once`` action, docs.python.org "The Warnings
Filter"); they cannot add to this process's count.

Libraries that log instead of warning get the same treatment where their logging is configured
with :class:`OncePerMessage`: vLLM's is (:data:`VLLM_LOGGING_CONFIG`, through vLLM's own
``VLLM_LOGGING_CONFIG_PATH``): its CPU worker logs "CPU backend doesn't allow to use
`torch.set_num_threads` ..." four times per engine and every engine repeats its start-up
warnings; each distinct WARNING-or-above message is shown once and its repeats are counted in
the same summary line.
"""
from __future__ import annotations

import contextlib
import logging
import os
import sys
import warnings
from collections import Counter
from pathlib import Path
from typing import Iterator, TextIO

__all__ = ["warnings_once", "OncePerMessage", "VLLM_LOGGING_CONFIG", "table_console"]

CHILD_FILTER = "once::UserWarning"


#: the open ``warnings_once`` blocks' counters, innermost last (read by :class:`OncePerMessage`)
_OPEN: list[Counter] = []

#: vLLM's logging configuration under hargo (``VLLM_LOGGING_CONFIG_PATH``, set by
#: :func:`hargo.evaluation.generate.import_vllm`): vLLM's ``vllm`` logger at WARNING through one
#: stream handler with :class:`OncePerMessage`.
VLLM_LOGGING_CONFIG = Path(__file__).with_name("vllm_logging.json")


class OncePerMessage(logging.Filter):
    """A logging filter: inside :func:`warnings_once`, a WARNING-or-above record passes the first
    time its message template (``record.msg``, before the arguments are put in) is seen from its
    library, and its repeats are counted in the block's summary; outside a block, or below
    WARNING, every record passes. Named in a ``dictConfig`` as
    ``{"()": "hargo.console.OncePerMessage"}`` (vLLM re-applies its configuration at every engine
    start, so the count lives in the block, not in the filter)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not _OPEN or record.levelno < logging.WARNING:
            return True
        seen = _OPEN[-1]
        key = (f"{record.name.split('.')[0]} {record.levelname}", str(record.msg))
        seen[key] += 1
        return seen[key] == 1


@contextlib.contextmanager
def warnings_once(stream: TextIO | None = None) -> Iterator[Counter]:
    """Inside the block, each distinct ``UserWarning`` (and subclass) is shown once, on one line
    (the warning without the library's source line under it); the repeats are counted and
    summarised on ``stream`` (default ``sys.stderr``) at the end.

    Yields:
        ``Counter`` of ``(category name, message text)`` -> times raised (shown or not).

    The previous warning filters, ``warnings.showwarning`` and ``PYTHONWARNINGS`` are
    restored on exit.
    """
    seen: Counter = Counter()
    old_env = os.environ.get("PYTHONWARNINGS")
    with warnings.catch_warnings():
        shown_by = warnings.showwarning

        def show(message, category, filename, lineno, file=None, line=None):
            key = (category.__name__, str(message))
            seen[key] += 1
            if seen[key] == 1:   # line "": one line, without the library's source line
                shown_by(message, category, filename, lineno, file, "")

        # every repeat reaches `show` (Python's default shows one per code location)
        warnings.filterwarnings("always", category=UserWarning)
        warnings.showwarning = show
        os.environ["PYTHONWARNINGS"] = ",".join(x for x in (old_env, CHILD_FILTER) if x)
        _OPEN.append(seen)
        try:
            yield seen
        finally:
            _OPEN.pop()
            if old_env is None:
                os.environ.pop("PYTHONWARNINGS", None)
            else:
                os.environ["PYTHONWARNINGS"] = old_env
            repeats = {k: n - 1 for k, n in seen.items() if n > 1}
            if repeats:
                out = stream or sys.stderr
                print(f"({sum(repeats.values())} repeats of {len(repeats)} library warning(s) "
                      "above not shown again: " + "; ".join(
                          f"{cat} '{msg[:60]}{'...' if len(msg) > 60 else ''}' x{n + 1}"
                          for (cat, msg), n in repeats.items()) + ")", file=out, flush=True)


def columns_env() -> int | None:
    """``$COLUMNS`` as a width, or None where it says nothing usable: unset, empty, ``0``, a
    negative number or junk (rich would take ``COLUMNS=0`` as a zero-wide console and print
    nothing at all, exit 0); a positive width below :data:`MIN_COLUMNS` is raised to it (the
    terminal wraps the longer lines, nothing is cut)."""
    raw = os.environ.get("COLUMNS", "").strip()
    if not raw.isdigit() or int(raw) <= 0:
        return None
    return max(int(raw), MIN_COLUMNS)


#: The narrowest console a table is laid out for (a stacked layout fits it).
MIN_COLUMNS = 40


def table_console(min_width: int):
    """A rich ``Console`` for a stage's tables: as wide as ``$COLUMNS`` says when it is a positive
    width (the user's choice, also for a narrow terminal; :func:`columns_env`), else the
    terminal's width; only where neither tells (a pipe, a log file: rich would assume 80 columns
    and cut the model names) at least ``min_width`` columns. ``COLUMNS=0`` or junk counts as
    unset, never as a zero-wide console that prints nothing."""
    from rich.console import Console

    width = columns_env()
    if width is not None:
        return Console(width=width)
    saved = os.environ.pop("COLUMNS", None)   # rich reads it too: "0" would make it zero-wide
    try:
        console = Console()
        width = console.width if console.is_terminal else max(console.width, min_width)
    finally:
        if saved is not None:
            os.environ["COLUMNS"] = saved
    return Console(width=width)   # fixed: rich would read $COLUMNS again at each print
