"""The Prefect flows (flows/): params checked before any task, overrides written into
params.yaml, every stage run through DVC (one book: ``dvc.lock``), retries only on transient
failures, the report artifact, and the whole pipeline agreeing with ``dvc repro`` -- a
``dvc repro`` after a flow run has nothing to reproduce, a flow run after ``dvc repro`` runs no
stage.

Flow runs execute under ``prefect_test_harness`` (a temporary local Prefect API) in a small copy
of the project (tests/flow_project.py, a DVC project) with the first records of the real
HPC-GPT files.
"""
from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from flow_project import PIPELINE_GROUP, make_project, tiny_overrides

N_RAW = 40  # records per raw file in the project copies
# one worker runs this module: its Prefect API (``harness``) starts once, and the Prefect door
# and conftest's ``dvc_door`` and ``dvc_compare_door`` (shared with test_compare) run once
# (flow_project.PIPELINE_GROUP)
pytestmark = pytest.mark.xdist_group(PIPELINE_GROUP)


# ------------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def harness(tmp_path_factory):
    """A temporary Prefect API for this module; task results stored in a temp folder."""
    from prefect.settings import PREFECT_LOCAL_STORAGE_PATH, temporary_settings
    from prefect.testing.utilities import prefect_test_harness

    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    storage = tmp_path_factory.mktemp("prefect-results")
    with temporary_settings({PREFECT_LOCAL_STORAGE_PATH: storage}), \
            prefect_test_harness(server_startup_timeout=120):
        yield


@pytest.fixture()
def project(tmp_path, real_raw_dir, monkeypatch, mlflow_uri):
    """A project copy (a DVC project) as the working directory."""
    root = make_project(tmp_path / "project", real_raw_dir, N_RAW, dvc=True)
    monkeypatch.chdir(root)
    monkeypatch.delenv("HARGO_DOOR", raising=False)
    return root


class PrefectDoor:
    """The tiny main pipeline run once by the ``hargo-pipeline`` flow (:func:`prefect_door`)."""

    def __init__(self, root: Path, state, overrides: dict, mlflow_uri: str):
        self.root, self.state, self.overrides, self.mlflow_uri = root, state, overrides, mlflow_uri


@pytest.fixture(scope="module")
def prefect_door(harness, dvc_door, tmp_path_factory, real_raw_dir) -> PrefectDoor:
    """The main pipeline through Prefect once for this module, in a tiny project built like
    :func:`dvc_door`'s (same params: the same overrides as a flow parameter) and logging to the
    same MLflow store, so that one store holds both doors' runs. Read-only for its tests."""
    from flows.pipeline import hargo_pipeline

    root = make_project(tmp_path_factory.mktemp("prefect-door") / "flow", real_raw_dir, N_RAW,
                        params_updates=dvc_door.overrides, dvc=True)
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(root)
        mp.delenv("HARGO_DOOR", raising=False)
        mp.delenv("HARGO_PARENT_RUN_ID", raising=False)
        mp.setenv("MLFLOW_TRACKING_URI", dvc_door.mlflow_uri)
        state = hargo_pipeline(overrides=dvc_door.overrides, return_state=True)
    return PrefectDoor(root, state, dvc_door.overrides, dvc_door.mlflow_uri)


SMALL = {k: v for k, v in tiny_overrides(Path("unused"), N_RAW).items()
         if k.startswith(("validate.", "data."))}


def _task_runs(flow_run_id) -> list:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    with get_client(sync_client=True) as client:
        runs = client.read_task_runs(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))
    return sorted(runs, key=lambda r: r.expected_start_time)


def _states(flow_state, prefix: str) -> list[str]:
    """State names of the flow run's task runs whose name starts with ``prefix``, in order."""
    return [r.state.name for r in _task_runs(flow_state.state_details.flow_run_id)
            if r.name.startswith(prefix)]


def _dvc_env(mlflow_uri: str | None = None) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HARGO_")}
    env.update(PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}", DVC_NO_ANALYTICS="1")
    if mlflow_uri:
        env["MLFLOW_TRACKING_URI"] = mlflow_uri
    return env


