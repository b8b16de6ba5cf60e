"""PPO baseline (hargo.training.ppo): hand-computed token rewards, GAE, whitening and losses; the
config block; and 2 PPO steps of the tiny random model through ``rl.build_trainer(..., "ppo")``:
the value head trains, checkpoints hold it, the saved merged model loads and generates."""
from __future__ import annotations

import copy
import json
import math

import pytest
import torch

from rl_helpers import TASKS, crafted_records, rl_params, write_jsonl

from hargo.training.ppo import (PPOConfig, clipped_policy_loss, clipped_value_loss,
                                explained_variance, gae_advantages, token_rewards, whiten)

R = [[0.0, 0.0, 1.0]]
V = [[0.1, 0.2, 0.3]]


def t(x):
    return torch.tensor(x, dtype=torch.float32)


# ----------------------------------------------------------------------------------- GAE

def test_gae_gamma_lambda_one_is_reward_to_go_minus_value():
    adv, ret = gae_advantages(t(R), t(V), t([[1, 1, 1]]), gamma=1.0, lam=1.0)
    # A_2 = 1 - .3; A_1 = (0 + .3 - .2) + A_2; A_0 = (0 + .2 - .1) + A_1
    assert adv.tolist()[0] == pytest.approx([0.9, 0.8, 0.7])
    assert ret.tolist()[0] == pytest.approx([1.0, 1.0, 1.0])


def test_gae_with_discount_and_lambda_below_one():
    adv, ret = gae_advantages(t(R), t(V), t([[1, 1, 1]]), gamma=0.9, lam=0.5)
    # delta = (.9*.2 - .1, .9*.3 - .2, 1 - .3) = (.08, .07, .7); A_t = delta_t + .45 A_{t+1}
    a2 = 0.7
    a1 = 0.07 + 0.45 * a2          # 0.385
    a0 = 0.08 + 0.45 * a1          # 0.25325
    assert adv.tolist()[0] == pytest.approx([a0, a1, a2])
    assert ret.tolist()[0] == pytest.approx([a0 + 0.1, a1 + 0.2, a2 + 0.3])
    # lam = 0: one-step TD errors
    adv0, _ = gae_advantages(t(R), t(V), t([[1, 1, 1]]), gamma=1.0, lam=0.0)
    assert adv0.tolist()[0] == pytest.approx([0.1, 0.1, 0.7])


def test_gae_padding_is_masked():
    # the padded token carries garbage reward/value; it must not leak into the valid ones
    adv, ret = gae_advantages(t([[0.0, 1.0, 5.0]]), t([[0.1, 0.2, 9.0]]), t([[1, 1, 0]]),
                              gamma=0.9, lam=0.5)
    # A_1 = 1 - .2 (V after the last valid token is 0); A_0 = .9*.2 - .1 + .45 * .8
    assert adv.tolist()[0] == pytest.approx([0.44, 0.8, 0.0])
    assert ret.tolist()[0] == pytest.approx([0.54, 1.0, 0.0])
    unpadded, _ = gae_advantages(t([[0.0, 1.0]]), t([[0.1, 0.2]]), t([[1, 1]]), 0.9, 0.5)
    assert adv[0, :2].tolist() == pytest.approx(unpadded[0].tolist())
    with pytest.raises(ValueError, match="same shape|one shape"):
        gae_advantages(t(R), t([[0.1, 0.2]]), t([[1, 1, 1]]), 1.0, 1.0)


# ------------------------------------------------------------------------ token rewards

def test_token_rewards_kl_penalty_and_score_on_last_valid_token():
    logps = t([[-1.0, -2.0, -3.0], [-1.0, -2.0, -3.0]])
    ref = t([[-1.5, -2.0, -2.0], [-1.5, -2.0, -2.0]])   # logp - ref = (.5, 0, -1)
    mask = t([[1, 1, 0], [1, 1, 1]])
    r = token_rewards(logps, ref, t([2.0, -1.0]), mask, beta=0.1)
    assert r.tolist()[0] == pytest.approx([-0.05, 2.0, 0.0])
    assert r.tolist()[1] == pytest.approx([-0.05, 0.0, 0.1 - 1.0])
    r0 = token_rewards(logps, None, t([2.0, -1.0]), mask, beta=0.0)
    assert r0.tolist() == [[0.0, 2.0, 0.0], [0.0, 0.0, -1.0]]
    with pytest.raises(ValueError, match="reference"):
        token_rewards(logps, None, t([2.0, -1.0]), mask, beta=0.1)


# ---------------------------------------------------------------------------- whitening

def test_whiten_uses_valid_tokens_and_unbiased_variance():
    x, mask = t([[1.0, 2.0, 3.0, 100.0]]), t([[1, 1, 1, 0]])
    # mean 2, unbiased var (1 + 0 + 1) / 2 = 1
    assert whiten(x, mask).tolist()[0] == pytest.approx([-1.0, 0.0, 1.0, 0.0], abs=1e-6)
    assert whiten(x, mask, shift_mean=False).tolist()[0] == pytest.approx([1.0, 2.0, 3.0, 0.0],
                                                                          abs=1e-6)
    # two processes holding the same rows: statistics of (1, 2, 3, 1, 2, 3): var 4 / 5
    two = whiten(x, mask, reduce=lambda s: 2 * s)
    assert two.tolist()[0] == pytest.approx([-1 / math.sqrt(0.8), 0.0, 1 / math.sqrt(0.8), 0.0],
                                            abs=1e-6)
    with pytest.raises(ValueError, match="at least 2"):
        whiten(x, t([[1, 0, 0, 0]]))


