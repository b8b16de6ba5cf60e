"""The ``evaluate`` stage: the untuned base model, the SFT model and every RL model answer the
same eval prompts; the full metrics (hargo.metrics), the threshold-free race AUC and the WinRate
of each other model against SFT are computed, beside the race baselines that need no model
(always-yes, nearest-train), and written for DVC and logged to MLflow.

Steps (params.yaml ``evaluate``; paths relative to ``root``, the repository root):

1. Inputs are checked before anything is generated: every model folder (``model.out_dir``,
   ``sft.out_dir`` and ``rl.out_dir/<method>`` for each of ``rl.methods``) must be complete
   (``.complete`` marker), the train split (``data.out_dir/train.jsonl``) readable,
   and every eval record (``data.out_dir/eval.jsonl``) must have a known task, an id, a
   conversational prompt and its reference (label for race tasks, answer otherwise).
2. The prompt set: records whose chat-templated prompt is longer than
   ``evaluate.max_prompt_tokens`` tokens are skipped and counted per task (the training stages'
   rule, ``hargo.data.records.select_subset``: prompts over 8 characters per allowed token are
   skipped without tokenising them), then a seeded subset of ``evaluate.samples_per_task`` per
   task is drawn (``null``: all). Tokens are counted with the SFT model's tokenizer; every model
   answers exactly this set.
3. Each model generates with ``evaluate.backend`` (``hargo.evaluation.generate``), is scored
   (``score_samples``, ``compute_metrics``), and every model but SFT is compared with SFT
   (``win_rate`` with the judge of ``evaluate.judge``, named in the outputs).
4. Each model's race prompts only get one transformers forward pass more (either backend): the
   first-token ``log P(yes) - log P(no)`` (``hargo.evaluation.scoring``), whose ROC AUC against
   the labels is ``dr_auc`` (``hargo.metrics.race_auc``; null with a single class present).
5. The race baselines on the same race prompts (``hargo.evaluation.baselines``): ``always-yes``
   ("yes" everywhere, constant score: AUC 0.5) and ``nearest-train`` (the label of the most
   Jaccard-similar race kernel of the train split; score: nearest-yes minus nearest-no
   similarity).

Outputs, each whole or not at all:

- ``metrics/headline.json`` (the DVC metrics, :func:`headline`): a few numbers per model, so
  ``dvc metrics show`` and ``dvc exp show`` stay readable.
- ``metrics/eval.json`` (a plain output): ``{model: {metric: value}}`` for ``base``, ``sft``, each
  method and the baselines ``always-yes`` and ``nearest-train``, plus ``run`` (judge, backend,
  dtype, prompt counts, skipped counts). Per model: the metrics of ``compute_metrics``
  (``dr_confusion`` as ``{tp, fp, fn, tn}``), ``dr_auc``, ``win_rate`` / ``win_wins`` /
  ``win_ties`` / ``win_losses`` (every model but SFT), ``wall_s`` (load + generate + score),
  ``load_s``, ``generate_s``, ``score_s`` (the yes/no forward pass, load included),
  ``completion_tokens`` and ``gen_tokens_per_s``. Per baseline (``"baseline": true``): race
  metrics only (:func:`race_entry`).
- ``data/eval/<model>.jsonl``: per prompt ``id``, ``task``, ``completion``, ``reward``,
  ``correct``, ``win`` (the judge's verdict against SFT: 1, 0, -1; SFT's own rows 0) (and
  ``label`` / ``prediction`` / ``em`` / ``similarity``, ``chars``; race prompts also
  ``log_p_yes``, ``log_p_no``, ``yes_no_score``); ``data/eval/baselines.jsonl``: per race prompt
  ``id``, ``task``, ``label``, the nearest-train ``prediction``, ``neighbour`` (train id),
  ``similarity`` and ``score``; ``data/eval/prompts.json``: the chosen ids and skipped counts.
- ``reports/eval/``: DVC plot data and PNGs (``hargo.evaluation.plots``).
- MLflow child run ``evaluate``: metrics as ``<model>/<metric>``, the generations table
  (``eval/generations.json``), the plots, and ``metrics/eval.json``.
"""
from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

