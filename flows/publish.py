"""What a pipeline flow run leaves behind besides its stages' outputs: the MLflow parent run the
stage runs nest under (opened before the first step, closed FINISHED or FAILED after the last)
and the markdown report artifact ``hargo-pipeline-report`` (:mod:`flows.report` renders it)."""
from __future__ import annotations

import json
from pathlib import Path

from prefect import get_run_logger, task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE
from prefect.tasks import exponential_backoff

from flows.report import mlflow_runs, render_report
from flows.retries import retry_if_transient
from hargo import tracking
from hargo.config import as_config

__all__ = ["REPORT_KEY", "open_mlflow_run", "close_mlflow_run", "build_report", "publish"]

REPORT_KEY = "hargo-pipeline-report"

# Small MLflow reads/writes of the flow itself: quicker back-off.
_STORE_TASK = dict(retries=3, retry_delay_seconds=exponential_backoff(backoff_factor=2),
                   retry_jitter_factor=0.5, retry_condition_fn=retry_if_transient,
                   cache_policy=NO_CACHE)


@task(name="open-mlflow-run", **_STORE_TASK)
def open_mlflow_run(params: dict, flow_run_id: str) -> str:
    """Create the pipeline's MLflow parent run (door ``prefect``); returns its id."""
    return tracking.start_parent_run(as_config(params), "prefect",
                                     extra_tags={"hargo.prefect_flow_run_id": flow_run_id})


@task(name="close-mlflow-run", **_STORE_TASK)
def close_mlflow_run(run_id: str, failure: str | None, killed: bool = False) -> None:
    """End the parent run FINISHED, or FAILED with the failure recorded as a tag, or KILLED
    (``killed``: the flow run was cancelled or interrupted, as its stage runs were); it carries
    the flow's wall time as metric ``pipeline_wall_s``."""
    from mlflow.tracking import MlflowClient

    if failure:
        MlflowClient().set_tag(run_id, "hargo.failure", failure[:5000])
    tracking.end_pipeline_run(run_id, "KILLED" if killed else "FAILED" if failure
                              else "FINISHED")


@task(name="build-report", **_STORE_TASK)
def build_report(params: dict, params_path: str, overrides: dict, parent_run_id: str | None,
                 steps: list[dict], failure: str | None) -> str:
    """The run's markdown report: steps, metrics/eval.json's table, the MLflow runs."""
    uri = tracking.tracking_uri(".")
    exp_id = tracking.setup(as_config(params), ".")
    runs = mlflow_runs(exp_id, parent_run_id) if parent_run_id else []
    eval_path = Path("metrics") / "eval.json"
    metrics = json.loads(eval_path.read_text(encoding="utf-8")) if eval_path.exists() else None
    return render_report(status="Failed" if failure else "Completed", params_path=params_path,
                         overrides=overrides, tracking_uri=uri, experiment_id=exp_id,
                         parent_run_id=parent_run_id, runs=runs, eval_metrics=metrics,
                         steps=steps, failure=failure)


def publish(params: dict, params_path: str, overrides: dict, parent: str, steps: list[dict],
             failure: str | None, killed: bool = False) -> None:
    """Close the parent run (KILLED when ``killed``: a cancelled or interrupted flow run) and
    publish the report; their own failures are logged, never allowed to hide the step failure
    being reported."""
    log = get_run_logger()
    closed = close_mlflow_run(parent, failure, killed, return_state=True)
    if not closed.is_completed():
        log.error("could not close MLflow run %s: %s", parent, closed.message)
    report = build_report(params, params_path, overrides, parent, steps, failure,
                          return_state=True)
    if report.is_completed():
        create_markdown_artifact(markdown=report.result(), key=REPORT_KEY,
                                 description="hargo pipeline: metrics and MLflow runs")
    else:
        log.error("could not build the report: %s", report.message)
        status = f"Failed\n\n**{failure}**" if failure else "Completed"
        create_markdown_artifact(
            markdown=f"# hargo pipeline: {status}\n\n(report unavailable: {report.message})\n",
            key=REPORT_KEY, description="hargo pipeline report")
