"""Tracking-store problems a user must fix (issue 42, item 6): a deleted experiment, a store
written by another MLflow version, a store another process holds locked. Each gives one line
that names the store (and experiment) and the fix, and nothing is written: no run, no output.
And where a stage's runs land when DVC runs it in a temporary workspace (issue 42, item 2)."""
from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from hargo import tracking, tracking_store
from hargo.config import as_config

ROOT = Path(__file__).resolve().parents[1]


def _runs(db: Path) -> int:
    con = sqlite3.connect(db)
    try:
        return con.execute("SELECT count(*) FROM runs").fetchone()[0]
    finally:
        con.close()


@pytest.fixture(scope="module")
def store_template(tmp_path_factory, committed_params) -> Path:
    """A project's ``mlruns/`` with the experiment and one finished stage run (made once: a
    new SQLite store costs MLflow's migrations, seconds)."""
    root = tmp_path_factory.mktemp("store-template")
    mp = pytest.MonkeyPatch()
    mp.delenv("MLFLOW_TRACKING_URI", raising=False)
    mp.delenv("HARGO_PARENT_RUN_ID", raising=False)
    mp.delenv("DVC_ROOT", raising=False)
    try:
        with tracking.stage_run("validate", as_config(committed_params), root):
            pass
    finally:
        mp.undo()
    return root / "mlruns"


def _project(tmp_path, monkeypatch, store_template, moved: bool = False) -> Path:
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("HARGO_PARENT_RUN_ID", raising=False)
    monkeypatch.delenv("DVC_ROOT", raising=False)
    monkeypatch.delenv("DVC_STAGE", raising=False)
    root = tmp_path / "proj"
    root.mkdir()
    shutil.copy(ROOT / "params.yaml", root / "params.yaml")
    shutil.copytree(store_template, root / "mlruns", ignore=shutil.ignore_patterns("*.lock"))
    if not moved:
        tracking_store.reroot(root, quiet=True)        # the copy's own artifact folder
    monkeypatch.chdir(root)
    return root


@pytest.fixture()
def project(tmp_path, monkeypatch, store_template):
    """A project folder (params.yaml) as the working directory, with its local store
    ``mlruns/mlflow.db`` holding the experiment and one finished stage run."""
    return _project(tmp_path, monkeypatch, store_template)


def _break(kind: str, db: Path, stack, monkeypatch=None) -> str:
    """Make the store at ``db`` unusable in the way ``kind`` names; returns the fix the error
    must name."""
    import os

    uri = f"sqlite:///{db}"
    if kind == "deleted":
        client = MlflowClient(uri)
        exp = client.get_experiment_by_name("hargo")
        client.delete_experiment(exp.experiment_id)
        return f"mlflow experiments restore -x {exp.experiment_id}"
    if kind == "read-only":           # a read-only file in a writable folder
        db.chmod(0o444)
        stack.callback(db.chmod, 0o644)
        if os.geteuid() == 0:         # root writes a 444 file: what `chattr +i` makes access say
            access = os.access
            monkeypatch.setattr(os, "access", lambda p, mode, *a, **k: False if (
                mode & os.W_OK and str(p) == str(db)) else access(p, mode, *a, **k))
        return "is read-only"
    if kind == "corrupt":
        db.write_text("garbage\n")
        return f"is not an SQLite database ({db} is corrupt"
    con = sqlite3.connect(db, isolation_level=None)
    stack.callback(con.close)
    if kind == "damaged":
        con.execute("DROP TABLE runs")
        return "is damaged: table runs missing"
    if kind == "newer":
        con.execute("UPDATE alembic_version SET version_num = 'ffffffffffff'")
        return "pip install -U mlflow"
    if kind == "older":
        known, heads = tracking_store.schema_revisions()
        con.execute("UPDATE alembic_version SET version_num = ?", (sorted(known - heads)[0],))
        return f"mlflow db upgrade {uri}"
    assert kind == "locked"
    con.execute("BEGIN IMMEDIATE")       # another process's open write transaction
    stack.callback(con.execute, "ROLLBACK")
    return "fuser"


