"""Prefect 3 flows for the hargo pipeline: the second door next to ``dvc repro``, keeping the
same book (``dvc.lock``).

Every step is a Prefect task that asks DVC whether its stage is up to date and, if not, has DVC
run it (:mod:`flows.stages`: ``dvc status --json <stage>``, then ``dvc repro --single-item
<stage>``), so DVC both decides what runs and records it in ``dvc.lock``: a ``dvc repro`` after
a flow run (without overrides) has nothing to reproduce, and a flow run after ``dvc repro``
runs no stage (its tasks end in the state ``UpToDate``). The stage itself is the ``dvc.yaml`` command (the
``hargo`` CLI), the same process either door starts. The flows orchestrate:

    hargo-pipeline:  [pull-data] -> prepare -> validate -> base_model -> sft -> rl@<m>...
                     -> evaluate -> register, then a markdown report artifact
    hargo-prepare, hargo-validate, hargo-base-model, hargo-sft, hargo-rl, hargo-evaluate,
    hargo-register: one step each (deployable on their own, e.g. sft/rl/evaluate on GPU workers)

Parameters (every flow): ``params_path`` (``params.yaml``: the file ``dvc.yaml``'s stages read;
another file is refused) and ``overrides``, a dict of dotted keys (``{"rl.steps": 8,
"model.source": "..."}``; ``"rl.method": "hargo"`` is shorthand for ``"rl.methods": ["hargo"]``),
``force`` (``dvc repro --force``: run the steps although DVC finds them up to date). The
params and overrides are loaded and validated first thing in the flow, so a bad value fails the
flow run before any task runs, with the parameter's dotted name in the message
(``hargo.params.ParamsError``). Then the overrides are **written into params.yaml**
with DVC's own writer, as ``dvc exp run -S`` does in the workspace
(:func:`flows.stages.write_overrides`; only the changed values' lines differ), for the stages
to read and ``dvc.lock`` to record, and **params.yaml is restored when the flow run ends**
(completed, failed or cancelled): one run's overrides never become the project's params, so a
later ``dvc repro`` cannot silently drop a stage (``rl.methods: [hargo]`` left behind would drop
``rl@grpo``). The run's results stay where it wrote them: the outputs in the workspace and
``dvc.lock`` (made with the overrides, so ``dvc status`` reports those stages' params as
changed until ``dvc repro`` re-runs them with the committed params), and its MLflow runs, whose
params are the overrides'. The flow logs this when it restores the file.

The flows run in the project root, a DVC project (deployments set it with their pull step).
DVC lets one command at a time work in a repository: a stage waits for another DVC command
holding the lock (``--wait-for-lock``); flow runs at the same time need separate checkouts.

Retries: stage tasks retry with exponential back-off only on transient failures
(:func:`flows.retries.is_transient`: a locked/unreachable MLflow store, a dropped connection,
read from the stage's output); bad params, failed validation, bad input data and DVC's refusals
(a missing dependency) fail at once. ``pull-data`` (``dvc pull`` of the raw data from the DVC
remote) retries on any failure.

MLflow: the flows set ``HARGO_DOOR=prefect``, so every stage run is tagged
``hargo.door=prefect`` in the same experiment ``dvc repro`` logs to (the DVC subprocess and the
stage inherit the environment). The pipeline flow opens its own parent run and exports
``HARGO_PARENT_RUN_ID`` so the stage runs nest under it; a single-step flow joins the parent of
its (git commit, params) like a ``dvc repro`` stage does (:mod:`hargo.tracking`).
"""
from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

from prefect import flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.context import get_run_context
from prefect.states import Completed
from prefect.tasks import exponential_backoff

from flows import stages
from flows.publish import REPORT_KEY, open_mlflow_run, publish  # noqa: F401 (REPORT_KEY re-exported)
from flows.retries import retry_if_transient
from flows.stages import UP_TO_DATE
from hargo import tracking
from hargo.config import as_config
from hargo.methods import RL_FAMILIES, get_method
from hargo.params import ParamsError, load_params

