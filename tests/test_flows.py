"""The Prefect flows (flows/): params checked before any task, input-keyed caching, retries only
on transient failures, the report artifact, and the whole pipeline agreeing with ``dvc repro``.

Flow runs execute under ``prefect_test_harness`` (a temporary local Prefect API) in a small copy
of the project (tests/flow_project.py) with the first records of the real HPC-GPT files.
"""
from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from flow_project import make_project, tiny_overrides

N_RAW = 40  # records per raw file in the project copies


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
    """A project copy as the working directory, with small-data validate bounds."""
    root = make_project(tmp_path / "project", real_raw_dir, N_RAW)
    monkeypatch.chdir(root)
    monkeypatch.delenv("HARGO_DOOR", raising=False)
    return root


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


# ------------------------------------------------------------------------------- caching
DVC_YAML = """
stages:
  one:
    cmd: x
    deps: [in.txt, code]
    params: [seed, a.b]
    outs:
      - out.txt
      - logs:
          cache: false
          persist: true
    metrics:
      - m.json:
          cache: false
    plots:
      - p.csv:
          x: a
  many:
    foreach: [p, q]
    do:
      cmd: y ${item}
      deps: ["models/${item}"]
      params: [a]
      outs: ["res/${item}"]
"""


def test_stage_spec_reads_deps_params_and_outs(tmp_path):
    from flows.caching import stage_spec

    (tmp_path / "dvc.yaml").write_text(DVC_YAML)
    one = stage_spec(tmp_path / "dvc.yaml", "one", {})
    assert one.name == "one" and one.deps == ("in.txt", "code")
    assert one.params == ("seed", "a.b")
    assert one.outs == ("out.txt", "m.json", "p.csv")  # a persist: true folder is bookkeeping
    many = stage_spec(tmp_path / "dvc.yaml", "many", {}, "q")
    assert (many.name, many.deps, many.outs) == ("many@q", ("models/q",), ("res/q",))
    with pytest.raises(ValueError, match="no stage 'nope'"):
        stage_spec(tmp_path / "dvc.yaml", "nope", {})
    with pytest.raises(ValueError, match="foreach stage"):
        stage_spec(tmp_path / "dvc.yaml", "many", {})


def test_every_flow_step_is_a_dvc_stage(committed_params):
    """The flows key their cache on dvc.yaml: each step they run must be described there."""
    from flows.caching import stage_spec

    root = Path(__file__).resolve().parents[1]
    for step in ("prepare", "validate", "base_model", "sft", "evaluate", "register"):
        spec = stage_spec(root / "dvc.yaml", step, committed_params)
        assert spec.deps and spec.outs, step
    rl = stage_spec(root / "dvc.yaml", "rl", committed_params, "hargo")
    assert rl.name == "rl@hargo" and "models/rl/hargo" in rl.outs
    assert all("checkpoints" not in o for o in rl.outs)


def test_hash_path_file_and_folder(tmp_path):
    from flows.caching import hash_path

    (tmp_path / "d" / "sub").mkdir(parents=True)
    (tmp_path / "d" / "a.txt").write_bytes(b"alpha")
    (tmp_path / "d" / "sub" / "b.txt").write_bytes(b"beta")
    (tmp_path / "d" / "__pycache__").mkdir()
    (tmp_path / "d" / "__pycache__" / "x.pyc").write_bytes(b"ignored")
    sha = lambda b: hashlib.sha256(b).hexdigest()  # noqa: E731
    assert hash_path(tmp_path / "d" / "a.txt") == sha(b"alpha")
    expected = sha(f"a.txt\0{sha(b'alpha')}\nsub/b.txt\0{sha(b'beta')}\n".encode())
    assert hash_path(tmp_path / "d") == expected
    with pytest.raises(FileNotFoundError):
        hash_path(tmp_path / "missing")