from hargo.config import Config, to_plain
from hargo.data.records import read_prepared, select_subset
# the baselines' entries of metrics/eval.json, re-exported beside the stage that writes them
from hargo.evaluation.baselines import (ALWAYS_YES, BASE, BASELINES, NEAREST_TRAIN,
                                        baseline_entries, race_entry)
from hargo.generation_budget import budget_record
from hargo.hardware import generation_dtype
from hargo.io import HargoInputError, atomic_dir, atomic_write_json, atomic_write_jsonl, \
    require_complete_dir

__all__ = ["METRICS_FILE", "HEADLINE_FILE", "GENERATIONS_DIR", "PLOTS_DIR",
           "SFT", "BASE", "ALWAYS_YES", "NEAREST_TRAIN", "BASELINES", "model_dirs",
           "load_eval_records", "select_prompts", "eval_json_entry", "race_entry",
           "baseline_entries", "headline", "run"]

METRICS_FILE = "metrics/eval.json"
#: the DVC metrics file of the main pipeline (``dvc metrics show``, ``dvc exp show``)
HEADLINE_FILE = "metrics/headline.json"
GENERATIONS_DIR = "data/eval"
PLOTS_DIR = "reports/eval"
SFT = "sft"


def model_dirs(params: Config, root: str | Path = ".") -> dict[str, Path]:
    """``{"base": <model.out_dir>, "sft": <sft.out_dir>, <method>: <rl.out_dir>/<method>, ...}``
    in evaluation order, each checked complete (``params``: the typed config).

    Raises:
        FileNotFoundError: a folder is missing or half-written (no ``.complete`` marker); the
            message names it and the stage that writes it.
    """
    root = Path(root)
    model, sft, rl = params.model, params.sft, params.rl
    dirs = {BASE: root / model.out_dir, SFT: root / sft.out_dir}
    for m in rl.methods:
        dirs[m] = root / rl.out_dir / m
    for name, d in dirs.items():
        stage = {SFT: "sft (hargo sft)", BASE: "base_model (hargo base-model)"}.get(
            name, f"rl@{name} (hargo rl --method {name})")
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


def headline(doc: Mapping) -> dict:
    """The headline numbers of ``metrics/eval.json``'s document: ``{model: {metric: value}}``
    with the :func:`hargo.metrics.headline_metrics` each entry has (a baseline has the race ones
    only), models in the document's order, the ``run`` entry left out."""
    from hargo.metrics import headline as keep_headline

    return keep_headline({k: v for k, v in doc.items() if k != "run"})


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


def run(params: Config, root: str | Path = ".") -> dict:
    """Run the evaluate stage (see the module docstring).

    Args:
        params: the typed config (:class:`hargo.config.Config`; ``seed``, ``data.out_dir``, ``model.out_dir``,
            ``sft.out_dir``, ``rl.out_dir``, ``rl.methods``, ``train.threads``, ``rewards``,
            ``evaluate``).
        root: the repository root that relative paths start from.

    Returns:
        ``{"models": [base, sft, methods...], "baselines": ["always-yes", "nearest-train"],
        "n_prompts", "skipped", "judge", "backend", "run_id", "metrics": {model or baseline:
        {dr_f1, dr_mcc, dr_auc, dr_yes_share, plp_similarity, mlperf_em, avg_score, win_rate,
        gen_tokens_per_s}}}``.

    Raises:
        FileNotFoundError: a model folder is missing or half-written.
        HargoInputError: the eval or train split is missing or has a bad record (unknown
            task, ...), or no prompt is left after the length filter.
        ValueError: race prompts to evaluate but no race record of both labels in the train
            split (the nearest-train baseline needs them).
        VLLMUnavailableError: backend vllm without vLLM installed (says how to install it).
        RuntimeError: the MLflow store cannot be used.
    """
    with _no_weight_loading_bars():
        return _evaluate(params, root)


