"""Sweep RL knobs of the synthetic test bed over seeds, from the SFT policy in ``--root``.

The test bed's defaults (``synthetic.rl``: learning rate, steps, G, ...) are chosen from sweeps
like this one, never from one run. Each grid point is trained with every method and seed given,
by the test bed's own ``train_run`` (the project's trainers, the same evaluation), and evaluated
every ``synthetic.evaluate.every_steps`` steps, greedy and (``synthetic.evaluate.samples`` = k)
as the mean reward of k samples at the training temperature. Results are appended to a JSON-lines
file (one line a run, so an interrupted sweep keeps what it finished and resumes: a run already
in the file is skipped), then a table per (grid point, method, step) of mean +- sample std over
seeds is printed.

Needs ``data/synthetic`` and ``models/synthetic/sft`` (``dvc repro synthetic/dvc.yaml:synthetic_sft``);
``--root`` points at another root holding both (e.g. an SFT variant). Grid keys may be any
``synthetic.rl.*``, ``synthetic.evaluate.*`` or ``rl.<method>.*`` param (also a loss knob
params.yaml does not spell, e.g. ``rl.grpo.aggregation``: :func:`load_run_params`); ``synthetic.data``,
``.policy`` and ``.sft`` change the SFT policy and are refused in ``--grid``; without
``--train-sft`` the sweep trains no SFT: it starts from whatever policy ``<root>/models/synthetic/sft`` holds (a variant under
another root, or the last ``synthetic_sft`` run, whatever params it had), and such keys given
with ``-S`` must describe how that policy was trained (the held-out pool's offset reads
``synthetic.sft.examples_per_task``). Every grid point is checked against the params before any
run starts. ``--train-sft`` first prepares the data and trains the SFT policy under ``--root``
with the ``-S`` values (unless ``--root`` has one), and prints its per-task SFT rewards.

    python benchmarks/synthetic_sweep.py --config heterogeneous --methods grpo --seeds 1 2 3 \\
        --grid synthetic.rl.learning_rate=2e-4,1e-4,5e-5 -S synthetic.rl.steps=150 \\
        -S synthetic.evaluate.every_steps=50 -S synthetic.evaluate.samples=4 \\
        --workers 2 --out metrics/synthetic/sweeps/lr.jsonl

``--workers 2`` runs two runs at once with one torch thread each (on a 2-core AMX Xeon ~1.3x
the runs per hour of one two-thread run at a time; a run's numbers depend on its thread count).
Report the CPU (``grep -o 'avx512_bf16\\|amx_bf16' /proc/cpuinfo``).
"""
from __future__ import annotations

import argparse
import itertools
import json
import multiprocessing as mp
import os
import sys
import time
from pathlib import Path

_FORBIDDEN = ("synthetic.data", "synthetic.policy", "synthetic.sft", "seed")


def _parse_grid(items: list[str]) -> list[tuple[str, list[str]]]:
    out = []
    for it in items:
        key, _, values = it.partition("=")
        if not values:
            raise SystemExit(f"--grid {it!r}: expected key=v1,v2,...")
        out.append((key, values.split(",")))
    return out


def _shapes_sft(key: str) -> bool:
    """Whether ``key`` changes the SFT policy or its data (``_FORBIDDEN``)."""
    return any(key == f or key.startswith(f + ".") for f in _FORBIDDEN)


def _check_key(key: str) -> None:
    if _shapes_sft(key):
        raise SystemExit(f"{key}: changes the SFT policy or data; train a variant under --root")


def _points(grid: list[tuple[str, list[str]]]) -> list[dict[str, str]]:
    keys = [k for k, _ in grid]
    return [dict(zip(keys, combo)) for combo in itertools.product(*[v for _, v in grid])] or [{}]


def _run_key(point: dict, method: str, seed: int, config: str, policy: str) -> str:
    """A run's identity in ``--out``: its overrides, method, seed, configuration and the SFT
    policy it starts from (``policy``: the model digest, so two roots never share a run)."""
    return json.dumps({"point": point, "method": method, "seed": seed, "config": config,
                       "policy": policy}, sort_keys=True)


