"""Prefect flow ``hargo-comparison``: the nine-method comparison as one deployment run, the
same steps as ``dvc repro compare/dvc.yaml`` (``compare/dvc.yaml``), calling the same stage
functions as the ``hargo`` CLI does:

    preferences -> for each seed, for each method: compare_train -> compare_eval
    compare_sft (the SFT model on the same prompts) -> report

The upstream steps (prepare ... sft) are not run here: the comparison reads their outputs, as
the DVC pipeline does. Run ``hargo-pipeline`` first (or ``dvc repro``) when they are missing;
a missing SFT model fails the first step with the stage that writes it.

Parameters: ``params_path``, ``overrides`` (dotted keys, e.g. ``{"compare.seeds": [1, 2, 3],
"compare.steps": 200}``, validated before any task runs) and ``force`` (re-run steps whose
inputs did not change). Caching, retries and the MLflow door tag are those of
:mod:`flows.pipeline` (input keys read from ``compare/dvc.yaml``). The flow publishes the report's
markdown (``reports/comparison.md``) as the artifact ``hargo-comparison-report``.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import flow, task
from prefect.artifacts import create_markdown_artifact

from flows.caching import StageInputs, outputs_digest, stage_spec
from flows.pipeline import _STAGE_TASK, door_env, resolve_params, run_step

COMPARE_DVC_YAML = "compare/dvc.yaml"
REPORT_KEY = "hargo-comparison-report"

__all__ = ["hargo_comparison", "comparison_plan", "COMPARE_DVC_YAML", "REPORT_KEY"]


def _done(stage: str, params: dict, summary: Any, item=None) -> dict:
    spec = stage_spec(COMPARE_DVC_YAML, stage, params, item)
    return {"summary": summary, "outputs_digest": outputs_digest(spec, ".")}


@task(name="preferences", cache_policy=StageInputs(stage="preferences",
                                                   dvc_yaml=COMPARE_DVC_YAML), **_STAGE_TASK)
def preferences(params: dict) -> dict:
    """Stage preferences: ``hargo.compare.preferences.run(params)``."""
    from hargo.compare import preferences as stage

    return _done("preferences", params, stage.run(params))


@task(name="compare_train", task_run_name="compare_train@{method}-{seed}",
      cache_policy=StageInputs(stage="compare_train", dvc_yaml=COMPARE_DVC_YAML), **_STAGE_TASK)
def compare_train(params: dict, method: str, seed: int) -> dict:
    """Stage compare_train@<method>-<seed>: ``hargo.compare.train.run(params, method, seed)``."""
    from hargo.compare import train as stage

    return _done("compare_train", params, stage.run(params, method, seed),
                 {"method": method, "seed": seed})


@task(name="compare_eval", task_run_name="compare_eval@{method}-{seed}",
      cache_policy=StageInputs(stage="compare_eval", dvc_yaml=COMPARE_DVC_YAML), **_STAGE_TASK)
def compare_eval(params: dict, method: str, seed: int) -> dict:
    """Stage compare_eval@<method>-<seed>: ``hargo.compare.evaluate.run(params, run)``."""
    from hargo.compare import evaluate as stage
    from hargo.compare.train import run_name

    return _done("compare_eval", params, stage.run(params, run_name(method, seed)),
                 {"method": method, "seed": seed})


@task(name="compare_sft", cache_policy=StageInputs(stage="compare_sft",
                                                   dvc_yaml=COMPARE_DVC_YAML), **_STAGE_TASK)
def compare_sft(params: dict) -> dict:
    """Stage compare_sft: ``hargo.compare.evaluate.run(params, "sft")``."""
    from hargo.compare import evaluate as stage

    return _done("compare_sft", params, stage.run(params, "sft"))


@task(name="report", cache_policy=StageInputs(stage="report", dvc_yaml=COMPARE_DVC_YAML),
      **_STAGE_TASK)
def report(params: dict) -> dict:
    """Stage report: ``hargo.compare.report.run(params)``."""
    from hargo.compare import report as stage

    return _done("report", params, stage.run(params))


def comparison_plan(params: dict) -> list[tuple[str, dict]]:
    """The steps of one comparison, in order: ``[(stage, item), ...]`` with ``item`` None or
    ``{"method", "seed"}``. ``preferences`` always runs first, as in ``compare/dvc.yaml`` (every
    ``compare_train`` depends on it there), even when no preference method is compared."""
    c = params["compare"]
    plan: list[tuple[str, dict | None]] = [("preferences", None)]
    for seed in c["seeds"]:
        for m in c["methods"]:
            item = {"method": m, "seed": int(seed)}
            plan += [("compare_train", item), ("compare_eval", item)]
    plan += [("compare_sft", None), ("report", None)]
    return plan


_TASKS = {"preferences": preferences, "compare_train": compare_train,
          "compare_eval": compare_eval, "compare_sft": compare_sft, "report": report}


@flow(name="hargo-comparison")
def hargo_comparison(params_path: str = "params.yaml", overrides: dict[str, Any] | None = None,
                     force: bool = False) -> dict:
    """Every method x seed of ``compare``, then the report (see the module docstring).

    Returns ``{step: summary}``.

    Raises:
        ParamsError: bad params (before any task runs).
        StepFailed: a step failed (names it and the reason).
    """
    params = resolve_params(params_path, overrides)
    results: dict[str, Any] = {}
    steps: list[dict] = []
    with door_env():
        for stage, item in comparison_plan(params):
            name = stage if item is None else f"{stage}@{item['method']}-{item['seed']}"
            results[name] = run_step(stage, _TASKS[stage], params, item=item, force=force,
                                     record=steps, dvc_yaml=COMPARE_DVC_YAML)
    md = Path("reports") / "comparison.md"
    if md.is_file():
        create_markdown_artifact(markdown=md.read_text(encoding="utf-8"), key=REPORT_KEY,
                                 description="hargo nine-method comparison")
    return results
