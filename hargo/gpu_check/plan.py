"""The sizes of every part of the GPU check (:func:`make_plan`: the GPU run or the dry run) and
the params they start from (params.yaml as committed, pointed at the check's model and data)."""
from __future__ import annotations

from pathlib import Path

from hargo.gpu_check.common import ROOT


class Plan:
    """Sizes of every part, for the GPU run or the dry run (``make_plan``)."""

    def __init__(self, **kw):
        self.__dict__.update(kw)

    def as_dict(self) -> dict:
        return dict(self.__dict__)


def make_plan(dry_run: bool, cuda: bool) -> Plan:
    """The sizes of the run. ``dry_run``: a handful of prompts and 1-2 steps each."""
    if cuda:
        device_variants = [("cuda-fp32", "fp32", {"bf16": False}),
                           ("cuda-bf16", "bf16", {"bf16": True})]
    else:
        device_variants = [("cpu-fp32-again", "fp32", {"use_cpu": True, "bf16": False,
                                                       "dataloader_pin_memory": False})]
    if dry_run:
        return Plan(
            dry_run=True, threads=1, device_variants=device_variants,
            speed_sizes=[{"name": "cpu-bench", "prompts": 2, "G": 4, "max_new_tokens": 16,
                          "steps": 2, "samples_per_task": 2},
                         {"name": "gpu-size (dry: 4x2, 8 tokens)", "prompts": 4, "G": 2,
                          "max_new_tokens": 8, "steps": 1, "samples_per_task": 2}],
            sft={"samples_per_task": 2, "batch_size": 4, "max_steps": 2, "epochs": 1},
            rl={"steps": 1, "prompts_per_step": 2, "num_generations": 4, "max_new_tokens": 8,
                "samples_per_task": None},
            eval={"samples_per_task": 2, "max_new_tokens": 8, "batch_size": 8},
            rl_methods=["grpo", "dr_grpo", "hargo"], bootstrap_resamples=200,
            synthetic={"train_per_task": 3, "eval_per_task": 2})
    return Plan(
        dry_run=False, threads="auto", device_variants=device_variants,
        speed_sizes=[{"name": "cpu-bench", "prompts": 2, "G": 4, "max_new_tokens": 16,
                      "steps": 4, "samples_per_task": 4},
                     {"name": "gpu-size", "prompts": 64, "G": 4, "max_new_tokens": 128,
                      "steps": 3, "samples_per_task": 48}],
        sft={"samples_per_task": None, "batch_size": 16, "max_steps": -1, "epochs": 1},
        rl={"steps": 50, "prompts_per_step": 16, "num_generations": 4, "max_new_tokens": 48,
            "samples_per_task": None, "max_prompt_tokens": None},   # None: train's 384 tokens
        eval={"samples_per_task": None, "max_new_tokens": 48, "batch_size": 64},
        rl_methods=["grpo", "dr_grpo", "hargo"], bootstrap_resamples=2000, synthetic=None)


def _base_params(plan: Plan, model_dir: Path, data_dir: Path) -> dict:
    """params.yaml as committed, pointed at ``model_dir`` (as the SFT model) and ``data_dir``,
    with no checkpoints or completion tables unless asked."""
    from hargo.params import apply_overrides, load_params

    return apply_overrides(load_params(ROOT / "params.yaml"), {
        "sft.out_dir": str(model_dir), "model.out_dir": str(model_dir),
        "data.out_dir": str(data_dir), "train.threads": plan.threads,
        "train.gradient_checkpointing": False, "rl.generation_backend": "transformers",
        "rl.save_steps": 10 ** 6, "rl.log_completions_steps": 0})
