"""A Prefect worker that stops on SIGTERM: ``python -m flows.worker --pool cpu [options]``.

``prefect worker start`` (Prefect 3.7) answers its first SIGTERM by sending itself SIGINT and
then goes on polling: measured idle on this project, it was still running 65 s after the
signal, and with a flow run going it waits for that run to end (hours of training). A service
manager (systemd, Kubernetes, a SLURM job's end) sends SIGTERM and, some seconds later,
SIGKILL, which leaves the flow run's process orphaned and the stage's MLflow run RUNNING.

This runs ``prefect worker start <the same options>`` as a child and, on SIGTERM (or SIGINT):

1. sends SIGTERM to each flow run the worker started (its child processes): Prefect's engine
   turns it into an exception in the flow, which ends the DVC stage it runs (its MLflow run
   KILLED, DVC records nothing: :func:`flows.stages.run_dvc`), within
   :data:`flows.stages.STOP_GRACE_S`;
2. kills what is left of them after :data:`STOP_GRACE_S`, then the worker (which holds nothing
   that needs a clean exit: the server notices the missing heartbeats);
3. exits with 143 (128 + SIGTERM).

So an idle worker stops at once and a busy one within ~25 s, inside the usual 30 s grace before
SIGKILL. Every option is ``prefect worker start``'s (``--pool``, ``--type``, ``--limit``, ...).
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from flows.stages import STOP_GRACE_S as STAGE_GRACE_S

#: Seconds the flow runs get to end after SIGTERM before they and the worker are killed: the
#: stage's own grace (:data:`flows.stages.STOP_GRACE_S`) plus a little for the flow to exit.
STOP_GRACE_S = STAGE_GRACE_S + 4.0


def worker_command(args: list[str]) -> list[str]:
    """``prefect worker start <args>`` with this environment's ``prefect``."""
    return [str(Path(sys.executable).with_name("prefect")), "worker", "start", *args]


def stop_worker(proc: subprocess.Popen, grace_s: float = STOP_GRACE_S) -> None:
    """Stop the worker ``proc`` (started with ``start_new_session``): SIGTERM to its flow runs
    (its child processes), SIGKILL to those left after ``grace_s`` s, then SIGKILL to the
    worker's process group."""
    import psutil

    try:
        runs = psutil.Process(proc.pid).children()
    except psutil.NoSuchProcess:
        runs = []
    for run in runs:
        try:
            run.terminate()
        except psutil.NoSuchProcess:
            pass
    def alive(run) -> bool:        # a run that ended but is not reaped yet (a zombie) is gone
        try:
            return run.status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    deadline = time.monotonic() + grace_s
    left = [r for r in runs if alive(r)]
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = [r for r in left if alive(r)]
    for run in left:
        try:
            run.kill()
        except psutil.NoSuchProcess:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


def main(argv: list[str] | None = None, command: list[str] | None = None) -> int:
    """Run the worker until it exits (its exit code) or this process gets SIGTERM / SIGINT
    (:func:`stop_worker`, then 143). ``command`` replaces ``prefect worker start <argv>``
    (tests)."""
    cmd = command or worker_command(list(sys.argv[1:] if argv is None else argv))
    stop = threading.Event()
    got: list[int] = []

    def on_signal(signum, frame):
        got.append(signum)
        stop.set()

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        proc = subprocess.Popen(cmd, start_new_session=True)
        while proc.poll() is None and not stop.wait(0.5):
            pass
        if proc.poll() is not None and not stop.is_set():
            return proc.returncode
        print(f"[hargo worker] signal {got[0] if got else '?'}: ending the flow runs of the "
              f"worker (PID {proc.pid}), then the worker", flush=True)
        stop_worker(proc)
        return 128 + signal.SIGTERM
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
