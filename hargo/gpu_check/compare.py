"""The GPU check's ``compare`` part: SFT, then grpo, dr_grpo and hargo on one budget, evaluated.

SFT on the whole train split (LoRA, as params.yaml, batch 16, one epoch), then ``grpo``,
``dr_grpo`` and ``hargo`` from that SFT model with the same budget (50 steps of 16 prompts x G=4,
48 new tokens, prompts up to 384 tokens; fewer steps if the time budget says so: a method stopped
early by its deadline imposes its step count on the methods after it, and ``equal_budget`` says
whether all got the same), each model answering the whole eval split greedily (transformers
backend, bf16 on the GPU). DR-F1, PLP similarity, MLPerf EM, AvgScore (``hargo.metrics``),
WinRate vs SFT (judge ``task-reward``), next to an always-"yes" answerer and the SFT model, and
95% paired-bootstrap intervals of HARGO minus GRPO and HARGO minus Dr. GRPO
(``hargo.stats``).

Within the part's time SFT gets a fifth and each RL method an equal share of the rest, its
evaluation (timed on SFT's) kept back. :func:`rescore` recomputes the tables here from the
answers the run brought back (``--rescore``).
"""
from __future__ import annotations

import gzip
import json
import traceback
from collections import Counter
from pathlib import Path
from typing import Any, Mapping, Sequence

from hargo.gpu_check.common import (RESERVE_S, _deadline_callback, _free_memory, _now,
                                    _peak_gpu_mib, _reset_peak, _write_json, log)
from hargo.gpu_check.speed import _history_split
from hargo.config import as_config, to_plain
from hargo.params import apply_overrides



def headline() -> tuple[str, ...]:
    """The metrics that get HARGO-minus-other bootstrap intervals: each registered task's metric
    of the comparison report's view (:func:`hargo.tasks.headline_metrics` ``("report")``; the
    built-ins: ``dr_f1``, ``plp_similarity``, ``mlperf_em``), then ``avg_score`` and ``win_rate``
    (no task's). Read from the registry when called, so a new task's metric reaches the part."""
    from hargo.config.registries import task_metric_keys

    return task_metric_keys("report") + ("avg_score", "win_rate")


def _eval_model(name: str, model_dir: Path, subset: list[dict], ev: Mapping, reward_fn,
                seed: int) -> dict:
    from hargo.evaluation.generate import run_generation
    from hargo.metrics import compute_metrics, score_samples

    t0 = _now()
    res = run_generation(model_dir, [r["prompt"] for r in subset], ev, "transformers", seed=seed,
                         tasks=[r["task"] for r in subset])
    scored = score_samples(subset, res.completions, reward_fn)
    m = compute_metrics(subset, res.completions, rewards=[s["reward"] for s in scored],
                        reward_fn=reward_fn)
    m = {k: v for k, v in m.items() if k != "dr_confusion"} | {
        "dr_confusion": None if m.get("dr_confusion") is None else
        {c: int(m["dr_confusion"][c]) for c in ("tp", "fp", "fn", "tn")}}
    m.update(eval_s=round(_now() - t0, 2), generate_s=round(res.generate_s, 2),
             load_s=round(res.load_s, 2), completion_tokens=int(sum(res.completion_tokens)),
             gen_tokens_per_s=round(res.tokens_per_s, 1), dtype=res.dtype)
    log(f"eval {name}: DR-F1 {m.get('dr_f1')}, PLP {m.get('plp_similarity')}, MLPerf EM "
        f"{m.get('mlperf_em')}, AvgScore {m.get('avg_score')} ({m['eval_s']} s)")
    return {"completions": res.completions, "scored": scored, "metrics": m}


