"""The Prefect worker stops on SIGTERM (issue 42, item 9): ``python -m flows.worker`` ends the
flow runs its ``prefect worker start`` child started, then the worker, and exits 143 -- at once
when idle, within ~25 s when busy. ``prefect worker start`` itself ignored SIGTERM for more than
20 s (tests/test_prefect_deploy.py has the real worker on a real server)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path


ROOT = Path(__file__).resolve().parents[1]

# a stand-in for `prefect worker start`: ignores SIGTERM and SIGINT as the real one does, and
# has one "flow run" child that ends on SIGTERM (as Prefect's engine does), writing a marker
FAKE_WORKER = """
import signal, subprocess, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
signal.signal(signal.SIGINT, signal.SIG_IGN)
run = subprocess.Popen([sys.executable, "-c", '''
import signal, sys, time
def bye(*a):
    open("run-terminated", "w").write("yes")
    sys.exit(143)
signal.signal(signal.SIGTERM, bye)
open("run-started", "w").write("yes")
time.sleep(600)
'''])
open("worker.pid", "w").write(str(run.pid))
time.sleep(600)
"""


def test_sigterm_ends_the_flow_runs_then_the_worker(tmp_path):
    code = ("import sys\nfrom flows.worker import main\n"
            f"sys.exit(main(command=[sys.executable, '-c', {FAKE_WORKER!r}]))")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH",
                                                                                  "")])}
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 60
    while not (tmp_path / "run-started").exists():
        assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read()
        time.sleep(0.1)
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 143 and time.monotonic() - t0 < 10, out
    assert (tmp_path / "run-terminated").read_text() == "yes"      # the flow run got SIGTERM
    import psutil

    try:       # gone, or a zombie waiting for init to reap it (its parent was killed)
        assert psutil.Process(int((tmp_path / "worker.pid").read_text())).status() \
            == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        pass
    assert "ending the flow runs of the worker" in out


def test_a_worker_that_exits_on_its_own_passes_its_exit_code():
    from flows.worker import main, worker_command

    assert main(command=[sys.executable, "-c", "raise SystemExit(3)"]) == 3
    assert worker_command(["--pool", "cpu"])[1:] == ["worker", "start", "--pool", "cpu"]
