"""One run of the GPU check: its parts in turn, within a time budget, into ``--out``.

Time budget (``--time-budget-s``): correctness and speed each get at most a fixed share
(:data:`~hargo.gpu_check.common.PART_CAPS`) when parts follow them, the comparison what is left,
minus a reserve for writing the outputs; within it SFT gets a fifth and each RL method an equal
share of the rest, its evaluation (timed on SFT's) kept back. Training loops stop at their
deadline (a trainer callback), so a slow machine gives fewer steps, reported, not a killed run.
A part (or one variant, speed row or RL method) that raises is recorded with its traceback and
the run goes on. Each part writes into ``results.json`` as soon as it ends, so a run stopped by
its time limit still brings back what it finished.

Outputs in ``--out`` (the device machine brings back at most 8 files, none deeper than 2
folders): ``results.json`` (every part's numbers), ``tracking.jsonl`` (the tracking log,
:mod:`hargo.gpu_check.tracking`), ``gpu_check.log`` (everything printed), ``speed.png``,
``compare.png`` and ``generations.jsonl.gz`` (every eval answer, for re-scoring). Work files
(models, checkpoints) go to a temporary folder, removed at the end.
"""
from __future__ import annotations

import copy
import shutil
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from hargo.gpu_check.common import (PART_CAPS, PARTS, RESERVE_S, Deadline, _environment,
                                    _free_memory, _now, _write_json, log)
from hargo.gpu_check.compare import run_compare
from hargo.gpu_check.correctness import run_correctness
from hargo.gpu_check.inputs import _prepare_dry_inputs
from hargo.gpu_check.outputs import _figure_compare, _figure_speed, _write_generations
from hargo.gpu_check.plan import _base_params, make_plan
from hargo.gpu_check.speed import run_speed
from hargo.gpu_check.tracking import Tracker


def run_check(out: Path, parts: Sequence[str] = PARTS, dry_run: bool = False,
              model_dir: Path | None = None, data_dir: Path | None = None,
              time_budget_s: float = 480.0, keep_work: bool = False,
              tokenizer_dir: Path | None = None, use_device: bool | None = None) -> dict:
    """Run ``parts`` and write the outputs into ``out``; returns the results dict.

    ``dry_run``: the tiny sizes (tiny random model, synthetic data); ``use_device`` (default
    ``not dry_run``): compare against and train on CUDA when there is one (the smoke run of
    device call 1 is a dry run that does)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    dl = Deadline(time_budget_s)
    tracker = Tracker(out / "tracking.jsonl")
    work = Path(tempfile.mkdtemp(prefix="hargo-gpu-check-"))
    import torch

    use_device = (not dry_run) if use_device is None else use_device
    cuda = bool(torch.cuda.is_available()) and use_device
    plan = make_plan(dry_run, cuda)
    results: dict[str, Any] = {
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "dry_run": dry_run,
        "device": "cuda" if cuda else "cpu",
        "parts_requested": list(parts), "time_budget_s": time_budget_s,
        "plan": plan.as_dict(), "environment": _environment(), "parts": {}}

    def save() -> None:
        results["elapsed_s"] = round(dl.elapsed(), 2)
        _write_json(out / "results.json", results)

    def save_partial(part: str, value) -> None:
        results[part] = value
        results["parts"].setdefault(part, {"status": "running"})
        save()

    try:
        if dry_run:
            model_dir, data_dir = _prepare_dry_inputs(plan, work, tokenizer_dir, model_dir,
                                                      data_dir)
        if model_dir is None or data_dir is None:
            raise ValueError("--model and --data are needed outside --dry-run")
        model_dir, data_dir = Path(model_dir), Path(data_dir)
        params = _base_params(plan, model_dir, data_dir)
        results["inputs"] = {"model": str(model_dir), "data": str(data_dir)}
        tracker.params("run", {"dry_run": dry_run, "parts": ",".join(parts),
                               "time_budget_s": time_budget_s, "model": str(model_dir),
                               "device": "cuda" if cuda else "cpu"})
        tracker.tag("run", "hargo.kind", "gpu-check")
        save()
        ctx = {"plan": plan, "params": params, "model_dir": model_dir, "data_dir": data_dir,
               "work": work, "tracker": tracker, "deadline": dl, "save_partial": save_partial}
        _run_parts(parts, ctx, params, results, save, tracker, dl, time_budget_s)
        gens = ctx.get("generations")
        if gens:
            _write_generations(out / "generations.jsonl.gz", gens["subset"], gens["evals"])
            tracker.artifact("compare", "generations.jsonl.gz")
    finally:
        _write_figures(out, parts, results, tracker)
        results["passed"] = _overall(results)
        results["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        save()
        if not keep_work:
            shutil.rmtree(work, ignore_errors=True)
    return results


def _run_parts(parts: Sequence[str], ctx: dict, params: dict, results: dict,
               save: Callable[[], None], tracker: Tracker, dl: Deadline,
               time_budget_s: float) -> None:
    """Each part in turn into ``results`` (saved before and after it), within its share of the
    time budget (:data:`~hargo.gpu_check.common.PART_CAPS`), on a fresh copy of ``params``; a
    part that raises is recorded with its traceback and the next one runs."""
    runners: dict[str, Callable[[dict], dict]] = {
        "correctness": run_correctness, "speed": run_speed, "compare": run_compare}
    for part in parts:
        left = dl.left() - RESERVE_S
        if left <= 0:
            results["parts"][part] = {"status": "skipped", "reason": "time budget"}
            save()
            continue
        later = list(parts)[list(parts).index(part) + 1:]
        if part in PART_CAPS and later:   # the cap leaves room for the parts after it
            cap_s, cap_share = PART_CAPS[part]
            ctx["part_end"] = _now() + min(cap_s, cap_share * time_budget_s, left)
        else:
            ctx["part_end"] = dl.end - RESERVE_S
        ctx["params"] = copy.deepcopy(params)
        log(f"part {part}: {ctx['part_end'] - _now():.0f} s of {dl.left():.0f} s left")
        t0 = _now()
        results["parts"][part] = {"status": "running"}
        save()
        try:
            results[part] = runners[part](ctx)
            results["parts"][part] = {"status": "done", "wall_s": round(_now() - t0, 2)}
        except Exception as e:  # one part failing must not lose the others
            traceback.print_exc()
            results["parts"][part] = {"status": "error", "wall_s": round(_now() - t0, 2),
                                      "error": f"{type(e).__name__}: {e}",
                                      "traceback": traceback.format_exc()[-4000:]}
        tracker.metrics(part, {"wall_s": results["parts"][part]["wall_s"]})
        _free_memory()
        save()


def _write_figures(out: Path, parts: Sequence[str], results: Mapping, tracker: Tracker) -> None:
    """``speed.png`` and ``compare.png`` for the parts requested; a figure that fails is
    reported and skipped."""
    for name, fn, part in (("speed.png", _figure_speed, "speed"),
                           ("compare.png", _figure_compare, "compare")):
        if part not in parts:
            continue
        try:
            fn(out / name, results.get(part))
            tracker.artifact(part, name)
        except Exception:
            traceback.print_exc()


def _overall(results: Mapping) -> bool:
    parts = results.get("parts", {})
    ok = all(v.get("status") == "done" for v in parts.values()) and bool(parts)
    if "correctness" in results:
        ok = ok and bool(results["correctness"].get("passed"))
    return ok