# Stage tasks: a transient failure is retried twice, after ~10 s then ~20 s (+-50 % jitter).
# No Prefect cache: DVC decides what is up to date (flows.stages).
_STAGE_TASK = dict(retries=2, retry_delay_seconds=exponential_backoff(backoff_factor=10),
                   retry_jitter_factor=0.5, retry_condition_fn=retry_if_transient,
                   cache_policy=NO_CACHE)


class StepFailed(RuntimeError):
    """A pipeline step failed; the message is ``step <name> failed: <Type>: <reason>``."""

    def __init__(self, step: str, cause: BaseException):
        self.step, self.cause = step, cause
        super().__init__(f"step {step} failed: {type(cause).__name__}: {cause}")

    def __reduce__(self):  # picklable (Prefect may serialize a failed state's exception)
        return (type(self), (self.step, self.cause))


# --------------------------------------------------------------------------- params, env
def normalize_overrides(overrides: Mapping[str, Any] | None) -> dict:
    """``overrides`` with the shorthand ``"rl.method": m`` as ``"rl.methods": [m]``.

    Raises:
        ParamsError: both ``rl.method`` and ``rl.methods``, or an unknown method.
    """
    ov = dict(overrides or {})
    if "rl.method" in ov:
        if "rl.methods" in ov:
            raise ParamsError("rl.method: give either rl.method or rl.methods, not both")
        method = ov.pop("rl.method")
        try:
            get_method(method, *RL_FAMILIES)
        except ParamsError as e:
            raise ParamsError(f"rl.method: {e}") from None
        ov["rl.methods"] = [method]
    return ov


def resolve_params(params_path: str | os.PathLike = "params.yaml",
                   overrides: Mapping[str, Any] | None = None) -> dict:
    """Load and validate the params of one flow run: ``params_path`` with ``overrides``
    (dotted keys, ``hargo.params.apply_overrides``; ``"rl.method": m`` is shorthand for
    ``"rl.methods": [m]``, one RL method for this run).

    Raises:
        ParamsError: unknown key, bad value, or both ``rl.method`` and ``rl.methods`` given;
            the message names the parameter.
        FileNotFoundError: ``params_path`` does not exist.
    """
    return load_params(params_path, normalize_overrides(overrides))


@contextlib.contextmanager
def run_params(params_path: str | os.PathLike,
               overrides: Mapping[str, Any] | None) -> Iterator[dict]:
    """The frame of every flow, before any task: validate the params with the overrides,
    check that the working directory is the DVC project whose ``params.yaml`` is
    ``params_path``, write the overrides into it (as ``dvc exp run -S`` does), yield the params
    (now those of the file), and on exit, however the run ends, put back the bytes the file had
    before (atomically) and log where the run's results are.

    Raises:
        ParamsError: bad params or overrides, or ``params_path`` is not the project's
            ``params.yaml`` (nothing written).
        RuntimeError: the working directory is not a DVC project.
    """
    params = resolve_params(params_path, overrides)
    stages.check_project(params_path)
    path = Path(params_path)
    before = path.read_bytes()
    written = stages.write_overrides(path, normalize_overrides(overrides))
    if written:
        get_run_logger().info("overrides written into %s for this run (as `dvc exp run -S`): %s",
                              params_path, ", ".join(written))
    try:
        yield params
    finally:
        if written:
            stages.restore_file(path, before)
            get_run_logger().warning(
                "%s restored: this run's overrides (%s) are not left in the project's params. "
                "Its results: the outputs in the workspace and dvc.lock (made with the "
                "overrides; `dvc status` shows those stages' params as changed, `dvc repro` "
                "re-runs them with the committed params) and its MLflow runs.",
                params_path, ", ".join(written))


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
def dvc_stage(stage_target: str, force: bool = False):
    """The body of every stage task: DVC decides and runs (:mod:`flows.stages`).

    Returns ``{"stage": target, "reproduced": True, "changes": <what dvc status found>}`` after
    ``dvc repro --single-item`` ran the stage; for a stage ``dvc status`` finds up to date
    (without ``force``), the Completed state named ``UpToDate`` with ``reproduced: False``.

    Raises:
        flows.stages.DvcError: DVC or the stage failed (the reason in the message).
    """
    log = get_run_logger()
    changes: dict = {}
    if not force:
        changes = stages.stage_status(stage_target)
        if not changes:
            log.info("%s: up to date (dvc status): not run", stage_target)
            return Completed(name=UP_TO_DATE, message=f"dvc status: {stage_target} up to date",
                             data={"stage": stage_target, "reproduced": False, "changes": {}})
        log.info("%s: dvc status: %s", stage_target, json.dumps(changes)[:2000])
    stages.reproduce(stage_target, force=force, log=log.info)
    return {"stage": stage_target, "reproduced": True, "changes": changes}


