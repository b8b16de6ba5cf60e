"""MLflow layout: one experiment, a parent per pipeline run, a child run per stage."""
from __future__ import annotations

import hashlib
import json
import shutil
import socket
import time
from pathlib import Path

import mlflow
import pytest
from mlflow.tracking import MlflowClient

from hargo import tracking, tracking_store
from hargo.config import as_config


def test_stage_runs_share_one_parent_and_carry_tags(mlflow_uri, committed_params, monkeypatch,
                                                    tmp_path):
    """The project root is passed, not taken from the working directory: the data version is
    that root's DVC pointer (data/raw/hpc-gpt.dvc) wherever pytest runs from."""
    monkeypatch.setenv("HARGO_DOOR", "prefect")
    pointer = tmp_path / "data" / "raw" / "hpc-gpt.dvc"
    pointer.parent.mkdir(parents=True)
    pointer.write_text("outs:\n- md5: 0123456789abcdef0123456789abcdef.dir\n  size: 10\n"
                       "  nfiles: 4\n  hash: md5\n  path: hpc-gpt\n")
    with tracking.stage_run("prepare", as_config(committed_params), tmp_path) as r1:
        mlflow.log_metric("n", 3)
    with tracking.stage_run("sft", as_config(committed_params), tmp_path) as r2:
        pass
    client = MlflowClient(mlflow_uri)
    a, b = client.get_run(r1.info.run_id), client.get_run(r2.info.run_id)
    parent = a.data.tags["mlflow.parentRunId"]
    assert parent == b.data.tags["mlflow.parentRunId"]
    assert client.get_run(parent).data.tags["hargo.kind"] == "pipeline"
    assert a.data.tags["hargo.door"] == "prefect"
    assert a.data.tags["hargo.data_version"] == "0123456789abcdef0123456789abcdef.dir"
    assert b.data.tags["hargo.data_version"] == "0123456789abcdef0123456789abcdef.dir"
    assert a.data.params["rl.hargo.beta"] == "0.02"
    assert a.data.metrics["n"] == 3
    assert a.info.experiment_id == b.info.experiment_id


