"""The RL resume rule (hargo/training/checkpoints.py) as file logic, without training: a run
resumes only a complete checkpoint of the same fingerprint that is short of ``rl.steps``; a
changed learning rate, seed, reward, SFT model or train split starts over in an emptied folder;
keys that do not change what is trained (save_steps, another method's block) do not; a
half-written ``checkpoint-N`` (no ``trainer_state.json``, or no ``method_state.json``) is never
resumed from."""
from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from hargo.config import as_config
from hargo.training.checkpoints import (FINGERPRINT_NAME, METHOD_STATE_NAME, TRAINER_STATE_NAME,
                                        last_checkpoint, prepare_checkpoint_dir,
                                        resumable_checkpoint, run_fingerprint)

pytestmark = pytest.mark.fast

METHOD = "hargo"


def _fingerprint(params: dict, method: str, model: Path, data: Path) -> dict:
    """:func:`run_fingerprint` of the typed config of ``params`` (a params mapping the tests
    change in place), as the rl stage computes it."""
    return run_fingerprint(as_config(params), method, model, data)


@pytest.fixture
def inputs(tmp_path, committed_params):
    """(params with rl.steps = 4, model folder, train split): small stand-in files."""
    model = tmp_path / "sft"
    model.mkdir()
    (model / "model.safetensors").write_bytes(b"weights-v1")
    (model / "config.json").write_text('{"hidden_size": 8}')
    (model / "README.md").write_text("not part of the fingerprint")
    data = tmp_path / "train.jsonl"
    data.write_text('{"id": "a", "task": "plp"}\n')
    params = copy.deepcopy(committed_params)
    params["rl"]["steps"] = 4
    return params, model, data


def _checkpoint(ckpt_dir: Path, step: int, *, method_state=True, trainer_state=True) -> Path:
    p = ckpt_dir / f"checkpoint-{step}"
    p.mkdir(parents=True)
    (p / "model.safetensors").write_bytes(b"x")
    if method_state:
        (p / METHOD_STATE_NAME).write_text(json.dumps({"global_step": step}))
    if trainer_state:
        (p / TRAINER_STATE_NAME).write_text(json.dumps({"global_step": step}))
    return p


def _started(tmp_path, fp, steps=(1, 2)) -> Path:
    """A checkpoint folder as an interrupted run of fingerprint ``fp`` leaves it."""
    d = tmp_path / "checkpoints" / "rl" / METHOD
    assert prepare_checkpoint_dir(d, fp, log=lambda s: None) is None
    for s in steps:
        _checkpoint(d, s)
    return d


def test_same_inputs_resume_the_last_complete_checkpoint(tmp_path, inputs):
    params, model, data = inputs
    fp = _fingerprint(params, METHOD, model, data)
    d = _started(tmp_path, fp)
    assert json.loads((d / FINGERPRINT_NAME).read_text()) == json.loads(json.dumps(fp))
    again = _fingerprint(copy.deepcopy(params), METHOD, model, data)
    assert resumable_checkpoint(d, again) == d / "checkpoint-2"
    logs = []
    assert prepare_checkpoint_dir(d, again, log=logs.append) == d / "checkpoint-2"
    assert logs == [f"[rl] resuming from {d / 'checkpoint-2'}"]
    assert (d / "checkpoint-1").is_dir() and (d / "checkpoint-2").is_dir()   # nothing removed


def _lr(p):
    p["rl"]["learning_rate"] = p["rl"]["learning_rate"] * 2


def _seed(p):
    p["seed"] = p["seed"] + 1


def _alpha(p):
    p["rl"][METHOD]["alpha"] = p["rl"][METHOD]["alpha"] + 0.1


def _train(p):
    p["train"]["max_prompt_tokens"] = p["train"]["max_prompt_tokens"] + 1


def _steps(p):
    p["rl"]["steps"] = 6


@pytest.mark.parametrize("change", [_lr, _seed, _alpha, _train, _steps],
                         ids=["learning_rate", "seed", "own_method_knob", "train", "steps"])
def test_a_changed_training_param_starts_over(tmp_path, inputs, change):
    params, model, data = inputs
    d = _started(tmp_path, _fingerprint(params, METHOD, model, data))
    changed = copy.deepcopy(params)
    change(changed)
    fp = _fingerprint(changed, METHOD, model, data)
    assert resumable_checkpoint(d, fp) is None
    _starts_over(d, fp)


def _starts_over(d: Path, fp: dict) -> None:
    logs = []
    assert prepare_checkpoint_dir(d, fp, log=logs.append) is None
    assert sorted(p.name for p in d.iterdir()) == [FINGERPRINT_NAME]      # old checkpoints gone
    assert json.loads((d / FINGERPRINT_NAME).read_text()) == json.loads(json.dumps(fp))
    assert len(logs) == 1 and "starting over" in logs[0]


