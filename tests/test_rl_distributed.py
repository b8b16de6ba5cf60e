"""HARGO's group statistics are computed over the whole gathered batch: 2 CPU processes (gloo,
launched by ``accelerate launch`` with the shipped DDP config, configs/accelerate/multi_gpu.yaml,
as docs/gpu.md launches every stage) give the same per-response weights, advantages and EMA baseline as 1
process, on a fixed batch whose middle group straddles the two processes (12 completions in
groups of 4, 6 per process: group 1 is completions 4-7); one real training step on that batch
gives the 1-process loss and gradients (DDP's all-reduce included; issue 17). And a 2-process
run resumed mid-epoch 1 (where accelerate's ``set_epoch`` does not reach the sampler) ends on the
uninterrupted run's prompt order, EMA baseline and weights (issue 12).

One launch serves every test here: the module fixture :func:`two_process_run` starts the 2
processes once, and they run the four jobs (fixed-batch scoring, one training step, straight and
resumed training, dynamic sampling) one after the other, each in its own folder; each test reads
its job's result and runs its 1-process counterpart in the test process.

Run as a script, this file is the per-process worker (``accelerate launch ...
test_rl_distributed.py --jobs jobs.json``).
"""
from __future__ import annotations

import argparse
import json
import os
from dataclasses import dataclass
from pathlib import Path

import pytest

from hargo.config import as_config

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
#: one pytest-xdist worker runs this module, so the module fixture launches once
pytestmark = pytest.mark.xdist_group("rl-distributed")


