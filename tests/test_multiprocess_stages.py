"""The ``rl`` and ``sft`` stages launched on 2 CPU processes (gloo) with docs/gpu.md's launch
form and the shipped DDP config, ``accelerate launch --config_file
configs/accelerate/multi_gpu.yaml --num_processes 2 -m hargo.cli <stage> ...``: both processes
train, the step's batch is the *global* batch of params.yaml (not N times it), and only the main
process writes the model, the metrics file, the checkpoint fingerprint and the MLflow run.
"""
from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import yaml

from rl_helpers import (ACCELERATE_CONFIGS, accelerate_launch, free_port, launch_env, rl_params,
                        write_jsonl)

from hargo.testing import crafted_records

TIMEOUT_S = 300


def _launch(project: Path, params: dict, *stage_args: str,
            nproc: int = 2) -> subprocess.CompletedProcess:
    """``accelerate launch --config_file configs/accelerate/multi_gpu.yaml --num_processes N
    -m hargo.cli <stage_args>`` in ``project`` (params.yaml written there), logging to
    ``project/mlflow.db``."""
    (project / "params.yaml").write_text(yaml.safe_dump(params), encoding="utf-8")
    return accelerate_launch(["-m", "hargo.cli", *stage_args, "--params", "params.yaml"],
                             config="multi_gpu", nproc=nproc, cwd=project,
                             env=_env(project), timeout=TIMEOUT_S)


def _env(project: Path, **extra: str) -> dict[str, str]:
    return launch_env(MLFLOW_ENABLE_ASYNC_LOGGING="false",
                      MLFLOW_TRACKING_URI=f"sqlite:///{project / 'mlflow.db'}", **extra)


def _relaunch(project: Path, params: dict, *stage_args: str,
              nproc: int = 2) -> subprocess.CompletedProcess:
    """The plain ``python -m hargo.cli <stage_args>`` (as dvc.yaml's stage commands and the
    Prefect flows run it) with ``$HARGO_ACCELERATE_CONFIG`` naming the shipped DDP config and
    ``$HARGO_ACCELERATE_ARGS`` the process count and rendezvous: the stage re-launches itself
    under ``accelerate launch`` (hargo.training.launch.accelerate_relaunch)."""
    (project / "params.yaml").write_text(yaml.safe_dump(params), encoding="utf-8")
    env = _env(project, HARGO_ACCELERATE_CONFIG=str(ACCELERATE_CONFIGS / "multi_gpu.yaml"),
               HARGO_ACCELERATE_ARGS=f"--num_processes {nproc} --main_process_ip 127.0.0.1 "
                                     f"--main_process_port {free_port()}")
    proc = subprocess.run([sys.executable, "-m", "hargo.cli", *stage_args, "--params",
                           "params.yaml"], cwd=project, env=env, capture_output=True, text=True,
                          timeout=TIMEOUT_S)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-6000:]
    return proc


def _stage_runs(project: Path, experiment: str):
    """(stage runs, pipeline parent runs, client) of the project's MLflow store."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{project / 'mlflow.db'}")
    exp = client.get_experiment_by_name(experiment)
    assert exp is not None
    stages = client.search_runs([exp.experiment_id], "tags.`hargo.kind` = 'stage'")
    parents = client.search_runs([exp.experiment_id], "tags.`hargo.kind` = 'pipeline'")
    return stages, parents, client


def _assert_one_merged_model(parent: Path, name: str, like: Path) -> None:
    """``parent`` holds exactly the finished folder ``name`` (no leftover temporary siblings
    of a second writer); it is a merged plain model with ``like``'s tensor names, and loads."""
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    assert sorted(p.name for p in parent.iterdir()) == [name]
    folder = parent / name
    assert (folder / ".complete").is_file()
    assert not (folder / "adapter_config.json").exists()      # adapter merged
    assert load_file(folder / "model.safetensors").keys() == \
        load_file(like / "model.safetensors").keys()
    model = AutoModelForCausalLM.from_pretrained(str(folder))
    assert model.num_parameters() > 0


