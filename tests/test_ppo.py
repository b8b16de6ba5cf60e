"""PPO baseline (hargo.training.ppo): the config block, and 2 PPO steps of the tiny random model
through ``rl.build_trainer(..., "ppo")``: the value head trains, checkpoints hold it, the saved
merged model loads and generates. PPO's math (token rewards, GAE, whitening, the clipped losses,
explained variance) is tested by hand in tests/test_losses.py."""
from __future__ import annotations

import copy
import json
import math

import pytest
import torch

from rl_helpers import TASKS, rl_params, write_jsonl

from hargo.config import as_config
from hargo.methods import method_params
from hargo.testing import crafted_records


# ------------------------------------------------------------------------------ config

def test_ppo_config_from_committed_params_and_errors(committed_params):
    from hargo.params import ParamsError
    from hargo.training.trl_options import trl_loss_settings

    block = committed_params["rl"]["ppo"]
    cfg = method_params(committed_params, "ppo")
    assert cfg.to_dict() == {k: block[k] for k in ("kl_coef", "vf_coef", "gamma", "lam",
                                                   "cliprange_value", "whiten_advantages")}
    assert cfg.kl_coef == 0.02 and cfg.vf_coef == 0.1 and cfg.lam == 0.95
    bad = copy.deepcopy(committed_params)
    bad["rl"]["ppo"]["lam"] = 1.5
    with pytest.raises(ParamsError, match=r"rl\.ppo\.lam: must be <= 1.0, got 1.5"):
        method_params(bad, "ppo")
    bad["rl"]["ppo"]["lam"] = "high"
    with pytest.raises(ParamsError, match=r"rl\.ppo\.lam: expected a number, got 'high'"):
        method_params(bad, "ppo")
    bad["rl"]["ppo"]["lam"] = 0.9
    bad["rl"]["ppo"]["lamda"] = 0.9
    with pytest.raises(ParamsError, match=r"rl\.ppo: unknown key\(s\) lamda"):
        method_params(bad, "ppo")
    del bad["rl"]["ppo"]      # an absent block takes the defaults (an older params.yaml)
    assert method_params(bad, "ppo") == type(cfg)()
    assert trl_loss_settings("ppo") == {"loss_type": "grpo", "scale_rewards": "group"}


# ------------------------------------------------------------------------- integration

@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("prepared-ppo")
    write_jsonl(d / "train.jsonl", crafted_records(per_task=1))
    return d


def test_ppo_trains_value_head_and_saves_loadable_model(committed_params, tiny_model_dir,
                                                        data_dir, tmp_path):
    from safetensors import safe_open

    from hargo.evaluation.generate import run_generation
    from hargo.models.loading import save_merged
    from hargo.training.checkpoints import read_method_state
    from hargo.training.ppo import HargoPPOTrainer
    from hargo.training.rl import build_trainer, load_rl_records
    from hargo.training.rl_logging import RLLoggingCallback, StepRecorder

    params = rl_params(committed_params, tiny_model_dir, data_dir, steps=2, num_generations=2,
                       prompts_per_step=4, save_steps=2)
    params["train"]["bf16"] = False
    records = load_rl_records(data_dir / "train.jsonl")
    rec = StepRecorder()
    trainer = build_trainer(as_config(params), "ppo", tiny_model_dir, records, tmp_path / "ckpt",
                            recorder=rec, callbacks=[RLLoggingCallback(rec, "ppo")])
    assert isinstance(trainer, HargoPPOTrainer)
    assert trainer.ppo_config == method_params(params, "ppo")
    assert trainer.beta == params["rl"]["ppo"]["kl_coef"]   # PPO's KL coefficient, its own knob
    head = trainer.value_head
    assert head.weight.requires_grad and torch.count_nonzero(head.weight) == 0  # zero-init
    policy = trainer.accelerator.unwrap_model(trainer.model)
    assert policy.v_head is head      # part of the policy: the optimizer and clipping see it

    trainer.train()
    assert trainer.state.global_step == 2
    assert torch.count_nonzero(head.weight) > 0 and head.bias.item() != 0.0
    # the optimizer trained the head (LoRA on: only the adapter and the head are trainable)
    opt_params = {id(p) for g in trainer.optimizer.param_groups for p in g["params"]}
    assert id(head.weight) in opt_params and id(head.bias) in opt_params
    assert "v_head" not in policy._modules     # removed after train(): plain LM saved

    # recorder diagnostics per task, as for the GRPO family
    assert [h["step"] for h in rec.history] == [1, 2]
    for h in rec.history:
        for scope in TASKS + ("all",):
            assert math.isfinite(h[f"{scope}/reward_mean"]), scope
            assert math.isfinite(h[f"{scope}/advantage_mean"]), scope
        assert h["all/n_completions"] == 8
        assert h["all/weight_mean"] == pytest.approx(0.5)
    logged = [x for x in trainer.state.log_history if "ppo/value_loss" in x]
    assert len(logged) == 2
    for x in logged:
        assert math.isfinite(x["ppo/value_loss"]) and x["ppo/value_loss"] >= 0
        assert "ppo/explained_variance" in x and "ppo/kl" in x
        assert x["ppo/value_clipfrac"] == pytest.approx(0.0)   # old values = current values

    # the checkpoint holds the value head; a fresh trainer restores it
    state = read_method_state(tmp_path / "ckpt" / "checkpoint-2")
    assert state["method"] == "ppo"
    assert state["value_head"]["weight"] == pytest.approx(head.weight.reshape(-1).tolist())
    fresh = build_trainer(as_config(params), "ppo", tiny_model_dir, records, tmp_path / "ckpt2")
    fresh.load_method_state(json.loads(json.dumps(state)))
    assert torch.equal(fresh.value_head.weight, head.weight)
    assert fresh.value_head.bias.item() == head.bias.item()

    out = tmp_path / "model"
    save_merged(policy, trainer.processing_class, out, dtype="float32")
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        assert not any("v_head" in k or "lora" in k for k in f.keys())
    prompts = [r["prompt"] for r in records[:2]]
    res = run_generation(out, prompts, {"max_new_tokens": 4, "temperature": 0.0,
                                        "batch_size": 2, "dtype": "float32"}, "transformers")
    assert len(res.completions) == 2 and all(isinstance(c, str) for c in res.completions)


def test_ppo_rejects_more_than_one_update_per_rollout(committed_params, tiny_model_dir,
                                                      data_dir, tmp_path):
    from hargo.training.rl import build_trainer, load_rl_records

    params = rl_params(committed_params, tiny_model_dir, data_dir)
    records = load_rl_records(data_dir / "train.jsonl")
    with pytest.raises(ValueError, match="one optimizer step per rollout"):
        build_trainer(as_config(params), "ppo", tiny_model_dir, records, tmp_path / "ckpt",
                      num_iterations=2)