def load_run_params(params_path: str, overrides: list[str]) -> dict:
    """``load_params(params_path, overrides)``, except that an ``rl.<method>.<key>`` override
    may name a key (or a method block) that params.yaml does not spell: a GRPO-family block's
    optional loss knobs (``aggregation``, ``std``, ``std_scope``, ``std_eps``) or a method run
    with its defaults. Such a key is added, then set and checked like every other.

    Raises:
        ParamsError: a bad key or value (named)."""
    from hargo.config.loading import apply_overrides, read_params_file
    from hargo.params import validate_params

    raw = read_params_file(params_path)
    for item in overrides:
        parts = item.partition("=")[0].strip().split(".")
        if len(parts) == 3 and parts[0] == "rl" and isinstance(raw.get("rl"), dict):
            block = raw["rl"].setdefault(parts[1], {})
            if isinstance(block, dict):
                block.setdefault(parts[2], None)
    params = apply_overrides(raw, overrides)
    validate_params(params)
    return params


def _worker(job) -> dict:
    params_path, sets, point, method, seed, config, root, threads, policy = job
    os.environ.setdefault("OMP_NUM_THREADS", str(threads))
    import torch

    torch.set_num_threads(threads)
    from hargo.compare.synthetic import train_run
    from hargo.compare.synthetic_data import read_split
    from hargo.compare.synthetic_plan import MODEL_DIR, plan
    from hargo.config import as_config
    from hargo.models.loading import resolve_model_dir

    overrides = list(sets) + [f"{k}={v}" for k, v in point.items()] + [f"train.threads={threads}"]
    params = as_config(load_run_params(params_path, overrides))
    p = plan(params)
    root = Path(root)
    from hargo.training.divergence import TrainingDiverged

    train, ev = read_split(root, "train"), read_split(root, "eval")
    row = {"key": _run_key(point, method, seed, config, policy), "point": point,
           "method": method, "seed": seed, "config": config, "root": str(root),
           "policy": policy}
    try:
        run = train_run(params, p, config, method, seed, train, ev,
                        resolve_model_dir(root / MODEL_DIR), print_fn=lambda *a, **k: None)
    except TrainingDiverged as e:
        # a run the divergence guard (train.divergence) stopped is a result, not a crash of
        # the whole sweep: recorded (so a resume does not train it again), never scored
        return {**row, "run": None, "diverged": str(e)}
    ev = run.pop("eval")   # per-prompt completions: not needed; the per-prompt rewards are
    run["eval"] = {k: ev[k] for k in ("ids", "tasks", "reward", "correct") if k in ev}
    return {**row, "run": run}


def _table(rows: list[dict], tasks: tuple[str, ...]) -> str:
    from hargo.stats import mean_std

    groups: dict[tuple, list[dict]] = {}
    for r in (r for r in rows if r.get("run")):   # a diverged run has no scores
        groups.setdefault((json.dumps(r["point"], sort_keys=True), r["method"]), []).append(r)
    metrics = ["all/reward"] + [f"{t}/reward" for t in tasks] + ["all/sampled_reward"] + \
        [f"{t}/sampled_reward" for t in tasks]
    head = ["point", "method", "step", "n"] + metrics
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for (point, method), rs in sorted(groups.items()):
        steps = sorted({c["step"] for r in rs for c in r["run"]["eval_curve"]})
        for step in steps:
            cells = []
            for m in metrics:
                vals = [c[m] for r in rs for c in r["run"]["eval_curve"]
                        if c["step"] == step and m in c]
                if not vals:
                    cells.append("-")
                    continue
                mean, std = mean_std(vals)
                cells.append(f"{mean:.3f} +- {std:.3f}" if len(vals) > 1 else f"{mean:.3f}")
            n = sum(1 for r in rs if any(c["step"] == step for c in r["run"]["eval_curve"]))
            lines.append("| " + " | ".join([point, method, str(step), str(n)] + cells) + " |")
    return "\n".join(lines)


