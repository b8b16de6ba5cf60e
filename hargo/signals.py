"""SIGTERM as an exception in a stage, so its cleanup runs (:func:`terminate_as_exception`)."""
from __future__ import annotations

import contextlib
from typing import Iterator

__all__ = ["StageTerminated", "terminate_as_exception"]


class StageTerminated(SystemExit):
    """SIGTERM reached a stage: raised in the main thread by :func:`terminate_as_exception`'s
    handler, so ``finally`` blocks and context managers run (the MLflow runs end KILLED, atomic
    outputs are discarded) and the process then exits with code 143 (128 + SIGTERM), the code
    of a process killed by it. A ``SystemExit``, so ``except Exception`` never swallows it."""

    def __init__(self, signum: int):
        super().__init__(128 + signum)
        self.signum = signum

    def __str__(self) -> str:
        return f"terminated by signal {self.signum} (SIGTERM)"


@contextlib.contextmanager
def terminate_as_exception() -> Iterator[None]:
    """Within the block, SIGTERM raises :class:`StageTerminated` in the main thread instead of
    killing the process outright (Python's default, which runs no cleanup and left MLflow runs
    RUNNING forever); the previous handler is restored on exit. SIGINT already raises
    ``KeyboardInterrupt``. Outside the main thread (where Python cannot install handlers) a
    no-op."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        raise StageTerminated(signum)

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
