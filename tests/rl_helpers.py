"""Crafted RL inputs shared by tests/test_rl.py and tests/test_rl_distributed.py, and
``free_port`` for every test that starts a process group.

``accelerate_launch`` starts N CPU processes with a shipped accelerate config file
(``configs/accelerate/<name>.yaml``), the launch form docs/gpu.md gives for every stage.

A params builder for a tiny RL run (the small train split with all four tasks is
:func:`hargo.testing.crafted_records`), and a fixed batch of three prompt groups whose
completions are given (not sampled), fed through TRL's ``rollout_func`` hook so that the batch
is the same on 1 process or N.
"""
from __future__ import annotations

import copy
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

from hargo.testing import crafted_record, fixed_groups

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func is "experimental" in TRL

TASKS = ("race_c", "race_fortran", "mlperf", "plp")


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now, for a process group's rendezvous (torchrun's
    ``--master_port``, ``MASTER_PORT``) -- never the fixed 29500 that concurrent runs share."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


ROOT = Path(__file__).resolve().parents[1]
#: The shipped accelerate configs (docs/gpu.md); the suite runs DDP's with gloo on the CPU.
ACCELERATE_CONFIGS = ROOT / "configs" / "accelerate"


def launch_env(**extra: str) -> dict[str, str]:
    """The environment of a launched test run: the caller's, single-threaded, offline, TRL's
    experimental warning silenced, ``tests/`` and the repository on ``PYTHONPATH``; ``extra``
    added. A parent MLflow run id of the calling test is dropped."""
    env = {k: v for k, v in os.environ.items() if k != "HARGO_PARENT_RUN_ID"}
    env.update({"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
                "HF_HUB_OFFLINE": "1", "TRL_EXPERIMENTAL_SILENCE": "1",
                "PYTHONPATH": os.pathsep.join([str(ROOT / "tests"), str(ROOT),
                                               env.get("PYTHONPATH", "")])})
    env.update(extra)
    return env


def accelerate_launch(args, *, config: str = "multi_gpu", nproc: int = 2, cwd=None, env=None,
                      timeout: int = 420) -> subprocess.CompletedProcess:
    """``accelerate launch --config_file configs/accelerate/<config>.yaml --num_processes
    <nproc> <args>`` (``args``: a script and its arguments, or ``["-m", "hargo.cli", ...]``),
    rendezvous on 127.0.0.1 at a free port. On a host without CUDA the DDP config starts
    ``nproc`` gloo processes. Asserts exit status 0 (the message carries both output tails).
    """
    cmd = [sys.executable, "-m", "accelerate.commands.launch",
           "--config_file", str(ACCELERATE_CONFIGS / f"{config}.yaml"),
           "--num_processes", str(nproc), "--main_process_ip", "127.0.0.1",
           "--main_process_port", str(free_port()), *map(str, args)]
    proc = subprocess.run(cmd, cwd=cwd, env=env or launch_env(), capture_output=True,
                          text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-6000:]
    return proc


def _rec(i: int, task: str, content: str, answer: str, label=None) -> dict:
    return crafted_record(i, task, content, answer, label)


def write_jsonl(path: Path, records) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def rl_params(base: dict, model_dir, data_dir, **rl) -> dict:
    """A copy of ``base`` (committed params) set up for a tiny, fast RL run."""
    p = copy.deepcopy(base)
    p["sft"]["out_dir"] = str(model_dir)
    p["data"]["out_dir"] = str(data_dir)
    p["train"].update(max_prompt_tokens=128, threads=1, gradient_checkpointing=False,
                      bf16=False)  # fp32 on every machine (tests/test_hardware.py runs bf16)
    p["rl"].update(samples_per_task=1, steps=2, prompts_per_step=4, num_generations=2,
                   max_new_tokens=4, save_steps=2, log_completions_steps=2,
                   generation_backend="transformers", out_dir="models/rl", max_prompt_tokens=None)
    p["rl"]["lora"]["enabled"] = True
    knobs = {k: rl.pop(k) for k in ("beta", "alpha", "rho", "eps", "eps_w") if k in rl}
    p["rl"].update(rl)
    return set_method_knobs(p, **{"beta": 0.02, **knobs})


def char_reward(completions, **_) -> list[float]:
    """A TRL reward function with contrast even for a random model, and no model of its own:
    the characters of each completion / 10 (conversational or plain completions)."""
    return [len(c[0]["content"] if isinstance(c, list) else c) / 10.0 for c in completions]


#: tasks whose :func:`known_reward` is constant (every group of them has zero variance)
CONSTANT_REWARD = {"race_c": 1.0, "race_fortran": 0.0, "mlperf": 0.5}


def known_reward(completions, task, **_) -> list[float]:
    """A TRL reward function whose zero-variance groups are known in advance: constant per task
    for ``CONSTANT_REWARD``'s tasks; for plp the completion's position in the call / 10, so every
    plp group's rewards differ whatever the model samples."""
    return [CONSTANT_REWARD[t] if t in CONSTANT_REWARD else i / 10.0 for i, t in enumerate(task)]


def set_method_knobs(p: dict, **knobs) -> dict:
    """Set a knob in every ``rl.<method>`` block that has it (``beta`` also sets PPO's
    ``kl_coef``); returns ``p``."""
    from dataclasses import fields

    from hargo.methods import methods

    for m in (m for m in methods() if m.is_rl and m.params_class is not None):
        names = {f.name for f in fields(m.params_class)}
        block = p["rl"][m.name] = dict(p["rl"].get(m.name) or {})
        for k, v in knobs.items():
            if k in names:
                block[k] = v
            if k == "beta" and "kl_coef" in names:
                block["kl_coef"] = v
    return p


# --------------------------------------------------------------- a fixed batch of 3 groups

#: (record, G=4 completions). Group 0: one correct of four (method.md's worked check);
#: group 1: mixed mlperf answers; group 2: all correct (no contrast).
FIXED_GROUPS = fixed_groups(3)
G_FIXED = 4


def fixed_batch_params(committed_params: dict, model_dir, data_dir: Path) -> dict:
    """Params for the fixed 3-group batch (G=4, 12 completions), fp32, beta 0.02: the batch's
    records written to ``data_dir/train.jsonl``, the policy in ``model_dir``."""
    write_jsonl(data_dir / "train.jsonl", [rec for rec, _ in FIXED_GROUPS])
    p = rl_params(committed_params, model_dir, data_dir, num_generations=G_FIXED,
                  prompts_per_step=len(FIXED_GROUPS), max_new_tokens=8)
    p["train"]["bf16"] = False
    return p


def fixed_inputs() -> list[dict]:
    """The 12 per-completion inputs of the fixed batch in TRL's order (each prompt G times)."""
    return [dict(rec) for rec, comps in FIXED_GROUPS for _ in comps]


def fixed_completions() -> list[str]:
    return [c for _, comps in FIXED_GROUPS for c in comps]


def prompt_token_ids(tokenizer, prompt) -> list[int]:
    text = tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def completion_token_ids(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]


def fixed_rollout(prompts, trainer) -> dict:
    """TRL ``rollout_func``: the fixed completions, looked up by the global index of each prompt
    (this process's slice starts at ``process_index * len(prompts)``)."""
    tok = trainer.processing_class
    start = trainer.accelerator.process_index * len(prompts)
    texts = fixed_completions()[start:start + len(prompts)]
    return {"prompt_ids": [prompt_token_ids(tok, p) for p in prompts],
            "completion_ids": [completion_token_ids(tok, t) for t in texts],
            "logprobs": None}