def test_inputs_key_follows_deps_and_stage_params_only(tmp_path):
    from flows.caching import inputs_key, outputs_digest, stage_spec

    (tmp_path / "dvc.yaml").write_text(DVC_YAML)
    (tmp_path / "in.txt").write_text("1")
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "s.py").write_text("x = 1")
    params = {"seed": 1, "a": {"b": 2, "c": 3}}
    spec = stage_spec(tmp_path / "dvc.yaml", "one", params)
    k = inputs_key(spec, params, tmp_path)
    assert k.startswith("hargo-one-") and k == inputs_key(spec, params, tmp_path)
    # a param the stage does not declare: same key
    assert inputs_key(spec, {"seed": 1, "a": {"b": 2, "c": 99}}, tmp_path) == k
    # a declared param, a dep's content, the stage code: new key
    assert inputs_key(spec, {"seed": 2, "a": {"b": 2, "c": 3}}, tmp_path) != k
    (tmp_path / "in.txt").write_text("2")
    k2 = inputs_key(spec, params, tmp_path)
    assert k2 != k
    (tmp_path / "code" / "s.py").write_text("x = 2")
    assert inputs_key(spec, params, tmp_path) not in (k, k2)
    # a missing dep: no key (nothing cached, the stage reports the missing input)
    (tmp_path / "in.txt").unlink()
    assert inputs_key(spec, params, tmp_path) is None
    # outputs: digest only when all present
    assert outputs_digest(spec, tmp_path) is None
    (tmp_path / "out.txt").write_text("o")
    (tmp_path / "m.json").write_text("{}")
    (tmp_path / "p.csv").write_text("a\n1\n")
    d = outputs_digest(spec, tmp_path)
    (tmp_path / "out.txt").write_text("changed")
    assert outputs_digest(spec, tmp_path) not in (None, d)


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


# ------------------------------------------------------------------------------- flow runs
@pytest.mark.timeout(300)
def test_bad_params_fail_the_run_before_any_task(harness, project):
    from flows.pipeline import hargo_pipeline, hargo_rl

    state = hargo_pipeline(overrides={**SMALL, "rl.stepz": 3}, return_state=True)
    assert state.is_failed()
    assert "ParamsError: rl.stepz: unknown parameter" in state.message
    assert _task_runs(state.state_details.flow_run_id) == []
    state = hargo_rl(overrides={"rl.method": "reinforce"}, return_state=True)
    assert state.is_failed() and "rl.method: unknown method 'reinforce'" in state.message
    assert _task_runs(state.state_details.flow_run_id) == []
    assert not (project / "data" / "prepared").exists()


@pytest.mark.timeout(300)
def test_prepare_is_cached_by_inputs_and_outputs(harness, project):
    from flows.pipeline import hargo_prepare

    first = hargo_prepare(overrides=SMALL, return_state=True)
    assert first.is_completed(), first.message
    train = (project / "data" / "prepared" / "train.jsonl").read_bytes()
    assert _states(first, "prepare") == ["Completed"]
    # same inputs, outputs untouched: served from the cache, the stage does not run
    second = hargo_prepare(overrides=SMALL, return_state=True)
    assert _states(second, "prepare") == ["Cached"]
    assert second.result() == first.result()
    # an output replaced since: the cached result is not trusted, the stage runs again
    (project / "data" / "prepared" / "train.jsonl").write_text("")
    third = hargo_prepare(overrides=SMALL, return_state=True)
    assert _states(third, "prepare") == ["Cached", "Completed"]
    assert (project / "data" / "prepared" / "train.jsonl").read_bytes() == train
    # a param of the stage changed: a new key, the stage runs
    fourth = hargo_prepare(overrides={**SMALL, "seed": 7}, return_state=True)
    assert _states(fourth, "prepare") == ["Completed"]
    # a param of another stage changed: still cached
    fifth = hargo_prepare(overrides={**SMALL, "seed": 7, "rl.steps": 9}, return_state=True)
    assert _states(fifth, "prepare") == ["Cached"]
    # force: runs whatever the cache says
    sixth = hargo_prepare(overrides={**SMALL, "seed": 7}, force=True, return_state=True)
    assert _states(sixth, "prepare") == ["Completed"]


