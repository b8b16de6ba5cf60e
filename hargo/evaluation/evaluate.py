"""The ``evaluate`` stage: the SFT model and every RL model answer the same eval prompts; the
full metrics (hargo.metrics) and the WinRate of each RL model against SFT are computed and
written for DVC and logged to MLflow.

Steps (params.yaml ``evaluate``; paths relative to ``root``, the repository root):

1. Inputs are checked before anything is generated: every model folder (``sft.out_dir`` and
   ``rl.out_dir/<method>`` for each of ``rl.methods``) must be complete (``.complete`` marker),
   and every eval record (``data.out_dir/eval.jsonl``) must have a known task, an id, a
   conversational prompt and its reference (label for race tasks, answer otherwise).
2. The prompt set: records whose chat-templated prompt is longer than
   ``evaluate.max_prompt_tokens`` tokens are skipped and counted per task (the training stages'
   rule, ``hargo.data.records.select_subset``: prompts over 8 characters per allowed token are
   skipped without tokenising them), then a seeded subset of ``evaluate.samples_per_task`` per
   task is drawn (``null``: all). Tokens are counted with the SFT model's tokenizer; every model
   answers exactly this set.
3. Each model generates with ``evaluate.backend`` (``hargo.evaluation.generate``), is scored
   (``score_samples``, ``compute_metrics``), and every RL model is compared with SFT
   (``win_rate`` with the judge of ``evaluate.judge``, named in the outputs).

Outputs, each whole or not at all:

- ``metrics/eval.json`` (DVC metrics): ``{model: {metric: value}}`` for ``sft`` and each method,
  plus ``run`` (judge, backend, dtype, prompt counts, skipped counts). Per model: the metrics of
  ``compute_metrics`` (``dr_confusion`` as ``{tp, fp, fn, tn}``), ``win_rate`` / ``win_wins`` /
  ``win_ties`` / ``win_losses`` (RL models), ``wall_s`` (load + generate + score),
  ``load_s``, ``generate_s``, ``completion_tokens`` and ``gen_tokens_per_s``.
- ``data/eval/<model>.jsonl``: per prompt ``id``, ``task``, ``completion``, ``reward``,
  ``correct`` (and ``prediction`` / ``em`` / ``similarity``, ``chars``); ``data/eval/prompts.json``:
  the chosen ids and skipped counts.
- ``reports/eval/``: DVC plot data and PNGs (``hargo.evaluation.plots``).
- MLflow child run ``evaluate``: metrics as ``<model>/<metric>``, the generations table
  (``eval/generations.json``), the plots, and ``metrics/eval.json``.
"""
from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Mapping, Sequence

from hargo.data.records import read_prepared, select_subset
from hargo.hardware import generation_dtype
from hargo.io import HargoInputError, atomic_dir, atomic_write_json, atomic_write_jsonl, \
    require_complete_dir

__all__ = ["METRICS_FILE", "GENERATIONS_DIR", "PLOTS_DIR", "SFT", "model_dirs",
           "load_eval_records", "select_prompts", "eval_json_entry", "run"]

METRICS_FILE = "metrics/eval.json"
GENERATIONS_DIR = "data/eval"
PLOTS_DIR = "reports/eval"
SFT = "sft"


def model_dirs(params: Mapping, root: str | Path = ".") -> dict[str, Path]:
    """``{"sft": <sft.out_dir>, <method>: <rl.out_dir>/<method>, ...}`` in evaluation order,
    each checked complete.

    Raises:
        FileNotFoundError: a folder is missing or half-written (no ``.complete`` marker); the
            message names it and the stage that writes it.
    """
    root = Path(root)
    dirs = {SFT: root / params["sft"]["out_dir"]}
    for m in params["rl"]["methods"]:
        dirs[m] = root / params["rl"]["out_dir"] / m
    for name, d in dirs.items():
        stage = "sft (hargo sft)" if name == SFT else f"rl@{name} (hargo rl --method {name})"
        try:
            require_complete_dir(d, f"model folder of '{name}'")
        except FileNotFoundError as e:
            raise FileNotFoundError(f"{e} (written by stage {stage}; `dvc repro` runs it)") \
                from None
    return dirs


def load_eval_records(path: str | Path) -> list[dict]:
    """The prepared eval split, checked (:func:`hargo.data.records.read_prepared`: ids unique,
    tasks known, conversational prompts, yes/no labels on race tasks, string answers elsewhere).

    Raises:
        HargoInputError: the file is missing/unreadable, or a bad record (the message names the
            file, the record index and id, and the field).
    """
    return read_prepared(path)


