"""Training throughput on the real SmolLM2-135M-Instruct with the committed params.

    .venv/bin/python benchmarks/bench_training.py [--steps 6] [--only sft] [--params params.yaml]

Each benchmark runs in its own fresh Python process (so ``ru_maxrss``, the peak resident memory,
is that benchmark's own) and returns one table row; the rows are printed as a Markdown table
(docs/results.md carries the latest). Benchmarks register in ``BENCHMARKS``: ``name -> function(params,
base_dir, train_path, steps) -> dict``.

- ``sft``: TRL SFTTrainer with the committed ``sft.*`` / ``train.*`` params (LoRA or full, bf16
  if the CPU has native bf16) on the committed subset of ``data/prepared/train.jsonl``, for
  ``--steps`` optimizer steps. tokens/s counts non-padding prompt + completion tokens through
  forward, backward and optimizer step, over the training loop's wall time; tokens/cpu-s over
  its CPU time (with one thread: the rate on an otherwise idle machine; this machine is shared).

The real model folder is converted once from the embedded GGUF into ``--cache``
(default ``/tmp/hargo-bench``) and reused.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Mapping

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def real_base_dir(cache: Path) -> Path:
    """The converted real SmolLM2 folder under ``cache`` (converted on first use)."""
    from hargo.io import atomic_dir
    from hargo.models import smollm2

    out = cache / "smollm2-base"
    if not (out / ".complete").exists():
        with atomic_dir(out) as tmp:
            smollm2.convert(tmp, dtype="float32")
    return out


def bench_sft(params: Mapping, base_dir: Path, train_path: Path, steps: int) -> dict[str, Any]:
    """SFT tokens/s, s/step and peak memory for ``steps`` steps with the committed params."""
    from hargo.config import as_config
    from hargo.data.records import read_prepared, select_subset
    from hargo.models import loading
    from hargo.params import apply_overrides
    from hargo.training import sft

    p = apply_overrides(dict(params), {"sft.max_steps": steps})
    cfg = as_config(p)
    tok = loading.load_tokenizer(base_dir)
    subset, skipped = select_subset(read_prepared(train_path), cfg.sft.samples_per_task,
                                    cfg.seed, tok, cfg.train.max_prompt_tokens)
    m = sft.train(cfg, base_dir, subset, out_dir=None, report_to=())
    s = cfg.sft
    return {
        "benchmark": "SFT step (fwd+bwd+opt)",
        "mode": f"LoRA r={s.lora.r}" if s.lora.enabled else "full",
        "batch": f"{s.batch_size}x{s.grad_accum}",
        "bf16": m["bf16"], "threads": cfg.train.threads,
        "steps": m["steps"],
        "s/step": round(m["train_seconds"] / max(m["steps"], 1), 2),
        "cpu s/step": round(m["train_cpu_seconds"] / max(m["steps"], 1), 2),
        "tokens/s": m["tokens_per_s"],
        "tokens/cpu-s": round(m["tokens"] / m["train_cpu_seconds"], 1),
        "gen tokens/s": "-",
        "peak RSS MiB": m["peak_rss_mb"],
        "loss first->last": f"{m['initial_loss']:.3f}->{m['final_loss']:.3f}",
    }


BENCHMARKS: dict[str, Callable[..., dict[str, Any]]] = {"sft": bench_sft}


def print_table(rows: list[dict[str, Any]]) -> str:
    """Print ``rows`` as one Markdown table (columns: the union of keys, in first-seen order)."""
    cols: list[str] = []
    for r in rows:
        cols += [k for k in r if k not in cols]
    lines = ["| " + " | ".join(cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    for r in rows:
        lines.append("| " + " | ".join(str(r.get(c, "")) for c in cols) + " |")
    text = "\n".join(lines)
    print(text)
    return text


def _run_one(name: str, args: argparse.Namespace) -> dict[str, Any]:
    """Run benchmark ``name`` in a fresh process; returns its row (its last stdout line, JSON)."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--one", name, "--steps",
           str(args.steps), "--params", str(args.params), "--cache", str(args.cache),
           "--train", str(args.train)] + (["--profile", args.profile] if args.profile else [])
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, cwd=ROOT)
    if proc.returncode != 0:
        return {"benchmark": name, "error": f"exit {proc.returncode}"}
    row = json.loads(proc.stdout.strip().splitlines()[-1])
    row["process s"] = round(time.perf_counter() - t0, 1)
    return row


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--params", type=Path, default=ROOT / "params.yaml")
    ap.add_argument("--train", type=Path, default=None,
                    help="prepared train split (default: <data.out_dir>/train.jsonl)")
    ap.add_argument("--steps", type=int, default=6, help="optimizer steps per benchmark")
    ap.add_argument("--cache", type=Path, default=Path("/tmp/hargo-bench"))
    ap.add_argument("--only", action="append", choices=sorted(BENCHMARKS), default=None)
    ap.add_argument("--one", choices=sorted(BENCHMARKS), help=argparse.SUPPRESS)
    ap.add_argument("--profile", default=None, choices=["cpu", "cpu-bf16"],
                    help="simulate a CPU hardware profile (cpu-bf16 on an AVX2 CPU: emulated bf16)")
    args = ap.parse_args(argv)

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from hargo.config import as_config, as_section
    from hargo.params import load_params

    params = load_params(args.params)
    if args.train is None:
        args.train = ROOT / as_section(params, "data").out_dir / "train.jsonl"
    if args.one:
        from hargo import hardware

        if args.profile:   # benchmark-only: what a forced profile costs on this CPU
            hardware.detect_profile = lambda: hardware.PROFILES[args.profile]
        hardware.setup_torch(as_config(params))
        row = BENCHMARKS[args.one](params, real_base_dir(args.cache), args.train, args.steps)
        sys.stdout.flush()
        print("\n" + json.dumps(row))
        return
    real_base_dir(args.cache)  # convert once, outside the timed processes
    rows = [_run_one(name, args) for name in (args.only or list(BENCHMARKS))]
    print()
    print_table(rows)