@pytest.mark.timeout(300)
def test_transient_failures_are_retried_others_are_not(harness, project, monkeypatch):
    import flows.pipeline as fp
    from hargo.data import prepare as stage
    from hargo.io import HargoInputError

    monkeypatch.setattr(fp, "prepare", fp.prepare.with_options(retry_delay_seconds=0))
    real = stage.run
    calls = []

    def locked_once(params):
        calls.append(1)
        if len(calls) == 1:
            raise sqlite3.OperationalError("database is locked")
        return real(params)

    monkeypatch.setattr(stage, "run", locked_once)
    state = fp.hargo_prepare(overrides=SMALL, force=True, return_state=True)
    assert state.is_completed(), state.message
    assert len(calls) == 2

    def bad_input(params):
        calls.append(1)
        raise HargoInputError("data/raw/hpc-gpt/task1_plp.json", "expected a JSON array")

    calls.clear()
    monkeypatch.setattr(stage, "run", bad_input)
    state = fp.hargo_prepare(overrides=SMALL, force=True, return_state=True)
    assert state.is_failed() and len(calls) == 1
    assert ("step prepare failed: HargoInputError: data/raw/hpc-gpt/task1_plp.json: "
            "expected a JSON array") in state.message


# ------------------------------------------------------------------ pipeline == dvc repro
def _dvc(args: list[str], cwd: Path, env: dict, timeout: int) -> None:
    proc = subprocess.run([sys.executable, "-m", "dvc", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, \
        f"dvc {' '.join(args)}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"


TIMINGS = {"wall_s", "load_s", "generate_s", "gen_tokens_per_s"}


def _without_timings(doc: dict) -> dict:
    return {m: {k: v for k, v in e.items() if k not in TIMINGS} if isinstance(e, dict) else e
            for m, e in doc.items()}


@pytest.mark.timeout(900)
def test_pipeline_flow_matches_dvc_repro(harness, tmp_path, real_raw_dir, tiny_model_dir,
                                         monkeypatch, mlflow_uri):
    """The whole pipeline through Prefect and through `dvc repro`, same params, same code, one
    MLflow store: same final metrics; runs marked by door; a report artifact."""
    from mlflow.tracking import MlflowClient
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    from flows.pipeline import REPORT_KEY, hargo_pipeline
    from flows.report import per_model_metrics
    from hargo.io import read_jsonl

    overrides = tiny_overrides(tiny_model_dir, N_RAW)
    # the DVC door: overrides written into params.yaml (as `dvc exp run -S` does)
    dvc_root = make_project(tmp_path / "dvc", real_raw_dir, N_RAW, params_updates=overrides)
    env = {k: v for k, v in os.environ.items() if not k.startswith("HARGO_")}
    env.update(MLFLOW_TRACKING_URI=mlflow_uri,
               PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    _dvc(["init", "--no-scm", "-q"], dvc_root, env, 60)
    _dvc(["repro"], dvc_root, env, 600)
    dvc_metrics = json.loads((dvc_root / "metrics" / "eval.json").read_text())

    # the Prefect door: committed params.yaml + the same overrides as a flow parameter
    flow_root = make_project(tmp_path / "flow", real_raw_dir, N_RAW)
    monkeypatch.chdir(flow_root)
    monkeypatch.delenv("HARGO_DOOR", raising=False)
    state = hargo_pipeline(overrides=overrides, return_state=True)
    assert state.is_completed(), state.message
    flow_metrics = json.loads((flow_root / "metrics" / "eval.json").read_text())

    models = per_model_metrics(flow_metrics)
    assert set(models) == {"sft", "hargo"}, flow_metrics
    assert models["hargo"]["n"] == models["sft"]["n"] > 0
    # every metric, count and confusion cell equal; only the timings differ
    assert _without_timings(flow_metrics) == _without_timings(dvc_metrics)
    # and the models wrote the same completions for the same prompts
    def completions(root: Path, name: str) -> list[tuple[str, str]]:
        return [(r["id"], r["completion"])
                for r in read_jsonl(root / "data" / "eval" / f"{name}.jsonl")]

    for name in models:
        assert completions(flow_root, name) == completions(dvc_root, name) != []

    # MLflow: one experiment; the Prefect parent run and its stage runs marked door=prefect
    client = MlflowClient(tracking_uri=mlflow_uri)
    exp = client.get_experiment_by_name("hargo")
    parents = client.search_runs([exp.experiment_id],
                                 "tags.`hargo.kind` = 'pipeline' and tags.`hargo.door` = 'prefect'")
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    parent = parents[0]
    assert parent.data.tags["hargo.prefect_flow_run_id"] == str(state.state_details.flow_run_id)
    children = client.search_runs([exp.experiment_id],
                                  f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'")
    assert children and all(r.data.tags["hargo.door"] == "prefect" for r in children)
    dvc_runs = client.search_runs([exp.experiment_id], "tags.`hargo.door` = 'dvc'")
    dvc_stages = {r.data.tags.get("hargo.stage") for r in dvc_runs
                  if r.data.tags.get("hargo.kind") == "stage"}
    assert {r.data.tags.get("hargo.stage") for r in children} == dvc_stages

    # the report artifact: the metrics table and the MLflow runs
    with get_client(sync_client=True) as pc:
        arts = pc.read_artifacts(artifact_filter=ArtifactFilter(
            key=ArtifactFilterKey(any_=[REPORT_KEY])))
    mine = [a for a in arts if a.flow_run_id == state.state_details.flow_run_id]
    assert len(mine) == 1
    text = mine[0].data
    assert "# hargo pipeline: Completed" in text and parent.info.run_id in text
    for name in models:
        assert f"| {name} |" in text
    for r in children:
        assert r.info.run_id in text


def test_comparison_flow_runs_the_plan_and_publishes_the_report(harness, project, tiny_model_dir):
    """`hargo-comparison` on the outputs of `hargo-pipeline`: preferences, then train + eval per
    method x seed, SFT eval, report; the report artifact is the rendered comparison; a second
    run is served from the cache."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    from flows.compare import REPORT_KEY, hargo_comparison
    from flows.pipeline import hargo_pipeline

    overrides = {**tiny_overrides(tiny_model_dir, N_RAW),
                 "compare.methods": ["grpo", "dpo", "hpcgpt"], "compare.seeds": [1]}
    assert hargo_pipeline(overrides=overrides, pull=False, return_state=True).is_completed()
    state = hargo_comparison(overrides=overrides, return_state=True)
    assert state.is_completed(), state.message
    results = state.result()
    assert list(results) == ["preferences", "compare_train@grpo-1", "compare_eval@grpo-1",
                             "compare_train@dpo-1", "compare_eval@dpo-1",
                             "compare_train@hpcgpt-1", "compare_eval@hpcgpt-1", "compare_sft",
                             "report"]
    assert results["compare_train@dpo-1"]["method"] == "dpo"
    assert results["compare_eval@grpo-1"]["n_prompts"] == \
        results["compare_eval@hpcgpt-1"]["n_prompts"] > 0
    md = (project / "reports" / "comparison.md").read_text()
    with get_client(sync_client=True) as pc:
        arts = pc.read_artifacts(artifact_filter=ArtifactFilter(
            key=ArtifactFilterKey(any_=[REPORT_KEY])))
    mine = [a for a in arts if a.flow_run_id == state.state_details.flow_run_id]
    assert len(mine) == 1 and mine[0].data == md
    again = hargo_comparison(overrides=overrides, return_state=True)
    assert again.is_completed()
    assert set(_states(again, "compare_train")) == {"Cached"}