def _per_prompt(subset: Sequence[Mapping], scored: Sequence[Mapping]) -> dict:
    """Per-prompt arrays for the paired bootstrap (hargo.stats): ``avg_score`` (every prompt's
    reward) and each task metric of :func:`headline` over the rows of the tasks declaring it,
    read from the registry: its scored row ``field`` as floats for a mean, ``(label is yes,
    predicted yes)`` records (:func:`hargo.stats.race_f1_records`) for a yes/no statistic (the
    race ``dr_f1``). A metric without prompts is left out."""
    import numpy as np

    from hargo.stats import race_f1_records
    from hargo.tasks import headline_metrics, metric_tasks

    out = {"avg_score": np.array([r["reward"] for r in scored], dtype=float)}
    for m in headline_metrics("report"):
        rows = [(s, r) for s, r in zip(subset, scored) if s["task"] in metric_tasks(m.key)]
        if not rows:
            continue
        if m.statistic == "mean":
            out[m.key] = np.array([r[m.field] for _, r in rows], dtype=float)
        else:
            out[m.key] = race_f1_records([s["label"] for s, _ in rows],
                                         [r[m.field] for _, r in rows])
    return out


def _statistic(key: str):
    """The statistic of metric ``key``'s per-prompt values: its task metric's, else the mean."""
    from hargo.stats import STATISTIC_FUNCTIONS
    from hargo.tasks import headline_metrics

    stats = {m.key: m.statistic for m in headline_metrics("report")}
    return STATISTIC_FUNCTIONS[stats.get(key, "mean")]


def _comparison_tables(subset: list[dict], evals: Mapping[str, Mapping], reward_fn,
                       resamples: int, seed: int) -> tuple[dict, dict]:
    """Metrics per model (WinRate vs SFT added) and the bootstrap intervals of HARGO minus the
    others; works from completions alone (also used by ``--rescore``)."""
    import numpy as np

    from hargo.stats import paired_bootstrap_ci
    from hargo.judges import RewardJudge

    judge = RewardJudge(reward_fn)          # the GPU check compares by task reward
    models: dict[str, dict] = {}
    per_prompt: dict[str, dict] = {}
    for name, e in evals.items():
        models[name] = dict(e["metrics"])
        per_prompt[name] = _per_prompt(subset, e["scored"])
    if "sft" in evals:
        for name, e in evals.items():
            if name in ("sft", "always_yes"):
                continue
            v = judge.compare_batch(subset, e["completions"], evals["sft"]["completions"])
            wins, ties, losses = v.count(1), v.count(0), v.count(-1)
            models[name].update(win_rate=(wins + 0.5 * ties) / len(v) if v else None,
                                win_wins=wins, win_ties=ties, win_losses=losses,
                                win_judge=judge.name)
            per_prompt[name]["win_rate"] = np.array([{1: 1.0, 0: 0.5, -1: 0.0}[x] for x in v])
    ci: dict[str, dict] = {}
    for other in ("grpo", "dr_grpo"):
        if "hargo" not in per_prompt or other not in per_prompt:
            continue
        pair = {}
        for k in headline():
            a, b = per_prompt["hargo"].get(k), per_prompt[other].get(k)
            if a is None or b is None:
                continue
            pair[k] = paired_bootstrap_ci(a, b, _statistic(k), resamples=resamples,
                                          confidence=0.95, seed=seed)
        ci[f"hargo-{other}"] = pair
    return models, ci


def _train_sft(ctx: dict, records: list[dict], out_dir: Path, end: float) -> dict:
    from hargo.hardware import setup_torch
    from hargo.models.loading import load_model, load_tokenizer, save_merged
    from hargo.training import sft

    p = ctx["params"]
    cfg = as_config(p)
    setup_torch(cfg)
    model = load_model(ctx["model_dir"], dtype="float32")
    tok = load_tokenizer(ctx["model_dir"])
    args = sft.sft_config(cfg, ctx["work"] / "sft-trainer", report_to=())
    args.disable_tqdm = True
    trainer = sft.build_trainer(cfg, model, tok, records, args)
    stop = _deadline_callback(end)
    trainer.add_callback(stop)
    t0 = _now()
    out = trainer.train()
    train_s = _now() - t0
    save_merged(trainer.accelerator.unwrap_model(trainer.model), tok, out_dir,
                dtype=cfg.model.dtype)
    curve = [(int(e["step"]), float(e["loss"])) for e in trainer.state.log_history
             if "loss" in e and "step" in e and "train_loss" not in e]
    res = {"examples": len(records), "steps": int(trainer.state.global_step),
           "max_steps": int(trainer.state.max_steps), "train_s": round(train_s, 2),
           "mean_train_loss": float(out.training_loss), "bf16": bool(args.bf16),
           "first_loss": curve[0][1] if curve else None,
           "last_loss": curve[-1][1] if curve else None,
           "stopped_by_deadline": bool(stop.stopped), "lora": bool(cfg.sft.lora.enabled),
           "batch_size": int(cfg.sft.batch_size), "learning_rate": float(cfg.sft.learning_rate)}
    for step, loss in curve:
        ctx["tracker"].metrics("compare/sft", {"loss": loss}, step=step)
    del trainer, model
    _free_memory()
    return res