@task(name="pull-data", retries=3, retry_delay_seconds=exponential_backoff(backoff_factor=5),
      retry_jitter_factor=0.5, cache_policy=NO_CACHE)
def pull_data(params: dict) -> dict:
    """``dvc pull <data.raw_dir>.dvc``: restore the raw data from the DVC remote.

    Without a ``.dvc`` pointer next to ``data.raw_dir`` the folder is used as it is (data
    supplied directly). Any failure is retried (a remote read).

    Raises:
        flows.stages.DvcError: ``dvc pull`` failed (its output's tail in the message).
    """
    raw = Path(as_config(params).data.raw_dir)
    pointer = raw.with_name(raw.name + ".dvc")
    log = get_run_logger()
    if not pointer.exists():
        log.info("no DVC pointer %s: using %s as it is", pointer, raw)
        return {"pulled": False, "raw_dir": str(raw)}
    out = stages.run_dvc(["pull", str(pointer)])
    log.info("dvc pull %s: %s", pointer, out.strip()[-500:])
    return {"pulled": True, "raw_dir": str(raw)}


@task(name="prepare", task_run_name="prepare", **_STAGE_TASK)
def prepare(force: bool = False) -> dict:
    """Stage prepare (``hargo prepare``) through DVC."""
    return dvc_stage("prepare", force)


@task(name="validate", task_run_name="validate", **_STAGE_TASK)
def validate(force: bool = False) -> dict:
    """Stage validate (``hargo validate``) through DVC; a failed data contract is final."""
    return dvc_stage("validate", force)


@task(name="base_model", task_run_name="base_model", **_STAGE_TASK)
def base_model(force: bool = False) -> dict:
    """Stage base_model (``hargo base-model``) through DVC."""
    return dvc_stage("base_model", force)


@task(name="sft", task_run_name="sft", **_STAGE_TASK)
def sft(force: bool = False) -> dict:
    """Stage sft (``hargo sft``) through DVC."""
    return dvc_stage("sft", force)


@task(name="rl", task_run_name="rl@{method}", **_STAGE_TASK)
def rl(method: str, force: bool = False) -> dict:
    """Stage rl@<method> (``hargo rl --method <method>``) through DVC."""
    return dvc_stage(stages.target("rl", method), force)


@task(name="evaluate", task_run_name="evaluate", **_STAGE_TASK)
def evaluate(force: bool = False) -> dict:
    """Stage evaluate (``hargo evaluate``) through DVC."""
    return dvc_stage("evaluate", force)


@task(name="register", task_run_name="register", **_STAGE_TASK)
def register(force: bool = False) -> dict:
    """Stage register (``hargo register``) through DVC."""
    return dvc_stage("register", force)