_FIXES = {"read-only": "Fix: make it writable (chmod u+w",
          "corrupt": "Fix: move it aside (mv",
          "damaged": "Fix: move"}


@pytest.mark.parametrize("moved", [False, True], ids=["in-place", "copied"])
@pytest.mark.parametrize("kind", ["deleted", "newer", "older", "locked", "read-only", "corrupt",
                                  "damaged"])
def test_a_store_problem_is_one_line_naming_the_fix_and_nothing_is_written(
        tmp_path, store_template, kind, moved, monkeypatch):
    """Before: a deleted experiment ended `hargo prepare` in a 133-line traceback
    (MlflowException: The experiment 1 must be in the 'active' state); a newer MLflow's store
    was told to run `mlflow db upgrade`; a locked one to make its folder writable. Then (issue
    42 item 6, second round): a read-only database file gave a 925-line traceback (`attempt to
    write a readonly database`); a corrupt file was told to make its folder writable; a dropped
    table, a 425-line traceback after MLflow wrote "Creating initial MLflow database tables"
    into the store; and in a copied project the re-root rewrote the store before the refusal
    ("[tracking] the project moved: ..." came first)."""
    import contextlib

    from typer.testing import CliRunner

    from hargo.cli import app

    project = _project(tmp_path, monkeypatch, store_template, moved=moved)
    from hargo import tracking_db

    monkeypatch.setattr(tracking_store, "PROBE_TIMEOUT_S", 0.5)    # the locked store's wait
    monkeypatch.setattr(tracking_db, "PROBE_TIMEOUT_S", 0.5)       # (both modules probe it)
    db = project / "mlruns" / "mlflow.db"
    runs = _runs(db)
    with contextlib.ExitStack() as stack:
        fix = _break(kind, db, stack, monkeypatch)
        before = db.read_bytes()
        files = sorted(p.name for p in db.parent.iterdir() if p.suffix != ".lock")
        res = CliRunner().invoke(app, ["prepare"])
        assert db.read_bytes() == before                    # the store as it was: no re-root
        assert sorted(p.name for p in db.parent.iterdir() if p.suffix != ".lock") == files
    assert res.exit_code == 1, res.output
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: TrackingStoreError: "), res.output
    assert f"sqlite:///{db}" in lines[0] and fix in lines[0], lines[0]
    assert _FIXES.get(kind, "Fix:") in lines[0], lines[0]
    if kind == "deleted":
        assert "'hargo' (id 1)" in lines[0] and "is deleted" in lines[0]
    if kind not in ("corrupt", "damaged"):
        assert _runs(db) == runs                            # no run, no parent
    assert not (project / "data").exists()                  # no stage output


def test_the_store_checks_read_nothing_into_a_new_or_empty_store(tmp_path):
    """A store that does not exist yet, or an empty file (SQLite's new database), passes the
    checks untouched: MLflow creates its tables. A store with tables but no schema revision is
    damaged."""
    db = tmp_path / "mlruns" / "mlflow.db"
    tracking_store.check_store(f"sqlite:///{db}", experiment="hargo")
    assert not db.exists()
    db.write_bytes(b"")
    tracking_store.check_store(f"sqlite:///{db}", experiment="hargo")
    assert db.read_bytes() == b""
    con = sqlite3.connect(db)
    con.execute("CREATE TABLE experiments (experiment_id INTEGER)")
    con.commit()
    con.close()
    with pytest.raises(tracking_store.TrackingStoreError,
                       match=r"is damaged: it has tables but no schema revision"):
        tracking_store.check_store(f"sqlite:///{db}")
    assert "runs" in tracking_store.expected_tables()
    assert "registered_models" in tracking_store.expected_tables()