def _dvc(args: list[str], cwd: Path, env: dict | None = None, timeout: int = 120) -> str:
    proc = subprocess.run([sys.executable, "-m", "dvc", *args], cwd=cwd,
                          env=env or _dvc_env(), capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, \
        f"dvc {' '.join(args)}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


def _status(root: Path, *targets: str) -> dict:
    """``dvc status --json [targets]`` in ``root``: {} when everything is up to date."""
    out = _dvc(["status", "--json", *targets], root)
    return json.loads(out[out.index("{"):])


def _lock_stages(root: Path, name: str = "dvc.lock") -> set[str]:
    return set(yaml.safe_load((root / name).read_text())["stages"])


# ------------------------------------------------------------------------------- params
def test_resolve_params_rl_method_shorthand():
    from flows.pipeline import resolve_params
    from hargo.params import ParamsError

    root = Path(__file__).resolve().parents[1]
    p = resolve_params(root / "params.yaml", {"rl.method": "hargo", "rl.steps": 2})
    assert p["rl"]["methods"] == ["hargo"] and p["rl"]["steps"] == 2
    with pytest.raises(ParamsError, match=r"^rl.method: give either"):
        resolve_params(root / "params.yaml", {"rl.method": "hargo", "rl.methods": ["grpo"]})
    with pytest.raises(ParamsError, match=r"^rl.method: unknown method 'reinforce'"):
        resolve_params(root / "params.yaml", {"rl.method": "reinforce"})
    with pytest.raises(ParamsError, match=r"^rl.stepz: unknown parameter"):
        resolve_params(root / "params.yaml", {"rl.stepz": 3})


def test_door_env_restores(monkeypatch):
    from flows.pipeline import door_env

    monkeypatch.setenv("HARGO_DOOR", "dvc")
    monkeypatch.delenv("HARGO_PARENT_RUN_ID", raising=False)
    with door_env("abc123"):
        assert os.environ["HARGO_DOOR"] == "prefect"
        assert os.environ["HARGO_PARENT_RUN_ID"] == "abc123"
    assert os.environ["HARGO_DOOR"] == "dvc"
    assert "HARGO_PARENT_RUN_ID" not in os.environ


# ------------------------------------------------------------------------------- DVC door
def test_every_flow_step_is_a_dvc_stage(tmp_path, committed_params, monkeypatch):
    """The flows address their stages by DVC's names: each must be one DVC knows (matrix and
    foreach items included) for the committed params."""
    from dvc.repo import Repo

    from flows.compare import comparison_targets
    from flows.pipeline import pipeline_targets
    from flows.stages import target

    root = Path(__file__).resolve().parents[1]
    for name in ("dvc.yaml", "compare/dvc.yaml", "params.yaml"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes((root / name).read_bytes())
    _dvc(["init", "--no-scm", "-q"], tmp_path)
    monkeypatch.chdir(tmp_path)  # DVC's addresses are relative to the working directory
    with Repo(str(tmp_path)) as repo:
        known = {s.addressing for s in repo.index.stages}
    flows_targets = pipeline_targets(committed_params) + comparison_targets(committed_params)
    assert set(flows_targets) <= known, set(flows_targets) - known
    assert "rl@hargo" in flows_targets
    assert target("compare_train", {"method": "hargo", "seed": 1}, "compare/dvc.yaml") \
        == "compare/dvc.yaml:compare_train@hargo-1" in known
    # every stage DVC knows is run by a flow; `params` by every stage task, before its stage
    # (flows.stages.reproduce)
    from flows.stages import PARAMS_STAGE

    assert known == set(flows_targets) | {PARAMS_STAGE}


def test_committed_params_are_a_fixed_point_of_dvcs_writer(tmp_path):
    """`dvc exp run -S k=v` re-dumps params.yaml with DVC's writer: lists in block style,
    nulls empty. The committed file is already in that style, so a -S changes only its own
    line (it rewrote 58 lines when the lists were inline)."""
    from dvc.utils.hydra import apply_overrides

    root = Path(__file__).resolve().parents[1]
    before = (root / "params.yaml").read_text()
    path = tmp_path / "params.yaml"
    path.write_text(before)
    apply_overrides(path, [])
    assert path.read_text() == before
    apply_overrides(path, ["rl.steps=9"])
    changed = [(a, b) for a, b in zip(before.splitlines(), path.read_text().splitlines())
               if a != b]
    assert changed == [("  steps: 4", "  steps: 9")]


def test_write_overrides_writes_what_dvc_writes(tmp_path):
    """The flows' writer and `dvc exp run -S` give the same bytes: only the changed values'
    lines differ, comments stay; unknown keys are refused; the same values again leave the
    file untouched."""
    import difflib

    from dvc.utils.hydra import apply_overrides

    from flows.pipeline import normalize_overrides, resolve_params
    from flows.stages import write_overrides
    from hargo.params import ParamsError

    root = Path(__file__).resolve().parents[1]
    path, dvc_path = tmp_path / "params.yaml", tmp_path / "dvc.yaml"
    before = (root / "params.yaml").read_text()
    path.write_text(before)
    dvc_path.write_text(before)
    ov = normalize_overrides({"rl.method": "hargo", "rl.steps": 9, "seed": 42,
                              "validate.task_counts": {"race_c": [1, 40], "race_fortran": [1, 40],
                                                       "mlperf": [1, 40], "plp": [1, 40]}})
    assert sorted(write_overrides(path, ov)) == ["rl.methods", "rl.steps", "validate.task_counts"]
    after = path.read_text()
    assert yaml.safe_load(after) == resolve_params(root / "params.yaml", ov)
    apply_overrides(dvc_path, ["rl.methods=[hargo]", "rl.steps=9", "seed=42",
                               "validate.task_counts={race_c: [1, 40], race_fortran: [1, 40], "
                               "mlperf: [1, 40], plp: [1, 40]}"])
    assert after == dvc_path.read_text()
    diff = [d for d in difflib.ndiff(before.splitlines(), after.splitlines())
            if d[:1] in "-+"]
    # task_counts: 8 numbers; rl.methods [grpo, hargo] -> [hargo]: one line gone; rl.steps
    assert sum(d.startswith("- ") for d in diff) == 10, diff
    assert sum(d.startswith("+ ") for d in diff) == 9, diff
    assert any("# each gets its own stage" in line for line in after.splitlines()
               if line.startswith("  methods:"))
    assert after.count("#") == before.count("#")
    # the same values again: the file is not touched
    mtime = path.stat().st_mtime_ns
    assert write_overrides(path, ov) == [] and path.stat().st_mtime_ns == mtime
    with pytest.raises(ParamsError, match=r"^rl.stepz: unknown parameter"):
        write_overrides(path, {"rl.stepz": 1})
    assert not list(tmp_path.glob(".*.tmp"))


def test_dvc_error_reason_and_permanence():
    """A failed stage's message leads with the `hargo` CLI's error line; what the CLI reports
    as bad params, input or data, and DVC's refusals, are final; the rest is classified by
    flows.retries from the output."""
    from flows.retries import is_transient
    from flows.stages import DvcError

    args = ["repro", "--single-item", "prepare"]
    failed_run = "ERROR: failed to reproduce 'prepare': failed to run: hargo prepare, exited with 1"
    bad = DvcError(args, 1, "Running stage 'prepare':\n> hargo prepare\nerror: HargoInputError: "
                            f"data/raw/x.json: expected a JSON array\n{failed_run}")
    assert str(bad).startswith("HargoInputError: data/raw/x.json: expected a JSON array "
                               "(dvc repro --single-item prepare, exit 1)\n")
    assert bad.permanent and not is_transient(bad)
    contract = DvcError(args, 1, "validation failed:\n  prepared.ids_unique: 2 of 9\n" + failed_run)
    assert contract.permanent and not is_transient(contract)
    missing = DvcError(["repro", "--single-item", "sft"], 1,
                       "ERROR: failed to reproduce 'sft': dependency 'models/base' does not exist")
    assert missing.permanent and not is_transient(missing)
    locked = DvcError(args, 1, "error: RuntimeError: MLflow store sqlite:///m.db cannot be used: "
                               f"OperationalError: database is locked\n{failed_run}")
    assert not locked.permanent and is_transient(locked)
    crash = DvcError(args, 1, "Traceback (most recent call last):\nKeyError: 'x'\n" + failed_run)
    assert not crash.permanent and not is_transient(crash)
    assert str(crash).startswith("ERROR: failed to reproduce 'prepare'")


# ------------------------------------------------------------------------------- retries
def test_is_transient_classification():
    from mlflow.exceptions import MlflowException
    from mlflow.protos.databricks_pb2 import INVALID_PARAMETER_VALUE, TEMPORARILY_UNAVAILABLE
    from prefect.states import Failed

    from flows.retries import is_transient, retry_if_transient
    from hargo.data.validate import ValidationFailed
    from hargo.io import HargoInputError
    from hargo.params import ParamsError

    locked = sqlite3.OperationalError("database is locked")
    try:
        try:
            raise locked
        except sqlite3.OperationalError as e:
            raise RuntimeError("MLflow store sqlite:///x cannot be used") from e
    except RuntimeError as e:
        wrapped = e
    assert is_transient(locked) and is_transient(wrapped)
    assert is_transient(ConnectionRefusedError(111, "refused"))
    assert is_transient(TimeoutError("read timed out"))
    assert is_transient(MlflowException("busy", error_code=TEMPORARILY_UNAVAILABLE))
    assert not is_transient(MlflowException("bad", error_code=INVALID_PARAMETER_VALUE))
    assert not is_transient(ParamsError("rl.steps: must be >= 1, got 0"))
    assert not is_transient(HargoInputError("x.json", "not valid JSON", record=3))
    assert not is_transient(ValueError("bad"))
    failed = ValidationFailed([{"name": "prepared.ids_unique", "failing": 2,
                                "element_count": 9, "ids": ["a"]}])
    assert not is_transient(failed)
    # a permanent error raised while handling a transient one is still permanent
    try:
        try:
            raise locked
        except sqlite3.OperationalError:
            raise ParamsError("seed: expected an integer")
    except ParamsError as e:
        assert not is_transient(e)
    assert retry_if_transient(None, None, Failed(data=locked)) is True
    assert retry_if_transient(None, None, Failed(data=failed)) is False


# ------------------------------------------------------------------------------- report
def test_metrics_table_and_report():
    from flows.report import metrics_table, per_model_metrics, render_report, run_link

    metrics = {  # the layout hargo.evaluation.evaluate writes (keys sorted)
        "hargo": {"dr_f1": 0.75, "plp_similarity": 0.125, "win_rate": 0.5, "n": 8,
                  "wall_s": 10},
        "run": {"judge": "reward", "n_prompts": 8},
        "sft": {"dr_f1": 0.5, "plp_similarity": 0.25, "n": 8, "mlperf_em": None,
                "dr_confusion": {"tp": 1, "fp": 0, "fn": 1, "tn": 2}, "wall_s": 12.5}}
    assert per_model_metrics(metrics) == {
        "sft": {"dr_f1": 0.5, "plp_similarity": 0.25, "n": 8, "wall_s": 12.5},
        "hargo": {"dr_f1": 0.75, "plp_similarity": 0.125, "win_rate": 0.5, "n": 8, "wall_s": 10}}
    assert metrics_table(metrics) == (
        "| model | dr_f1 | plp_similarity | win_rate | wall_s |\n"
        "|---|---:|---:|---:|---:|\n"
        "| sft | 0.5000 | 0.2500 | — | 12.5000 |\n"
        "| hargo | 0.7500 | 0.1250 | 0.5000 | 10 |")
    assert metrics_table({"run": {"n_prompts": 3}}) == ""
    # the baselines first and marked, then SFT, then the methods; MCC and AUC beside DR-F1
    with_baselines = {**metrics,
                      "always-yes": {"baseline": True, "dr_f1": 0.5, "dr_mcc": 0.0, "dr_auc": 0.5},
                      "base": {"dr_f1": 0.25, "dr_mcc": -0.5, "dr_auc": 0.25}}
    assert metrics_table(with_baselines).splitlines() == [
        "| model | dr_f1 | dr_mcc | dr_auc | plp_similarity | win_rate | wall_s |",
        "|---|---:|---:|---:|---:|---:|---:|",
        "| always-yes (baseline) | 0.5000 | 0.0000 | 0.5000 | — | — | — |",
        "| base (baseline) | 0.2500 | -0.5000 | 0.2500 | — | — | — |",
        "| sft | 0.5000 | — | — | 0.2500 | — | 12.5000 |",
        "| hargo | 0.7500 | — | — | 0.1250 | 0.5000 | 10 |"]
    assert run_link("http://mlflow:5000/", "3", "r1") == \
        "http://mlflow:5000/#/experiments/3/runs/r1"
    assert run_link("sqlite:///m.db", "3", "r1") == "http://127.0.0.1:5000/#/experiments/3/runs/r1"
    text = render_report(status="Failed", params_path="params.yaml", overrides={"rl.steps": 1},
                         tracking_uri="sqlite:///m.db", experiment_id="3", parent_run_id="p9",
                         runs=[{"name": "sft", "run_id": "r1", "status": "FINISHED"}],
                         eval_metrics=None, steps=[{"step": "sft", "state": "Failed"}],
                         failure="step sft failed: RuntimeError: boom")
    assert "# hargo pipeline: Failed" in text
    assert "**step sft failed: RuntimeError: boom**" in text
    assert "| sft | Failed |" in text and "_no evaluation yet_" in text
    assert "- `rl.steps`: `1`" in text
    assert "[p9](http://127.0.0.1:5000/#/experiments/3/runs/p9)" in text
    assert "| sft | [r1](http://127.0.0.1:5000/#/experiments/3/runs/r1) | FINISHED |" in text
    # a DVC failure: the reason in bold, the output's tail in a text block
    text = render_report(status="Failed", params_path="params.yaml", overrides={},
                         tracking_uri="sqlite:///m.db", experiment_id="3", parent_run_id=None,
                         runs=[], eval_metrics=None, steps=[],
                         failure="step sft failed: DvcError: boom (dvc repro, exit 1)\nline 1\n")
    assert "**step sft failed: DvcError: boom (dvc repro, exit 1)**\n\n~~~text\nline 1\n~~~" \
        in text


# ------------------------------------------------------------------------------- flow runs
@pytest.mark.timeout(300)
def test_bad_params_fail_the_run_before_any_task(harness, project):
    from flows.pipeline import hargo_pipeline, hargo_rl, hargo_validate

    committed = (project / "params.yaml").read_bytes()
    state = hargo_pipeline(overrides={**SMALL, "rl.stepz": 3}, return_state=True)
    assert state.is_failed()
    assert "ParamsError: rl.stepz: unknown parameter" in state.message
    assert _task_runs(state.state_details.flow_run_id) == []
    state = hargo_rl(overrides={"rl.method": "reinforce"}, return_state=True)
    assert state.is_failed() and "rl.method: unknown method 'reinforce'" in state.message
    assert _task_runs(state.state_details.flow_run_id) == []
    # another params file: DVC would not read it, so the flows refuse it
    (project / "other.yaml").write_bytes(committed)
    state = hargo_validate(params_path="other.yaml", overrides=SMALL, return_state=True)
    assert state.is_failed() and "ParamsError: params_path: the stages read params.yaml" \
        in state.message
    assert _task_runs(state.state_details.flow_run_id) == []
    assert (project / "params.yaml").read_bytes() == committed  # nothing written
    assert not (project / "data" / "prepared").exists()
    # not a DVC project: refused before any task
    shutil.rmtree(project / ".dvc")
    state = hargo_validate(overrides=SMALL, return_state=True)
    assert state.is_failed() and "not a DVC project" in state.message
    assert _task_runs(state.state_details.flow_run_id) == []


def _lock_params(root: Path, stage: str) -> dict:
    return yaml.safe_load((root / "dvc.lock").read_text())["stages"][stage]["params"]["params.yaml"]


@pytest.mark.timeout(400)
def test_prepare_runs_through_dvc(harness, project):
    """DVC decides: the stage runs when `dvc status` finds it changed (new, an output replaced,
    one of its params changed) or with force, and is `UpToDate` otherwise. A run's overrides
    are what dvc.lock records, and params.yaml is back as it was when the run ends."""
    from flows.pipeline import hargo_prepare
    from flows.stages import write_overrides

    committed = (project / "params.yaml").read_bytes()
    first = hargo_prepare(overrides=SMALL, return_state=True)
    assert first.is_completed(), first.message
    assert _states(first, "prepare") == ["Completed"]
    assert first.result()["prepare"]["reproduced"] is True
    assert _lock_stages(project) == {"params", "prepare"}
    # the stage ran with the overrides (dvc.lock), and the project's params are untouched
    assert _lock_params(project, "prepare")["data"]["split"]["eval_fraction"] == \
        SMALL["data.split.eval_fraction"]
    assert (project / "params.yaml").read_bytes() == committed
    assert "changed deps" in json.dumps(_status(project, "prepare"))   # `dvc repro` would re-run
    train = (project / "data" / "prepared" / "train.jsonl").read_bytes()
    # nothing changed: DVC says up to date, the stage does not run
    second = hargo_prepare(overrides=SMALL, return_state=True)
    assert _states(second, "prepare") == ["UpToDate"]
    assert second.result()["prepare"] == {"stage": "prepare", "reproduced": False, "changes": {}}
    # an output replaced since: DVC sees it, the stage runs again
    (project / "data" / "prepared" / "train.jsonl").write_text("")
    third = hargo_prepare(overrides=SMALL, return_state=True)
    assert _states(third, "prepare") == ["Completed"]
    assert "changed outs" in json.dumps(third.result()["prepare"]["changes"])
    assert (project / "data" / "prepared" / "train.jsonl").read_bytes() == train
    # a param of the stage changed: runs
    fourth = hargo_prepare(overrides={**SMALL, "seed": 7}, return_state=True)
    assert _states(fourth, "prepare") == ["Completed"]
    assert _lock_params(project, "prepare")["seed"] == 7
    assert (project / "params.yaml").read_bytes() == committed
    # a param of another stage changed: still up to date
    fifth = hargo_prepare(overrides={**SMALL, "seed": 7, "rl.steps": 9}, return_state=True)
    assert _states(fifth, "prepare") == ["UpToDate"]
    # force (`dvc repro --force`): runs whatever DVC says
    sixth = hargo_prepare(overrides={**SMALL, "seed": 7}, force=True, return_state=True)
    assert _states(sixth, "prepare") == ["Completed"]
    # the params in the file are the ones the stage ran with: DVC agrees
    write_overrides(project / "params.yaml", {**SMALL, "seed": 7})
    assert _status(project, "prepare") == {}


def test_overrides_are_taken_back_however_the_run_ends(harness, project):
    """A flow run's overrides live only as long as the run: params.yaml gets its bytes back
    when the run fails, too (and is not rewritten when there was nothing to write)."""
    from prefect import flow

    from flows.pipeline import run_params

    committed = (project / "params.yaml").read_bytes()
    seen = {}

    @flow(name="overrides-then-fail")
    def fails():
        with run_params("params.yaml", {"rl.steps": 9, "rl.method": "hargo"}) as params:
            seen["params"] = params["rl"]
            seen["file"] = yaml.safe_load((project / "params.yaml").read_text())["rl"]
            raise RuntimeError("a stage failed")

    state = fails(return_state=True)
    assert state.is_failed() and "a stage failed" in state.message
    assert seen["file"]["steps"] == seen["params"]["steps"] == 9
    assert seen["file"]["methods"] == ["hargo"]
    assert (project / "params.yaml").read_bytes() == committed
    assert not list(project.glob(".params.yaml.tmp"))


@pytest.mark.timeout(300)
def test_transient_failures_are_retried_others_are_not(harness, project, monkeypatch):
    import flows.pipeline as fp
    from flows import stages

    monkeypatch.setattr(fp, "prepare", fp.prepare.with_options(retry_delay_seconds=0))
    real = stages.reproduce
    calls = []

    def locked_once(target, force=False, log=None):
        calls.append(target)
        if len(calls) == 1:
            raise stages.DvcError(["repro", "--single-item", target], 1, (
                "error: RuntimeError: MLflow store sqlite:///m.db cannot be used: "
                "OperationalError: database is locked\nERROR: failed to reproduce 'prepare'"))
        return real(target, force, log)

    monkeypatch.setattr(stages, "reproduce", locked_once)
    state = fp.hargo_prepare(overrides=SMALL, return_state=True)
    assert state.is_completed(), state.message
    assert calls == ["prepare", "prepare"]
    assert _lock_params(project, "prepare")["data"]["split"]["eval_fraction"] == \
        SMALL["data.split.eval_fraction"]                   # the retried run was recorded

    # bad input data, through the real `dvc repro`: the CLI's error, not retried
    calls.clear()
    monkeypatch.setattr(stages, "reproduce", lambda t, force=False, log=None:
                        calls.append(t) or real(t, force, log))
    (project / "data" / "raw" / "hpc-gpt" / "task1_plp.json").write_text("{}")
    state = fp.hargo_prepare(overrides=SMALL, return_state=True)
    assert state.is_failed() and calls == ["prepare"], state.message
    assert "step prepare failed: DvcError: HargoInputError: data/raw/hpc-gpt/task1_plp.json" \
        in state.message


# ------------------------------------------------------------------ pipeline == dvc repro
TIMINGS = {"wall_s", "load_s", "generate_s", "score_s", "gen_tokens_per_s"}


def _without_timings(doc: dict) -> dict:
    return {m: {k: v for k, v in e.items() if k not in TIMINGS} if isinstance(e, dict) else e
            for m, e in doc.items()}


@pytest.mark.timeout(1500)
def test_pipeline_flow_matches_dvc_repro(harness, dvc_door, prefect_door, monkeypatch):
    """The whole pipeline through Prefect and through `dvc repro` (the shared tiny runs), same
    params, same code, one MLflow store: same final metrics; runs marked by door; a report
    artifact. One book: after the flow run `dvc status` finds every stage up to date and `dvc
    repro` has nothing to reproduce; after `dvc repro`, a flow run runs no stage."""
    from mlflow.tracking import MlflowClient
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    from flows.pipeline import REPORT_KEY, hargo_pipeline, pipeline_targets
    from flows.report import per_model_metrics
    from hargo.io import read_jsonl

    mlflow_uri = dvc_door.mlflow_uri
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_uri)
    monkeypatch.delenv("HARGO_PARENT_RUN_ID", raising=False)
    # the DVC door: the overrides written into params.yaml (as `dvc exp run -S` does)
    dvc_root, env = dvc_door.root, dvc_door.env
    dvc_metrics = json.loads((dvc_root / "metrics" / "eval.json").read_text())

    # the Prefect door: the same params.yaml, and the same overrides as a flow parameter
    # (nothing left to write: a run whose overrides change the file restores it at the end,
    # test_prepare_runs_through_dvc)
    flow_root, state = prefect_door.root, prefect_door.state
    assert state.is_completed(), state.message
    flow_metrics = json.loads((flow_root / "metrics" / "eval.json").read_text())
    targets = pipeline_targets(yaml.safe_load((flow_root / "params.yaml").read_text()))
    assert targets == ["prepare", "validate", "base_model", "sft", "rl@hargo", "evaluate",
                       "register"]
    assert [r.state.name for r in _task_runs(state.state_details.flow_run_id)
            if r.name in targets] == ["Completed"] * len(targets)

    # one book: the params in params.yaml, every stage in dvc.lock, and DVC agrees
    assert yaml.safe_load((flow_root / "params.yaml").read_text()) == \
        yaml.safe_load((dvc_root / "params.yaml").read_text())
    assert _lock_stages(flow_root) == set(targets) | {"params"} == _lock_stages(dvc_root)
    assert _status(flow_root, "dvc.yaml") == {}  # every stage of the main pipeline
    again = _dvc(["repro"], flow_root, env, 300)
    assert "Running stage" not in again and "Data and pipelines are up to date." in again, again

    models = per_model_metrics(flow_metrics)
    assert set(models) == {"always-yes", "nearest-train", "base", "sft", "hargo"}, flow_metrics
    assert models["hargo"]["n"] == models["sft"]["n"] > 0
    # every metric, count and confusion cell equal; only the timings differ
    assert _without_timings(flow_metrics) == _without_timings(dvc_metrics)
    # and the models wrote the same completions for the same prompts
    def completions(root: Path, name: str) -> list[tuple[str, str]]:
        return [(r["id"], r["completion"])
                for r in read_jsonl(root / "data" / "eval" / f"{name}.jsonl")]

    for name in ("base", "sft", "hargo"):   # the models (the other baselines generate nothing)
        assert completions(flow_root, name) == completions(dvc_root, name) != []

    # MLflow: one experiment; the Prefect parent run and its stage runs marked door=prefect
    client = MlflowClient(tracking_uri=mlflow_uri)
    exp = client.get_experiment_by_name("hargo")
    parents = client.search_runs([exp.experiment_id],
                                 "tags.`hargo.kind` = 'pipeline' and tags.`hargo.door` = 'prefect'")
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    parent = parents[0]
    assert parent.data.metrics["pipeline_wall_s"] == pytest.approx(
        (parent.info.end_time - parent.info.start_time) / 1000, abs=0.01)
    assert parent.data.tags["hargo.prefect_flow_run_id"] == str(state.state_details.flow_run_id)
    children = client.search_runs([exp.experiment_id],
                                  f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'")
    assert children and all(r.data.tags["hargo.door"] == "prefect" for r in children)
    dvc_runs = client.search_runs([exp.experiment_id], "tags.`hargo.door` = 'dvc'")
    dvc_stages = {r.data.tags.get("hargo.stage") for r in dvc_runs
                  if r.data.tags.get("hargo.kind") == "stage"}
    assert {r.data.tags.get("hargo.stage") for r in children} == dvc_stages
    # the DVC door's parent spans its stages (re-opened by each, ended by the last) and carries
    # the prepared splits it trained and evaluated on, digest = dvc.lock's md5
    (dvc_parent,) = [r for r in dvc_runs if r.data.tags.get("hargo.kind") == "pipeline"]
    dvc_children = [r for r in dvc_runs
                    if r.data.tags.get("mlflow.parentRunId") == dvc_parent.info.run_id]
    assert dvc_parent.info.status == "FINISHED"
    assert dvc_parent.info.start_time <= min(r.info.start_time for r in dvc_children)
    assert dvc_parent.info.end_time >= max(r.info.end_time for r in dvc_children)
    assert dvc_parent.data.metrics["pipeline_wall_s"] == pytest.approx(
        (dvc_parent.info.end_time - dvc_parent.info.start_time) / 1000, abs=0.01)
    lock = yaml.safe_load((dvc_root / "dvc.lock").read_text())
    md5 = {o["path"]: o["md5"] for o in lock["stages"]["prepare"]["outs"]}
    inputs = {(i.dataset.name, i.dataset.digest)
              for i in client.get_run(dvc_parent.info.run_id).inputs.dataset_inputs}
    assert inputs == {("hpc-gpt-train", md5["data/prepared/train.jsonl"]),
                      ("hpc-gpt-eval", md5["data/prepared/eval.jsonl"])}

    # the report artifact: the metrics table and the MLflow runs
    with get_client(sync_client=True) as pc:
        arts = pc.read_artifacts(artifact_filter=ArtifactFilter(
            key=ArtifactFilterKey(any_=[REPORT_KEY])))
    mine = [a for a in arts if a.flow_run_id == state.state_details.flow_run_id]
    assert len(mine) == 1
    text = mine[0].data
    assert "# hargo pipeline: Completed" in text and parent.info.run_id in text
    for name in ("always-yes", "nearest-train", "base"):
        assert f"| {name} (baseline) |" in text
    for name in ("sft", "hargo"):
        assert f"| {name} |" in text
    for r in children:
        assert r.info.run_id in text

    # the converse: after `dvc repro`, a flow run runs no stage and leaves dvc.lock as it was
    lock = (dvc_root / "dvc.lock").read_bytes()
    monkeypatch.chdir(dvc_root)
    after_dvc = hargo_pipeline(return_state=True)
    assert after_dvc.is_completed(), after_dvc.message
    assert {r.name: r.state.name for r in _task_runs(after_dvc.state_details.flow_run_id)
            if r.name in targets} == dict.fromkeys(targets, "UpToDate")
    assert not any(r["reproduced"] for r in after_dvc.result().values())
    assert (dvc_root / "dvc.lock").read_bytes() == lock
    assert json.loads((dvc_root / "metrics" / "eval.json").read_text()) == dvc_metrics


@pytest.mark.timeout(1500)
def test_comparison_flow_runs_the_plan_and_publishes_the_report(harness, dvc_compare_door,
                                                                tmp_path, monkeypatch,
                                                                mlflow_uri):
    """`hargo-comparison` on a copy of the shared comparison run (flow_project.DOOR_METHODS x
    seed 1, reproduced by `dvc repro compare/dvc.yaml`) whose DPO run lost its model and its eval,
    with three of the methods: preferences, then train + eval per method x seed, SFT eval,
    report, each through DVC, in the plan's order; only what is missing or whose params
    changed is reproduced (DPO's two stages; the report, whose method list changed), the rest
    is UpToDate; the report artifact is the rendered comparison; afterwards DVC finds both
    pipelines up to date, and a second run runs nothing."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    from flows.compare import REPORT_KEY, hargo_comparison
    from flows.stages import write_overrides

    project = dvc_compare_door.copy(tmp_path / "project")
    shutil.rmtree(project / "models" / "compare" / "dpo-s1")
    shutil.rmtree(project / "data" / "compare" / "eval" / "dpo-s1")
    monkeypatch.chdir(project)
    monkeypatch.delenv("HARGO_DOOR", raising=False)
    overrides = {**dvc_compare_door.overrides,
                 "compare.methods": ["grpo", "dpo", "hpcgpt"], "compare.seeds": [1]}
    # the project's params (a flow run's own overrides are taken back when it ends)
    write_overrides(project / "params.yaml", overrides)
    state = hargo_comparison(overrides=overrides, return_state=True)
    assert state.is_completed(), state.message
    results = state.result()
    assert list(results) == ["preferences", "compare_train@grpo-1", "compare_eval@grpo-1",
                             "compare_train@dpo-1", "compare_eval@dpo-1",
                             "compare_train@hpcgpt-1", "compare_eval@hpcgpt-1", "compare_sft",
                             "compare_base", "report"]
    assert results["compare_train@dpo-1"] == {
        "stage": "compare/dvc.yaml:compare_train@dpo-1", "reproduced": True,
        "changes": results["compare_train@dpo-1"]["changes"]}
    assert [step for step, r in results.items() if r["reproduced"]] == \
        ["compare_train@dpo-1", "compare_eval@dpo-1", "report"]
    assert _states(state, "compare_train") == ["UpToDate", "Completed", "UpToDate"]
    train_dpo = json.loads((project / "metrics" / "compare" / "train" / "dpo-s1.json").read_text())
    assert train_dpo["method"] == "dpo"
    n_prompts = [json.loads((project / "data" / "compare" / "eval" / run / "metrics.json")
                            .read_text())["n_prompts"] for run in ("dpo-s1", "hpcgpt-s1")]
    assert n_prompts[0] == n_prompts[1] > 0
    # one book: compare/dvc.lock holds every step, DVC finds both pipelines up to date
    assert set(results) <= _lock_stages(project, "compare/dvc.lock")
    assert _status(project) == {}
    md = (project / "reports" / "comparison.md").read_text()
    assert "| DPO " in md and "| KTO " not in md        # the report of the three methods
    with get_client(sync_client=True) as pc:
        arts = pc.read_artifacts(artifact_filter=ArtifactFilter(
            key=ArtifactFilterKey(any_=[REPORT_KEY])))
    mine = [a for a in arts if a.flow_run_id == state.state_details.flow_run_id]
    assert len(mine) == 1 and mine[0].data == md
    again = hargo_comparison(overrides=overrides, return_state=True)
    assert again.is_completed()
    assert set(_states(again, "compare_train")) == {"UpToDate"}
    assert not any(r["reproduced"] for r in again.result().values())
