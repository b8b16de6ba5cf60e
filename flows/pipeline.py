"""Prefect 3 flows for the hargo pipeline: the second door next to ``dvc repro``.

Every step is a Prefect task that calls the same stage function the DVC stage calls through
``hargo/cli.py`` (``hargo.data.prepare.run(params)`` ...); the flows only orchestrate:

    hargo-pipeline:  [pull-data] -> prepare -> validate -> base_model -> sft -> rl@<m>...
                     -> evaluate -> register, then a markdown report artifact
    hargo-prepare, hargo-validate, hargo-base-model, hargo-sft, hargo-rl, hargo-evaluate,
    hargo-register: one step each (deployable on their own, e.g. sft/rl/evaluate on GPU workers)

Parameters (every flow): ``params_path`` (default ``params.yaml``) and ``overrides``, a dict of
dotted keys applied on top (``{"rl.steps": 8, "model.source": "..."}``; ``"rl.method": "hargo"``
is shorthand for ``"rl.methods": ["hargo"]``), ``force`` (re-run cached steps). The params are
loaded and validated first thing in the flow, so a bad value fails the flow run before any task
runs, with the parameter's dotted name in the message (``hargo.params.ParamsError``).

Paths in params are relative to the working directory: run the flows from the project root
(deployments set it with their pull step).

Retries: stage tasks retry with exponential back-off only on transient failures
(:func:`flows.retries.is_transient`: a locked/unreachable MLflow store, a dropped connection);
bad params, failed validation and bad input data fail at once. ``pull-data`` (``dvc pull`` of
the raw data from the DVC remote) retries on any failure. Caching: a stage whose ``dvc.yaml``
deps and params did not change, and whose outputs are still those it wrote, is not run again
(:mod:`flows.caching`; the task shows as ``Cached``).

MLflow: the flows set ``HARGO_DOOR=prefect``, so every stage run is tagged
``hargo.door=prefect`` in the same experiment ``dvc repro`` logs to. The pipeline flow opens its
own parent run and exports ``HARGO_PARENT_RUN_ID`` so the stage runs nest under it; a single-step
flow joins the parent of its (git commit, params) like a ``dvc repro`` stage does
(:mod:`hargo.tracking`).
"""
from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE
from prefect.context import get_run_context
from prefect.tasks import exponential_backoff

from flows.caching import StageInputs, outputs_digest, stage_spec
from flows.report import mlflow_runs, render_report
from flows.retries import retry_if_transient
from hargo import tracking
from hargo.params import RL_METHODS, ParamsError, load_params

REPORT_KEY = "hargo-pipeline-report"
DVC_YAML = "dvc.yaml"

# Stage tasks: a transient failure is retried twice, after ~10 s then ~20 s (+-50 % jitter).
_STAGE_TASK = dict(retries=2, retry_delay_seconds=exponential_backoff(backoff_factor=10),
                   retry_jitter_factor=0.5, retry_condition_fn=retry_if_transient)
# Small MLflow reads/writes of the flow itself: quicker back-off.
_STORE_TASK = dict(retries=3, retry_delay_seconds=exponential_backoff(backoff_factor=2),
                   retry_jitter_factor=0.5, retry_condition_fn=retry_if_transient,
                   cache_policy=NO_CACHE)


class StepFailed(RuntimeError):
    """A pipeline step failed; the message is ``step <name> failed: <Type>: <reason>``."""

    def __init__(self, step: str, cause: BaseException):
        self.step, self.cause = step, cause
        super().__init__(f"step {step} failed: {type(cause).__name__}: {cause}")


# --------------------------------------------------------------------------- params, env
def resolve_params(params_path: str | os.PathLike = "params.yaml",
                   overrides: Mapping[str, Any] | None = None) -> dict:
    """Load and validate the params of one flow run.

    ``overrides`` are dotted keys (``hargo.params.apply_overrides``); ``"rl.method": m`` is
    shorthand for ``"rl.methods": [m]`` (one RL method for this run).

    Raises:
        ParamsError: unknown key, bad value, or both ``rl.method`` and ``rl.methods`` given;
            the message names the parameter.
        FileNotFoundError: ``params_path`` does not exist.
    """
    ov = dict(overrides or {})
    if "rl.method" in ov:
        if "rl.methods" in ov:
            raise ParamsError("rl.method: give either rl.method or rl.methods, not both")
        method = ov.pop("rl.method")
        if method not in RL_METHODS:
            raise ParamsError(f"rl.method: unknown method {method!r}; "
                              f"valid: {', '.join(RL_METHODS)}")
        ov["rl.methods"] = [method]
    return load_params(params_path, ov)