# ------------------------------------------------------------------------------ losses

def test_clipped_value_loss_hand_computed_with_gradient():
    values = t([[1.0, 1.0, 0.5, 7.0]]).requires_grad_(True)
    old = t([[0.8, 0.8, 0.5, 0.0]])
    returns = t([[0.0, 2.0, 1.0, 0.0]])
    mask = t([[1, 1, 1, 0]])
    loss, clipfrac = clipped_value_loss(values, old, returns, mask, cliprange_value=0.1)
    # token 0: clip(1, .7, .9) = .9: max(1, .81) = 1; token 1: max(1, 1.21) = 1.21 (clipped);
    # token 2: .25; token 3 padding. 0.5 * (1 + 1.21 + .25) / 3
    assert loss.item() == pytest.approx(0.5 * 2.46 / 3)
    assert clipfrac.item() == pytest.approx(1 / 3)
    loss.backward()
    # d/dV of 0.5 (V - R)^2 / 3 = (V - R) / 3 where the unclipped term wins; 0 where the clipped
    # one does (the clip binds) and on padding
    assert values.grad.tolist()[0] == pytest.approx([1 / 3, 0.0, -0.5 / 3, 0.0])


def test_clipped_policy_loss_hand_computed():
    logps = t([[math.log(1.5), math.log(1.5), 0.0]])
    old = t([[0.0, 0.0, 0.0]])
    adv = t([[1.0, -1.0, 3.0]])
    loss, clipfrac = clipped_policy_loss(logps, old, adv, t([[1, 1, 0]]), clip_low=0.2)
    # A>0: max(-1.5, -1.2) = -1.2 (clipped); A<0: max(1.5, 1.2) = 1.5
    assert loss.item() == pytest.approx((-1.2 + 1.5) / 2)
    assert clipfrac.item() == pytest.approx(0.5)
    # ratio 1 (one update per rollout): the loss is -mean(A)
    loss1, clip1 = clipped_policy_loss(old, old, adv, t([[1, 1, 1]]), clip_low=0.2)
    assert loss1.item() == pytest.approx(-1.0) and clip1.item() == 0.0


def test_explained_variance():
    ret, mask = t([[1.0, 2.0, 3.0, 50.0]]), t([[1, 1, 1, 0]])
    assert explained_variance(ret, ret, mask) == pytest.approx(1.0)
    assert explained_variance(torch.zeros_like(ret), ret, mask) == pytest.approx(0.0)
    # V = 2 + (R - 2) / 2: R - V = (R - 2) / 2, so Var(R - V) = Var(R) / 4 -> 0.75
    assert explained_variance(2 + (ret - 2) / 2, ret, mask) == pytest.approx(0.75)
    assert math.isnan(explained_variance(ret, torch.ones_like(ret), mask))


# ------------------------------------------------------------------------------ config

def test_ppo_config_from_committed_params_and_errors(committed_params):
    from hargo.params import ParamsError
    from hargo.training.grpo import trl_loss_settings

    block = committed_params["compare"]["ppo"]
    cfg = PPOConfig.from_params(committed_params)
    assert cfg.to_dict() == {k: block[k] for k in ("vf_coef", "gamma", "lam", "cliprange_value",
                                                   "whiten_advantages")}
    bad = copy.deepcopy(committed_params)
    bad["compare"]["ppo"]["lam"] = 1.5
    with pytest.raises(ParamsError, match="compare.ppo.lam"):
        PPOConfig.from_params(bad)
    bad["compare"]["ppo"]["lam"] = "high"
    with pytest.raises(ParamsError, match="compare.ppo.lam"):
        PPOConfig.from_params(bad)
    del bad["compare"]
    with pytest.raises(ParamsError, match="compare.ppo"):
        PPOConfig.from_params(bad)
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
    from hargo.training.common import save_merged
    from hargo.training.grpo import read_hargo_state
    from hargo.training.ppo import HargoPPOTrainer
    from hargo.training.rl import build_trainer, load_rl_records
    from hargo.training.rl_logging import RLLoggingCallback, StepRecorder

    params = rl_params(committed_params, tiny_model_dir, data_dir, steps=2, num_generations=2,
                       prompts_per_step=4, save_steps=2)
    params["train"]["bf16"] = False
    records = load_rl_records(data_dir / "train.jsonl")
    rec = StepRecorder()
    trainer = build_trainer(params, "ppo", tiny_model_dir, records, tmp_path / "ckpt",
                            recorder=rec, callbacks=[RLLoggingCallback(rec, "ppo")])
    assert isinstance(trainer, HargoPPOTrainer)
    assert trainer.ppo_config == PPOConfig.from_params(params)
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
    state = read_hargo_state(tmp_path / "ckpt" / "checkpoint-2")
    assert state["method"] == "ppo"
    assert state["value_head"]["weight"] == pytest.approx(head.weight.reshape(-1).tolist())
    fresh = build_trainer(params, "ppo", tiny_model_dir, records, tmp_path / "ckpt2")
    fresh.load_hargo_state(json.loads(json.dumps(state)))
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
        build_trainer(params, "ppo", tiny_model_dir, records, tmp_path / "ckpt",
                      num_iterations=2)
