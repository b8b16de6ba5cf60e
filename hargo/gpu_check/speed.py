"""The GPU check's ``speed`` part: seconds per RL step, split into generation / scoring / update.

The CPU benchmark's RL step (``benchmarks/bench_training.py`` ``bench_rl``: 2 prompts x G=4, 16
new tokens) and a GPU-sized one (64 prompts x G=4, up to 128 new tokens), for ``grpo`` and
``hargo`` in the same process, TRL's transformers sampling, bf16 where the device has it:
seconds per step split into generation / scoring / update (the trainer's
:class:`~hargo.training.rl_logging.StepRecorder`), generated tokens/s, prompt+completion tokens/s
through the update, peak GPU memory, and HARGO / GRPO step time.
"""
from __future__ import annotations

import traceback
from typing import Mapping, Sequence

from hargo.gpu_check.common import (_deadline_callback, _free_memory, _now, _peak_gpu_mib,
                                    _peak_rss_mib, _reset_peak, log)


def _history_split(hist: Sequence[Mapping]) -> dict:
    """Mean gen/score/update/step seconds over ``hist`` rows that have them."""
    rows = [h for h in hist if "time/step_s" in h]
    n = max(len(rows), 1)
    tot = lambda k: sum(float(h.get(k, 0.0) or 0.0) for h in rows)  # noqa: E731
    return {"steps": len(rows), "step_s": tot("time/step_s") / n,
            "generation_s": tot("time/generation_s") / n, "scoring_s": tot("time/scoring_s") / n,
            "update_s": tot("time/update_s") / n}


def _speed_one(ctx: dict, size: Mapping, method: str, records: list[dict], tok, end: float
               ) -> dict:
    from hargo.hardware import setup_torch
    from hargo.training.rl import build_trainer
    from hargo.training.rl_logging import RLLoggingCallback, StepRecorder

    from hargo.config import as_config
    from hargo.params import apply_overrides

    p = as_config(apply_overrides(ctx["params"], {"rl.steps": int(size["steps"]),
                                                  "rl.prompts_per_step": int(size["prompts"]),
                                                  "rl.num_generations": int(size["G"]),
                                                  "rl.max_new_tokens": int(size["max_new_tokens"])}))
    setup_torch(p)
    rec = StepRecorder()
    stop = _deadline_callback(end)
    t0 = _now()
    trainer = build_trainer(p, method, ctx["model_dir"], records,
                            ctx["work"] / f"speed-{method}-{size['prompts']}", recorder=rec,
                            callbacks=[RLLoggingCallback(rec, f"speed {method}"), stop],
                            tokenizer=tok)
    setup_s = _now() - t0
    _reset_peak()
    t0 = _now()
    trainer.train()
    train_s = _now() - t0
    hist = rec.history
    steady = hist[1:] if len(hist) > 1 else hist
    split_all, split = _history_split(hist), _history_split(steady)
    gen_tokens = sum(float(h.get("all/completion_length", 0) or 0)
                     * float(h.get("all/n_completions", 0) or 0) for h in steady)
    gen_s_total = split["generation_s"] * max(split["steps"], 1)
    upd_s_total = split_all["update_s"] * max(split_all["steps"], 1)
    row = {
        "size": size["name"], "method": method,
        "batch": f"{size['prompts']}x{size['G']}, <={size['max_new_tokens']} new tokens",
        "bf16": bool(trainer.args.bf16), "device": str(trainer.accelerator.device),
        "steps": len(hist), "steady_steps": split["steps"],
        "setup_s": round(setup_s, 2), "train_s": round(train_s, 2),
        "first_step_s": round(float(hist[0].get("time/step_s", 0.0)), 3) if hist else None,
        "s_per_step": round(split["step_s"], 3),
        "generation_s": round(split["generation_s"], 3),
        "scoring_s": round(split["scoring_s"], 3), "update_s": round(split["update_s"], 3),
        "gen_tokens_per_s": round(gen_tokens / gen_s_total, 1) if gen_s_total > 0 else None,
        "update_tokens_per_s": round(trainer.state.num_input_tokens_seen / upd_s_total, 1)
        if upd_s_total > 0 else None,
        "completion_length": round(sum(float(h.get("all/completion_length", 0) or 0)
                                       for h in steady) / max(len(steady), 1), 1),
        "peak_gpu_mib": _peak_gpu_mib(), "peak_rss_mib": _peak_rss_mib(),
        "stopped_by_deadline": bool(stop.stopped),
    }
    del trainer
    _free_memory()
    return row


def run_speed(ctx: dict) -> dict:
    from hargo.data.records import select_subset
    from hargo.io import read_jsonl
    from hargo.config import as_config
    from hargo.models.loading import load_tokenizer
    from hargo.training.rl import prompt_cap

    plan, end = ctx["plan"], ctx["part_end"]
    cfg = as_config(ctx["params"])
    seed = int(cfg.seed)
    tok = load_tokenizer(ctx["model_dir"])
    train = read_jsonl(ctx["data_dir"] / "train.jsonl")
    rows, skipped, errors = [], [], {}
    for size in plan.speed_sizes:
        records, _ = select_subset(train, size["samples_per_task"], seed, tok,
                                   prompt_cap(cfg))
        for method in ("grpo", "hargo"):
            if _now() > end:
                skipped.append(f"{size['name']}/{method}")
                continue
            log(f"speed: {size['name']} {method}")
            try:
                row = _speed_one(ctx, size, method, records, tok, end)
            except Exception as e:   # e.g. out of memory at one size: keep the other rows
                traceback.print_exc()
                errors[f"{size['name']}/{method}"] = f"{type(e).__name__}: {e}"
                _free_memory()
                continue
            rows.append(row)
            ctx["tracker"].metrics(f"speed/{size['name']}/{method}",
                                   {k: v for k, v in row.items() if isinstance(v, (int, float))})
            log(f"speed {size['name']} {method}: {row['s_per_step']} s/step (gen "
                f"{row['generation_s']}, score {row['scoring_s']}, update {row['update_s']}), "
                f"peak GPU {row['peak_gpu_mib']} MiB")
    ratios = {}
    for size in plan.speed_sizes:
        r = {m: next((x for x in rows if x["size"] == size["name"] and x["method"] == m), None)
             for m in ("grpo", "hargo")}
        if r["grpo"] and r["hargo"] and r["grpo"]["s_per_step"] > 0:
            ratios[size["name"]] = round(r["hargo"]["s_per_step"] / r["grpo"]["s_per_step"], 3)
    if errors and not rows:
        raise RuntimeError(f"every speed run failed: {errors}")
    return {"rows": rows, "hargo_over_grpo_step_time": ratios, "skipped": skipped,
            "errors": errors}