def bench_rl(params: Mapping, base_dir: Path, train_path: Path, steps: int,
             backend: str = "transformers", method: str = "hargo") -> dict[str, Any]:
    """One RL run of ``steps`` steps with the committed ``rl.*``/``train.*`` params (method
    ``hargo``: the reference forward always runs), no MLflow. Reports s/step split into rollout
    generation, scoring (reference log-probs + rewards + weights) and update (policy forward,
    backward, optimizer), generated tokens/s, prompt+completion tokens/s through the update, and
    the process's peak RSS. The real SmolLM2 base stands in for the SFT model (same size)."""
    import resource

    from hargo.config import as_config, to_plain
    from hargo.data.records import select_subset
    from hargo.models import loading
    from hargo.generation_budget import describe_budget
    from hargo.params import apply_overrides
    from hargo.training.rl import build_trainer, load_rl_records, prompt_cap
    from hargo.training.rl_logging import RLLoggingCallback, StepRecorder

    p = apply_overrides(dict(params), {"rl.steps": steps, "rl.generation_backend": backend,
                                       "rl.save_steps": 10 ** 6})
    cfg = as_config(p)
    rl = cfg.rl
    tok = loading.load_tokenizer(base_dir)
    subset, _ = select_subset(load_rl_records(train_path), rl.samples_per_task,
                                     cfg.seed, tok, prompt_cap(cfg))
    rec = StepRecorder()
    cache = Path(os.environ.get("TMPDIR", "/tmp")) / "hargo-bench-rl"
    t0 = time.perf_counter()
    trainer = build_trainer(cfg, method, base_dir, subset, cache / f"{method}-{backend}",
                            recorder=rec, callbacks=[RLLoggingCallback(rec, method)],
                            tokenizer=tok)
    setup_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    trainer.train()
    train_s = time.perf_counter() - t0
    hist = rec.history
    n = max(len(hist), 1)
    tot = lambda k: sum(h.get(k, 0.0) for h in hist)  # noqa: E731
    gen_tokens = sum(h["all/completion_length"] * h["all/n_completions"] for h in hist)
    # steady state: without the first step (allocator and engine warm-up)
    steady = hist[1:] or hist
    return {
        "benchmark": f"RL step ({method}, {backend})",
        "mode": f"LoRA r={rl.lora.r}" if rl.lora.enabled else "full",
        "batch": f"{rl.prompts_per_step}x{rl.num_generations}, {to_plain(rl.max_new_tokens)} new,"
                 f" prompts<={describe_budget(prompt_cap(cfg))}",
        "bf16": bool(trainer.args.bf16), "threads": cfg.train.threads,
        "steps": len(hist),
        "s/step": round(train_s / n, 2),
        "steady s/step": round(sum(h["time/step_s"] for h in steady) / len(steady), 2),
        "gen s/step": round(tot("time/generation_s") / n, 2),
        "score s/step": round(tot("time/scoring_s") / n, 2),
        "update s/step": round(tot("time/update_s") / n, 2),
        "tokens/s": round(trainer.state.num_input_tokens_seen / max(tot("time/update_s"), 1e-9), 1),
        "gen tokens/s": round(gen_tokens / max(tot("time/generation_s"), 1e-9), 1),
        "setup s": round(setup_s, 1),
        "peak RSS MiB": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
    }


BENCHMARKS.update({
    "rl": bench_rl,
    "rl_vllm": lambda params, base_dir, train_path, steps: bench_rl(params, base_dir, train_path,
                                                                    steps, backend="vllm"),
})


if __name__ == "__main__":
    main()
