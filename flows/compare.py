"""Prefect flow ``hargo-comparison``: the nine-method comparison as one deployment run, the
same steps as ``dvc repro compare/dvc.yaml`` (``compare/dvc.yaml``), each run through DVC as
the pipeline's are (:mod:`flows.stages`):

    preferences -> for each seed, for each method: compare_train -> compare_eval
    compare_sft (the SFT model on the same prompts) -> compare_base (the untuned base model,
    a baseline row) -> report

Each task asks ``dvc status`` about its stage (``compare/dvc.yaml:compare_train@hargo-1``) and
has ``dvc repro --single-item`` run it when it is not up to date, so ``dvc.lock`` (the one
next to ``compare/dvc.yaml``) records the flow's runs and a later ``dvc repro compare/dvc.yaml``
has nothing to do. The upstream steps (prepare ... sft) are not run here: the comparison reads
their outputs, as the DVC pipeline does. Run ``hargo-pipeline`` first (or ``dvc repro``) when
they are missing; DVC then fails the first step naming the missing dependency.

Parameters: ``params_path``, ``overrides`` (dotted keys, e.g. ``{"compare.seeds": [1, 2, 3],
"compare.steps": 200}``, validated before any task runs, then written into ``params.yaml`` as
``dvc exp run -S`` does) and ``force`` (``dvc repro --force``: re-run steps DVC finds up to
date). Retries and the MLflow door tag are those of :mod:`flows.pipeline`. The flow publishes
the report's markdown (``reports/comparison.md``) as the artifact ``hargo-comparison-report``.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import flow, task
from prefect.artifacts import create_markdown_artifact

from flows.pipeline import _STAGE_TASK, door_env, dvc_stage, run_params, run_step
from flows.stages import COMPARE_DVC_YAML, target
from hargo.config import as_section

REPORT_KEY = "hargo-comparison-report"

__all__ = [
    "COMPARE_DVC_YAML",
    "REPORT_KEY",
    "comparison_plan",
    "comparison_targets",
    "hargo_comparison",
]


@task(name="preferences", task_run_name="preferences", **_STAGE_TASK)
def preferences(force: bool = False) -> dict:
    """Stage preferences (``hargo preferences``) through DVC."""
    return dvc_stage(target("preferences", dvc_yaml=COMPARE_DVC_YAML), force)


@task(name="compare_train", task_run_name="compare_train@{method}-{seed}", **_STAGE_TASK)
def compare_train(method: str, seed: int, force: bool = False) -> dict:
    """Stage compare_train@<method>-<seed> (``hargo compare-train``) through DVC."""
    item = {"method": method, "seed": seed}
    return dvc_stage(target("compare_train", item, COMPARE_DVC_YAML), force)


@task(name="compare_eval", task_run_name="compare_eval@{method}-{seed}", **_STAGE_TASK)
def compare_eval(method: str, seed: int, force: bool = False) -> dict:
    """Stage compare_eval@<method>-<seed> (``hargo compare-eval``) through DVC."""
    item = {"method": method, "seed": seed}
    return dvc_stage(target("compare_eval", item, COMPARE_DVC_YAML), force)


@task(name="compare_sft", task_run_name="compare_sft", **_STAGE_TASK)
def compare_sft(force: bool = False) -> dict:
    """Stage compare_sft (``hargo compare-eval --run sft``) through DVC."""
    return dvc_stage(target("compare_sft", dvc_yaml=COMPARE_DVC_YAML), force)


@task(name="compare_base", task_run_name="compare_base", **_STAGE_TASK)
def compare_base(force: bool = False) -> dict:
    """Stage compare_base (``hargo compare-eval --run base``) through DVC."""
    return dvc_stage(target("compare_base", dvc_yaml=COMPARE_DVC_YAML), force)


@task(name="report", task_run_name="report", **_STAGE_TASK)
def report(force: bool = False) -> dict:
    """Stage report (``hargo report``) through DVC."""
    return dvc_stage(target("report", dvc_yaml=COMPARE_DVC_YAML), force)


def comparison_plan(params: dict) -> list[tuple[str, dict]]:
    """The steps of one comparison, in order: ``[(stage, item), ...]`` with ``item`` None or
    ``{"method", "seed"}``. ``preferences`` always runs first, as in ``compare/dvc.yaml`` (every
    ``compare_train`` depends on it there), even when no preference method is compared."""
    c = as_section(params, "compare", required=True)
    plan: list[tuple[str, dict | None]] = [("preferences", None)]
    for seed in c.seeds:
        for m in c.methods:
            item = {"method": m, "seed": int(seed)}
            plan += [("compare_train", item), ("compare_eval", item)]
    plan += [("compare_sft", None), ("compare_base", None), ("report", None)]
    return plan


def comparison_targets(params: dict) -> list[str]:
    """The DVC addresses of :func:`comparison_plan`'s steps
    (``compare/dvc.yaml:compare_train@hargo-1``, ...)."""
    return [target(stage, item, COMPARE_DVC_YAML) for stage, item in comparison_plan(params)]


_TASKS = {"preferences": preferences, "compare_train": compare_train,
          "compare_eval": compare_eval, "compare_sft": compare_sft,
          "compare_base": compare_base, "report": report}


@flow(name="hargo-comparison")
def hargo_comparison(params_path: str = "params.yaml", overrides: dict[str, Any] | None = None,
                     force: bool = False) -> dict:
    """Every method x seed of ``compare``, then the report (see the module docstring).

    Returns ``{step: result}`` (:func:`flows.pipeline.dvc_stage`).

    Raises:
        ParamsError: bad params (before any task runs).
        StepFailed: a step failed (names it and the reason).
    """
    results: dict[str, Any] = {}
    steps: list[dict] = []
    # ParamsError: fails before any task; params.yaml restored when the run ends
    with run_params(params_path, overrides) as params, door_env():
        for stage, item in comparison_plan(params):
            name = stage if item is None else f"{stage}@{item['method']}-{item['seed']}"
            results[name] = run_step(stage, _TASKS[stage], item=item, force=force,
                                     record=steps)
    md = Path("reports") / "comparison.md"
    if md.is_file():
        create_markdown_artifact(markdown=md.read_text(encoding="utf-8"), key=REPORT_KEY,
                                 description="hargo nine-method comparison")
    return results