@contextlib.contextmanager
def _no_weight_loading_bars():
    """transformers' "Loading weights" bar off inside (the yes/no scorer and the embedding
    model load once per model: a bar each, beside the stage's own line that gives the load
    time), restored after; vLLM's generation bar stays."""
    from transformers.utils import logging as hf_logging

    was = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was:
            hf_logging.enable_progress_bar()


@dataclass
class _Inputs:
    """What :func:`_evaluate` checked and chose before the first token is generated."""

    cfg: Config
    ev_dict: dict            # the evaluate section as the generation and scoring helpers take it
    dirs: dict[str, Path]
    subset: list[dict]
    skipped: dict[str, int]
    n_task: dict[str, int]
    race_idx: list[int]
    race_labels: list
    baselines: dict[str, dict]
    baseline_rows: list[dict]
    dtype: str
    reward_fn: object
    judge: object


def _check_inputs(cfg: Config, root: Path) -> _Inputs:
    """Step 1 of :func:`_evaluate`: everything that can be checked, checked (model folders,
    splits, backend, judge) and the prompt set chosen, before the first token is generated."""
    from hargo.evaluation import generate as gen
    from hargo.judges import make_judge
    from hargo.rewards import RACE_TASKS
    from hargo.rewards import RewardConfig, TaskReward
    from hargo.models.loading import load_tokenizer

    ev = cfg.evaluate
    # the generation, scoring and judge helpers still take the section as a mapping
    ev_dict = to_plain(ev)     # the engine settings the generation and scoring helpers take
    seed = cfg.seed
    backend = ev.backend
    if backend not in gen.BACKENDS:
        raise ValueError(f"evaluate.backend: must be one of {', '.join(gen.BACKENDS)}, "
                         f"got {backend!r}")
    dirs = model_dirs(cfg, root)
    eval_path = root / cfg.data.out_dir / "eval.jsonl"
    records = load_eval_records(eval_path)
    train = read_prepared(root / cfg.data.out_dir / "train.jsonl")
    if backend == "vllm":
        gen.import_vllm()
    dtype = generation_dtype(ev.dtype)
    reward_fn = TaskReward(RewardConfig.from_params(cfg.rewards))
    judge = make_judge(ev, reward_fn)
    subset, skipped = select_prompts(records, ev_dict, seed, load_tokenizer(dirs[SFT]))
    if not subset:
        raise HargoInputError(eval_path, f"no eval prompt has at most evaluate.max_prompt_tokens"
                              f"={ev.max_prompt_tokens} tokens (skipped per task: {skipped})")
    race_idx = [i for i, r in enumerate(subset) if r["task"] in RACE_TASKS]
    race_labels = [subset[i]["label"] for i in race_idx]
    baselines, baseline_rows = baseline_entries(subset, train)
    n_task = {t: sum(r["task"] == t for r in subset) for t in skipped}
    print(f"[evaluate] {len(subset)} prompts {n_task}, skipped as too long {skipped}; "
          f"backend {backend} ({dtype}), judge {judge.name}", flush=True)
    return _Inputs(cfg, ev_dict, dirs, subset, skipped, n_task, race_idx, race_labels, baselines,
                   baseline_rows, dtype, reward_fn, judge)