def select_prompts(records: Sequence[dict], params_evaluate: Mapping, seed: int,
                   tokenizer) -> tuple[list[dict], dict[str, int]]:
    """The eval prompt set: over-long prompts skipped and counted per task, then a seeded
    subset per task (:func:`hargo.data.records.select_subset`).

    Returns ``(subset, skipped_per_task)``; ``subset`` is interleaved across tasks and
    deterministic for fixed records, params and seed.
    """
    return select_subset(records, params_evaluate.get("samples_per_task"), int(seed), tokenizer,
                         int(params_evaluate["max_prompt_tokens"]))


def eval_json_entry(metrics: Mapping) -> dict:
    """A model's ``compute_metrics`` dict as stored in ``metrics/eval.json``: scalars kept,
    ``dr_confusion`` reduced to ``{tp, fp, fn, tn}`` (no lists, so ``dvc metrics diff`` works)."""
    out = {}
    for k, v in metrics.items():
        if k == "dr_confusion":
            out[k] = None if v is None else {c: int(v[c]) for c in ("tp", "fp", "fn", "tn")}
        elif v is None or isinstance(v, (bool, int, float, str)):
            out[k] = v
    return out


def _mlflow_metrics(entry: Mapping, prefix: str) -> dict[str, float]:
    """Numeric leaves of an eval.json entry as ``{prefix/metric: value}`` (nested joined
    with ``_``), NaN and None left out."""
    out = {}
    for k, v in entry.items():
        if isinstance(v, Mapping):
            out.update(_mlflow_metrics({f"{k}_{kk}": vv for kk, vv in v.items()}, prefix))
        elif isinstance(v, (int, float)) and not isinstance(v, bool) and not (
                isinstance(v, float) and math.isnan(v)):
            out[f"{prefix}/{k}"] = float(v)
    return out


def _rss_mib() -> float | None:
    try:
        import psutil

        return psutil.Process().memory_info().rss / (1 << 20)
    except Exception:  # psutil missing or /proc unreadable: the check is informational
        return None