def _train_sft(params_path: str, sets: list[str], root: Path) -> None:
    """``synthetic_data`` and ``synthetic_sft`` under ``root`` with the ``-S`` values, unless
    ``root`` already holds an SFT policy (then its per-task SFT rewards are printed again)."""
    from hargo.compare.synthetic import train_sft
    from hargo.compare.synthetic_data import prepare_data
    from hargo.compare.synthetic_plan import METRICS_DIR, MODEL_DIR
    from hargo.config import load_config

    metrics = root / METRICS_DIR / "sft.json"
    if not (root / MODEL_DIR).exists() or not metrics.exists():
        params = load_config(params_path, sets)
        t0 = time.perf_counter()
        prepare_data(params, root)
        train_sft(params, root)
        print(f"[sweep] SFT policy trained under {root} in {time.perf_counter() - t0:.0f} s",
              flush=True)
    else:
        print(f"[sweep] {root} holds an SFT policy already; not retrained", flush=True)
    ev = json.loads(metrics.read_text())["eval"]
    for name, e in ev.items():
        s = e["summary"]
        print(f"[sweep] SFT eval ({name}, greedy): " +
              ", ".join(f"{k} {v:.3f}" for k, v in sorted(s.items())), flush=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--params", default="params.yaml")
    ap.add_argument("--config", default="heterogeneous", choices=["heterogeneous", "homogeneous"])
    ap.add_argument("--methods", nargs="+", default=["grpo"])
    ap.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3])
    ap.add_argument("--grid", action="append", default=[], help="key=v1,v2,... (repeatable)")
    ap.add_argument("-S", "--set", dest="sets", action="append", default=[],
                    help="a fixed override key=value (repeatable)")
    ap.add_argument("--root", default=".", help="folder holding data/synthetic and models/synthetic")
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--out", required=True, help="JSON-lines results (appended; resumable)")
    ap.add_argument("--table-only", action="store_true", help="print the table of --out and exit")
    ap.add_argument("--train-sft", action="store_true",
                    help="first prepare the data and train the SFT policy under --root with the "
                         "-S values (synthetic_data + synthetic_sft), unless --root has one")
    a = ap.parse_args(argv)
    grid = _parse_grid(a.grid)
    for key, _ in grid:
        _check_key(key)
    from hargo.data.synthetic import SYNTHETIC_TASKS

    from hargo.compare.synthetic_plan import plan
    from hargo.config import as_config
    from hargo.params import ParamsError

    for s in a.sets:
        key = s.partition("=")[0]
        if _shapes_sft(key) and not a.train_sft:
            print(f"[sweep] -S {key}: describes the SFT policy in {a.root}; the sweep does not "
                  "retrain it", flush=True)
    for pt in _points(grid):   # a bad value fails here, naming the key, before any run
        try:
            plan(as_config(load_run_params(a.params,
                                           a.sets + [f"{k}={v}" for k, v in pt.items()])))
        except (ParamsError, ValueError) as e:
            raise SystemExit(f"error: {e}")
    if a.train_sft:
        _train_sft(a.params, a.sets, Path(a.root))
    out = Path(a.out)
    done = []
    if out.exists():
        done = [json.loads(x) for x in out.read_text().splitlines() if x.strip()]
    if not a.table_only:
        # the fixed overrides are part of a run's identity too
        points = [{**dict(s.partition("=")[::2] for s in a.sets), **pt} for pt in _points(grid)]
        from hargo.compare.synthetic_plan import MODEL_DIR
        from hargo.models.loading import model_digest, resolve_model_dir

        policy = model_digest(resolve_model_dir(Path(a.root) / MODEL_DIR))
        have = {r["key"] for r in done}
        jobs = [(a.params, [], pt, m, s, a.config, a.root, 1 if a.workers > 1 else 2, policy)
                for pt in points for s in a.seeds for m in a.methods
                if _run_key(pt, m, s, a.config, policy) not in have]
        print(f"[sweep] {len(jobs)} runs to train ({len(done)} in {out} already); "
              f"{a.workers} worker(s)", flush=True)
        out.parent.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        ctx = mp.get_context("spawn")
        with ctx.Pool(a.workers) as pool, out.open("a") as f:
            for i, r in enumerate(pool.imap_unordered(_worker, jobs), 1):
                f.write(json.dumps(r) + "\n")
                f.flush()
                done.append(r)
                if r["run"] is None:
                    print(f"[sweep] {i}/{len(jobs)} {r['point']} {r['method']} s{r['seed']}: "
                          f"DIVERGED ({r['diverged']})", flush=True)
                    continue
                s = r["run"]["eval_summary"]
                sampled = (f" sampled {s['all/sampled_reward']:.3f}"
                           if "all/sampled_reward" in s else "")
                print(f"[sweep] {i}/{len(jobs)} {r['point']} {r['method']} s{r['seed']}: "
                      f"greedy {s['all/reward']:.3f}{sampled} train {r['run']['train_s']:.0f} s "
                      f"({time.perf_counter() - t0:.0f} s)", flush=True)
    rows = [r for r in done if r["config"] == a.config and r["method"] in a.methods]
    if len({r.get("policy") for r in rows}) > 1:
        print(f"[sweep] note: {out} holds runs from {len({r.get('policy') for r in rows})} SFT "
              "policies; the table groups them by overrides only")
    print(_table(rows, SYNTHETIC_TASKS))
    return 0


if __name__ == "__main__":
    sys.exit(main())
