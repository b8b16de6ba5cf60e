"""Stage ``preferences``: the preference pairs every preference method (DPO, KTO, SimPO) trains on.

As the paper built them (method.md, "Preference baselines"): for each train prompt, sample
``compare.preferences.samples_per_prompt`` (the paper: 2) completions from the SFT model, score
each with the fixed task reward (:class:`hargo.rewards.TaskReward`, the same reward every method
is judged by), and keep the best as ``chosen`` and the worst as ``rejected``. A prompt whose
samples all got the same reward carries no preference: it is dropped and counted (per task).

Steps (params.yaml ``compare.preferences``; paths relative to ``root``):

1. Read ``data.out_dir/train.jsonl`` (:func:`load_train_records`) and the SFT model
   (``sft.out_dir``).
2. Draw ``samples_per_task`` prompts per task with
   :func:`hargo.data.records.select_subset` (seeded by ``seed``; prompts over
   ``train.max_prompt_tokens`` chat-templated tokens are skipped and counted).
3. Sample ``samples_per_prompt`` completions per prompt
   (:func:`hargo.evaluation.generate.run_generation` with ``num_samples``; ``backend`` vllm or
   transformers; ``temperature``, ``max_new_tokens``; engine settings from ``evaluate``).
4. Score, rank and pair (:func:`make_pairs`).
5. Write ``out_dir/pairs.jsonl`` and ``out_dir/stats.json`` whole or not at all
   (:func:`hargo.io.atomic_dir`), inside the MLflow child run ``preferences``.

Pair record (TRL's conversational preference format, plus ours)::

    {"id", "task", "prompt": [messages], "chosen": [{"role": "assistant", "content": ...}],
     "rejected": [{"role": "assistant", "content": ...}], "chosen_reward", "rejected_reward"}
"""
from __future__ import annotations

import math
import time
from collections import Counter
from pathlib import Path
from typing import Any, Mapping, Sequence

from hargo.config import Config, as_section
from hargo.io import HargoInputError, atomic_dir, atomic_write_json, atomic_write_jsonl
from hargo.methods import method_names

__all__ = ["PAIRS_FILE", "STATS_FILE", "check_params", "load_train_records", "make_pairs",
           "generation_params", "run"]

PAIRS_FILE = "pairs.jsonl"
STATS_FILE = "stats.json"


def check_params(params: Config) -> Config:
    """Check that the typed config ``params`` has a ``compare`` section and ``compare.preferences.out_dir`` is a
    non-empty path, which the config does not check; returns ``params``.

    Raises:
        ParamsError: no ``compare`` section, or an empty ``compare.preferences.out_dir``.
    """
    from hargo.params import ParamsError

    as_section(params, "compare", required=True)    # no compare section: refused by name
    out = params.compare.preferences.out_dir
    if not out.strip():
        raise ParamsError(f"compare.preferences.out_dir: expected a non-empty path, got {out!r}")
    return params


def load_train_records(path: str | Path) -> list[dict]:
    """The prepared train split, checked (:func:`hargo.data.records.read_prepared`).

    Raises:
        HargoInputError: missing file, or a bad record (names file, record, field).
    """
    from hargo.data.records import read_prepared

    return read_prepared(path)


