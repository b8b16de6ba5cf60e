"""HARGO's group statistics are computed over the whole gathered batch: 2 CPU processes (gloo,
launched by torchrun) give the same per-response weights, advantages and EMA baseline as 1
process, on a fixed batch whose middle group straddles the two processes (12 completions in
groups of 4, 6 per process: group 1 is completions 4-7).

Run as a script, this file is the per-process worker (``torchrun ... test_rl_distributed.py``).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def score_fixed_batch(params: dict, method: str, out_dir: str, world_size: int) -> dict | None:
    """Build the trainer on this process, score its slice of the fixed batch and return the
    gathered weights/advantages and the EMA baseline (on process 0; None elsewhere)."""
    import torch

    from hargo.training.rl import build_trainer
    from rl_helpers import FIXED_GROUPS, fixed_inputs, fixed_rollout

    trainer = build_trainer(params, method, params["sft"]["out_dir"],
                            [rec for rec, _ in FIXED_GROUPS], Path(out_dir) / "ckpt",
                            trainer_kwargs={"rollout_func": fixed_rollout}, world_size=world_size)
    trainer.model.train()
    acc = trainer.accelerator
    assert acc.num_processes == world_size, (acc.num_processes, world_size)
    inputs = fixed_inputs()
    n = len(inputs) // world_size
    out = trainer._generate_and_score_completions(inputs[acc.process_index * n:
                                                         (acc.process_index + 1) * n])
    assert out["response_weights"].shape == (n,)
    weights = acc.gather(out["response_weights"])
    adv = acc.gather(out["advantages"])
    task_ids = acc.gather(out["task_ids"])
    if not acc.is_main_process:
        return None
    return {"weights": weights.tolist(), "advantages": adv.tolist(), "ema": trainer.ema.value,
            "tasks": [trainer.task_names[i] for i in task_ids.tolist()],
            "backend": str(torch.distributed.get_backend()) if world_size > 1 else None}


def test_two_processes_give_the_one_process_response_weights(committed_params, tiny_model_dir,
                                                          tmp_path):
    import pytest

    from rl_helpers import FIXED_GROUPS, G_FIXED, free_port, rl_params, write_jsonl

    write_jsonl(tmp_path / "data" / "train.jsonl", [rec for rec, _ in FIXED_GROUPS])
    params = rl_params(committed_params, tiny_model_dir, tmp_path / "data",
                       num_generations=G_FIXED, prompts_per_step=len(FIXED_GROUPS),
                       max_new_tokens=8, beta=0.0)
    params["train"]["bf16"] = False
    (tmp_path / "params.json").write_text(json.dumps(params))

    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
           "TRL_EXPERIMENTAL_SILENCE": "1", "PYTHONWARNINGS": "ignore",
           "PYTHONPATH": os.pathsep.join([str(HERE), str(ROOT), os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
           "--master_addr", "127.0.0.1", "--master_port", str(free_port()), __file__,
           "--params", str(tmp_path / "params.json"), "--method", "hargo",
           "--out", str(tmp_path / "two"), "--world-size", "2"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=420)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    two = json.loads((tmp_path / "two" / "result.json").read_text())

    one = score_fixed_batch(params, "hargo", str(tmp_path / "one"), world_size=1)
    assert two["backend"] == "gloo"
    assert two["tasks"] == one["tasks"] == [rec["task"] for rec, c in FIXED_GROUPS for _ in c]
    assert two["weights"] == pytest.approx(one["weights"], abs=1e-6)
    assert two["advantages"] == pytest.approx(one["advantages"], abs=1e-6)
    assert two["ema"] == pytest.approx(one["ema"], abs=1e-7)
    for g in range(len(FIXED_GROUPS)):   # whole groups, including the straddling one, sum to 1
        assert sum(two["weights"][g * G_FIXED:(g + 1) * G_FIXED]) == pytest.approx(1.0, abs=1e-6)
    assert one["weights"][4:8] != pytest.approx([0.25] * 4, abs=1e-3)   # real contrast there


def _main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--params", required=True)
    ap.add_argument("--method", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--world-size", type=int, required=True)
    a = ap.parse_args()
    import torch

    torch.set_num_threads(1)
    params = json.loads(Path(a.params).read_text())
    res = score_fixed_batch(params, a.method, a.out, a.world_size)
    if res is not None:
        Path(a.out).mkdir(parents=True, exist_ok=True)
        (Path(a.out) / "result.json").write_text(json.dumps(res))


if __name__ == "__main__":
    _main()
