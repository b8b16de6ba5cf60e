"""Integration: a real Prefect server, prefect.yaml deployments, a process worker.

Starts ``prefect server start`` on 127.0.0.1 on a free port (its own PREFECT_HOME in a temp
folder), deploys every deployment of the project's ``prefect.yaml`` (``prefect --no-prompt
deploy --all``) to two ``process`` work pools, starts a worker on ``cpu``, and triggers
``hargo-validate/cpu``: two deployment runs -- one on a small prepared set that must
reach Completed (its stage run through DVC, recorded in ``dvc.lock``), one with a bad
parameter that must fail before any task runs, naming the parameter -- then stops the worker
and the server by their PIDs. No fixed time budget per phase: every wait polls (the server's
health endpoint, the flow runs' states) until ready or one overall deadline, ``TIMEOUT_S``
(900 s; env ``HARGO_PREFECT_TEST_TIMEOUT_S``), so a slow shared machine only makes it slower.

Also checks the static side of the deployments: ``prefect.yaml``'s structure (checked here
against the keys Prefect documents for the file: Prefect 3.7 has no public API that loads or
validates it, only the CLI's private ``prefect.cli.deploy._models``; the integration test's
``prefect deploy --all`` is Prefect's own check), the pools, entrypoints and parameters the docs
promise, and the GPU Kubernetes job template requests ``nvidia.com/gpu`` and only uses
placeholders it declares.
"""
from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from uuid import UUID

import pytest
import yaml

from flow_project import ROOT, make_project

