"""A full disk, told as one line: the path, the space there, and what the stage needs.

Every stage writes its outputs to a temporary name and renames them into place
(:mod:`hargo.io`, the trainers' final save), so a full disk leaves nothing half written; what
was left was the message: a ``No space left on device`` deep inside torch, safetensors or
pyarrow, 96 lines of traceback. :func:`disk_full` recognises the error whichever library raised
it (``OSError`` with ``errno.ENOSPC``, also when wrapped or chained, and the texts of the
libraries that turn it into their own error: torch's ``PytorchStreamWriter failed writing
file``, safetensors' ``os error 28`` / ``StorageFull``), and :func:`disk_full_message` says
where, how much is free there, and how much the stage's largest output needs (the size of the
model it starts from, for the stages that save a model).
"""
from __future__ import annotations

import errno
import re
import shutil
from pathlib import Path

__all__ = ["NotEnoughSpace", "disk_full", "disk_full_message", "human_bytes", "require_free"]

# what the libraries say when they wrap ENOSPC (seen on a full tmpfs: safetensors 0.7 "I/O
# error: No space left on device (os error 28)"; torch 2.x "[enforce fail at
# inline_container.cc:...] . unexpected pos 576 vs 534" from its zip writer, or "file write
# failed")
_TEXTS = re.compile(r"no space left on device|os error 28|storagefull|disk quota exceeded|"
                    r"inline_container\.cc.*(unexpected pos|file write failed)", re.I | re.S)


class NotEnoughSpace(OSError):
    """A check before writing found too little free space (``errno`` ENOSPC, so
    :func:`disk_full` is true for it). ``filename`` is the folder, ``needed`` and ``free`` are
    bytes, ``what`` names what was to be written there."""

    def __init__(self, folder: str | Path, needed: int, free: int, what: str):
        super().__init__(errno.ENOSPC, "No space left on device", str(folder))
        self.needed, self.free, self.what = int(needed), int(free), what


def require_free(folder: str | Path, needed: int, what: str) -> None:
    """Check that ``folder``'s file system has ``needed`` bytes free before writing ``what``.

    Raises:
        NotEnoughSpace: fewer than ``needed`` bytes are free there.
    """
    folder = Path(folder)
    free = shutil.disk_usage(_existing(folder)).free
    if free < needed:
        raise NotEnoughSpace(folder, needed, free, what)


def _chain(exc: BaseException):
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


def disk_full(exc: BaseException) -> bool:
    """Whether ``exc`` (or an exception it was raised from) means the disk is full.

    True for ``OSError`` with ``errno`` ENOSPC or EDQUOT, and for the messages libraries give
    when they wrap that error (:data:`_TEXTS`, case-insensitive)."""
    for e in _chain(exc):
        if isinstance(e, OSError) and e.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", -1)):
            return True
        if _TEXTS.search(str(e)):
            return True
    return False


def human_bytes(n: float) -> str:
    """``n`` bytes as ``'1.5 GiB'`` (binary units)."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def _folder_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.is_dir() else 0


def _existing(path: Path) -> Path:
    path = path.absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def disk_full_message(exc: BaseException, out_dir: str | Path = ".",
                      model_dir: str | Path | None = None) -> str:
    """One line for a stage that ran out of disk.

    Args:
        exc: the error (:func:`disk_full` is true for it).
        out_dir: where the stage writes, used when the error names no file.
        model_dir: the model the stage starts from, if any: a saved model needs about its
            size (a LoRA adapter less).

    Returns:
        ``no space left on device writing <path>: <free> free of <total> on that file system;
        ...``: the path (the error's file name if it has one), the free space there and what
        the stage needs.
    """
    for e in _chain(exc):
        if isinstance(e, NotEnoughSpace):     # found by a check before anything was written
            return (f"not enough space in {Path(e.filename).absolute()} for {e.what}: it needs "
                    f"about {human_bytes(e.needed)}, {human_bytes(e.free)} free. Nothing was "
                    "written; free space there (or point TMPDIR at a folder with room, for a "
                    "temporary copy) and run the stage again.")
    path = None
    for e in _chain(exc):
        name = getattr(e, "filename", None)
        if name:
            path = Path(name)
            break
    path = (path or Path(out_dir)).absolute()
    usage = shutil.disk_usage(_existing(path))
    msg = (f"no space left on device writing {path}: {human_bytes(usage.free)} free of "
           f"{human_bytes(usage.total)} on that file system")
    need = _folder_bytes(Path(model_dir)) if model_dir else 0
    if need:
        msg += (f"; the stage saves a model of about {human_bytes(need)} (the size of "
                f"{model_dir}), so it needs at least that much free")
    return msg + ". Nothing half written was kept (outputs are renamed into place whole); " \
                 "free space there, or move the project, and run the stage again."