def test_a_deleted_experiment_stops_rl_before_its_checkpoint_folder_changes(
        project, tiny_model_dir, committed_params):
    """The rl stage prepares its checkpoint folder (a DVC output it may empty) before its MLflow
    run opens: the experiment is checked before that, not only the store."""
    from rl_helpers import rl_params, write_jsonl

    from hargo.testing import crafted_records
    from hargo.training import rl

    write_jsonl(project / "data" / "train.jsonl", crafted_records(1))
    stale = project / rl.CHECKPOINT_ROOT / "grpo" / "checkpoint-9" / "keep.txt"
    stale.parent.mkdir(parents=True)
    stale.write_text("an earlier run's checkpoint")
    client = MlflowClient(f"sqlite:///{project / 'mlruns' / 'mlflow.db'}")
    client.delete_experiment(client.get_experiment_by_name("hargo").experiment_id)
    with pytest.raises(tracking_store.TrackingStoreError, match="restore -x 1"):
        rl.run(as_config(rl_params(committed_params, tiny_model_dir, project / "data")), "grpo",
               root=project)
    assert stale.read_text() == "an earlier run's checkpoint"


# ------------------------------------------------------------ a DVC temporary workspace (item 2)
def test_a_dvc_temp_workspace_logs_to_the_projects_store(project, committed_params,
                                                         monkeypatch):
    """``dvc exp run --temp`` / ``--queue``: DVC runs the stage in
    ``<project>/.dvc/tmp/exps/<tmp>`` (deleted afterwards) with ``$DVC_ROOT`` = the project and
    ``$DVC_EXP_NAME`` = the experiment's name. The run lands in the project's store, tagged with
    that name, and no store is created in the workspace."""
    ws = project / ".dvc" / "tmp" / "exps" / "tmpabc123"
    ws.mkdir(parents=True)
    monkeypatch.chdir(ws)
    monkeypatch.setenv("DVC_ROOT", str(project))
    monkeypatch.setenv("DVC_EXP_NAME", "dusty-mule")
    assert tracking.tracking_uri(ws) == f"sqlite:///{project / 'mlruns' / 'mlflow.db'}"
    with tracking.stage_run("validate", as_config(committed_params), ws) as run:
        pass
    assert not (ws / "mlruns").exists()
    got = MlflowClient(f"sqlite:///{project / 'mlruns' / 'mlflow.db'}").get_run(run.info.run_id)
    assert got.data.tags["hargo.dvc_experiment"] == "dusty-mule"
    assert got.info.artifact_uri.startswith((project / "mlruns" / "artifacts").as_uri())
    # docs/tracking.md's relative spelling names the project's store there too
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "sqlite:///mlruns/mlflow.db")
    assert tracking.tracking_uri(ws) == f"sqlite:///{project / 'mlruns' / 'mlflow.db'}"
    # the workspace itself (DVC_ROOT = the folder) and any folder outside .dvc/tmp: their own
    for root in (project, project.parent):
        assert tracking_store.store_root(root) == root


def _cached_outs(root: Path) -> list[str]:
    """The DVC-cached outputs of ``root``'s dvc.yaml (``.gitignore`` patterns: git holds the
    rest, as in the repository)."""
    import yaml

    pats = []
    for stage in yaml.safe_load((root / "dvc.yaml").read_text())["stages"].values():
        for out in stage.get("do", stage).get("outs", []):
            if isinstance(out, str):
                pats.append("/" + out.replace("${item}", "*"))
    return pats