#: Overall limit of the integration test (server start, deploys, both runs), seconds: generous,
#: because every wait polls and returns as soon as its condition holds.
TIMEOUT_S = float(os.environ.get("HARGO_PREFECT_TEST_TIMEOUT_S", "900"))
POLL_S = 0.5
PREFECT = str(Path(sys.executable).with_name("prefect"))
TERMINAL = {"COMPLETED", "FAILED", "CRASHED", "CANCELLED"}
DEPLOYMENTS = ("hargo-pipeline/cpu", "hargo-pipeline/gpu", "hargo-validate/cpu",
               "hargo-sft/cpu", "hargo-sft/gpu", "hargo-rl/cpu", "hargo-rl/gpu",
               "hargo-evaluate/cpu", "hargo-evaluate/gpu", "hargo-comparison/cpu",
               "hargo-comparison/gpu")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _left(deadline: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError(f"integration test exceeded its overall timeout of {TIMEOUT_S:.0f} s "
                           "(HARGO_PREFECT_TEST_TIMEOUT_S)")
    return left


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM the process group led by ``proc`` (started with start_new_session), then
    SIGKILL after 15 s."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    except ProcessLookupError:
        pass


def _cli(args: list[str], env: dict, cwd: Path, deadline: float) -> str:
    proc = subprocess.run([PREFECT, *args], env=env, cwd=cwd, capture_output=True, text=True,
                          timeout=_left(deadline))
    assert proc.returncode == 0, f"prefect {' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


@pytest.fixture()
def prefect_server(tmp_path):
    """A real Prefect server on 127.0.0.1:<free port>, polled on ``/api/health`` until it answers
    (or the overall deadline); yields (env for clients, deadline)."""
    deadline = time.monotonic() + TIMEOUT_S
    port = _free_port()
    api = f"http://127.0.0.1:{port}/api"
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PREFECT_", "MLFLOW_TRACKING_URI", "HARGO_"))}
    env.update(PREFECT_HOME=str(tmp_path / "prefect-home"), PREFECT_API_URL=api,
               PREFECT_SERVER_ANALYTICS_ENABLED="false", PREFECT_UI_ENABLED="false",
               PREFECT_WORKER_QUERY_SECONDS="1", PREFECT_WORKER_PREFETCH_SECONDS="5",
               OMP_NUM_THREADS="1", PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    log = (tmp_path / "server.log").open("w")
    server = subprocess.Popen([PREFECT, "server", "start", "--host", "127.0.0.1", "--port",
                               str(port), "--no-ui"], env=env, stdout=log,
                              stderr=subprocess.STDOUT, start_new_session=True)
    try:
        while True:
            if server.poll() is not None:
                pytest.fail(f"prefect server exited ({server.returncode}):\n"
                            + (tmp_path / "server.log").read_text()[-3000:])
            try:
                with urllib.request.urlopen(f"{api}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"prefect server not healthy within {TIMEOUT_S:.0f} s "
                            "(HARGO_PREFECT_TEST_TIMEOUT_S):\n"
                            + (tmp_path / "server.log").read_text()[-3000:])
            time.sleep(POLL_S)
        yield env, deadline
    finally:
        _stop(server)
        log.close()


def _wait_final(client, run_id, deadline: float):
    while True:
        run = client.read_flow_run(run_id)
        if run.state is not None and run.state.type.value in TERMINAL:
            return run
        _left(deadline)
        time.sleep(POLL_S)


@pytest.mark.timeout(TIMEOUT_S + 60)
def test_validate_deployment_on_process_worker(prefect_server, tmp_path, real_raw_dir):
    env, deadline = prefect_server
    n = 30
    project = make_project(tmp_path / "project", real_raw_dir, n, params_updates={
        "validate.task_counts": {t: [1, n] for t in ("race_c", "race_fortran", "mlperf", "plp")},
        "validate.yes_fraction": [0.0, 1.0],
        "data.split.eval_fraction": 0.25}, dvc=True)  # the flows run stages through DVC
    # the small prepared set the deployed validate step checks
    prep = subprocess.run([sys.executable, "-m", "hargo.cli", "prepare"], cwd=project, env=env,
                          capture_output=True, text=True, timeout=_left(deadline))
    assert prep.returncode == 0, prep.stderr

    # both pools of prefect.yaml (here `gpu` is a process pool too: only `cpu` gets a worker)
    _cli(["work-pool", "create", "cpu", "--type", "process"], env, project, deadline)
    _cli(["work-pool", "create", "gpu", "--type", "process"], env, project, deadline)
    out = _cli(["--no-prompt", "deploy", "--all"], env, project, deadline)
    created = set(re.findall(r"Deployment '([a-z-]+/[a-z]+)' successfully created", out))
    assert created == set(DEPLOYMENTS), out[-3000:]

    wlog = (tmp_path / "worker.log").open("w")
    # the documented worker command (it stops on SIGTERM: test_the_hargo_worker_stops_on_sigterm)
    worker = subprocess.Popen([sys.executable, "-m", "flows.worker", "--pool", "cpu", "--type",
                               "process"], cwd=project, env=env, stdout=wlog,
                              stderr=subprocess.STDOUT, start_new_session=True)
    try:
        from prefect.client.orchestration import get_client
        from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId
        from prefect.deployments import run_deployment
        from prefect.settings import PREFECT_API_URL, temporary_settings

        with temporary_settings({PREFECT_API_URL: env["PREFECT_API_URL"]}):
            good = run_deployment("hargo-validate/cpu", timeout=0).id
            # the documented CLI trigger, with a bad value in the per-run overrides
            out = _cli(["deployment", "run", "hargo-validate/cpu", "-p",
                        'overrides={"rl.steps": 0}'], env, project, deadline)
            bad = UUID(re.search(r"UUID: ([0-9a-f-]{36})", out).group(1))
            with get_client(sync_client=True) as client:
                good_run = _wait_final(client, good, deadline)
                bad_run = _wait_final(client, bad, deadline)
                assert bad_run.parameters["overrides"] == {"rl.steps": 0}
                bad_tasks = client.read_task_runs(
                    flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[bad])))
        assert worker.poll() is None, "the worker died"
    finally:
        _stop(worker)
        wlog.close()
    worker_log = (tmp_path / "worker.log").read_text()

    # bad params: the run fails before any task, and says which parameter
    assert bad_run.state.type.value == "FAILED", worker_log[-4000:]
    assert "rl.steps: must be >= 1, got 0" in bad_run.state.message
    assert bad_tasks == [], [t.name for t in bad_tasks]
    assert good_run.state.type.value == "COMPLETED", \
        f"{good_run.state.type.value}: {good_run.state.message}\n{worker_log[-4000:]}"
    # the validate stage ran in the project copy, through `dvc repro --single-item validate`
    assert (project / "metrics" / "validation.json").exists()
    assert "validate" in yaml.safe_load((project / "dvc.lock").read_text())["stages"]


# ------------------------------------------------------------------ static deployment checks
#: The keys Prefect 3 documents for prefect.yaml ("Define deployments with YAML"): top level,
#: one deployment, one deployment's ``work_pool``. Prefect has no public loader/validator of the
#: file (its CLI's model is private), so the structure is checked here against these.
PREFECT_YAML_KEYS = {"name", "prefect-version", "build", "push", "pull", "deployments",
                     "definitions"}
DEPLOYMENT_KEYS = {"name", "version", "version_type", "tags", "description", "schedule",
                   "schedules", "paused", "concurrency_limit", "flow_name", "entrypoint",
                   "parameters", "enforce_parameter_schema", "build", "push", "pull",
                   "work_pool", "triggers", "sla"}
WORK_POOL_KEYS = {"name", "work_queue_name", "job_variables"}


def _check_steps(steps, where: str) -> None:
    """``build``/``push``/``pull``: null or a list of one-key mappings ``{step path: kwargs}``,
    each step an importable function (e.g. ``prefect.deployments.steps.set_working_directory``)."""
    import importlib

    if steps is None:
        return
    assert isinstance(steps, list), f"{where}: a list of steps, got {type(steps).__name__}"
    for step in steps:
        assert isinstance(step, dict) and len(step) == 1, f"{where}: {step!r}"
        (path, kwargs), = step.items()
        module, _, fn = path.rpartition(".")
        assert callable(getattr(importlib.import_module(module), fn, None)), f"{where}: {path}"
        assert kwargs is None or isinstance(kwargs, dict), f"{where}: {path}: {kwargs!r}"