def _evaluate(cfg: Config, root: str | Path) -> dict:
    """:func:`run`'s body: inputs checked (:func:`_check_inputs`), then, in the stage's MLflow
    run, each model generates and is scored (:func:`_score_model`), judged against SFT
    (:func:`_judge_against_sft`), and the outputs written (:func:`_write_outputs`) and logged
    (:func:`_log_to_mlflow`)."""
    from hargo import tracking
    from hargo.hardware import setup_torch

    root = Path(root)
    ev = cfg.evaluate
    # 1. everything that can be checked is checked before the first token is generated
    x = _check_inputs(cfg, root)
    dirs, baselines = x.dirs, x.baselines

    setup_torch(cfg)
    with tracking.stage_run("evaluate", cfg, root) as mlrun:
        tracking.log_split("eval", "evaluation", cfg, root)

        completions: dict[str, list[str]] = {}
        scored: dict[str, list[dict]] = {}
        entries: dict[str, dict] = {}
        for name, d in dirs.items():
            completions[name], scored[name], entries[name] = _score_model(x, name, d)
        _judge_against_sft(x, completions, scored, entries)
        info = {"judge": x.judge.name, "backend": ev.backend, "dtype": x.dtype,
                "n_prompts": len(x.subset), "skipped_total": sum(x.skipped.values()),
                "max_prompt_tokens": int(ev.max_prompt_tokens),
                "max_new_tokens": budget_record(x.ev_dict["max_new_tokens"]),
                "temperature": float(ev.temperature),
                **{f"n_{t}": n for t, n in x.n_task.items()},
                **{f"skipped_{t}": k for t, k in x.skipped.items()}}
        for name, b in baselines.items():
            print(f"[evaluate] baseline {name}: DR-F1 {_fmt(b['dr_f1'])}, DR MCC "
                  f"{_fmt(b['dr_mcc'])}, DR AUC {_fmt(b['dr_auc'])}, yes share "
                  f"{_fmt(b['dr_yes_share'])}", flush=True)
        doc = {**entries, **baselines, "run": info}

        # 2. outputs, each whole or not at all
        _write_outputs(root, x, scored, doc)
        # 3. MLflow: metrics, generations table, plots
        _log_to_mlflow(root, x, {**entries, **baselines}, info, scored)
        run_id = mlrun.info.run_id

    return {"models": list(dirs), "baselines": list(baselines), "n_prompts": len(x.subset),
            "skipped": x.skipped, "judge": x.judge.name, "backend": ev.backend, "run_id": run_id,
            "metrics": {n: {k: e.get(k) for k in ("dr_f1", "dr_mcc", "dr_auc", "dr_yes_share",
                                                  "plp_similarity", "mlperf_em", "avg_score",
                                                  "win_rate", "gen_tokens_per_s")}
                        for n, e in {**entries, **baselines}.items()}}


def _score_model(x: _Inputs, name: str, d: Path) -> tuple[list[str], list[dict], dict]:
    """Model ``name`` (folder ``d``) generates for the prompt set and is scored: its
    completions, per-prompt rows and ``metrics/eval.json`` entry (``win_rate`` added later)."""
    import mlflow

    from hargo.evaluation import generate as gen
    from hargo.evaluation.scoring import score_yes_no
    from hargo.metrics import compute_metrics, race_auc, score_samples

    subset, race_idx = x.subset, x.race_idx
    t0 = time.perf_counter()
    res = gen.run_generation(d, [r["prompt"] for r in subset], x.ev_dict, x.cfg.evaluate.backend,
                             seed=x.cfg.seed, tasks=[r["task"] for r in subset])
    s = score_samples(subset, res.completions, x.reward_fn)
    m = compute_metrics(subset, res.completions, rewards=[r["reward"] for r in s],
                        reward_fn=x.reward_fn)
    yn, score_s = score_yes_no(d, [subset[i]["prompt"] for i in race_idx], x.ev_dict)
    for i, row in zip(race_idx, yn):
        s[i].update(row)
    entry = eval_json_entry(m)
    entry["dr_auc"] = race_auc(x.race_labels, [r["yes_no_score"] for r in yn]) \
        if race_idx else None
    entry.update(wall_s=time.perf_counter() - t0, load_s=res.load_s, score_s=score_s,
                 generate_s=res.generate_s, completion_tokens=sum(res.completion_tokens),
                 prompt_tokens=sum(res.prompt_tokens), gen_tokens_per_s=res.tokens_per_s)
    rss = _rss_mib()
    if rss is not None:
        mlflow.log_metric(f"{name}/rss_mib_after", rss)
    print(f"[evaluate] {name}: {len(s)} completions in {res.generate_s:.1f} s "
          f"({res.tokens_per_s:.0f} tokens/s, load {res.load_s:.1f} s); "
          f"DR-F1 {_fmt(entry.get('dr_f1'))}, DR MCC {_fmt(entry.get('dr_mcc'))}, "
          f"DR AUC {_fmt(entry.get('dr_auc'))}, PLP {_fmt(entry.get('plp_similarity'))}, "
          f"MLPerf EM {_fmt(entry.get('mlperf_em'))}, AvgScore "
          f"{_fmt(entry.get('avg_score'))}", flush=True)
    return res.completions, s, entry