@contextlib.contextmanager
def door_env(parent_run_id: str | None = None) -> Iterator[None]:
    """Set ``HARGO_DOOR=prefect`` (and ``HARGO_PARENT_RUN_ID`` when given) for the stages
    called inside; the previous values are restored on exit."""
    new = {tracking.DOOR_ENV: "prefect"}
    if parent_run_id:
        new[tracking.PARENT_ENV] = parent_run_id
    old = {k: os.environ.get(k) for k in new}
    os.environ.update(new)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


# --------------------------------------------------------------------------- tasks
def _done(stage: str, params: dict, summary: Any, method: str | None = None) -> dict:
    """Wrap a stage's summary with the digest of the outputs it just wrote (flows.caching)."""
    spec = stage_spec(DVC_YAML, stage, params, method)
    return {"summary": summary, "outputs_digest": outputs_digest(spec, ".")}


@task(name="pull-data", retries=3, retry_delay_seconds=exponential_backoff(backoff_factor=5),
      retry_jitter_factor=0.5, cache_policy=NO_CACHE)
def pull_data(params: dict) -> dict:
    """``dvc pull <data.raw_dir>.dvc``: restore the raw data from the DVC remote.

    Without a ``.dvc`` pointer next to ``data.raw_dir`` the folder is used as it is (data
    supplied directly). Any failure is retried (a remote read).

    Raises:
        RuntimeError: ``dvc pull`` failed (its stderr tail in the message).
    """
    raw = Path(params["data"]["raw_dir"])
    pointer = raw.with_name(raw.name + ".dvc")
    log = get_run_logger()
    if not pointer.exists():
        log.info("no DVC pointer %s: using %s as it is", pointer, raw)
        return {"pulled": False, "raw_dir": str(raw)}
    proc = subprocess.run([sys.executable, "-m", "dvc", "pull", str(pointer)],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"dvc pull {pointer} failed ({proc.returncode}): "
                           f"{(proc.stderr or proc.stdout).strip()[-2000:]}")
    log.info("dvc pull %s: %s", pointer, proc.stdout.strip()[-500:])
    return {"pulled": True, "raw_dir": str(raw)}


@task(name="prepare", cache_policy=StageInputs(stage="prepare"), **_STAGE_TASK)
def prepare(params: dict) -> dict:
    """Stage prepare: ``hargo.data.prepare.run(params)``."""
    from hargo.data import prepare as stage

    return _done("prepare", params, stage.run(params))


@task(name="validate", cache_policy=StageInputs(stage="validate"), **_STAGE_TASK)
def validate(params: dict) -> dict:
    """Stage validate: ``hargo.data.validate.run(params)``; ``ValidationFailed`` is final."""
    from hargo.data import validate as stage

    return _done("validate", params, stage.run(params))


@task(name="base_model", cache_policy=StageInputs(stage="base_model"), **_STAGE_TASK)
def base_model(params: dict) -> dict:
    """Stage base_model: ``hargo.models.base.run(params)``."""
    from hargo.models import base as stage

    return _done("base_model", params, stage.run(params))


@task(name="sft", cache_policy=StageInputs(stage="sft"), **_STAGE_TASK)
def sft(params: dict) -> dict:
    """Stage sft: ``hargo.training.sft.run(params)``."""
    from hargo.training import sft as stage

    return _done("sft", params, stage.run(params))


@task(name="rl", task_run_name="rl@{method}", cache_policy=StageInputs(stage="rl"),
      **_STAGE_TASK)
def rl(params: dict, method: str) -> dict:
    """Stage rl@<method>: ``hargo.training.rl.run(params, method)``."""
    from hargo.training import rl as stage

    return _done("rl", params, stage.run(params, method), method)


@task(name="evaluate", cache_policy=StageInputs(stage="evaluate"), **_STAGE_TASK)
def evaluate(params: dict) -> dict:
    """Stage evaluate: ``hargo.evaluation.evaluate.run(params)``."""
    from hargo.evaluation import evaluate as stage

    return _done("evaluate", params, stage.run(params))


@task(name="register", cache_policy=StageInputs(stage="register"), **_STAGE_TASK)
def register(params: dict) -> dict:
    """Stage register: ``hargo.registry.run(params)``."""
    from hargo import registry as stage

    return _done("register", params, stage.run(params))


