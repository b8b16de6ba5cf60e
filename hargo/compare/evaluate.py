"""Stages ``compare_eval@<method>-<seed>`` and ``compare_sft``: one model of the comparison
answers the comparison's eval prompts.

``run(params, run)`` (``hargo compare-eval --run <method>-s<seed>`` or ``--run sft``) evaluates
``compare.out_dir/<run>`` (or the SFT model for ``sft``, the untuned base model ``model.out_dir``
for ``base``) exactly as the ``evaluate`` stage does
(:mod:`hargo.evaluation.evaluate`: same prompt selection rule, backend, decoding, rewards and
metrics, the first-token yes/no score of the race prompts and ``dr_auc``), with
``evaluate.samples_per_task`` and ``evaluate.max_new_tokens`` replaced by
``compare.evaluate``'s. The prompt set is drawn with the *global* ``seed``, never the run's, so
every model of the comparison answers the same prompts (the report pairs them by prompt id).
Decoding is greedy by default (``evaluate.temperature: 0``), so SFT is evaluated once.

Outputs (whole or not at all): ``data/compare/eval/<run>/generations.jsonl`` (one row per prompt:
:func:`hargo.metrics.score_samples`'s ``id, task, completion, reward, correct, chars`` and
``prediction`` / ``em`` / ``similarity``; race rows also ``log_p_yes``, ``log_p_no``,
``yes_no_score``) and ``data/compare/eval/<run>/metrics.json`` (the
model's :func:`hargo.evaluation.evaluate.eval_json_entry` plus timing and the prompt counts);
MLflow child run ``compare-eval-<run>``.
"""
from __future__ import annotations

import dataclasses
import re
import time
from pathlib import Path
from typing import Mapping

from hargo.generation_budget import budget_record
from hargo.io import HargoInputError, atomic_dir, atomic_write_json, atomic_write_jsonl
from hargo.compare.layout import BASE_RUN, EVAL_ROOT, SFT_RUN  # re-exported
from hargo.config import CompareEvaluate, Config, as_section, to_plain
from hargo.params import ParamsError

__all__ = ["run", "eval_params", "parse_run", "EVAL_ROOT", "SFT_RUN", "BASE_RUN"]

_RUN_RE = re.compile(r"^(?P<method>[a-z_0-9]+)-s(?P<seed>\d+)$")


def parse_run(params: Config, run: str) -> tuple[str, int] | None:
    """``(method, seed)`` of ``"<method>-s<seed>"``, or None for ``"sft"`` and ``"base"``
    (``params``: the typed config).

    Raises:
        ParamsError: not ``sft``, ``base`` nor a run of ``compare.methods`` x ``compare.seeds``.
    """
    if run in (SFT_RUN, BASE_RUN):
        return None
    m = _RUN_RE.match(run)
    c = as_section(params, "compare", required=True)
    methods = list(c.methods)
    seeds = [int(s) for s in c.seeds]
    if not m or m["method"] not in methods or int(m["seed"]) not in seeds:
        raise ParamsError(f"--run: {run!r} is not 'sft', 'base' nor '<method>-s<seed>' with a method of "
                          f"compare.methods {methods} and a seed of compare.seeds {seeds}")
    return m["method"], int(m["seed"])


#: the keys of ``compare.evaluate`` that replace ``evaluate``'s
_OWN = tuple(f.name for f in dataclasses.fields(CompareEvaluate))


def eval_params(params: Config) -> dict:
    """The typed ``evaluate`` section of ``params`` (the typed config) as the mapping the generation and scoring helpers take
    (every field; a key params.yaml leaves out has the config's default, the same as the
    helpers'), with ``compare.evaluate``'s keys (samples_per_task, max_new_tokens) applied.

    Raises:
        ParamsError: bad params (by the key's dotted name), or no ``compare`` section."""
    ev, own = params.evaluate, as_section(params, "compare", required=True).evaluate
    out = to_plain(ev)
    out.update({k: to_plain(getattr(own, k)) for k in _OWN})
    return out


def eval_param_names(params: Config) -> tuple[str, str]:
    """The params.yaml names of the prompt cap and the completion budget :func:`eval_params`
    took: ``compare.evaluate.<key>`` where that block (typed: :class:`CompareEvaluate`, whose
    keys are required) has the key, else ``evaluate.<key>``; the same for every valid
    ``params``."""
    return tuple(f"compare.evaluate.{k}" if k in _OWN else f"evaluate.{k}"
                 for k in ("max_prompt_tokens", "max_new_tokens"))