def _train_rl(ctx: dict, method: str, sft_dir: Path, records: list[dict], steps: int,
              out_dir: Path, end: float) -> dict:
    from hargo.hardware import setup_torch
    from hargo.models.loading import load_tokenizer, save_merged
    from hargo.training.rl import build_trainer
    from hargo.training.rl_logging import RLLoggingCallback, StepRecorder

    p = as_config(apply_overrides(ctx["params"], {"rl.steps": int(steps)}))
    setup_torch(p)
    tok = load_tokenizer(sft_dir)
    rec = StepRecorder()
    stop = _deadline_callback(end)
    trainer = build_trainer(p, method, sft_dir, records, ctx["work"] / f"rl-{method}",
                            recorder=rec, callbacks=[RLLoggingCallback(rec, method), stop],
                            tokenizer=tok)
    _reset_peak()
    t0 = _now()
    trainer.train()
    train_s = _now() - t0
    save_merged(trainer.accelerator.unwrap_model(trainer.model), tok, out_dir,
                dtype=p.model.dtype)
    hist = rec.history
    for h in hist:
        ctx["tracker"].metrics(f"compare/rl-{method}", {k: v for k, v in h.items() if k != "step"},
                               step=int(h["step"]))
    split = _history_split(hist)
    res = {"method": method, "steps": int(trainer.state.global_step), "max_steps": int(steps),
           "train_s": round(train_s, 2), "s_per_step": round(split["step_s"], 3),
           "time_split_s_per_step": {k: round(split[k], 3)
                                     for k in ("generation_s", "scoring_s", "update_s")},
           "ema_baseline": trainer.ema.value, "bf16": bool(trainer.args.bf16),
           "stopped_by_deadline": bool(stop.stopped), "peak_gpu_mib": _peak_gpu_mib(),
           "reward_curve": [(int(h["step"]), h.get("all/reward_mean")) for h in hist],
           "final_reward_mean": hist[-1].get("all/reward_mean") if hist else None}
    del trainer
    _free_memory()
    return res


def _compare_inputs(ctx: dict) -> dict:
    """The part's params (the plan's SFT and RL sizes, stored back into ``ctx["params"]``) and
    inputs: ``seed``, ``ev`` (the evaluate block as the mapping the evaluation helpers take),
    the SFT examples, the RL prompt pool, the eval ``subset``, ``reward_fn`` and the ``setup``
    the tracker and the results record."""
    from hargo.data.records import select_subset
    from hargo.evaluation.evaluate import select_prompts
    from hargo.io import read_jsonl
    from hargo.models.loading import load_tokenizer
    from hargo.rewards import RewardConfig, TaskReward
    from hargo.training.rl import prompt_cap

    plan = ctx["plan"]
    # the part's params: the plan's SFT and RL sizes (the RL steps are per method, _train_rl)
    p = ctx["params"] = apply_overrides(
        ctx["params"], {**{f"sft.{k}": v for k, v in plan.sft.items()},
                        **{f"rl.{k}": v for k, v in plan.rl.items() if k != "steps"}})
    cfg = as_config(p)
    seed = int(cfg.seed)
    # the evaluate block as the mapping the evaluation helpers take, with the plan's sizes
    ev = to_plain(cfg.evaluate)
    ev.update(plan.eval, backend="transformers", temperature=0.0)
    tok = load_tokenizer(ctx["model_dir"])
    train = read_jsonl(ctx["data_dir"] / "train.jsonl")
    eval_records = read_jsonl(ctx["data_dir"] / "eval.jsonl")
    sft_records, sft_skipped = select_subset(train, plan.sft["samples_per_task"], seed, tok,
                                             int(cfg.train.max_prompt_tokens))
    rl_records, rl_skipped = select_subset(train, plan.rl["samples_per_task"], seed, tok,
                                           prompt_cap(cfg))
    subset, eval_skipped = select_prompts(eval_records, ev, seed, tok)
    reward_fn = TaskReward(RewardConfig.from_params(cfg.rewards))
    setup = {"sft_examples": len(sft_records), "sft_skipped": sft_skipped,
             "rl_prompt_pool": len(rl_records), "rl_skipped": rl_skipped,
             "eval_prompts": len(subset), "eval_skipped": eval_skipped,
             "eval_per_task": dict(Counter(r["task"] for r in subset)),
             "rl": dict(plan.rl), "sft": dict(plan.sft),
             "eval": {k: ev[k] for k in ("max_new_tokens", "batch_size", "max_prompt_tokens")},
             "judge": "task-reward", "methods": list(plan.rl_methods)}
    return {"seed": seed, "ev": ev, "sft_records": sft_records, "rl_records": rl_records,
            "subset": subset, "reward_fn": reward_fn, "setup": setup}