def make_pairs(records: Sequence[Mapping], completions: Sequence[str],
               rewards: Sequence[float], samples_per_prompt: int) -> tuple[list[dict], dict]:
    """Rank each prompt's samples by reward; best -> ``chosen``, worst -> ``rejected``.

    Args:
        records: N prompt records (``id``, ``task``, ``prompt``).
        completions: N*k completion strings, prompt-major (prompt i's samples are
            ``completions[i*k:(i+1)*k]``, as :func:`hargo.evaluation.generate.run_generation`
            returns them with ``num_samples=k``).
        rewards: N*k task rewards aligned with ``completions``.
        samples_per_prompt: k >= 2.

    Ties: a prompt whose k rewards are all equal is dropped and counted. Among equal best (or
    worst) rewards the first sample wins, so the result is deterministic.

    Returns:
        ``(pairs, stats)``. ``pairs``: one record per kept prompt, in prompt order (see the
        module docstring); ``chosen_reward >= rejected_reward``, strictly greater. ``stats``:
        ``prompts``, ``pairs``, ``ties_dropped`` (totals), ``per_task`` (task -> ``prompts``,
        ``pairs``, ``ties_dropped``; every task of ``records``, sorted), ``mean_reward_gap``
        (mean of chosen - rejected over the pairs; None without pairs), ``samples_per_prompt``.

    Raises:
        ValueError: k < 2, lengths that are not N*k, or a non-finite reward (names the record).
    """
    k = samples_per_prompt
    if isinstance(k, bool) or not isinstance(k, int) or k < 2:
        raise ValueError(f"samples_per_prompt: must be an integer >= 2, got {k!r}")
    n = len(records)
    if len(completions) != n * k or len(rewards) != n * k:
        raise ValueError(f"make_pairs: {n} prompts x {k} samples need {n * k} completions and "
                         f"rewards, got {len(completions)} and {len(rewards)}")
    pairs: list[dict] = []
    per_task: dict[str, Counter] = {}
    gaps: list[float] = []
    for i, rec in enumerate(records):
        task = rec["task"]
        c = per_task.setdefault(task, Counter(prompts=0, pairs=0, ties_dropped=0))
        c["prompts"] += 1
        rs = [float(x) for x in rewards[i * k:(i + 1) * k]]
        if not all(math.isfinite(x) for x in rs):
            raise ValueError(f"make_pairs: record {i} ({rec.get('id')!r}): non-finite reward "
                             f"in {rs}")
        hi = max(range(k), key=lambda j: (rs[j], -j))   # first of the best
        lo = min(range(k), key=lambda j: (rs[j], j))    # first of the worst
        if rs[hi] == rs[lo]:
            c["ties_dropped"] += 1
            continue
        c["pairs"] += 1
        gaps.append(rs[hi] - rs[lo])
        pairs.append({
            "id": rec["id"], "task": task,
            "prompt": [{"role": m["role"], "content": m["content"]} for m in rec["prompt"]],
            "chosen": [{"role": "assistant", "content": completions[i * k + hi]}],
            "rejected": [{"role": "assistant", "content": completions[i * k + lo]}],
            "chosen_reward": rs[hi], "rejected_reward": rs[lo],
        })
    stats = {
        "prompts": n, "pairs": len(pairs),
        "ties_dropped": sum(c["ties_dropped"] for c in per_task.values()),
        "per_task": {t: dict(per_task[t]) for t in sorted(per_task)},
        "mean_reward_gap": sum(gaps) / len(gaps) if gaps else None,
        "samples_per_prompt": k,
    }
    return pairs, stats


def generation_params(params: Config) -> dict:
    """The ``params_evaluate``-style block :func:`run_generation` reads: decoding from
    ``compare.preferences`` (``temperature``, ``max_new_tokens``), the engine settings (dtype,
    batch size, KV cache, GPU memory share, eager mode) from ``evaluate`` (a key params.yaml
    leaves out has the config's default, the same as :func:`run_generation`'s); ``params``: the
    typed config."""
    ev, pref = params.evaluate, params.compare.preferences
    out = {"dtype": ev.dtype, "batch_size": ev.batch_size, "kv_cache_gib": ev.kv_cache_gib,
           "gpu_memory_utilization": ev.gpu_memory_utilization,
           "enforce_eager": ev.enforce_eager}
    out.update(temperature=float(pref.temperature), max_new_tokens=int(pref.max_new_tokens))
    return out