def run(params: dict, root: str | Path = ".") -> dict:
    """Run the evaluate stage (see the module docstring).

    Args:
        params: the loaded params.yaml (``seed``, ``data.out_dir``, ``sft.out_dir``,
            ``rl.out_dir``, ``rl.methods``, ``train.threads``, ``rewards``, ``evaluate``).
        root: the repository root that relative paths start from.

    Returns:
        ``{"models": [...], "n_prompts", "skipped", "judge", "backend", "metrics": {model:
        {dr_f1, plp_similarity, mlperf_em, avg_score, win_rate, gen_tokens_per_s}}}``.

    Raises:
        FileNotFoundError: a model folder is missing or half-written.
        HargoInputError: the eval split is missing or has a bad record (unknown task, ...), or
            no prompt is left after the length filter.
        VLLMUnavailableError: backend vllm without vLLM installed (says how to install it).
        RuntimeError: the MLflow store cannot be used.
    """
    from hargo import tracking
    from hargo.evaluation import generate as gen
    from hargo.evaluation.plots import write_plots
    from hargo.judges import make_judge
    from hargo.metrics import compute_metrics, score_samples, win_rate
    from hargo.rewards import RewardConfig, TaskReward
    from hargo.hardware import setup_torch
    from hargo.models.loading import load_tokenizer

    root = Path(root)
    ev = params["evaluate"]
    seed = int(params["seed"])
    backend = ev["backend"]
    if backend not in gen.BACKENDS:
        raise ValueError(f"evaluate.backend: must be one of {', '.join(gen.BACKENDS)}, "
                         f"got {backend!r}")
    # 1. everything that can be checked is checked before the first token is generated
    dirs = model_dirs(params, root)
    eval_path = root / params["data"]["out_dir"] / "eval.jsonl"
    records = load_eval_records(eval_path)
    if backend == "vllm":
        gen.import_vllm()
    dtype = generation_dtype(ev.get("dtype", "auto"))
    reward_fn = TaskReward(RewardConfig.from_params(params.get("rewards")))
    judge = make_judge(ev, reward_fn)
    subset, skipped = select_prompts(records, ev, seed, load_tokenizer(dirs[SFT]))
    if not subset:
        raise HargoInputError(eval_path, f"no eval prompt has at most evaluate.max_prompt_tokens"
                              f"={ev['max_prompt_tokens']} tokens (skipped per task: {skipped})")
    prompts = [r["prompt"] for r in subset]
    n_task = {t: sum(r["task"] == t for r in subset) for t in skipped}
    print(f"[evaluate] {len(subset)} prompts {n_task}, skipped as too long {skipped}; "
          f"backend {backend} ({dtype}), judge {judge.name}", flush=True)

    setup_torch(params)
    with tracking.stage_run("evaluate", params, root) as mlrun:
        import mlflow

        tracking.log_split("eval", "evaluation", params, root)

        completions: dict[str, list[str]] = {}
        scored: dict[str, list[dict]] = {}
        entries: dict[str, dict] = {}
        for name, d in dirs.items():
            t0 = time.perf_counter()
            res = gen.run_generation(d, prompts, ev, backend, seed=seed)
            s = score_samples(subset, res.completions, reward_fn)
            m = compute_metrics(subset, res.completions, rewards=[r["reward"] for r in s],
                                reward_fn=reward_fn)
            entry = eval_json_entry(m)
            entry.update(wall_s=time.perf_counter() - t0, load_s=res.load_s,
                         generate_s=res.generate_s, completion_tokens=sum(res.completion_tokens),
                         prompt_tokens=sum(res.prompt_tokens), gen_tokens_per_s=res.tokens_per_s)
            completions[name], scored[name], entries[name] = res.completions, s, entry
            rss = _rss_mib()
            if rss is not None:
                mlflow.log_metric(f"{name}/rss_mib_after", rss)
            print(f"[evaluate] {name}: {len(s)} completions in {res.generate_s:.1f} s "
                  f"({res.tokens_per_s:.0f} tokens/s, load {res.load_s:.1f} s); "
                  f"DR-F1 {_fmt(entry.get('dr_f1'))}, PLP {_fmt(entry.get('plp_similarity'))}, "
                  f"MLPerf EM {_fmt(entry.get('mlperf_em'))}, AvgScore "
                  f"{_fmt(entry.get('avg_score'))}", flush=True)
        for name in dirs:
            if name == SFT:
                continue
            w = win_rate(subset, completions[name], completions[SFT], judge)
            entries[name].update(win_rate=w["win_rate"], win_wins=w["wins"],
                                 win_ties=w["ties"], win_losses=w["losses"])
            print(f"[evaluate] {name} vs sft: WinRate {_fmt(w['win_rate'])} "
                  f"({w['wins']} wins, {w['ties']} ties, {w['losses']} losses; judge {judge.name})",
                  flush=True)
        info = {"judge": judge.name, "backend": backend, "dtype": dtype,
                "n_prompts": len(subset), "skipped_total": sum(skipped.values()),
                "max_prompt_tokens": int(ev["max_prompt_tokens"]),
                "max_new_tokens": int(ev["max_new_tokens"]),
                "temperature": float(ev.get("temperature", 0.0)),
                **{f"n_{t}": n for t, n in n_task.items()},
                **{f"skipped_{t}": k for t, k in skipped.items()}}
        doc = {**entries, "run": info}

        # 2. outputs, each whole or not at all
        with atomic_dir(root / GENERATIONS_DIR) as tmp:
            for name, rows in scored.items():
                atomic_write_jsonl(tmp / f"{name}.jsonl", rows)
            atomic_write_json(tmp / "prompts.json",
                              {"ids": [r["id"] for r in subset], "skipped": skipped,
                               "judge": judge.name})
        with atomic_dir(root / PLOTS_DIR) as tmp:
            write_plots(tmp, subset, scored)
        atomic_write_json(root / METRICS_FILE, doc)

        # 3. MLflow: metrics, generations table, plots
        mlflow.set_tags({"hargo.judge": judge.name, "hargo.eval_backend": backend})
        flat: dict[str, float] = {}
        for name, entry in entries.items():
            flat.update(_mlflow_metrics(entry, name))
        flat.update(_mlflow_metrics({k: v for k, v in info.items()
                                     if isinstance(v, (int, float))}, "eval"))
        mlflow.log_metrics(flat)
        mlflow.log_table(_generations_table(subset, scored), artifact_file="eval/generations.json")
        mlflow.log_artifacts(str(root / PLOTS_DIR), artifact_path="eval/plots")
        mlflow.log_artifact(str(root / METRICS_FILE), artifact_path="eval")
        run_id = mlrun.info.run_id

    return {"models": list(dirs), "n_prompts": len(subset), "skipped": skipped,
            "judge": judge.name, "backend": backend, "run_id": run_id,
            "metrics": {n: {k: e.get(k) for k in ("dr_f1", "plp_similarity", "mlperf_em",
                                                  "avg_score", "win_rate", "gen_tokens_per_s")}
                        for n, e in entries.items()}}


def _fmt(v) -> str:
    return "-" if v is None else f"{v:.3f}"


def _generations_table(subset: Sequence[dict], scored: Mapping[str, Sequence[dict]]):
    """One row per (model, prompt): model, id, task, prompt (first 500 characters of the user
    message), completion, reward, correct."""
    import pandas as pd

    rows = []
    for model, rs in scored.items():
        for rec, r in zip(subset, rs):
            rows.append({"model": model, "id": r["id"], "task": r["task"],
                         "prompt": str(rec["prompt"][-1]["content"])[:500],
                         "completion": r["completion"], "reward": r["reward"],
                         "correct": bool(r["correct"])})
    return pd.DataFrame(rows)
