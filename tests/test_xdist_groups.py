"""scripts/test.sh runs the suite with ``-n 2 --dist loadgroup``: the tests of one
``xdist_group`` (the shared tiny pipeline, the GPU-check dry run, ...) must run on one worker,
so that their module and session fixtures are built once. pytest 9.2 with pytest-xdist 3.8
breaks this silently (xdist issue #1386: the group suffix no longer reaches the scheduler, and
every grouped test is distributed on its own); pyproject.toml pins pytest below 9.2. This test
runs a crafted two-module suite the way scripts/test.sh does and fails if the grouping is lost.
"""
from __future__ import annotations

import os
import subprocess
import sys

GROUPED = '''
import os, pytest

pytestmark = pytest.mark.xdist_group("heavy")


@pytest.fixture(scope="module")
def built():
    with open(os.environ["GROUP_LOG"], "a") as f:
        f.write(f"fixture {os.environ['PYTEST_XDIST_WORKER']}\\n")


@pytest.mark.parametrize("i", range(6))
def test_grouped(built, i):
    with open(os.environ["GROUP_LOG"], "a") as f:
        f.write(f"grouped {os.environ['PYTEST_XDIST_WORKER']}\\n")
'''
LOOSE = '''
import time, pytest


@pytest.mark.parametrize("i", range(12))
def test_loose(i):
    time.sleep(0.05)
'''


def test_an_xdist_group_runs_on_one_worker_and_builds_its_fixture_once(tmp_path):
    (tmp_path / "test_grouped.py").write_text(GROUPED)
    (tmp_path / "test_loose.py").write_text(LOOSE)
    log = tmp_path / "log"
    env = {**os.environ, "GROUP_LOG": str(log)}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "-n", "2", "--dist", "loadgroup", "-p", "randomly", str(tmp_path)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = log.read_text().split()
    workers = {lines[i + 1] for i in range(0, len(lines), 2) if lines[i] == "grouped"}
    assert lines.count("grouped") == 6 and len(workers) == 1, log.read_text()
    assert lines.count("fixture") == 1, log.read_text()     # built once, not once per worker
