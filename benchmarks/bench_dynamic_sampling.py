"""Dynamic sampling on the real SFT model: informative groups trained per CPU-second (issue 15)

    PYTHONPATH=. .venv/bin/python benchmarks/bench_dynamic_sampling.py --root <project>
        [--params params.yaml] [--methods grpo,hargo] [--steps 4] [--json out.json]
        [--budget-ab 16]

``<project>`` is a project folder after the main job (``models/sft``, ``data/prepared``). For
each method, runs the ``rl`` stage (:func:`hargo.training.rl.run`, the committed params.yaml
otherwise, its MLflow store a temporary one) with ``rl.dynamic_sampling.enabled`` false and
true, into temporary folders, and prints per run: training seconds; groups trained; of those,
informative ones (rewards not all equal; with dynamic sampling off every zero-variance group is
trained, with it on only the unfilled ones); informative groups per training second (the figure
dynamic sampling is meant to raise: the update only learns from these); groups sampled and
dropped per task; the generation share of the time. ``--budget-ab N`` instead runs each method
with dynamic sampling off twice, with ``rl.max_new_tokens: N`` for every task and with the
params' own (per-task) budgets, and prints training and generation seconds and the final reward
per task of both (docs/operations.md "Completion budgets per task"; figures in docs/results.md).
Run it alone on the machine (2-thread torch with a busy neighbour is ~11x slower) and name the
CPU with the figures.
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def one_run(params: dict, method: str, root: Path, enabled: bool) -> dict:
    from hargo.config import as_config
    from hargo.training import rl

    # Not apply_overrides: rl.dynamic_sampling (a block with defaults) or its enabled key may be
    # absent from the project's own params.yaml, and apply_overrides refuses a key the file lacks.
    p = copy.deepcopy(params)
    p["rl"].setdefault("dynamic_sampling", {})["enabled"] = enabled
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{tmp / 'mlflow.db'}"
        res = rl.run(as_config(p), method, root=root, run_name=f"bench-{method}-{'ds' if enabled else 'off'}",
                     out_dir=tmp / "model", ckpt_dir=tmp / "ckpt",
                     metrics_path=tmp / "metrics.json", keep_history=True)
    cfg = as_config(p)
    G = cfg.rl.num_generations
    per_step = cfg.rl.prompts_per_step
    hist = res["history"]
    trained = per_step * len(hist)
    zero_trained = 0
    for h in hist:
        if enabled:
            zero_trained += int(h.get("all/unfilled_groups") or 0)
        else:
            zero_trained += round((h.get("all/zero_variance_groups") or 0.0) * per_step)
    train_s = res["time"]["train_s"]
    out = {"method": method, "dynamic_sampling": enabled, "steps": res["steps"],
           "G": G, "train_s": train_s, "groups_trained": trained,
           "informative_trained": trained - zero_trained,
           "informative_per_s": (trained - zero_trained) / train_s if train_s else None,
           "generation_s": res["time"]["steps_split_s"].get("generation_s"),
           "zero_variance": {k: v["mean_over_steps"]
                             for k, v in res["zero_variance_groups"].items()},
           "final_reward": {k: v.get("final_reward_mean") for k, v in res["rewards"].items()}}
    if "dynamic_sampling" in res:
        out["sampled_dropped"] = {k: (int(v["sampled_groups"]), int(v["dropped_groups"]))
                                  for k, v in res["dynamic_sampling"]["per_task"].items()}
        out["refill_groups"] = res["dynamic_sampling"]["refill_groups"]
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", required=True, help="project folder after the main job")
    ap.add_argument("--methods", default="grpo,hargo")
    ap.add_argument("--params", default=None,
                    help="params.yaml to use (default: the project's own)")
    ap.add_argument("--steps", type=int, default=None, help="rl.steps (default: params.yaml)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--budget-ab", type=int, default=None, metavar="N",
                    help="compare one budget of N tokens for every task with the params' own")
    a = ap.parse_args(argv)
    from hargo.params import apply_overrides, load_params

    root = Path(a.root).resolve()
    params = load_params(a.params or root / "params.yaml")
    if a.steps:
        params = apply_overrides(params, {"rl.steps": a.steps})
    if a.budget_ab:
        flat = apply_overrides(params, {"rl.max_new_tokens": a.budget_ab})
        ab = [(label, m, one_run(p, m, root, False)) for m in a.methods.split(",")
              for label, p in ((f"{a.budget_ab} for all", flat), ("per task", params))]
        print("\nmethod  budget        train_s  gen_s  final reward per task")
        for label, m, r in ab:
            fr = " ".join(f"{t} {v:.3f}" for t, v in sorted(r["final_reward"].items())
                          if v is not None and t != "all")
            print(f"{m:<7} {label:<12} {r['train_s']:8.1f}  {r['generation_s'] or 0:5.1f}  {fr}")
        if a.json:
            Path(a.json).write_text(json.dumps([r for _, _, r in ab], indent=2))
        return 0
    rows = [one_run(params, m, root, on) for m in a.methods.split(",") for on in (False, True)]
    print("\nmethod  dyn.sampling  train_s  gen_s  trained  informative  informative/s  "
          "sampled/dropped per task")
    for r in rows:
        sd = " ".join(f"{t} {s}/{d}" for t, (s, d) in sorted(r.get("sampled_dropped", {}).items())
                      if t != "all")
        print(f"{r['method']:<7} {'on' if r['dynamic_sampling'] else 'off':<13} "
              f"{r['train_s']:7.1f}  {r['generation_s'] or 0:5.1f}  {r['groups_trained']:7d}  "
              f"{r['informative_trained']:11d}  {r['informative_per_s']:13.3f}  {sd}")
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