@pytest.mark.parametrize("what", ["train_split", "sft_weights", "sft_config"])
def test_changed_data_or_model_starts_over(tmp_path, inputs, what):
    params, model, data = inputs
    d = _started(tmp_path, _fingerprint(params, METHOD, model, data))
    target = {"train_split": data, "sft_weights": model / "model.safetensors",
              "sft_config": model / "config.json"}[what]
    target.write_bytes(target.read_bytes() + b" ")
    fp = _fingerprint(params, METHOD, model, data)
    assert resumable_checkpoint(d, fp) is None
    _starts_over(d, fp)


def _save_steps(p):
    p["rl"]["save_steps"] = p["rl"]["save_steps"] + 1


def _log_steps(p):
    p["rl"]["log_completions_steps"] = 0


def _other_method(p):
    p["rl"]["grpo"]["beta"] = p["rl"]["grpo"]["beta"] + 0.5


@pytest.mark.parametrize("change", [_save_steps, _log_steps, _other_method],
                         ids=["save_steps", "log_completions_steps", "other_method_block"])
def test_keys_that_do_not_change_training_still_resume(tmp_path, inputs, change):
    params, model, data = inputs
    d = _started(tmp_path, _fingerprint(params, METHOD, model, data))
    changed = copy.deepcopy(params)
    change(changed)
    (model / "README.md").write_text("edited")       # not a weight/config file
    assert resumable_checkpoint(d, _fingerprint(changed, METHOD, model, data)) == \
        d / "checkpoint-2"


@pytest.mark.parametrize("missing", [TRAINER_STATE_NAME, METHOD_STATE_NAME])
def test_a_half_written_checkpoint_is_skipped(tmp_path, inputs, missing):
    """Interrupted while saving checkpoint-3: the resume goes back to checkpoint-2."""
    params, model, data = inputs
    fp = _fingerprint(params, METHOD, model, data)
    d = _started(tmp_path, fp)
    _checkpoint(d, 3, method_state=missing != METHOD_STATE_NAME,
                trainer_state=missing != TRAINER_STATE_NAME)
    (d / "checkpoint-x").mkdir()                     # not a checkpoint name
    assert last_checkpoint(d) == d / "checkpoint-2"
    assert resumable_checkpoint(d, fp) == d / "checkpoint-2"
    assert prepare_checkpoint_dir(d, fp, log=lambda s: None) == d / "checkpoint-2"
    # the numeric order, not the string order: checkpoint-10 is after checkpoint-9
    _checkpoint(d, 9)
    _checkpoint(d, 10, trainer_state=False)
    assert last_checkpoint(d) == d / "checkpoint-9"
    _checkpoint(d, 11)
    assert last_checkpoint(d) == d / "checkpoint-11"


def test_only_half_written_checkpoints_start_over(tmp_path, inputs):
    params, model, data = inputs
    fp = _fingerprint(params, METHOD, model, data)
    d = _started(tmp_path, fp, steps=())
    _checkpoint(d, 1, trainer_state=False)
    assert last_checkpoint(d) is None and resumable_checkpoint(d, fp) is None
    _starts_over(d, fp)


def test_a_finished_run_starts_over(tmp_path, inputs):
    """The last checkpoint at rl.steps: the run had finished (DVC re-runs it only when something
    else changed), so it is not resumed (transformers would train past max_steps)."""
    params, model, data = inputs
    fp = _fingerprint(params, METHOD, model, data)
    d = _started(tmp_path, fp, steps=(2, 4))
    assert resumable_checkpoint(d, fp) is None
    _starts_over(d, fp)
    d2 = _started(tmp_path / "b", fp, steps=(2, 3))
    assert resumable_checkpoint(d2, fp) == d2 / "checkpoint-3"


@pytest.mark.parametrize("fingerprint_file", ["missing", "corrupt", "another_method"])
def test_no_or_unreadable_fingerprint_starts_over(tmp_path, inputs, fingerprint_file):
    params, model, data = inputs
    fp = _fingerprint(params, METHOD, model, data)
    d = _started(tmp_path, fp)
    path = d / FINGERPRINT_NAME
    if fingerprint_file == "missing":
        path.unlink()
    elif fingerprint_file == "corrupt":
        path.write_text('{"method": "hargo", ')
    else:
        path.write_text(json.dumps(_fingerprint(params, "grpo", model, data)))
    assert resumable_checkpoint(d, fp) is None
    _starts_over(d, fp)


def test_an_empty_or_absent_folder_starts_quietly(tmp_path, inputs):
    params, model, data = inputs
    fp = _fingerprint(params, METHOD, model, data)
    d = tmp_path / "nowhere"
    logs = []
    assert prepare_checkpoint_dir(d, fp, log=logs.append) is None
    assert logs == [] and sorted(p.name for p in d.iterdir()) == [FINGERPRINT_NAME]