def test_rl_stage_on_two_processes(committed_params, tiny_model_dir, tmp_path):
    """rl.prompts_per_step 4 x G=2 = 8 completions per step over 2 processes (4 each): the step
    records 8 completions (16 had each process taken the whole batch); one checkpoint with both
    processes' RNG states, one model, one metrics file, one MLflow stage run under one parent."""
    project = tmp_path / "project"
    write_jsonl(project / "data" / "prepared" / "train.jsonl", crafted_records(per_task=1))
    params = rl_params(committed_params, tiny_model_dir, "data/prepared", steps=2,
                       prompts_per_step=4, num_generations=2, save_steps=1,
                       log_completions_steps=1)
    params["train"]["bf16"] = False
    proc = _launch(project, params, "rl", "--method", "hargo", "-S", "rl.steps=1")

    assert proc.stdout.count("[rl hargo] done: 1 steps") == 1, proc.stdout[-3000:]
    assert proc.stdout.count(", 2 processes") == 1
    _assert_one_merged_model(project / "models" / "rl", "hargo", tiny_model_dir)

    assert sorted(p.name for p in (project / "metrics" / "rl").iterdir()) == ["hargo.json"]
    metrics = json.loads((project / "metrics" / "rl" / "hargo.json").read_text())
    assert metrics["steps"] == 1 and metrics["steps_this_run"] == 1
    assert metrics["completions_per_step"] == 8

    ckpt_root = project / "checkpoints" / "rl" / "hargo"
    assert sorted(p.name for p in ckpt_root.iterdir() if p.name != "README.md") == \
        ["checkpoint-1", "run_fingerprint.json"]          # README.md: TRL's model card
    fingerprint = json.loads((ckpt_root / "run_fingerprint.json").read_text())
    assert fingerprint["method"] == "hargo" and fingerprint["rl"]["steps"] == 1
    ckpt = ckpt_root / "checkpoint-1"
    assert (ckpt / "trainer_state.json").is_file() and (ckpt / "method_state.json").is_file()
    assert sorted(p.name for p in ckpt.glob("rng_state*.pth")) == ["rng_state_0.pth",
                                                                   "rng_state_1.pth"]

    stages, parents, client = _stage_runs(project, params["mlflow"]["experiment"])
    assert len(parents) == 1
    (run,) = stages
    assert run.info.status == "FINISHED"
    assert run.data.tags["hargo.stage"] == "rl" and run.data.tags["hargo.method"] == "hargo"
    assert run.data.params["rl.method"] == "hargo" and run.data.params["rl.steps"] == "1"
    n = client.get_metric_history(run.info.run_id, "all/n_completions")
    assert [(m.step, m.value) for m in n] == [(1, 8.0)]      # the global batch, logged once
    for task in ("race_c", "race_fortran", "mlperf", "plp"):  # one group of G=2 per task
        assert [m.value for m in client.get_metric_history(run.info.run_id,
                                                           f"{task}/n_completions")] == [2.0]
    top = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"hargo.json", "rl_history.json", "plots", "completions"} <= top
    table_path = client.download_artifacts(run.info.run_id, "completions/step_00001.json",
                                           str(tmp_path / "dl"))
    assert len(json.loads(Path(table_path).read_text())["data"]) == 8


def test_sft_stage_on_two_processes(committed_params, tiny_model_dir, tmp_path):
    """8 examples, sft.batch_size 4 = the global batch (2 per process): one epoch is 2 optimizer
    steps (it would be 1 had each process taken 4); the loss is logged once per step. Started
    as DVC and the Prefect gpu pool start it: plain ``hargo sft`` with
    ``$HARGO_ACCELERATE_CONFIG`` set, which re-launches it under accelerate."""
    project = tmp_path / "project"
    write_jsonl(project / "data" / "prepared" / "train.jsonl", crafted_records(per_task=2))
    params = copy.deepcopy(committed_params)
    params["model"]["out_dir"] = str(tiny_model_dir)
    params["train"].update(max_prompt_tokens=128, threads=1, gradient_checkpointing=False,
                           bf16=False)
    params["sft"].update(samples_per_task=2, epochs=1, max_steps=-1, batch_size=4,
                         grad_accum=1, max_length=96, learning_rate=5e-3)
    proc = _relaunch(project, params, "sft")
    launched = [ln for ln in proc.stdout.splitlines() if ln.startswith("[hargo] launching: ")]
    assert len(launched) == 1, proc.stdout[-2000:]           # once: not again inside the launch
    assert "--config_file " + str(ACCELERATE_CONFIGS / "multi_gpu.yaml") in launched[0]
    assert launched[0].endswith("-m hargo.cli sft --params params.yaml")

    _assert_one_merged_model(project / "models", "sft", tiny_model_dir)
    assert sorted(p.name for p in (project / "metrics").iterdir()) == ["sft.json"]
    metrics = json.loads((project / "metrics" / "sft.json").read_text())
    assert metrics["steps"] == 2 and metrics["examples"] == 8, metrics
    assert metrics["examples_per_task"] == {"mlperf": 2, "plp": 2, "race_c": 2,
                                            "race_fortran": 2}

    stages, parents, client = _stage_runs(project, params["mlflow"]["experiment"])
    assert len(parents) == 1, proc.stdout[-2000:]
    (run,) = stages
    assert run.info.status == "FINISHED" and run.data.tags["hargo.stage"] == "sft"
    loss = client.get_metric_history(run.info.run_id, "loss")
    assert [m.step for m in loss] == [1, 2]
    assert client.get_metric_history(run.info.run_id, "sft.steps")[-1].value == 2.0
    assert "sft_loss.png" in {a.path for a in client.list_artifacts(run.info.run_id)}