@pytest.mark.xdist_group("tiny-pipeline")       # flow_project.PIPELINE_GROUP: shares dvc_door
@pytest.mark.timeout(900)
def test_a_queued_experiment_logs_its_runs_to_the_projects_store(dvc_door, tmp_path):
    """Issue 42, item 2, the reported case: ``dvc exp run --queue`` then ``dvc queue start``.
    DVC ran the stage in a temporary workspace, where it created a new MLflow store that DVC
    deleted afterwards: the experiment's runs existed nowhere. Now they are in the project's
    store (``mlruns/mlflow.db``), tagged with the experiment's name. :func:`dvc_door`'s tiny
    project as a git repository that ignores what the repository's .gitignore ignores (a new
    user's clone). ``register.tolerance`` changed re-runs ``params`` and ``register`` only: it
    re-ran validate, both RL trainings and evaluate, whose ``cache: false`` outputs outside git
    were missing in DVC's temporary workspace (tests/test_stage_deps.py)."""
    import os
    import subprocess
    import sys
    import time

    root = dvc_door.copy(tmp_path / "project")
    env = {k: v for k, v in dvc_door.env.items() if k != "MLFLOW_TRACKING_URI"}
    env.update(GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t",
               GIT_COMMITTER_EMAIL="t@t")

    def run(*cmd: str, timeout: float = 300) -> str:
        proc = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True,
                              timeout=timeout)
        assert proc.returncode == 0, f"{' '.join(cmd)}:\n{proc.stdout}\n{proc.stderr}"
        return proc.stdout

    dvc = (sys.executable, "-m", "dvc")
    (root / ".gitignore").write_text("\n".join([*_cached_outs(root), "/mlruns/", ""])
                                     + (ROOT / ".gitignore").read_text())
    run("git", "init", "-q")
    run(*dvc, "config", "core.no_scm", "false")
    run("git", "add", "-A")
    run("git", "commit", "-q", "-m", "the tiny pipeline, reproduced")
    assert not (root / "mlruns" / "mlflow.db").exists()     # the door logged elsewhere
    run(*dvc, "exp", "run", "--queue", "-n", "q42", "-S", "register.tolerance=0.02")
    try:
        run(*dvc, "queue", "start")
        deadline = time.monotonic() + 600
        while True:
            status = run(*dvc, "queue", "status")
            if "q42" in status and not any(s in status for s in ("Queued", "Running")):
                break
            assert time.monotonic() < deadline, status
            time.sleep(2)
        logs = run(*dvc, "queue", "logs", "q42")
        assert "Success" in status, status + logs
    finally:
        subprocess.run([*dvc, "queue", "stop", "--kill"], cwd=root, env=env,
                       capture_output=True, timeout=120)
    import re

    assert set(re.findall(r"Running stage '([^']+)'", logs)) == {"params", "register"}, logs
    db = root / "mlruns" / "mlflow.db"
    assert db.is_file(), "the project's store was not created: the runs went elsewhere"
    client = MlflowClient(f"sqlite:///{db}")
    exp = client.get_experiment_by_name("hargo")
    runs = client.search_runs([exp.experiment_id], "tags.`hargo.dvc_experiment` = 'q42'")
    stages = {r.data.tags.get("hargo.stage") for r in runs}
    assert "register" in stages, [r.data.tags for r in runs]
    reg = next(r for r in runs if r.data.tags.get("hargo.stage") == "register")
    assert reg.info.status == "FINISHED" and reg.data.params["register.tolerance"] == "0.02"
    assert reg.info.artifact_uri.startswith((root / "mlruns" / "artifacts").as_uri())


@pytest.mark.parametrize("command", [["summary"], ["check-params", "--explain", "seed"]])
def test_the_first_hargo_command_in_a_copied_project_reroots_its_store(
        tmp_path, monkeypatch, store_template, command):
    """Issue 42, item 9: docs/tracking.md says the first hargo command of a moved or copied
    project re-roots its store; only the stages did (`hargo summary`, the main job's last
    command, read the old clone's store)."""
    from typer.testing import CliRunner

    from hargo.cli import app

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("HARGO_PARENT_RUN_ID", raising=False)
    monkeypatch.delenv("DVC_ROOT", raising=False)
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    shutil.copy(ROOT / "params.yaml", a / "params.yaml")
    shutil.copytree(store_template, a / "mlruns")
    tracking_store.reroot(a, quiet=True)                # a project whose store is its own
    exp_id = "1"
    shutil.copytree(a, b)
    monkeypatch.chdir(b)
    res = CliRunner().invoke(app, command)
    assert "re-rooted its MLflow store" in res.output, res.output
    loc = MlflowClient(f"sqlite:///{b / 'mlruns' / 'mlflow.db'}").get_experiment(exp_id)
    assert loc.name == "hargo" and loc.artifact_location == (b / "mlruns" / "artifacts").as_uri()