@task(name="open-mlflow-run", **_STORE_TASK)
def open_mlflow_run(params: dict, flow_run_id: str) -> str:
    """Create the pipeline's MLflow parent run (door ``prefect``); returns its id."""
    return tracking.start_parent_run(params, "prefect",
                                     extra_tags={"hargo.prefect_flow_run_id": flow_run_id})


@task(name="close-mlflow-run", **_STORE_TASK)
def close_mlflow_run(run_id: str, failure: str | None) -> None:
    """End the parent run FINISHED, or FAILED with the failure recorded as a tag."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient()
    if failure:
        client.set_tag(run_id, "hargo.failure", failure[:5000])
    client.set_terminated(run_id, "FAILED" if failure else "FINISHED")


@task(name="build-report", **_STORE_TASK)
def build_report(params: dict, params_path: str, overrides: dict, parent_run_id: str | None,
                 steps: list[dict], failure: str | None) -> str:
    """The run's markdown report: steps, metrics/eval.json's table, the MLflow runs."""
    uri = tracking.tracking_uri(".")
    exp_id = tracking.setup(params, ".")
    runs = mlflow_runs(exp_id, parent_run_id) if parent_run_id else []
    eval_path = Path("metrics") / "eval.json"
    metrics = json.loads(eval_path.read_text(encoding="utf-8")) if eval_path.exists() else None
    return render_report(status="Failed" if failure else "Completed", params_path=params_path,
                         overrides=overrides, tracking_uri=uri, experiment_id=exp_id,
                         parent_run_id=parent_run_id, runs=runs, eval_metrics=metrics,
                         steps=steps, failure=failure)


# --------------------------------------------------------------------------- orchestration
def run_step(step: str, stage_task, params: dict, *, method: str | None = None,
             force: bool = False, record: list[dict] | None = None,
             item: Mapping[str, Any] | None = None, dvc_yaml: str = DVC_YAML) -> Any:
    """Run one stage task and return the stage's summary.

    ``method`` is the item of a ``foreach`` stage (``rl@<method>``); ``item`` the keys of a
    ``matrix`` stage, passed to the task as keyword arguments (``compare_train@hargo-1``:
    ``{"method": "hargo", "seed": 1}``); ``dvc_yaml`` the file that declares the stage. A
    ``Cached`` result is used only if the stage's outputs on disk still have the digest the
    cached run recorded; otherwise (outputs replaced by another run, or deleted) the stage runs
    again. ``force`` ignores the cache. The step and its final state name are appended to
    ``record``.

    Raises:
        StepFailed: the task failed (after any retries); names the step and the reason.
    """
    kwargs: dict[str, Any] = {"params": params}
    if item is not None:
        kwargs.update(item)
        name = f"{step}@{'-'.join(str(v) for v in item.values())}"
        spec_item: Any = dict(item)
    else:
        if method is not None:
            kwargs["method"] = method
        name = f"{step}@{method}" if method else step
        spec_item = method
    t = stage_task.with_options(refresh_cache=True) if force else stage_task
    state = t(**kwargs, return_state=True)
    if state.is_completed() and state.name == "Cached":
        cached = state.result()
        spec = stage_spec(dvc_yaml, step, params, spec_item)
        if cached.get("outputs_digest") != outputs_digest(spec, "."):
            get_run_logger().info("%s: outputs changed since the cached run; running again", name)
            state = stage_task.with_options(refresh_cache=True)(**kwargs, return_state=True)
    if record is not None:
        record.append({"step": name, "state": state.name})
    if not state.is_completed():
        exc = state.result(raise_on_failure=False)
        cause = exc if isinstance(exc, BaseException) else RuntimeError(state.message or "failed")
        raise StepFailed(name, cause) from cause
    return state.result()["summary"]


def _pull(params: dict, pull: bool, record: list[dict] | None = None) -> None:
    if not pull:
        return
    state = pull_data(params, return_state=True)
    if record is not None:
        record.append({"step": "pull-data", "state": state.name})
    if not state.is_completed():
        exc = state.result(raise_on_failure=False)
        raise StepFailed("pull-data", exc if isinstance(exc, BaseException)
                         else RuntimeError(state.message or "failed"))


def _single(step: str, stage_task, params_path: str, overrides: dict | None, force: bool,
            pull: bool = False) -> dict:
    params = resolve_params(params_path, overrides)  # ParamsError: fails before any task
    with door_env():
        _pull(params, pull)
        if step == "rl":
            return {f"rl@{m}": run_step("rl", rl, params, method=m, force=force)
                    for m in params["rl"]["methods"]}
        return {step: run_step(step, stage_task, params, force=force)}


@flow(name="hargo-prepare")
def hargo_prepare(params_path: str = "params.yaml", overrides: dict[str, Any] | None = None,
                 pull: bool = True, force: bool = False) -> dict:
    """Step prepare (after ``dvc pull`` of the raw data when ``pull``)."""
    return _single("prepare", prepare, params_path, overrides, force, pull)


@flow(name="hargo-validate")
def hargo_validate(params_path: str = "params.yaml", overrides: dict[str, Any] | None = None,
                  force: bool = False) -> dict:
    """Step validate: the data contracts over the raw and prepared data."""
    return _single("validate", validate, params_path, overrides, force)


@flow(name="hargo-base-model")
def hargo_base_model(params_path: str = "params.yaml", overrides: dict[str, Any] | None = None,
                    force: bool = False) -> dict:
    """Step base_model: resolve ``model.source`` into ``model.out_dir``."""
    return _single("base_model", base_model, params_path, overrides, force)


@flow(name="hargo-sft")
def hargo_sft(params_path: str = "params.yaml", overrides: dict[str, Any] | None = None,
             force: bool = False) -> dict:
    """Step sft: supervised fine-tuning of the base model."""
    return _single("sft", sft, params_path, overrides, force)


@flow(name="hargo-rl")
def hargo_rl(params_path: str = "params.yaml", overrides: dict[str, Any] | None = None,
            force: bool = False) -> dict:
    """Step rl: one run per method in ``rl.methods`` (``overrides={"rl.method": m}`` for one)."""
    return _single("rl", rl, params_path, overrides, force)


@flow(name="hargo-evaluate")
def hargo_evaluate(params_path: str = "params.yaml", overrides: dict[str, Any] | None = None,
                  force: bool = False) -> dict:
    """Step evaluate: SFT and every RL model of ``rl.methods`` on the eval split."""
    return _single("evaluate", evaluate, params_path, overrides, force)


@flow(name="hargo-register")
def hargo_register(params_path: str = "params.yaml", overrides: dict[str, Any] | None = None,
                  force: bool = False) -> dict:
    """Step register: MLflow registry versions and the champion gate."""
    return _single("register", register, params_path, overrides, force)


PIPELINE_STEPS: tuple[tuple[str, Callable], ...] = (
    ("prepare", prepare), ("validate", validate), ("base_model", base_model), ("sft", sft),
    ("rl", rl), ("evaluate", evaluate), ("register", register))


@flow(name="hargo-pipeline")
def hargo_pipeline(params_path: str = "params.yaml", overrides: dict[str, Any] | None = None,
                   pull: bool = True, force: bool = False) -> dict:
    """The whole pipeline in ``dvc.yaml``'s order, under one MLflow parent run (door
    ``prefect``); publishes the markdown artifact ``hargo-pipeline-report``.

    Returns ``{step: stage summary}`` (``rl@<method>`` per RL method).

    Raises:
        ParamsError: bad params (before any task runs).
        StepFailed: a step failed; the report artifact and the MLflow parent run record it.
    """
    params = resolve_params(params_path, overrides)  # ParamsError: fails before any task
    flow_run_id = str(get_run_context().flow_run.id)
    parent = open_mlflow_run(params, flow_run_id)
    steps: list[dict] = []
    results: dict[str, Any] = {}
    failure: str | None = None
    try:
        with door_env(parent):
            _pull(params, pull, steps)
            for step, stage_task in PIPELINE_STEPS:
                if step == "rl":
                    for m in params["rl"]["methods"]:
                        results[f"rl@{m}"] = run_step("rl", rl, params, method=m, force=force,
                                                      record=steps)
                else:
                    results[step] = run_step(step, stage_task, params, force=force,
                                             record=steps)
    except StepFailed as e:
        failure = str(e)
        raise
    except Exception as e:  # an orchestration error, not a step's: still reported
        failure = f"pipeline failed: {type(e).__name__}: {e}"
        raise
    finally:
        _publish(params, params_path, overrides or {}, parent, steps, failure)
    return results


def _publish(params: dict, params_path: str, overrides: dict, parent: str, steps: list[dict],
             failure: str | None) -> None:
    """Close the parent run and publish the report; their own failures are logged, never
    allowed to hide the step failure being reported."""
    log = get_run_logger()
    closed = close_mlflow_run(parent, failure, return_state=True)
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