@pytest.mark.parametrize("env, door", [
    ({"HARGO_DOOR": "prefect", "DVC_STAGE": "sft"}, "prefect"),   # a flow's stage, through DVC
    ({"DVC_STAGE": "sft"}, "dvc"),
    ({}, "cli"),                  # a new user's `hargo rl` by hand was tagged dvc
    ({"HARGO_DOOR": ""}, "cli"),
])
def test_the_door_tag_says_how_the_stage_was_started(monkeypatch, committed_params, env, door):
    for k in ("HARGO_DOOR", "DVC_STAGE"):
        monkeypatch.delenv(k, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert tracking.door() == door
    assert tracking.common_tags(as_config(committed_params))["hargo.door"] == door


@pytest.mark.fast
def test_data_version_is_the_roots_dvc_pointer(tmp_path, monkeypatch):
    """Read from the given root, never the working directory; ``unknown`` without a pointer."""
    import yaml

    root = Path(__file__).resolve().parents[1]
    want = yaml.safe_load((root / "data" / "raw" / "hpc-gpt.dvc").read_text())["outs"][0]["md5"]
    monkeypatch.chdir(tmp_path)
    assert tracking.data_version(root) == want
    assert tracking.data_version() == tracking.data_version(tmp_path) == "unknown"


def test_changed_params_get_a_new_parent(mlflow_uri, committed_params):
    other = {**committed_params, "seed": committed_params["seed"] + 1}
    p1 = tracking.parent_run_id(as_config(committed_params))
    p2 = tracking.parent_run_id(as_config(other))
    assert p1 != p2
    assert tracking.parent_run_id(as_config(committed_params)) == p1


def test_failed_stage_marks_run_failed(mlflow_uri, committed_params):
    with pytest.raises(ValueError):
        with tracking.stage_run("validate", as_config(committed_params)) as run:
            raise ValueError("boom")
    assert MlflowClient(mlflow_uri).get_run(run.info.run_id).info.status == "FAILED"


def test_unwritable_store_is_a_clear_error(tmp_path, monkeypatch, committed_params):
    # (tests run as root, so permissions cannot make a store unwritable: a file stands where
    # the store's folder should be instead)
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("x")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{blocker / 'sub' / 'mlflow.db'}")
    with pytest.raises(RuntimeError, match="cannot be used"):
        tracking.setup(as_config(committed_params))


# --- issue 13: experiment kind, a parent spanning the pipeline, datasets, portability, fail-fast


def test_experiment_is_a_model_training_experiment(mlflow_uri, committed_params):
    exp_id = tracking.setup(as_config(committed_params))
    client = MlflowClient(mlflow_uri)
    assert client.get_experiment(exp_id).tags["mlflow.experimentKind"] == "custom_model_development"
    # an experiment created before the tag existed (or switched in the UI) is marked again
    client.set_experiment_tag(exp_id, "mlflow.experimentKind", "genai_development")
    assert tracking.setup(as_config(committed_params)) == exp_id
    assert client.get_experiment(exp_id).tags["mlflow.experimentKind"] == "custom_model_development"


def test_parent_run_spans_the_pipeline(mlflow_uri, committed_params):
    import time

    client = MlflowClient(mlflow_uri)
    with tracking.stage_run("prepare", as_config(committed_params)) as r1:
        parent = r1.data.tags["mlflow.parentRunId"]
        assert client.get_run(parent).info.status == "RUNNING"
        time.sleep(0.6)
    assert client.get_run(parent).info.status == "FINISHED"
    with tracking.stage_run("sft", as_config(committed_params)) as r2:
        assert client.get_run(parent).info.status == "RUNNING"   # re-opened, not re-created
        time.sleep(0.6)
    assert r2.data.tags["mlflow.parentRunId"] == parent
    p, a, b = (client.get_run(i) for i in (parent, r1.info.run_id, r2.info.run_id))
    assert p.info.status == "FINISHED"
    assert p.info.start_time <= a.info.start_time
    assert p.info.end_time >= b.info.end_time
    wall = (p.info.end_time - p.info.start_time) / 1000
    assert wall >= 1.2
    assert p.data.metrics["pipeline_wall_s"] == pytest.approx(wall, abs=0.01)
    assert len(client.search_runs([p.info.experiment_id],
                                  "tags.`hargo.kind` = 'pipeline'")) == 1


def test_failed_stage_ends_the_parent_failed(mlflow_uri, committed_params):
    with pytest.raises(ValueError), tracking.stage_run("validate", as_config(committed_params)) as run:
        raise ValueError("boom")
    parent = run.data.tags["mlflow.parentRunId"]
    assert MlflowClient(mlflow_uri).get_run(parent).info.status == "FAILED"


def _prepared(root, rows):
    d = root / "data" / "prepared"
    d.mkdir(parents=True)
    text = "".join(json.dumps(r) + "\n" for r in rows)
    (d / "train.jsonl").write_text(text)
    return d / "train.jsonl", text


def test_split_dataset_digest_is_the_dvc_hash_and_profile_counts_tasks(tmp_path, committed_params):
    rows = [{"task": "code", "prompt": "a"}, {"task": "code", "prompt": "b"},
            {"task": "qa", "prompt": "c"}]
    path, text = _prepared(tmp_path, rows)
    ds = tracking.split_dataset("train", as_config(committed_params), tmp_path)
    assert ds.digest == hashlib.md5(text.encode()).hexdigest()   # no dvc.lock: the file's md5
    (tmp_path / "dvc.lock").write_text(
        "schema: '2.0'\nstages:\n  prepare:\n    outs:\n    - path: data/prepared/train.jsonl\n"
        f"      md5: 0123456789abcdef0123456789abcdef\n      size: {len(text)}\n")
    ds = tracking.split_dataset("train", as_config(committed_params), tmp_path)
    assert ds.name == "hpc-gpt-train"
    assert ds.digest == "0123456789abcdef0123456789abcdef"
    assert ds.profile == {"num_rows": 3, "tasks": {"code": 2, "qa": 1}}
    path.write_text(text + json.dumps({"task": "qa", "prompt": "d"}) + "\n")   # lock is stale
    assert tracking.split_dataset("train", as_config(committed_params), tmp_path).digest == \
        hashlib.md5(path.read_bytes()).hexdigest()


def test_stage_logs_its_split_as_an_input(mlflow_uri, tmp_path, committed_params):
    _, text = _prepared(tmp_path, [{"task": "code", "prompt": "a"}, {"task": "qa", "prompt": "b"}])
    with tracking.stage_run("sft", as_config(committed_params), tmp_path) as run:
        tracking.log_split("train", "training", as_config(committed_params), tmp_path)
    client = MlflowClient(mlflow_uri)
    for run_id in (run.info.run_id, run.data.tags["mlflow.parentRunId"]):
        (inp,) = client.get_run(run_id).inputs.dataset_inputs
        assert inp.dataset.name == "hpc-gpt-train"
        assert inp.dataset.digest == hashlib.md5(text.encode()).hexdigest()
        assert json.loads(inp.dataset.profile) == {"num_rows": 2, "tasks": {"code": 1, "qa": 1}}
        assert json.loads(inp.dataset.source)["uri"].endswith("data/prepared/train.jsonl")
        tags = {t.key: t.value for t in inp.tags}
        assert tags == {"mlflow.data.context": "training", "hargo.tasks.code": "1",
                        "hargo.tasks.qa": "1"}


@pytest.mark.parametrize("how", ["first-use", "cli"])
def test_moved_project_reads_its_own_artifacts(how, tmp_path, monkeypatch, committed_params):
    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    monkeypatch.delenv("HARGO_PARENT_RUN_ID", raising=False)
    a, b = tmp_path / "clone-a", tmp_path / "moved" / "clone-b"
    a.mkdir()
    (a / "note.txt").write_text("hello")
    with tracking.stage_run("prepare", as_config(committed_params), a) as run:
        mlflow.log_artifact(str(a / "note.txt"))
    b.parent.mkdir()
    shutil.move(str(a), str(b))
    # a new process in the moved clone (mlflow.set_tracking_uri exported the old store's URI)
    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    if how == "cli":
        from typer.testing import CliRunner

        from hargo.cli import app

        res = CliRunner().invoke(app, ["tracking-reroot", "--root", str(b)])
        assert res.exit_code == 0, res.output
        assert "'experiments.artifact_location': 1" in res.output
        assert "'runs.artifact_uri': 2" in res.output      # the stage run and its parent
    exp_id = tracking.setup(as_config(committed_params), b)        # re-roots the moved store (first use)
    client = MlflowClient(tracking.tracking_uri(b))
    assert client.get_experiment(exp_id).artifact_location == (b / "mlruns" / "artifacts").as_uri()
    got = client.download_artifacts(run.info.run_id, "note.txt", str(tmp_path))
    assert Path(got).read_text() == "hello"
    assert tracking_store.reroot(b) == {}                     # idempotent


def test_reroot_moves_every_location_under_the_old_store_and_nothing_else(tmp_path, monkeypatch,
                                                                         committed_params):
    """MLflow's Default experiment lands under the project's mlruns/ when the store is created
    there (`dvc repro` runs in the project): it moves with the store; an experiment whose
    artifacts live elsewhere (a team's shared folder, a remote store) stays."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    monkeypatch.delenv("HARGO_PARENT_RUN_ID", raising=False)
    a, b = tmp_path / "clone-a", tmp_path / "moved" / "clone-b"
    a.mkdir()
    monkeypatch.chdir(a)                      # as under dvc repro: the store is created here
    tracking.setup(as_config(committed_params), a)
    client = MlflowClient(tracking.tracking_uri(a))
    default_before = client.get_experiment("0").artifact_location
    assert default_before.replace("file://", "").startswith(str(a / "mlruns"))
    shared = client.create_experiment("shared", artifact_location=(tmp_path / "team").as_uri())
    remote = client.create_experiment("remote", artifact_location="s3://bucket/x/mlruns/artifacts")
    b.parent.mkdir()
    shutil.move(str(a), str(b))
    monkeypatch.chdir(b)
    changed = tracking_store.reroot(b, quiet=True)
    assert changed == {"experiments.artifact_location": 2}      # hargo's and Default
    client = MlflowClient(f"sqlite:///{b / 'mlruns' / 'mlflow.db'}")
    assert client.get_experiment("0").artifact_location.replace("file://", "") \
        == str(b / "mlruns" / "0")
    assert client.get_experiment(shared).artifact_location == (tmp_path / "team").as_uri()
    assert client.get_experiment(remote).artifact_location == "s3://bucket/x/mlruns/artifacts"
    assert tracking_store.reroot(b) == {}


@pytest.mark.fast
def test_the_local_store_is_recognised_however_its_uri_is_spelled(tmp_path, monkeypatch):
    from hargo.tracking_store import is_local_store

    root = tmp_path / "proj"
    (root / "mlruns").mkdir(parents=True)
    monkeypatch.chdir(root)
    for uri in (f"sqlite:///{root}/mlruns/mlflow.db", "sqlite:///mlruns/mlflow.db",
                f"sqlite:///{root}/./mlruns/mlflow.db", f"sqlite:///{root}/../proj/mlruns/mlflow.db"):
        assert is_local_store(uri, root), uri
    for uri in (f"sqlite:///{tmp_path}/other/mlruns/mlflow.db", "http://127.0.0.1:5000",
                "sqlite:///mlruns/other.db", "databricks"):
        assert not is_local_store(uri, root), uri


def test_a_copied_project_reroots_through_a_relative_uri_and_before_loading_a_model(
        tmp_path, monkeypatch, committed_params):
    """MLFLOW_TRACKING_URI=sqlite:///mlruns/mlflow.db (docs/tracking.md's spelling) in a copied clone,
    and hargo.registry.load_registered / ask: both re-root before MLflow reads an artifact."""
    from hargo.registry import load_registered

    monkeypatch.delenv("HARGO_PARENT_RUN_ID", raising=False)
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    a.mkdir()
    monkeypatch.chdir(a)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "sqlite:///mlruns/mlflow.db")
    exp_id = tracking.setup(as_config(committed_params), a)
    shutil.copytree(a, b)
    shutil.copytree(a, c)
    monkeypatch.chdir(b)
    tracking.setup(as_config(committed_params), b)
    assert MlflowClient(f"sqlite:///{b}/mlruns/mlflow.db").get_experiment(exp_id) \
        .artifact_location == (b / "mlruns" / "artifacts").as_uri()
    monkeypatch.chdir(c)
    with pytest.raises(Exception):          # nothing is registered there; the store moved first
        load_registered("hargo-hpc", root=c)
    assert MlflowClient(f"sqlite:///{c}/mlruns/mlflow.db").get_experiment(exp_id) \
        .artifact_location == (c / "mlruns" / "artifacts").as_uri()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("kind", ["sqlite", "sqlite-two-slashes", "http"])
def test_unusable_store_fails_fast_naming_the_uri(kind, tmp_path, monkeypatch, committed_params):
    if kind == "sqlite":
        blocker = tmp_path / "not-a-dir"
        blocker.write_text("x")
        uri = f"sqlite:///{blocker / 'sub' / 'mlflow.db'}"
    elif kind == "sqlite-two-slashes":
        uri = "sqlite://mlruns/mlflow.db"
    else:
        uri = f"http://127.0.0.1:{_free_port()}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    t0 = time.monotonic()
    with pytest.raises(RuntimeError) as err:
        tracking.setup(as_config(committed_params))
    assert time.monotonic() - t0 < 10
    assert uri in str(err.value) and "Fix:" in str(err.value)


def test_http_retries_are_bounded_unless_the_user_set_them(mlflow_uri, monkeypatch,
                                                           committed_params):
    monkeypatch.delenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", raising=False)
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "7")
    tracking.setup(as_config(committed_params))
    from mlflow.environment_variables import (
        MLFLOW_HTTP_REQUEST_MAX_RETRIES,
        MLFLOW_HTTP_REQUEST_TIMEOUT,
    )
    assert MLFLOW_HTTP_REQUEST_MAX_RETRIES.get() == 4
    assert MLFLOW_HTTP_REQUEST_TIMEOUT.get() == 7


@pytest.mark.parametrize(("code", "ok"), [(200, True), (401, True), (503, False)])
def test_http_store_probe_accepts_an_answering_server(code, ok):
    import http.server
    import threading

    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(code if self.path == "/health" else 404)
            self.end_headers()
            self.wfile.write(b"OK")

        def log_message(self, *args):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Health)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    uri = f"http://127.0.0.1:{srv.server_address[1]}"
    try:
        if ok:
            tracking_store.check_store(uri)
        else:
            with pytest.raises(RuntimeError, match=f"{uri} cannot be used.*503"):
                tracking_store.check_store(uri)
    finally:
        srv.shutdown()
        srv.server_close()


def test_transient_server_outage_is_retried_with_a_bounded_back_off(monkeypatch, caplog,
                                                                   committed_params):
    """A server that answers 503 twice, then normally: the call succeeds after two retries
    (back-off 1 s, 2 s plus jitter under hargo's defaults), each retry logged by urllib3."""
    import http.server
    import logging
    import threading

    hits = []

    class Flaky(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            if self.path == "/health":
                code, body = 200, b"OK"
            else:
                hits.append(self.path)
                code, body = (503, b"busy") if len(hits) <= 2 else (404, json.dumps(
                    {"error_code": "RESOURCE_DOES_NOT_EXIST", "message": "no such"}).encode())
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Flaky)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    uri = f"http://127.0.0.1:{srv.server_address[1]}"
    for k in tracking_store.HTTP_RETRY_DEFAULTS:
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    try:
        with caplog.at_level(logging.WARNING, logger=tracking_store.RETRY_LOGGER):
            t0 = time.monotonic()
            with pytest.raises(RuntimeError):  # the 404 on create: the point is the retries
                tracking.setup(as_config(committed_params))
            took = time.monotonic() - t0
    finally:
        srv.shutdown()
        srv.server_close()
    assert "experiments/get-by-name" in hits[0] and len(hits) >= 3
    assert hits[0] == hits[1] == hits[2]                    # the same call, retried twice
    assert 1 <= took < 12
    retries = [r.getMessage() for r in caplog.records if r.name == tracking_store.RETRY_LOGGER]
    assert len(retries) == 2 and all("get-by-name" in m for m in retries), retries


def test_parent_bookkeeping_failure_does_not_fail_the_stage(mlflow_uri, committed_params,
                                                            monkeypatch, caplog):
    def broken(*args, **kwargs):
        raise ConnectionError("store went away")

    monkeypatch.setattr(tracking, "end_pipeline_run", broken)
    with tracking.stage_run("sft", as_config(committed_params)) as run:
        mlflow.log_metric("n", 1)
    assert MlflowClient(mlflow_uri).get_run(run.info.run_id).info.status == "FINISHED"
    assert any("could not update the pipeline parent run" in r.getMessage()
               and "store went away" in r.getMessage() for r in caplog.records)


def _setup_in_process(args):
    """One of several processes opening a fresh SQLite store at the same moment."""
    uri, root, params, barrier = args
    import os

    os.environ["MLFLOW_TRACKING_URI"] = uri
    from hargo import tracking as t

    barrier.wait()
    try:
        return "ok", t.setup(as_config(params), root)
    except Exception as e:  # the result names what went wrong
        return "error", f"{type(e).__name__}: {e}"


def test_four_processes_open_one_fresh_store_at_once(tmp_path, committed_params):
    """Issue 30, item 6: without a lock, three of four processes failed in MLflow's schema
    migration (``OperationalError duplicate column name: step``). All four must succeed and see
    the same experiment."""
    import multiprocessing as mp

    uri = f"sqlite:///{tmp_path / 'mlruns' / 'mlflow.db'}"
    ctx = mp.get_context("spawn")
    with ctx.Manager() as manager:
        barrier = manager.Barrier(4)
        with ctx.Pool(4) as pool:
            out = pool.map(_setup_in_process,
                           [(uri, str(tmp_path), committed_params, barrier)] * 4)
    assert [status for status, _ in out] == ["ok"] * 4, out
    assert len({exp for _, exp in out}) == 1
    assert (tmp_path / "mlruns" / "mlflow.db.lock").exists()


_SLOW_STAGE = """
import json, signal, sys, time
# Ctrl-C as in a shell: a child inherits SIGINT ignored when its parent ignores it (Python
# installs its KeyboardInterrupt handler only when SIGINT is not ignored at start), as a test
# worker may after other tests
signal.signal(signal.SIGINT, signal.default_int_handler)
from hargo import tracking
from hargo.config import as_config
params = as_config(json.loads(sys.argv[2]))
with tracking.stage_run("rl", params, sys.argv[1], extra_tags={"hargo.method": "hargo"}) as run:
    print(run.info.run_id, flush=True)
    time.sleep(120)
"""


@pytest.mark.parametrize("sig, code", [("SIGTERM", 143), ("SIGINT", None)])
def test_a_signal_ends_the_stage_and_parent_runs_killed(tmp_path, committed_params, sig, code):
    """Issue 30, item 5: SIGTERM during a stage left its MLflow run RUNNING with no end time
    forever. A real signal to a real process: the stage run and the pipeline parent end KILLED
    with an end time, and SIGTERM's exit code is 143."""
    import os
    import signal
    import subprocess
    import sys

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri}
    env.pop("HARGO_PARENT_RUN_ID", None)
    proc = subprocess.Popen([sys.executable, "-c", _SLOW_STAGE, str(tmp_path),
                             json.dumps(committed_params)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    run_id = proc.stdout.readline().strip()
    assert run_id, proc.stderr.read()
    proc.send_signal(getattr(signal, sig))
    proc.communicate(timeout=60)
    if code is not None:
        assert proc.returncode == code
    else:
        assert proc.returncode != 0
    client = MlflowClient(uri)
    run = client.get_run(run_id)
    assert run.info.status == "KILLED" and run.info.end_time
    assert run.data.tags["hargo.error"].startswith(
        "StageTerminated: terminated by signal 15" if sig == "SIGTERM" else "KeyboardInterrupt")
    parent = client.get_run(run.data.tags["mlflow.parentRunId"])
    assert parent.info.status == "KILLED" and parent.info.end_time