# --------------------------------------------------------------------------- orchestration
def run_step(step: str, stage_task, *, method: str | None = None,
             item: Mapping[str, Any] | None = None, force: bool = False,
             record: list[dict] | None = None) -> dict:
    """Run one stage task and return its result (:func:`dvc_stage`).

    ``method`` is the item of a ``foreach`` stage (``rl@<method>``); ``item`` the keys of a
    ``matrix`` stage, passed to the task as keyword arguments (``compare_train@hargo-1``:
    ``{"method": "hargo", "seed": 1}``). ``force`` runs the stage although DVC finds it up to
    date. The step and its final state name (``Completed``, ``UpToDate``, ``Failed``) are
    appended to ``record``.

    Raises:
        StepFailed: the task failed (after any retries); names the step and the reason.
    """
    kwargs: dict[str, Any] = {"force": force}
    if item is not None:
        kwargs.update(item)
        name = f"{step}@{'-'.join(str(v) for v in item.values())}"
    else:
        if method is not None:
            kwargs["method"] = method
        name = f"{step}@{method}" if method else step
    state = stage_task(**kwargs, return_state=True)
    if record is not None:
        record.append({"step": name, "state": state.name})
    if not state.is_completed():
        exc = state.result(raise_on_failure=False)
        cause = exc if isinstance(exc, BaseException) else RuntimeError(state.message or "failed")
        raise StepFailed(name, cause) from cause
    return state.result()


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
    # ParamsError: fails before any task
    with run_params(params_path, overrides) as params, door_env():
        _pull(params, pull)
        if step == "rl":
            return {f"rl@{m}": run_step("rl", rl, method=m, force=force)
                    for m in as_config(params).rl.methods}
        return {step: run_step(step, stage_task, force=force)}


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


def pipeline_targets(params: Mapping[str, Any]) -> list[str]:
    """The DVC stages the pipeline flow runs, in order (``rl@<method>`` per RL method)."""
    return [stages.target(step, m) for step, _ in PIPELINE_STEPS
            for m in (as_config(params).rl.methods if step == "rl" else [None])]


@flow(name="hargo-pipeline")
def hargo_pipeline(params_path: str = "params.yaml", overrides: dict[str, Any] | None = None,
                   pull: bool = True, force: bool = False) -> dict:
    """The whole pipeline in ``dvc.yaml``'s order, under one MLflow parent run (door
    ``prefect``); publishes the markdown artifact ``hargo-pipeline-report``.

    Returns ``{step: result}`` (``rl@<method>`` per RL method; :func:`dvc_stage`).

    Raises:
        ParamsError: bad params (before any task runs).
        StepFailed: a step failed; the report artifact and the MLflow parent run record it.
    """
    with run_params(params_path, overrides) as params:  # ParamsError: before any task
        return _pipeline(params, params_path, overrides, pull, force)


def _pipeline(params: dict, params_path: str, overrides: Mapping[str, Any] | None, pull: bool,
              force: bool) -> dict:
    flow_run_id = str(get_run_context().flow_run.id)
    parent = open_mlflow_run(params, flow_run_id)
    steps: list[dict] = []
    results: dict[str, Any] = {}
    failure: str | None = None
    killed = False
    try:
        with door_env(parent):
            _pull(params, pull, steps)
            for step, stage_task in PIPELINE_STEPS:
                if step == "rl":
                    for m in as_config(params).rl.methods:
                        results[f"rl@{m}"] = run_step("rl", rl, method=m, force=force,
                                                      record=steps)
                else:
                    results[step] = run_step(step, stage_task, force=force, record=steps)
    except StepFailed as e:
        failure = str(e)
        raise
    except Exception as e:  # an orchestration error, not a step's: still reported
        failure = f"pipeline failed: {type(e).__name__}: {e}"
        raise
    except BaseException as e:  # cancelled (Prefect's termination signal) or interrupted
        failure, killed = f"pipeline cancelled: {type(e).__name__}: {e}", True
        raise
    finally:
        publish(params, params_path, overrides or {}, parent, steps, failure, killed)
    return results
