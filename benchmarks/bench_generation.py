"""Generation speed: vLLM's offline engine against batched transformers ``generate``, on the same
eval prompts and the same model, with the evaluate stage's code path
(``hargo.evaluation.generate.run_generation``).

    .venv/bin/python benchmarks/bench_generation.py [--model DIR] [--per-task 8]
        [--max-new-tokens N] [--dtype auto|float32|bfloat16] [--batch-size N]

- Model: ``--model``, else ``models/sft`` if complete, else ``models/base`` if complete, else the
  real SmolLM2-135M-Instruct converted once from the embedded GGUF into ``--cache``
  (``/tmp/hargo-bench/smollm2-base``, shared with benchmarks/bench_training.py).
- Prompts: the eval split (``data/prepared/eval.jsonl``), over-long prompts skipped and a seeded
  subset of ``--per-task`` per task drawn exactly as the evaluate stage does.
- Decoding: greedy, ``--max-new-tokens`` (default params ``evaluate.max_new_tokens``), the same
  weights' dtype for both backends (default params ``evaluate.dtype``; ``auto`` is bf16 on a CPU
  with native bf16, else fp32); torch threads ``train.threads`` (``--threads``).
- Each backend runs in its own fresh Python process (nothing shared, and vLLM's process-wide
  settings cannot touch the transformers run). tokens/s = generated tokens (EOS included when
  hit) / generation wall time, model load excluded.

Prints a Markdown table (docs/results.md carries the latest), the vLLM / transformers ratio, and how
many greedy completions the two backends agree on.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def default_model(cache: Path) -> Path:
    """models/sft, else models/base (complete folders), else SmolLM2 converted into ``cache``."""
    for cand in (ROOT / "models" / "sft", ROOT / "models" / "base"):
        if (cand / ".complete").exists():
            return cand
    from hargo.io import atomic_dir
    from hargo.models import smollm2

    out = cache / "smollm2-base"
    if not (out / ".complete").exists():
        print(f"[bench] converting SmolLM2-135M-Instruct into {out}", flush=True)
        with atomic_dir(out) as tmp:
            smollm2.convert(tmp, dtype="float32")
    return out


def worker(spec: dict) -> dict:
    """One backend's run (in its own process): the evaluate stage's generation on ``spec``."""
    os.environ.setdefault("OMP_NUM_THREADS", str(spec["threads"]))
    import torch

    if spec["threads"] > 0:
        torch.set_num_threads(spec["threads"])
    from hargo.evaluation.generate import run_generation

    prompts = json.loads(Path(spec["prompts_file"]).read_text())
    res = run_generation(spec["model"], prompts, spec["evaluate"], spec["backend"],
                         seed=spec["seed"])
    return {"backend": res.backend, "dtype": res.dtype, "prompts": len(prompts),
            "prompt_tokens": sum(res.prompt_tokens),
            "completion_tokens": sum(res.completion_tokens), "load_s": res.load_s,
            "generate_s": res.generate_s, "tokens_per_s": res.tokens_per_s,
            "completions": res.completions}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, default=None, help="model folder (see above)")
    ap.add_argument("--params", type=Path, default=ROOT / "params.yaml")
    ap.add_argument("--eval", type=Path, default=ROOT / "data" / "prepared" / "eval.jsonl")
    ap.add_argument("--per-task", type=int, default=8, help="prompts per task")
    ap.add_argument("--max-new-tokens", type=int, default=None)
    ap.add_argument("--dtype", default=None, help="auto | float32 | bfloat16 (both backends)")
    ap.add_argument("--batch-size", type=int, default=None, help="transformers batch size")
    ap.add_argument("--backends", default="vllm,transformers")
    ap.add_argument("--threads", type=int, default=None,
                    help="torch threads (default params train.threads)")
    ap.add_argument("--cache", type=Path, default=Path("/tmp/hargo-bench"))
    ap.add_argument("--worker", type=Path, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--json", action="store_true",
                    help="end with the last backend's row as one JSON line (for bench_hardware)")
    args = ap.parse_args(argv)

    if args.worker is not None:  # child process: one backend, result as JSON on the last line
        spec = json.loads(args.worker.read_text())
        print("@@RESULT@@" + json.dumps(worker(spec)), flush=True)
        return 0

    from hargo.evaluation.evaluate import load_eval_records, select_prompts
    from hargo.hardware import generation_dtype
    from hargo.params import load_params
    from hargo.models.loading import load_tokenizer

    from hargo.config import as_config, to_plain

    cfg = as_config(load_params(args.params))
    ev = to_plain(cfg.evaluate)
    if args.max_new_tokens is not None:
        ev["max_new_tokens"] = args.max_new_tokens
    if args.batch_size is not None:
        ev["batch_size"] = args.batch_size
    ev["dtype"] = generation_dtype(args.dtype or ev.get("dtype", "auto"))
    ev["temperature"] = 0.0
    ev["samples_per_task"] = args.per_task
    model = args.model or default_model(args.cache)
    if not args.eval.exists():
        print(f"error: {args.eval} not found: run `dvc repro prepare` (or hargo prepare) first",
              file=sys.stderr)
        return 2
    subset, skipped = select_prompts(load_eval_records(args.eval), ev, cfg.seed,
                                     load_tokenizer(model))
    from hargo.hardware import resolve_threads

    threads = resolve_threads(cfg.train.threads if args.threads is None
                              else args.threads)
    print(f"[bench] model {model}; {len(subset)} prompts ({args.per_task} per task, skipped as "
          f"too long: {skipped}); greedy, max_new_tokens {ev['max_new_tokens']}, dtype "
          f"{ev['dtype']}, torch threads {threads}", flush=True)

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        prompts_file = Path(tmp) / "prompts.json"
        prompts_file.write_text(json.dumps([r["prompt"] for r in subset]))
        for backend in args.backends.split(","):
            spec_file = Path(tmp) / f"{backend}.json"
            spec_file.write_text(json.dumps({
                "model": str(model), "prompts_file": str(prompts_file), "evaluate": ev,
                "backend": backend, "seed": cfg.seed, "threads": threads}))
            env = {**os.environ, "OMP_NUM_THREADS": str(threads or os.cpu_count())}
            proc = subprocess.run([sys.executable, __file__, "--worker", str(spec_file)],
                                  env=env, capture_output=True, text=True)
            lines = [x for x in proc.stdout.splitlines() if x.startswith("@@RESULT@@")]
            if proc.returncode != 0 or not lines:
                sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-4000:])
                print(f"error: the {backend} run failed (exit {proc.returncode})",
                      file=sys.stderr)
                return 1
            rows.append(json.loads(lines[-1][len("@@RESULT@@"):]))
            r = rows[-1]
            print(f"[bench] {backend}: {r['completion_tokens']} tokens in "
                  f"{r['generate_s']:.1f} s = {r['tokens_per_s']:.0f} tokens/s "
                  f"(load {r['load_s']:.1f} s)", flush=True)

    print()
    print("| backend | dtype | prompts | prompt tokens | generated tokens | load s | "
          "generate s | generated tokens/s |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['backend']} | {r['dtype']} | {r['prompts']} | {r['prompt_tokens']} | "
              f"{r['completion_tokens']} | {r['load_s']:.1f} | {r['generate_s']:.1f} | "
              f"{r['tokens_per_s']:.0f} |")
    by = {r["backend"]: r for r in rows}
    if "vllm" in by and "transformers" in by:
        v, t = by["vllm"], by["transformers"]
        ratio = v["tokens_per_s"] / t["tokens_per_s"] if t["tokens_per_s"] else float("inf")
        same = sum(a == b for a, b in zip(v["completions"], t["completions"]))
        print(f"\nvLLM / transformers: {ratio:.1f}x generated tokens/s; "
              f"identical greedy completions: {same}/{len(subset)}")
    if args.json and rows:
        print(json.dumps({k: v for k, v in rows[-1].items() if k != "completions"}))
    return 0


if __name__ == "__main__":  # vLLM runs in-process here, but keep the entry point guarded
    sys.exit(main())