def run(params: Config, root: str | Path = ".") -> dict[str, Any]:
    """Stage ``preferences`` (see the module docstring; ``params``: the typed config); returns the stats written (plus the
    output folder under ``out_dir``).

    Raises:
        ParamsError: bad ``compare.preferences`` params (before any work).
        FileNotFoundError: the SFT model folder is missing or incomplete.
        HargoInputError: missing or malformed train split, or every prompt over
            ``train.max_prompt_tokens``.
        VLLMUnavailableError: backend vllm where vLLM is not installed.
    """
    from hargo import tracking
    from hargo.evaluation.generate import run_generation
    from hargo.data.records import select_subset
    from hargo.models.loading import load_tokenizer, resolve_model_dir

    t_start = time.perf_counter()
    cfg = check_params(params)
    root = Path(root)
    pref = cfg.compare.preferences
    seed, k, backend = int(cfg.seed), int(pref.samples_per_prompt), pref.backend
    model_dir = resolve_model_dir(root / cfg.sft.out_dir)
    train_path = root / cfg.data.out_dir / "train.jsonl"
    records = load_train_records(train_path)
    tok = load_tokenizer(model_dir)
    cap = int(cfg.train.max_prompt_tokens)
    subset, skipped = select_subset(records, pref.samples_per_task, seed, tok, cap)
    if not subset:
        raise HargoInputError(train_path, f"every prompt is longer than train.max_prompt_tokens="
                              f"{cap} tokens (skipped: {skipped})")
    out_dir = root / pref.out_dir
    with tracking.stage_run("preferences", cfg, root) as mlrun:
        print(f"[preferences] {len(subset)} prompts x {k} samples from {model_dir} "
              f"({backend}, temperature {pref.temperature}, {pref.max_new_tokens} new "
              f"tokens; {sum(skipped.values())} skipped as too long)", flush=True)
        gen = run_generation(model_dir, [r["prompt"] for r in subset], generation_params(cfg),
                             backend, seed=seed, num_samples=k,
                             param_names=("train.max_prompt_tokens",
                                          "compare.preferences.max_new_tokens"))
        rewards, reward_s = _task_rewards(cfg, subset, gen.completions, k)
        pairs, stats = make_pairs(subset, gen.completions, rewards, k)
        _require_pairs(cfg, pairs, stats, k)
        stats.update({
            "skipped_too_long": skipped, "max_prompt_tokens": cap, "seed": seed,
            "backend": gen.backend, "dtype": gen.dtype,
            "temperature": float(pref.temperature),
            "max_new_tokens": int(pref.max_new_tokens),
            "model": str(cfg.sft.out_dir),
            "completion_tokens": sum(gen.completion_tokens),
            "time": {"load_s": round(gen.load_s, 3), "generate_s": round(gen.generate_s, 3),
                     "reward_s": round(reward_s, 3),
                     "total_s": round(time.perf_counter() - t_start, 3)},
        })
        with atomic_dir(out_dir) as tmp:
            atomic_write_jsonl(tmp / PAIRS_FILE, pairs)
            atomic_write_json(tmp / STATS_FILE, stats)
        _log_to_mlflow(stats, gen.generate_s, out_dir)
    gap = stats["mean_reward_gap"]
    ties = ", ".join(f"{t} {c['ties_dropped']}" for t, c in stats["per_task"].items())
    gap_s = "n/a" if gap is None else f"{gap:.3f}"
    print(f"[preferences] {stats['pairs']} pairs, {stats['ties_dropped']} ties dropped ({ties}), "
          f"mean reward gap {gap_s} -> {out_dir}", flush=True)
    if not pairs:
        print("[preferences] no pairs: every prompt's samples tied (no preference method is "
              "in compare.methods, so nothing needs them)", flush=True)
    return {**stats, "out_dir": str(out_dir), "run_id": mlrun.info.run_id}


def _task_rewards(cfg: Config, subset: list[dict], completions: list[str], k: int
                  ) -> tuple[list[float], float]:
    """The task reward of each of the ``k`` completions per prompt of ``subset`` (prompt-major,
    as generated), and the seconds it took."""
    from hargo.rewards import RewardConfig, TaskReward

    rep = [r for r in subset for _ in range(k)]
    t0 = time.perf_counter()
    reward = TaskReward(RewardConfig.from_params(cfg.rewards))
    rewards = reward(prompts=[r.get("prompt") for r in rep],
                     completions=completions, task=[r["task"] for r in rep],
                     answer=[r.get("answer") for r in rep], label=[r.get("label") for r in rep])
    return rewards, time.perf_counter() - t0


def _require_pairs(cfg: Config, pairs: list[dict], stats: Mapping, k: int) -> None:
    """Raises ValueError when no pair came out but ``compare.methods`` lists a preference method
    (fail here, not later in compare_train; nothing is written)."""
    needing = [m for m in cfg.compare.methods if m in method_names("preference")]
    if not pairs and needing:
        raise ValueError(
            f"preferences: 0 pairs from {stats['prompts']} prompts (every prompt's "
            f"{k} samples tied on the task reward; ties per task: "
            f"{ {t: c['ties_dropped'] for t, c in stats['per_task'].items()} }), but "
            f"compare.methods lists {', '.join(needing)}, which train on pairs: raise "
            "compare.preferences.samples_per_task, temperature or max_new_tokens")


def _log_to_mlflow(stats: Mapping, generate_s: float, out_dir: Path) -> None:
    """The stage's metrics (``preferences/...``, per task too) and its two files, into the
    active run."""
    import mlflow

    metrics = {"pairs": stats["pairs"], "prompts": stats["prompts"],
               "ties_dropped": stats["ties_dropped"],
               "completion_tokens": stats["completion_tokens"],
               "generate_s": generate_s}
    if stats["mean_reward_gap"] is not None:
        metrics["mean_reward_gap"] = stats["mean_reward_gap"]
    for t, c in stats["per_task"].items():
        metrics.update({f"{t}/pairs": c["pairs"], f"{t}/ties_dropped": c["ties_dropped"]})
    mlflow.log_metrics({f"preferences/{m}": float(v) for m, v in metrics.items()})
    mlflow.log_artifact(str(out_dir / STATS_FILE), artifact_path="preferences")
    mlflow.log_artifact(str(out_dir / PAIRS_FILE), artifact_path="preferences")