def score_fixed_batch(params: dict, method: str, out_dir: str, world_size: int) -> dict | None:
    """Build the trainer on this process, score its slice of the fixed batch and return the
    gathered weights/advantages, the EMA baseline and every process's EMA baseline (list of
    ``world_size`` floats, gathered), the accelerate distributed type and mixed precision (on
    process 0; None elsewhere)."""
    import torch

    from hargo.training.rl import build_trainer
    from rl_helpers import FIXED_GROUPS, fixed_inputs, fixed_rollout

    trainer = build_trainer(as_config(params), method, params["sft"]["out_dir"],
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
    emas = acc.gather(torch.tensor([trainer.ema.value], dtype=torch.float64))
    if not acc.is_main_process:
        return None
    return {"weights": weights.tolist(), "advantages": adv.tolist(), "ema": trainer.ema.value,
            "ema_per_rank": emas.tolist(),
            "tasks": [trainer.task_names[i] for i in task_ids.tolist()],
            "distributed_type": str(acc.distributed_type),
            "mixed_precision": str(acc.mixed_precision),
            "launch_mixed_precision": os.environ.get("ACCELERATE_MIXED_PRECISION"),
            "backend": str(torch.distributed.get_backend()) if world_size > 1 else None}


class _TaskRecorder:
    def __init__(self):
        self.tasks = []

    def add_generation(self, *, tasks, **_):
        self.tasks.append(list(tasks))

    def add_loss(self, **_):
        pass


def straight_and_resumed(params: dict, method: str, out_dir: str, world_size: int,
                         stop: int) -> dict | None:
    """Train ``params["rl"]["steps"]`` steps straight (a checkpoint after each), then a fresh
    trainer resumed from ``checkpoint-<stop>``; on process 0 return both runs' per-step tasks and
    EMA baselines and the largest difference of their trainable weights (None elsewhere)."""
    from hargo.testing import crafted_records
    from hargo.training.rl import build_trainer
    from rl_helpers import char_reward

    records = crafted_records(per_task=1)[:2]

    def train(out, resume=None):
        rec = _TaskRecorder()
        trainer = build_trainer(as_config(params), method, params["sft"]["out_dir"], records, out,
                                recorder=rec, reward_funcs=[char_reward],
                                save_total_limit=None, world_size=world_size)
        trainer.train(resume_from_checkpoint=resume)
        weights = {n: p.detach().clone() for n, p in trainer.model.named_parameters()
                   if p.requires_grad}
        return weights, rec.tasks, trainer.ema.value, trainer.accelerator.is_main_process

    wa, ta, ea, main = train(Path(out_dir) / "straight")
    wb, tb, eb, _ = train(Path(out_dir) / "resumed",
                          str(Path(out_dir) / "straight" / f"checkpoint-{stop}"))
    if not main:
        return None
    return {"straight_tasks": ta, "resumed_tasks": tb, "straight_ema": ea, "resumed_ema": eb,
            "max_weight_diff": max((wa[k] - wb[k]).abs().max().item() for k in wa),
            "max_lora_b": max(v.abs().max().item() for k, v in wa.items() if "lora_B" in k)}


def one_step_loss_and_grads(params: dict, method: str, out_dir: str, world_size: int) -> dict | None:
    """One real ``trainer.train()`` step on the fixed batch (12 completions, G=4, no shuffle:
    global order = :func:`rl_helpers.fixed_inputs`, 6 per process on 2 processes, so group 1 is
    split 2+2 across them as TRL shards it) with the gradients averaged by DDP (gloo) as in
    training. On process 0 return the logged loss (the mean of the processes' losses), the EMA
    baseline after the step (and every process's, gathered) and save
    the trainable parameters' gradients -- captured in ``on_pre_optimizer_step``, after the
    all-reduce, with clipping off -- to ``<out_dir>/grads.pt``; None elsewhere."""
    import torch
    from transformers import TrainerCallback

    from hargo.training.rl import build_trainer
    from rl_helpers import FIXED_GROUPS, fixed_rollout

    captured: dict = {}

    class Capture(TrainerCallback):
        def on_pre_optimizer_step(self, args, state, control, **kw):
            captured["grads"] = {n: p.grad.detach().clone()
                                 for n, p in trainer.model.named_parameters()
                                 if p.requires_grad and p.grad is not None}

        def on_log(self, args, state, control, logs=None, **kw):
            if logs and "loss" in logs:
                captured["loss"] = float(logs["loss"])

    trainer = build_trainer(as_config(params), method, params["sft"]["out_dir"],
                            [rec for rec, _ in FIXED_GROUPS], Path(out_dir) / "ckpt",
                            callbacks=[Capture()], trainer_kwargs={"rollout_func": fixed_rollout},
                            world_size=world_size, shuffle_dataset=False, max_grad_norm=0.0,
                            save_strategy="no")
    acc = trainer.accelerator
    assert acc.num_processes == world_size, (acc.num_processes, world_size)
    assert trainer.args.per_device_train_batch_size == 12 // world_size
    trainer.train()
    emas = acc.gather(torch.tensor([trainer.ema.value], dtype=torch.float64))
    if not acc.is_main_process:
        return None
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    torch.save(captured["grads"], Path(out_dir) / "grads.pt")
    return {"loss": captured["loss"], "n_grads": len(captured["grads"]),
            "ema": trainer.ema.value, "ema_per_rank": emas.tolist(),
            "backend": str(torch.distributed.get_backend()) if world_size > 1 else None}


def dynamic_sampling_run(params: dict, method: str, out_dir: str, world_size: int) -> dict | None:
    """Train ``params["rl"]["steps"]`` steps with dynamic sampling on (``rl_helpers.known_reward``:
    the zero-variance groups are known); on process 0 return what the recorder got per step
    (trained tasks, the sampled groups of all processes) and the largest LoRA B entry."""
    from hargo.testing import crafted_records
    from hargo.training.rl import build_trainer
    from rl_helpers import known_reward

    class Rec:
        def __init__(self):
            self.gens = []

        def add_generation(self, *, tasks, sampled_groups=None, **_):
            self.gens.append({"tasks": list(tasks), "sampled": sampled_groups})

        def add_loss(self, **_):
            pass

    rec = Rec()
    trainer = build_trainer(as_config(params), method, params["sft"]["out_dir"],
                            crafted_records(per_task=3),
                            Path(out_dir) / "ckpt", recorder=rec, reward_funcs=[known_reward],
                            world_size=world_size, save_strategy="no")
    assert trainer.accelerator.num_processes == world_size
    trainer.train()
    if not trainer.accelerator.is_main_process:
        return None
    return {"gens": rec.gens, "steps": trainer.state.global_step,
            "max_lora_b": max(p.detach().abs().max().item()
                              for n, p in trainer.model.named_parameters() if "lora_B" in n)}


#: The jobs of the one 2-process launch, in the order the processes run them (``_main``).
JOBS = ("weights", "one_step", "resume", "dynamic")


def _job_params(name: str, committed_params: dict, tiny_model_dir, root: Path) -> dict:
    """The params of one job (each test's tiny run, as its test asserts on it)."""
    from rl_helpers import FIXED_GROUPS, G_FIXED, rl_params, write_jsonl

    if name == "weights":
        write_jsonl(root / "data" / "train.jsonl", [rec for rec, _ in FIXED_GROUPS])
        params = rl_params(committed_params, tiny_model_dir, root / "data",
                           num_generations=G_FIXED, prompts_per_step=len(FIXED_GROUPS),
                           max_new_tokens=8, beta=0.0)
        params["train"]["bf16"] = False
    elif name == "one_step":
        write_jsonl(root / "data" / "train.jsonl", [rec for rec, _ in FIXED_GROUPS])
        params = rl_params(committed_params, tiny_model_dir, root / "data", steps=1,
                           num_generations=G_FIXED, prompts_per_step=len(FIXED_GROUPS),
                           max_new_tokens=8, log_completions_steps=0, beta=0.0)
    elif name == "resume":
        params = rl_params(committed_params, tiny_model_dir, ".", steps=4, save_steps=1,
                           prompts_per_step=1, num_generations=2, log_completions_steps=0,
                           learning_rate=5e-3)
        params["seed"] = 42      # epoch 1's prompt order is the reverse of epoch 0's
    elif name == "dynamic":
        params = rl_params(committed_params, tiny_model_dir, ".", steps=3, prompts_per_step=4,
                           num_generations=2, max_new_tokens=3, log_completions_steps=0)
        params["rl"]["dynamic_sampling"] = {"enabled": True, "refill_factor": 2.0,
                                            "max_refills": 1}
    else:
        raise KeyError(name)
    return params


@dataclass
class Job:
    """One job of the shared launch: its params, its folder (``two/`` holds the 2-process
    outputs: ``result.json``, ``grads.pt``) and the 2-process result (process 0's)."""

    params: dict
    root: Path
    result: dict


@pytest.fixture(scope="module")
def two_process_run(committed_params, tiny_model_dir, tmp_path_factory) -> dict[str, Job]:
    """Every job of :data:`JOBS` on 2 gloo CPU processes, started once with ``accelerate
    launch --config_file configs/accelerate/multi_gpu.yaml --num_processes 2`` (the shipped DDP
    config); job name -> :class:`Job`."""
    from rl_helpers import accelerate_launch

    base = tmp_path_factory.mktemp("two-process")
    jobs, spec = {}, []
    for name in JOBS:
        root = base / name
        root.mkdir()
        params = _job_params(name, committed_params, tiny_model_dir, root)
        (root / "params.json").write_text(json.dumps(params))
        spec.append({"job": name, "params": str(root / "params.json"),
                     "out": str(root / "two"), "method": "hargo"})
        jobs[name] = params
    (base / "jobs.json").write_text(json.dumps(spec))
    accelerate_launch([__file__, "--jobs", base / "jobs.json", "--world-size", "2"],
                      config="multi_gpu", nproc=2, timeout=900)
    return {name: Job(jobs[name], base / name,
                      json.loads((base / name / "two" / "result.json").read_text()))
            for name in JOBS}


def test_two_process_dynamic_sampling_refills_whole_groups_on_each_process(two_process_run):
    """Dynamic sampling on 2 processes (4 prompts x G=2 per step, 2 groups per process): every
    process runs the same refill rounds (TRL gathers inside each), keeps its own whole groups,
    and the step trains on exactly prompts_per_step groups, all informative when enough were
    sampled; the zero-variance flags gathered from both processes match the known reward."""
    from rl_helpers import CONSTANT_REWARD

    job = two_process_run["dynamic"]
    assert job.params["rl"]["dynamic_sampling"]["enabled"] is True
    r = job.result
    assert r["steps"] == 3 and len(r["gens"]) == 3
    refilled = 0
    for gen in r["gens"]:
        s = gen["sampled"]
        assert s["zero_variance"] == [t in CONSTANT_REWARD for t in s["tasks"]]
        assert sum(s["kept"]) == 4 and len(gen["tasks"]) == 8
        trained = sorted(gen["tasks"][::2])
        assert trained == sorted(t for t, k in zip(s["tasks"], s["kept"]) if k)
        refilled += any(s["refill"])
        # per process: its own 2 groups first, then its refill groups; each process keeps 2
        # (the gathered list is process 0's groups, then process 1's)
    assert refilled                          # the crafted data makes a refill happen
    assert r["max_lora_b"] > 0               # it trained


def test_two_process_resume_mid_second_epoch_equals_the_uninterrupted_run(two_process_run):
    """2 prompts, 1 per step (an epoch is 2 steps), 4 steps on 2 processes; resumed after
    checkpoint-3 (mid-epoch 1: transformers skips a batch and accelerate's ``set_epoch`` misses
    the sampler behind ``SkipBatchSampler(BatchSamplerShard(...))``; HargoGRPOTrainer sets the
    epoch itself). Tolerance 1e-6 (in practice bit-equal)."""
    job = two_process_run["resume"]
    assert job.params["rl"]["steps"] == 4 and job.params["seed"] == 42
    r = job.result
    ta = r["straight_tasks"]
    assert len(ta) == 4 and ta[:2] != ta[2:]          # epoch 1's order differs: a real check
    assert r["resumed_tasks"] == ta[3:]
    assert r["resumed_ema"] == pytest.approx(r["straight_ema"], abs=1e-9)
    assert r["max_weight_diff"] <= 1e-6
    assert r["max_lora_b"] > 1e-4                       # it trained


def test_two_processes_give_the_one_process_response_weights(two_process_run):
    """The fixed batch scored on 2 processes under the shipped DDP config (accelerate's
    MULTI_GPU type over gloo, mixed precision off: params.yaml's train.bf16 decides) gives the
    1-process weights, advantages and EMA baseline; the group statistics are gathered before
    each process keeps its slice (group 1 straddles the processes and still sums to 1), and
    both processes hold the same EMA baseline."""
    import torch

    from rl_helpers import FIXED_GROUPS, G_FIXED

    job = two_process_run["weights"]
    params, two = job.params, job.result
    one = score_fixed_batch(params, "hargo", str(job.root / "one"), world_size=1)
    assert two["backend"] == "gloo"
    # the shipped DDP config: DDP over GPUs, or over CPU processes where there is no CUDA
    ddp = "MULTI_GPU" if torch.cuda.is_available() else "MULTI_CPU"
    assert two["distributed_type"] == f"DistributedType.{ddp}"
    assert two["launch_mixed_precision"] == "no"     # the config's, set by accelerate launch
    assert two["mixed_precision"] == "no"
    assert len(two["ema_per_rank"]) == 2
    assert two["ema_per_rank"] == pytest.approx([one["ema"]] * 2, abs=1e-7)   # every rank
    assert one["ema"] != pytest.approx(0.0, abs=1e-6)     # a real baseline (set by this batch)
    assert two["tasks"] == one["tasks"] == [rec["task"] for rec, c in FIXED_GROUPS for _ in c]
    assert two["weights"] == pytest.approx(one["weights"], abs=1e-6)
    assert two["advantages"] == pytest.approx(one["advantages"], abs=1e-6)
    assert two["ema"] == pytest.approx(one["ema"], abs=1e-7)
    for g in range(len(FIXED_GROUPS)):   # whole groups, including the straddling one, sum to 1
        assert sum(two["weights"][g * G_FIXED:(g + 1) * G_FIXED]) == pytest.approx(1.0, abs=1e-6)
    assert one["weights"][4:8] != pytest.approx([0.25] * 4, abs=1e-3)   # real contrast there


#: fp32 tolerance of the 1-vs-2-process loss and gradients: relative to the largest gradient /
#: the loss scale (the two runs sum the same terms in a different order; measured: 6e-7 of the
#: largest gradient, 1.4e-7 of the loss; a loss normalised by the local weight sum is off 1.3e-3).
STEP_RTOL = 1e-5


def test_two_processes_give_the_one_process_loss_and_gradients(two_process_run):
    """One real training step (``trainer.train()``, DDP over gloo) of the fixed batch: 3 groups
    of G=4, 6 completions per process, so group 1 (completions 4-7) is split 2+2 across the two
    processes. The logged loss and every trainable parameter's gradient (captured before the
    optimizer step, after DDP's all-reduce; grad clipping off so a scale error is not hidden)
    equal the 1-process run's within ``STEP_RTOL``. fp32 is pinned (``rl_params``:
    ``train.bf16=False``) so the check does not depend on the CPU's bf16 support. Catches what
    the weights test above cannot: a per-process loss normalisation that is wrong only when a
    group is split (dividing by the local weight sum instead of ``N_local = B_local / G``), or a
    loss scaled by the world size (both planted and seen to fail, issue 17)."""
    import torch

    job = two_process_run["one_step"]
    params, two = job.params, job.result
    assert params["train"]["bf16"] is False
    one = one_step_loss_and_grads(params, "hargo", str(job.root / "one"), world_size=1)

    assert two["backend"] == "gloo"
    g1 = torch.load(job.root / "one" / "grads.pt")
    g2 = torch.load(job.root / "two" / "grads.pt")
    assert g1.keys() == g2.keys() and len(g1) == one["n_grads"] > 0
    scale = max(g.abs().max().item() for g in g1.values())
    assert scale > 1e-6                                   # a real gradient to compare
    worst = max((g2[k] - g1[k]).abs().max().item() for k in g1)
    assert worst <= STEP_RTOL * scale, (worst, scale)
    assert abs(one["loss"]) > 1e-6                        # a nonzero loss to compare
    assert two["loss"] == pytest.approx(one["loss"], rel=STEP_RTOL, abs=1e-7)
    # the EMA baseline after the step: the 1-process one, on both processes
    assert two["ema_per_rank"] == pytest.approx([one["ema"]] * 2, abs=1e-7)


def _run_job(job: str, params: dict, method: str, out: str, world_size: int) -> dict | None:
    """One job of :data:`JOBS` on this process (process 0's result; None elsewhere)."""
    if job == "weights":
        return score_fixed_batch(params, method, out, world_size)
    if job == "one_step":
        return one_step_loss_and_grads(params, method, out, world_size)
    if job == "resume":
        return straight_and_resumed(params, method, out, world_size, stop=3)
    if job == "dynamic":
        return dynamic_sampling_run(params, method, out, world_size)
    raise KeyError(job)


def _main() -> None:
    """Worker: run every job of ``--jobs`` (a JSON list of ``{job, params, method, out}``) in
    order, process 0 writing each result to ``<out>/result.json``."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", required=True)
    ap.add_argument("--world-size", type=int, required=True)
    a = ap.parse_args()
    import torch

    torch.set_num_threads(1)
    for spec in json.loads(Path(a.jobs).read_text()):
        params = json.loads(Path(spec["params"]).read_text())
        res = _run_job(spec["job"], params, spec["method"], spec["out"], a.world_size)
        if res is not None:
            Path(spec["out"]).mkdir(parents=True, exist_ok=True)
            (Path(spec["out"]) / "result.json").write_text(json.dumps(res))


if __name__ == "__main__":
    _main()
