"""MLflow layout: one experiment, a parent per pipeline run, a child run per stage."""
from __future__ import annotations

import mlflow
import pytest
from mlflow.tracking import MlflowClient

from hargo import tracking


def test_stage_runs_share_one_parent_and_carry_tags(mlflow_uri, committed_params, monkeypatch):
    monkeypatch.setenv("HARGO_DOOR", "prefect")
    with tracking.stage_run("prepare", committed_params) as r1:
        mlflow.log_metric("n", 3)
    with tracking.stage_run("sft", committed_params) as r2:
        pass
    client = MlflowClient(mlflow_uri)
    a, b = client.get_run(r1.info.run_id), client.get_run(r2.info.run_id)
    parent = a.data.tags["mlflow.parentRunId"]
    assert parent == b.data.tags["mlflow.parentRunId"]
    assert client.get_run(parent).data.tags["hargo.kind"] == "pipeline"
    assert a.data.tags["hargo.door"] == "prefect"
    assert a.data.tags["hargo.data_version"] == "d4b8976c107bec18a39c09fdbc1f0999.dir"
    assert a.data.params["rl.hargo.beta"] == "0.02"
    assert a.data.metrics["n"] == 3
    assert a.info.experiment_id == b.info.experiment_id


def test_changed_params_get_a_new_parent(mlflow_uri, committed_params):
    other = {**committed_params, "seed": committed_params["seed"] + 1}
    p1 = tracking.parent_run_id(committed_params)
    p2 = tracking.parent_run_id(other)
    assert p1 != p2
    assert tracking.parent_run_id(committed_params) == p1


def test_failed_stage_marks_run_failed(mlflow_uri, committed_params):
    with pytest.raises(ValueError):
        with tracking.stage_run("validate", committed_params) as run:
            raise ValueError("boom")
    assert MlflowClient(mlflow_uri).get_run(run.info.run_id).info.status == "FAILED"


def test_unwritable_store_is_a_clear_error(tmp_path, monkeypatch, committed_params):
    # (tests run as root, so permissions cannot make a store unwritable: a file stands where
    # the store's folder should be instead)
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("x")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{blocker / 'sub' / 'mlflow.db'}")
    with pytest.raises(RuntimeError, match="cannot be used"):
        tracking.setup(committed_params)