def test_prefect_yaml_deployments():
    """prefect.yaml's structure (the keys Prefect documents, step functions that import, flow
    entrypoints that resolve and accept the deployment's parameters) and what the docs promise:
    the eleven deployments, their pools, ``params_path``, the gpu working directory."""
    import inspect

    raw = yaml.safe_load((ROOT / "prefect.yaml").read_text())
    assert isinstance(raw, dict) and set(raw) <= PREFECT_YAML_KEYS, set(raw) - PREFECT_YAML_KEYS
    for key in ("build", "push", "pull"):
        _check_steps(raw.get(key), key)
    assert isinstance(raw["deployments"], list)
    names = {}
    for d in raw["deployments"]:
        assert isinstance(d, dict) and set(d) <= DEPLOYMENT_KEYS, set(d) - DEPLOYMENT_KEYS
        assert isinstance(d["name"], str) and isinstance(d["entrypoint"], str)
        assert isinstance(d.get("description", ""), str)
        tags = d.get("tags", [])
        assert isinstance(tags, list) and all(isinstance(t, str) for t in tags), tags
        pool = d["work_pool"]
        assert isinstance(pool, dict) and set(pool) <= WORK_POOL_KEYS, pool
        assert isinstance(pool.get("job_variables", {}), dict)
        for key in ("build", "push", "pull"):
            _check_steps(d.get(key), f"{d['name']}.{key}")
        flow = _flow(d["entrypoint"])
        accepted = set(inspect.signature(flow.fn).parameters)
        assert isinstance(d["parameters"], dict) and set(d["parameters"]) <= accepted, \
            (d["entrypoint"], set(d["parameters"]) - accepted)
        key = f"{flow.name}/{d['name']}"
        assert key not in names, f"deployment {key} twice"
        names[key] = d
    assert set(names) == set(DEPLOYMENTS)
    for key, d in names.items():
        pool = key.split("/")[1]
        assert d["work_pool"]["name"] == pool
        assert d["parameters"]["params_path"] == "params.yaml"
        if pool == "gpu":
            step = d["pull"][0]["prefect.deployments.steps.set_working_directory"]
            assert step["directory"] == "/workspace/hargo"


def _flow(entrypoint: str):
    """The Prefect flow object an entrypoint ``path/to/file.py:function`` names (the file must
    exist in the repository)."""
    import importlib

    path, fn = entrypoint.split(":")
    assert (ROOT / path).is_file(), entrypoint
    module = importlib.import_module(path.removesuffix(".py").replace("/", "."))
    return getattr(module, fn)


def test_gpu_kubernetes_job_template():
    tpl = json.loads((ROOT / "deploy" / "gpu-kubernetes-job-template.json").read_text())
    declared = set(tpl["variables"]["properties"])
    used = set(re.findall(r"\{\{\s*([a-z_]+)\s*\}\}", json.dumps(tpl["job_configuration"])))
    assert used <= declared, f"placeholders without a variable: {used - declared}"
    container = tpl["job_configuration"]["job_manifest"]["spec"]["template"]["spec"][
        "containers"][0]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "{{ gpu_count }}"
    assert tpl["variables"]["properties"]["gpu_count"]["default"] == 1


@pytest.mark.timeout(TIMEOUT_S + 60)
def test_the_hargo_worker_stops_on_sigterm(prefect_server, tmp_path):
    """Issue 42, item 9: `prefect worker start` (Prefect 3.7) answers SIGTERM by sending itself
    SIGINT and polls on: idle, it was still running 65 s later. `python -m flows.worker` (the
    documented command) starts the same worker and stops it, and its flow runs, on SIGTERM."""
    env, deadline = prefect_server
    env = {**env, "PYTHONPATH": os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])}
    log = tmp_path / "worker.log"
    with log.open("w") as out:
        worker = subprocess.Popen([sys.executable, "-m", "flows.worker", "--pool", "cpu",
                                   "--type", "process"], cwd=tmp_path, env=env, stdout=out,
                                  stderr=subprocess.STDOUT)
        try:
            while "started!" not in log.read_text():
                assert worker.poll() is None, log.read_text()
                _left(deadline)
                time.sleep(POLL_S)
            t0 = time.monotonic()
            worker.send_signal(signal.SIGTERM)
            worker.wait(timeout=60)
            waited = time.monotonic() - t0
        finally:
            if worker.poll() is None:
                worker.kill()
    assert worker.returncode == 143 and waited < 10, (worker.returncode, waited,
                                                      log.read_text()[-2000:])