def run(params: Config, run: str, root: str | Path = ".") -> dict:
    """Evaluate one model of the comparison (see the module docstring; ``params``: the typed
    config).

    Returns ``{"run", "n_prompts", "skipped", "metrics": {dr_f1, plp_similarity, mlperf_em,
    avg_score, ...}}``.

    Raises:
        ParamsError: unknown run name or bad params.
        FileNotFoundError: the model folder is missing or half-written (names the stage).
        HargoInputError: bad eval split, or no prompt left after the length filter.
        VLLMUnavailableError: backend vllm without vLLM.
    """
    from hargo import tracking
    from hargo.evaluation import generate as gen
    from hargo.evaluation.evaluate import eval_json_entry, load_eval_records, select_prompts
    from hargo.metrics import compute_metrics, score_samples
    from hargo.rewards import RewardConfig, TaskReward
    from hargo.hardware import setup_torch
    from hargo.models.loading import load_tokenizer

    cfg = params
    root = Path(root)
    parsed = parse_run(cfg, run)
    ev = eval_params(cfg)     # the generation and scoring helpers take the block as a mapping
    seed = int(cfg.seed)
    sft_dir = root / cfg.sft.out_dir
    mdir = _model_dir(cfg, run, parsed, root)
    eval_path = root / cfg.data.out_dir / "eval.jsonl"
    records = load_eval_records(eval_path)
    backend = cfg.evaluate.backend
    if backend == "vllm":
        gen.import_vllm()
    reward_fn = TaskReward(RewardConfig.from_params(cfg.rewards))
    subset, skipped = select_prompts(records, ev, seed, load_tokenizer(sft_dir))
    if not subset:
        raise HargoInputError(eval_path, f"no eval prompt has at most evaluate.max_prompt_tokens"
                              f"={cfg.evaluate.max_prompt_tokens} tokens (skipped per task: "
                              f"{skipped})")
    setup_torch(cfg)
    print(f"[compare-eval {run}] {len(subset)} prompts, backend {backend}", flush=True)
    with tracking.stage_run("compare-eval", cfg, root, extra_tags={"hargo.run": run},
                            run_name=f"compare-eval-{run}"):
        import mlflow

        tracking.log_split("eval", "evaluation", cfg, root)

        t0 = time.perf_counter()
        res = gen.run_generation(mdir, [r["prompt"] for r in subset], ev, backend,
                                 seed=seed, param_names=eval_param_names(cfg),
                                 tasks=[r["task"] for r in subset])
        scored = score_samples(subset, res.completions, reward_fn)
        metrics = compute_metrics(subset, res.completions, rewards=[s["reward"] for s in scored],
                                  reward_fn=reward_fn)
        dr_auc, score_s = _yes_no(mdir, subset, scored, ev)
        entry = eval_json_entry(metrics)
        entry["dr_auc"] = dr_auc
        entry.update(run=run, method=run if parsed is None else parsed[0], score_s=score_s,
                     seed=None if parsed is None else parsed[1], n_prompts=len(subset),
                     skipped=skipped, backend=backend,
                     max_new_tokens=budget_record(to_plain(cfg.compare.evaluate.max_new_tokens)),
                     wall_s=round(time.perf_counter() - t0, 3), load_s=res.load_s,
                     generate_s=res.generate_s, completion_tokens=sum(res.completion_tokens),
                     gen_tokens_per_s=res.tokens_per_s)
        with atomic_dir(root / EVAL_ROOT / run) as tmp:
            atomic_write_jsonl(tmp / "generations.jsonl", scored)
            atomic_write_json(tmp / "metrics.json", entry)
        mlflow.log_metrics({k: float(v) for k, v in entry.items()
                            if isinstance(v, (int, float)) and not isinstance(v, bool)})
    print(f"[compare-eval {run}] DR-F1 {entry.get('dr_f1')}, PLP {entry.get('plp_similarity')}, "
          f"MLPerf EM {entry.get('mlperf_em')}, AvgScore {entry.get('avg_score')} "
          f"({entry['wall_s']:.1f} s)", flush=True)
    return {"run": run, "n_prompts": len(subset), "skipped": skipped,
            "metrics": {k: entry.get(k) for k in ("dr_f1", "plp_similarity", "mlperf_em",
                                                  "avg_score")}}


def _model_dir(cfg: Config, run: str, parsed: tuple[str, int] | None, root: Path) -> Path:
    """The model folder of ``run`` (the base model, SFT or a compare_train run), checked
    complete, and SFT's (whose tokenizer picks the prompts). Raises FileNotFoundError naming the
    stage that writes the missing one."""
    from hargo.io import require_complete_dir

    sft_dir = root / cfg.sft.out_dir
    if run == BASE_RUN:
        mdir, stage = root / cfg.model.out_dir, "base_model (hargo base-model)"
    elif parsed is None:
        mdir, stage = sft_dir, "sft (hargo sft)"
    else:
        mdir = root / cfg.compare.out_dir / run
        stage = f"compare_train@{parsed[0]}-{parsed[1]} (hargo compare-train)"
    try:
        require_complete_dir(mdir, f"model folder of {run!r}")
        require_complete_dir(sft_dir, "SFT model folder (its tokenizer picks the prompts)")
    except FileNotFoundError as e:
        raise FileNotFoundError(f"{e} (written by stage {stage})") from None
    return mdir


def _yes_no(mdir: Path, subset: list[dict], scored: list[dict], ev: Mapping
            ) -> tuple[float | None, float]:
    """The race prompts' first-token yes/no scores (:mod:`hargo.evaluation.scoring`) added to
    their rows of ``scored``; returns ``(dr_auc, seconds)`` (``dr_auc`` None without race
    prompts)."""
    from hargo.evaluation.scoring import score_yes_no
    from hargo.metrics import race_auc
    from hargo.rewards import RACE_TASKS

    race_idx = [i for i, r in enumerate(subset) if r["task"] in RACE_TASKS]
    yn, score_s = score_yes_no(mdir, [subset[i]["prompt"] for i in race_idx], ev)
    for i, row in zip(race_idx, yn):
        scored[i].update(row)
    dr_auc = race_auc([subset[i]["label"] for i in race_idx],
                      [r["yes_no_score"] for r in yn]) if race_idx else None
    return dr_auc, score_s
