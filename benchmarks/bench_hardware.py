"""Threads x dtype x a busy neighbour, for an SFT step, an RL step and evaluation, on this CPU.

    .venv/bin/python benchmarks/bench_hardware.py [--only sft,rl,eval] [--timeout 180]
        [--threads 1,2] [--dtypes float32,bfloat16] [--busy-dtypes native|all]

Why: ``train.threads`` decides how many OpenMP threads torch uses. On a quiet 2-core machine two
threads are faster than one; with another process keeping one core busy, two spinning OpenMP
threads wait on each other and a step gets many times slower. This benchmark measures both, so
the default (``auto``, :func:`hargo.hardware.auto_threads`) follows numbers, not a guess.

Cells (each in a fresh process, the real SmolLM2-135M-Instruct, the committed params otherwise):

- ``sft``: ``benchmarks/bench_training.py --one sft`` (``--sft-steps`` optimizer steps): s/step.
- ``rl``: ``benchmarks/bench_training.py --one rl`` (method hargo, transformers rollout,
  ``--rl-steps`` steps): s/step (generation + scoring + update).
- ``eval``: ``benchmarks/bench_generation.py`` with the transformers backend (where torch's
  threads apply) on ``--eval-per-task`` eval prompts per task: generation seconds and tokens/s.
  vLLM's CPU engine binds its own OpenMP threads (one core is reserved for its scheduler), so
  ``train.threads`` does not change it; run bench_generation.py for vLLM's figures.

For every workload: threads in ``--threads`` x dtypes in ``--dtypes`` on a quiet machine, then
the same threads with a busy neighbour (a process spinning on one core) for the machine's
native dtype only (``--busy-dtypes native``; ``all`` for every dtype). bf16 on a CPU without
native bf16 is forced through ``--profile cpu-bf16`` (emulated: slower, shown for the record).
A cell that runs past ``--timeout`` seconds is stopped and reported as ``> T``.

Run it alone: anything else on the machine is a busy neighbour. It prints the CPU it ran on and
what ``auto`` chooses with and without the neighbour.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
HERE = Path(__file__).resolve().parent


class BusyNeighbour:
    """A child process that keeps one core busy (a pure-Python spin loop) while in the block."""

    def __enter__(self):
        self.proc = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        time.sleep(0.5)
        return self

    def __exit__(self, *exc):
        self.proc.kill()
        self.proc.wait()


def _last_json(stdout: str) -> dict:
    for line in reversed(stdout.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            return json.loads(line)
        if line.startswith("@@RESULT@@"):
            return json.loads(line[len("@@RESULT@@"):])
    raise ValueError("no result line")


def _cell(cmd: list[str], timeout: float, env: dict) -> tuple[dict | None, float, str]:
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              cwd=ROOT, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return None, time.perf_counter() - t0, f"> {timeout:.0f} s"
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout[-2000:] + proc.stderr[-3000:])
        return None, wall, f"exit {proc.returncode}"
    try:
        return _last_json(proc.stdout), wall, ""
    except ValueError:
        sys.stderr.write(proc.stdout[-2000:])
        return None, wall, "no result"


def run_cell(workload: str, threads: int, dtype: str, busy: bool, args, params: dict,
             tmp: Path, native: bool) -> dict:
    """One cell of the matrix; returns its table row."""
    from hargo.params import apply_overrides

    p = apply_overrides(params, {"train.threads": threads, "train.bf16": dtype == "bfloat16"})
    pfile = tmp / f"params-{workload}-{threads}-{dtype}-{int(busy)}.yaml"
    pfile.write_text(yaml.safe_dump(p))
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "TOKENIZERS_PARALLELISM": "false"}
    profile = ["--profile", "cpu-bf16" if dtype == "bfloat16" else "cpu"]
    if workload in ("sft", "rl"):
        steps = args.sft_steps if workload == "sft" else args.rl_steps
        cmd = [sys.executable, str(HERE / "bench_training.py"), "--one", workload, "--steps",
               str(steps), "--params", str(pfile), "--cache", str(args.cache), *profile]
    else:
        cmd = [sys.executable, str(HERE / "bench_generation.py"), "--backends", "transformers",
               "--params", str(pfile), "--per-task", str(args.eval_per_task), "--threads",
               str(threads), "--dtype", dtype, "--cache", str(args.cache),
               "--max-new-tokens", str(args.eval_max_new_tokens), "--json",
               "--model", str(args.cache / "smollm2-base")]
    if busy:
        with BusyNeighbour():
            res, wall, err = _cell(cmd, args.timeout, env)
    else:
        res, wall, err = _cell(cmd, args.timeout, env)
    row = {"workload": workload, "threads": threads,
           "dtype": dtype + ("" if dtype == "float32" or native else " (emulated)"),
           "neighbour": "busy core" if busy else "quiet"}
    if res is None:
        row.update({"s/step or s": err, "tokens/s": "-", "process s": round(wall, 1)})
    elif workload in ("sft", "rl"):
        row.update({"s/step or s": res["s/step"], "tokens/s": res["tokens/s"],
                    "process s": round(wall, 1)})
    else:
        row.update({"s/step or s": round(res["generate_s"], 2),
                    "tokens/s": round(res["tokens_per_s"], 1), "process s": round(wall, 1)})
    print(f"[bench] {json.dumps(row)}", flush=True)
    return row


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--params", type=Path, default=ROOT / "params.yaml")
    ap.add_argument("--only", default="sft,rl,eval")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--busy-dtypes", choices=["native", "all"], default="native")
    ap.add_argument("--timeout", type=float, default=180.0, help="seconds per cell")
    ap.add_argument("--sft-steps", type=int, default=3)
    ap.add_argument("--rl-steps", type=int, default=2)
    ap.add_argument("--eval-per-task", type=int, default=2)
    ap.add_argument("--eval-max-new-tokens", type=int, default=32)
    ap.add_argument("--cache", type=Path, default=Path("/tmp/hargo-bench"))
    ap.add_argument("--dry-run", action="store_true", help="print the cells, run nothing")
    args = ap.parse_args(argv)

    from hargo import hardware
    from hargo.params import load_params

    params = load_params(args.params)
    native = hardware.detect_profile().native_bf16
    native_dtype = "bfloat16" if native else "float32"
    threads = [int(t) for t in args.threads.split(",")]
    dtypes = args.dtypes.split(",")
    cells = []
    for w in args.only.split(","):
        cells += [(w, t, d, False) for d in dtypes for t in threads]
        busy_dtypes = dtypes if args.busy_dtypes == "all" else [native_dtype]
        cells += [(w, t, d, True) for d in busy_dtypes for t in threads]
    quiet_auto = hardware.resolve_threads("auto")
    with BusyNeighbour():
        busy_auto = hardware.resolve_threads("auto")
    header = (f"CPU: {hardware.describe_cpu()}; profile {hardware.detect_profile().name}; "
              f"train.threads auto -> {quiet_auto} (quiet), {busy_auto} (one core busy)")
    print(f"[bench] {header}", flush=True)
    if args.dry_run:
        for c in cells:
            print("[bench] cell", c)
        return []
    from bench_training import real_base_dir

    real_base_dir(args.cache)   # convert once, outside the timed cells
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for w, t, d, busy in cells:
            rows.append(run_cell(w, t, d, busy, args, params, Path(tmp), native))
    from bench_training import print_table

    print()
    print(header)
    print()
    print_table(rows)
    return rows


if __name__ == "__main__":
    main()