def _always_yes(subset: list[dict], reward_fn) -> dict:
    """The trivial answerer's evaluation: "yes" to every prompt."""
    yes = ["yes"] * len(subset)
    from hargo.metrics import compute_metrics, score_samples

    sc = score_samples(subset, yes, reward_fn)
    m = compute_metrics(subset, yes, rewards=[s["reward"] for s in sc], reward_fn=reward_fn)
    m["dr_confusion"] = None if m.get("dr_confusion") is None else {
        c: int(m["dr_confusion"][c]) for c in ("tp", "fp", "fn", "tn")}
    return {"completions": yes, "scored": sc, "metrics": m}


def run_compare(ctx: dict) -> dict:
    """The part (module docstring): the results (``setup``, ``sft``, ``rl`` per method,
    ``models``, ``bootstrap``, ``budget``, ``errors``, ``equal_budget``, ``steps_requested``);
    the answers are left in ``ctx["generations"]``."""
    work, dl = ctx["work"], ctx["deadline"]
    x = _compare_inputs(ctx)
    subset, ev, reward_fn, seed = x["subset"], x["ev"], x["reward_fn"], x["seed"]
    ctx["tracker"].params("compare", {"setup": x["setup"]})
    result: dict[str, Any] = {"setup": x["setup"], "models": {}, "rl": {}, "bootstrap": {}}
    evals: dict[str, dict] = {}

    def budget_left() -> float:
        return dl.end - RESERVE_S - _now()

    # always-yes: the trivial answerer
    evals["always_yes"] = _always_yes(subset, reward_fn)

    # SFT: up to a fifth of what is left
    log(f"compare: SFT on {len(x['sft_records'])} examples ({budget_left():.0f} s left)")
    sft_dir = work / "sft"
    result["sft"] = _train_sft(ctx, x["sft_records"], sft_dir, _now() + 0.2 * budget_left())
    ctx["save_partial"]("compare", result)
    evals["sft"] = _eval_model("sft", sft_dir, subset, ev, reward_fn, seed)
    _train_methods(ctx, x, sft_dir, result, evals, budget_left)
    _record_comparison(ctx, x, result, evals)
    ctx["generations"] = {"subset": subset, "evals": evals}
    return result


