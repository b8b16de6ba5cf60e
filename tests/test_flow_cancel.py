"""A cancelled or interrupted flow run ends the stage it was running (issue 42, item 9): the
stage's MLflow run ends KILLED, not FAILED, and DVC records nothing.

Prefect cancels a flow run on a process worker by sending its process SIGTERM (SIGKILL 30 s
later), which Prefect turns into an exception in the flow's main thread. Here a real process
runs :func:`flows.stages.run_dvc` on a real DVC stage that logs like a training stage, with a
SIGTERM handler that raises as Prefect's does."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from hargo.config import as_config

ROOT = Path(__file__).resolve().parents[1]

STAGE = """
import json, sys, time
from hargo import tracking
from hargo.config import as_config
params = as_config(json.load(open("params.json")))
with tracking.stage_run("rl", params, ".", extra_tags={"hargo.method": "hargo"}) as run:
    open("started", "w").write(run.info.run_id)
    for i in range(600):          # a training stage's log lines
        print(f"step {i}", flush=True)
        time.sleep(0.1)
"""

FLOW = """
import signal, sys
class TerminationSignal(BaseException):      # what Prefect raises on its SIGTERM
    pass
def handler(signum, frame):
    raise TerminationSignal(signum)
signal.signal(signal.SIGTERM, handler)
from flows.stages import run_dvc
try:
    run_dvc(["repro", "stage"])
except TerminationSignal:
    sys.exit(143)
"""


@pytest.mark.timeout(300)
def test_a_cancelled_flow_run_ends_its_stage_killed(tmp_path, committed_params):
    """Before: the flow's process stopped reading DVC's output and waited for it; the stage's
    next log line hit the closed pipe and its run ended FAILED (BrokenPipeError), after DVC had
    run on unwatched."""
    from mlflow.tracking import MlflowClient

    (tmp_path / "params.json").write_text(json.dumps(committed_params))
    (tmp_path / "stage.py").write_text(STAGE)
    (tmp_path / "dvc.yaml").write_text(yaml.safe_dump({"stages": {"stage": {
        "cmd": f"{sys.executable} stage.py", "deps": ["stage.py"], "outs": ["out"]}}}))
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri, "DVC_NO_ANALYTICS": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    env.pop("HARGO_PARENT_RUN_ID", None)
    subprocess.run([sys.executable, "-m", "dvc", "init", "--no-scm", "-q"], cwd=tmp_path,
                   env=env, check=True, timeout=120)
    flow = subprocess.Popen([sys.executable, "-c", FLOW], cwd=tmp_path, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not (tmp_path / "started").exists():
        assert flow.poll() is None and time.monotonic() < deadline, flow.stderr.read()
        time.sleep(0.2)
    time.sleep(0.5)
    t0 = time.monotonic()
    flow.send_signal(signal.SIGTERM)                 # Prefect's cancel
    try:
        flow.wait(timeout=60)
    except subprocess.TimeoutExpired:
        flow.kill()
    waited = time.monotonic() - t0
    run = MlflowClient(uri).get_run((tmp_path / "started").read_text())
    assert run.info.status == "KILLED" and run.info.end_time, run.data.tags.get("hargo.error")
    assert run.data.tags["hargo.error"].startswith("StageTerminated")
    assert flow.returncode == 143 and waited < 30, (flow.returncode, waited)
    assert not (tmp_path / "dvc.lock").exists()             # DVC recorded nothing


def test_the_pipeline_parent_run_ends_as_the_flow_run_did(mlflow_uri, committed_params):
    """A cancelled pipeline flow closes its MLflow parent KILLED, as its stage run ends (before:
    FINISHED, since a cancel is no ``Exception``); a failed one FAILED, a completed one
    FINISHED. One store for the three (a new store costs MLflow's migrations)."""
    from mlflow.tracking import MlflowClient

    from flows.publish import close_mlflow_run
    from hargo import tracking

    for failure, killed, status in [
            (None, False, "FINISHED"), ("step sft failed", False, "FAILED"),
            ("pipeline cancelled: TerminationSignal: 15", True, "KILLED")]:
        parent = tracking.start_parent_run(as_config(committed_params), "prefect")
        close_mlflow_run.fn(parent, failure, killed)
        run = MlflowClient(mlflow_uri).get_run(parent)
        assert run.info.status == status and run.info.end_time, failure
        assert run.data.tags.get("hargo.failure") == failure