def _judge_against_sft(x: _Inputs, completions: Mapping[str, list[str]],
                       scored: Mapping[str, list[dict]], entries: Mapping[str, dict]) -> None:
    """Every model but SFT judged against SFT (``win_rate``): the verdicts go into its rows'
    ``win``, the counts into its entry; SFT's own rows get ``win = 0``. In place."""
    from hargo.metrics import win_rate

    judge = x.judge
    for name in x.dirs:
        if name == SFT:   # against itself: a tie on every prompt (the gate reads "win")
            for row in scored[name]:
                row["win"] = 0
            continue
        w = win_rate(x.subset, completions[name], completions[SFT], judge)
        for row, verdict in zip(scored[name], w["verdicts"], strict=True):
            row["win"] = verdict
        entries[name].update(win_rate=w["win_rate"], win_wins=w["wins"],
                             win_ties=w["ties"], win_losses=w["losses"])
        print(f"[evaluate] {name} vs sft: WinRate {_fmt(w['win_rate'])} "
              f"({w['wins']} wins, {w['ties']} ties, {w['losses']} losses; judge {judge.name})",
              flush=True)


def _write_outputs(root: Path, x: _Inputs, scored: Mapping[str, list[dict]], doc: dict) -> None:
    """The generations, the plots, ``metrics/eval.json`` and the headline, each whole or not at
    all."""
    from hargo.evaluation.plots import write_plots

    with atomic_dir(root / GENERATIONS_DIR) as tmp:
        for name, rows in scored.items():
            atomic_write_jsonl(tmp / f"{name}.jsonl", rows)
        atomic_write_jsonl(tmp / "baselines.jsonl", x.baseline_rows)
        atomic_write_json(tmp / "prompts.json",
                          {"ids": [r["id"] for r in x.subset], "skipped": x.skipped,
                           "judge": x.judge.name})
    with atomic_dir(root / PLOTS_DIR) as tmp:
        write_plots(tmp, x.subset, scored)
    atomic_write_json(root / METRICS_FILE, doc)
    atomic_write_json(root / HEADLINE_FILE, headline(doc))


def _log_to_mlflow(root: Path, x: _Inputs, entries: Mapping[str, dict], info: Mapping,
                   scored: Mapping[str, list[dict]]) -> None:
    """Into the active run: tags, every model's and baseline's metrics (``entries``) and the
    run's numbers (``eval/...``), the generations table, the plots and ``metrics/eval.json``."""
    import mlflow

    mlflow.set_tags({"hargo.judge": x.judge.name, "hargo.eval_backend": x.cfg.evaluate.backend})
    flat: dict[str, float] = {}
    for name, entry in entries.items():
        flat.update(_mlflow_metrics(entry, name))
    flat.update(_mlflow_metrics({k: v for k, v in info.items()
                                 if isinstance(v, (int, float))}, "eval"))
    mlflow.log_metrics(flat)
    mlflow.log_table(_generations_table(x.subset, scored), artifact_file="eval/generations.json")
    mlflow.log_artifacts(str(root / PLOTS_DIR), artifact_path="eval/plots")
    mlflow.log_artifact(str(root / METRICS_FILE), artifact_path="eval")


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
