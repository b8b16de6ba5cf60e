"""Test scaffolding for the Prefect flow tests: a small copy of the hargo project in a temp folder.

The copy holds what the stages and the flows read relative to the working directory --
``params.yaml``, ``dvc.yaml``, ``prefect.yaml``, the ``hargo`` and ``flows`` sources (``dvc.yaml``
lists the stage code as deps) -- and ``data/raw/hpc-gpt`` with the first ``n`` records of each of
the four real HPC-GPT files, so that every stage sees real data but only a little of it. With
``dvc=True`` it is also a DVC project (``dvc init --no-scm``), as the flows need: they run every
stage through DVC.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Mapping

import yaml

ROOT = Path(__file__).resolve().parents[1]
RAW_FILES = ("task2_c_c++.json", "task2_fortran.json", "task1_ml_perf.json", "task1_plp.json")


def tiny_raw(src: Path, dst: Path, n: int) -> Path:
    """Write the first ``n`` records of each raw file in ``src`` to ``dst`` (same names)."""
    dst.mkdir(parents=True, exist_ok=True)
    for name in RAW_FILES:
        records = json.loads((src / name).read_text(encoding="utf-8"))[:n]
        (dst / name).write_text(json.dumps(records, ensure_ascii=False), encoding="utf-8")
    return dst


def make_project(dst: Path, raw_src: Path, n: int = 40,
                 params_updates: Mapping[str, Any] | None = None, dvc: bool = False) -> Path:
    """Build the project copy in ``dst``; ``params_updates`` (dotted keys) are written into its
    ``params.yaml`` (what ``dvc exp run -S`` would do), the rest stays as committed. ``dvc``:
    ``dvc init --no-scm`` in it (with the repository's ``.dvcignore``; no analytics)."""
    from hargo.params import apply_overrides

    dst.mkdir(parents=True, exist_ok=True)
    for name in ("dvc.yaml", "prefect.yaml", "compare/dvc.yaml"):
        if (ROOT / name).exists():
            (dst / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(ROOT / name, dst / name)
    params = yaml.safe_load((ROOT / "params.yaml").read_text(encoding="utf-8"))
    params = apply_overrides(params, params_updates or {})
    (dst / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False), encoding="utf-8")
    for pkg in ("hargo", "flows"):
        shutil.copytree(ROOT / pkg, dst / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    tiny_raw(raw_src, dst / "data" / "raw" / "hpc-gpt", n)
    if dvc:
        env = {**os.environ, "DVC_NO_ANALYTICS": "1"}
        for args in (["init", "--no-scm", "-q"], ["config", "core.analytics", "false"]):
            proc = subprocess.run([sys.executable, "-m", "dvc", *args], cwd=dst, env=env,
                                  capture_output=True, text=True, timeout=120)
            if proc.returncode != 0:
                raise RuntimeError(f"dvc {' '.join(args)} in {dst} failed:\n"
                                   f"{proc.stdout}\n{proc.stderr}")
        if (ROOT / ".dvcignore").exists():
            shutil.copy(ROOT / ".dvcignore", dst / ".dvcignore")
    return dst


#: The comparison door's methods: one per trainer path through ``compare/dvc.yaml`` -- SFT from
#: the base model (HPC-GPT), PPO's value head, a preference trainer with its pairs (DPO), and the
#: GRPO family twice, for the report's HARGO - GRPO row. KTO, SimPO and Dr. GRPO run the same
#: stage command with another registered method; tests/test_preference_training.py trains KTO
#: and SimPO end to end, tests/test_loss_path.py checks Dr. GRPO's loss against TRL's. Each
#: method here costs the door two stage processes (~35 s of one worker).
DOOR_METHODS = ["hpcgpt", "ppo", "dpo", "grpo", "hargo"]


# Params that make every stage small enough for a test on the tiny random model; the data
# contract bounds follow the size of the tiny raw set (``n`` records per file).
def tiny_overrides(model_dir: Path, n: int = 40) -> dict[str, Any]:
    """Dotted overrides for a whole-pipeline run in seconds, not minutes."""
    return {
        "validate.task_counts": {"race_c": [1, n], "race_fortran": [1, n],
                                 "mlperf": [1, n], "plp": [1, n]},
        "validate.yes_fraction": [0.0, 1.0],
        "data.split.eval_fraction": 0.25,
        "model.source": str(model_dir),
        "train.bf16": False,
        "sft.samples_per_task": 2,
        "sft.max_steps": 1,
        "sft.batch_size": 2,
        "rl.methods": ["hargo"],
        "rl.samples_per_task": 1,
        "rl.steps": 1,
        "rl.prompts_per_step": 2,
        "rl.num_generations": 2,
        "rl.max_new_tokens": 4,
        "rl.save_steps": 1,
        "evaluate.backend": "transformers",
        "evaluate.samples_per_task": 2,
        "evaluate.max_new_tokens": 4,
        # the comparison (compare/dvc.yaml)
        "compare.methods": list(DOOR_METHODS),
        "compare.seeds": [1],
        "compare.samples_per_task": 1,
        "compare.steps": 1,
        "compare.prompts_per_step": 2,
        "compare.preferences.samples_per_task": 2,
        "compare.preferences.max_new_tokens": 6,
        "compare.preferences.backend": "transformers",
        "compare.evaluate.samples_per_task": 2,
        "compare.evaluate.max_new_tokens": 4,
        "compare.report.bootstrap_resamples": 200,
    }


#: The xdist group of the tests that share :func:`dvc_door` (and test_flows' Prefect door):
#: ``scripts/test.sh`` runs ``--dist loadgroup``, so they land on one worker and the tiny
#: pipeline is reproduced once per run, not once per test. xdist hands out the largest work
#: unit first (``--loadscope-reorder``, its default), so this group (~12 min of one worker at
#: 36d0497) starts at once and the other worker's queue fills that time.
PIPELINE_GROUP = "tiny-pipeline"


class Door:
    """A tiny project after a whole main-pipeline run: its ``root``, the ``overrides`` it ran
    with (``flow_project.tiny_overrides``), the MLflow store it logged to (``mlflow_uri``) and
    the environment its DVC commands ran in (``env``)."""

    def __init__(self, root: Path, overrides: dict, mlflow_uri: str, env: dict):
        self.root, self.overrides, self.mlflow_uri, self.env = root, overrides, mlflow_uri, env

    def copy(self, dst: Path) -> Path:
        """A copy of the project (DVC cache and lock included) that a test may change."""
        shutil.copytree(self.root, dst, symlinks=True)
        return dst
