"""A refused setting never costs a finished run (issue 42, item 5): every check of an rl run's
settings -- the params stage's, PEFT's, TRL's and the trainer's own -- happens before the stage
touches its checkpoint folder (``prepare_checkpoint_dir`` clears a finished or stale run) or the
MLflow store. Before the fix the trainer was built after the folder was cleared, so
``-S 'rl.lora.target_modules=[lm_head]'`` printed "no resumable checkpoint ... starting over",
deleted the checkpoints, and only then failed."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from rl_helpers import rl_params, write_jsonl

from hargo.params import ParamsError
from hargo.testing import crafted_records
from hargo.config import as_config


def _tree(folder: Path) -> dict[str, str]:
    """Every file and folder under ``folder``: path -> sha256 of its bytes ("dir" for a folder)."""
    return {str(p.relative_to(folder)): "dir" if p.is_dir()
            else hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.rglob("*"))}


def _finished_run(ckpt: Path) -> None:
    """A finished run's checkpoint folder as the rl stage leaves it (the contents stand in for
    the real weights: any fingerprint but the new run's makes the stage clear the folder)."""
    step = ckpt / "checkpoint-2"
    step.mkdir(parents=True)
    (ckpt / "run_fingerprint.json").write_text(json.dumps({"method": "grpo", "rl": {"steps": 2}}))
    (step / "trainer_state.json").write_text(json.dumps({"global_step": 2}))
    (step / "method_state.json").write_text("{}")
    (step / "adapter_model.safetensors").write_bytes(bytes(range(256)) * 64)


def _gpt2_model(folder: Path, tokenizer_dir: Path) -> Path:
    """A tiny GPT-2 (its attention is ``c_attn``/``c_proj``: no ``q_proj``), as a hub model with
    other module names would be, marked complete."""
    from transformers import AutoTokenizer, GPT2Config, GPT2LMHeadModel

    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    GPT2LMHeadModel(GPT2Config(vocab_size=len(tok), n_embd=32, n_layer=1, n_head=2,
                               n_positions=512)).save_pretrained(folder)
    tok.save_pretrained(folder)
    (folder / ".complete").write_text("ok\n")
    return folder


class _ThreeProcesses:
    """``launch_state()`` of the main process of 3 (what ``accelerate launch --num_processes 3``
    gives), for a batch that does not split over them."""
    num_processes, process_index, is_main = 3, 0, True

    def wait_for_everyone(self):
        raise AssertionError("the refusal comes before the processes meet")


@pytest.mark.parametrize("case", ["tied_lora_target", "target_the_model_lacks",
                                  "batch_does_not_split"])
def test_a_refused_setting_leaves_the_checkpoints_byte_identical(
        case, committed_params, tiny_model_dir, tiny_tokenizer_dir, tmp_path, mlflow_uri,
        monkeypatch, capsys):
    from mlflow.tracking import MlflowClient

    from hargo.training import launch, rl

    root = tmp_path / "project"
    data = write_jsonl(tmp_path / "data" / "train.jsonl", crafted_records(per_task=1)).parent
    params = rl_params(committed_params, tiny_model_dir, data, steps=2)
    if case == "tied_lora_target":          # the reported case: refused at the params stage
        params["rl"]["lora"]["target_modules"] = ["lm_head"]
        error, match = ParamsError, r"rl\.lora\.target_modules: 'lm_head' is one of the tied"
    elif case == "target_the_model_lacks":   # PEFT's refusal, when the trainer is built
        params["sft"]["out_dir"] = str(_gpt2_model(tmp_path / "gpt2", tiny_tokenizer_dir))
        params["rl"]["lora"]["target_modules"] = ["q_proj"]
        error, match = ValueError, r"q_proj.*not found in the base model"
    else:                                    # 4 prompts x G=2 over 3 processes
        monkeypatch.setattr(launch, "launch_state", _ThreeProcesses)
        error, match = ParamsError, r"rl\.prompts_per_step: .* do not split over 3 processes"
    ckpt = root / "checkpoints" / "rl" / "grpo"
    _finished_run(ckpt)
    before = _tree(root)
    with pytest.raises(error, match=match):
        rl.run(as_config(params), "grpo", root=root)
    assert _tree(root) == before
    assert "starting over" not in capsys.readouterr().out
    client = MlflowClient(mlflow_uri)        # and no stage run was opened for it
    assert client.search_runs([e.experiment_id for e in client.search_experiments()]) == []