def _train_methods(ctx: dict, x: dict, sft_dir: Path, result: dict, evals: dict,
                   budget_left) -> None:
    """Each RL method of the plan from the SFT model, in turn, on an equal share of what is
    left (its evaluation, timed on SFT's, kept back), then evaluated: into ``result["rl"]`` and
    ``evals``. A method stopped early by its deadline imposes its step count on the methods
    after it; one that fails is recorded and the next one runs."""
    plan, work = ctx["plan"], ctx["work"]
    eval_s = evals["sft"]["metrics"]["eval_s"]
    methods = list(plan.rl_methods)
    steps = int(plan.rl["steps"])
    for i, method in enumerate(methods):
        n_left = len(methods) - i
        # this method's share of what is left, its evaluation (like SFT's) kept back
        share = (budget_left() - n_left * (eval_s * 1.2 + 5.0)) / n_left
        if share <= 0:
            result["rl"][method] = {"skipped": "time budget"}
            log(f"compare: {method} skipped (time budget)")
            continue
        log(f"compare: {method}, {steps} steps x {plan.rl['prompts_per_step']} prompts x "
            f"G={plan.rl['num_generations']} ({share:.0f} s for it)")
        try:
            r = _train_rl(ctx, method, sft_dir, x["rl_records"], steps,
                          work / f"rl-{method}-model", _now() + share)
            result["rl"][method] = r
            if r["steps"] < steps:
                log(f"compare: {method} stopped at step {r['steps']} by the time budget; the "
                    f"methods after it get {r['steps']} steps")
                steps = max(1, r["steps"])
            evals[method] = _eval_model(method, work / f"rl-{method}-model", x["subset"],
                                        x["ev"], x["reward_fn"], x["seed"])
        except Exception as e:   # one method failing must not lose the others
            traceback.print_exc()
            result["rl"][method] = {"error": f"{type(e).__name__}: {e}"}
            _free_memory()
        ctx["save_partial"]("compare", result)


def _record_comparison(ctx: dict, x: dict, result: dict, evals: Mapping[str, Mapping]) -> None:
    """The comparison tables and intervals (:func:`_comparison_tables`), the budget each method
    got and its errors, into ``result`` and the tracker."""
    plan = ctx["plan"]
    methods = list(plan.rl_methods)
    models, ci = _comparison_tables(x["subset"], evals, x["reward_fn"], plan.bootstrap_resamples,
                                    x["seed"])
    result["models"], result["bootstrap"] = models, ci
    done = [m for m in methods if m in evals]
    result["budget"] = {m: result["rl"][m].get("steps") for m in done}
    result["errors"] = {m: r["error"] for m, r in result["rl"].items() if "error" in r}
    result["equal_budget"] = len({result["budget"][m] for m in done}) <= 1 and len(done) == \
        len(methods)
    result["steps_requested"] = int(plan.rl["steps"])
    for name, mm in models.items():
        ctx["tracker"].metrics(f"compare/eval-{name}", mm)
    for pair, d in ci.items():
        for k, v in d.items():
            ctx["tracker"].metrics(f"compare/bootstrap-{pair}",
                                   {f"{k}/diff": v["diff"], f"{k}/low": v["low"],
                                    f"{k}/high": v["high"]})


def rescore(src: Path, data_dir: Path, out: Path, resamples: int = 2000, seed: int = 42) -> dict:
    """Recompute the comparison's metrics from ``src/generations.jsonl.gz`` with this machine's
    (exact, fp32) MiniLM and the eval records of ``data_dir``; writes ``out/rescored.json``."""
    from hargo.io import read_jsonl
    from hargo.metrics import compute_metrics, score_samples
    from hargo.rewards import RewardConfig, TaskReward

    rows = [json.loads(line) for line in gzip.open(Path(src) / "generations.jsonl.gz", "rt",
                                                    encoding="utf-8")]
    by_id = {r["id"]: r for r in read_jsonl(Path(data_dir) / "eval.jsonl")}
    models: dict[str, list[dict]] = {}
    for r in rows:
        models.setdefault(r["model"], []).append(r)
    first = next(iter(models.values()))
    subset = [by_id[r["id"]] for r in first]
    reward_fn = TaskReward(RewardConfig())
    evals = {}
    for name, rs in models.items():
        if [r["id"] for r in rs] != [s["id"] for s in subset]:
            raise ValueError(f"{name}: answers are not in the same prompt order as the others")
        comps = [r["completion"] for r in rs]
        sc = score_samples(subset, comps, reward_fn)
        m = compute_metrics(subset, comps, rewards=[s["reward"] for s in sc], reward_fn=reward_fn)
        m.pop("dr_confusion", None)
        evals[name] = {"completions": comps, "scored": sc, "metrics": m}
    tables, ci = _comparison_tables(subset, evals, reward_fn, resamples, seed)
    res = {"models": tables, "bootstrap": ci, "source": str(src), "n_prompts": len(subset)}
    Path(out).mkdir(parents=True, exist_ok=True)
    _write_json(Path(out) / "rescored.json", res)
    return res
