"""RL learns: a few steps of ``grpo`` and ``hargo`` raise the expected reward of a trivially
learnable task on a tiny random policy, and do not when the learning signal is broken.

The task: reward 1 when the one-token completion starts with a lowercase ASCII letter, else 0
(a random policy of this size does so ~17% of the time, so most groups of 8 have reward
variance). Its *expected* reward under the policy at temperature 1 is exact, with no sampling
noise: the probability mass of the lowercase-initial tokens at the first completion position,
averaged over the prompts (:func:`expected_reward`). One token, because with two a shifted mask
still trains the second token, whose lowercase share correlates with the first's. The margin is set from repeated
runs (seeds 1-5, 12 steps, fp32, measured on a 2-core AMX Xeon): gains of +0.155 to +0.275
(``grpo``) and +0.80 to +0.81 (``hargo``) with the signal intact; exactly 0 with zeroed weights
or the shifted mask, and -0.08 to -0.13 with the flipped sign. (HARGO's larger gain is its
weighting: a group of 8 with one rewarded completion gives it half the group's weight, 4x
GRPO's 1/8.)

Three planted bugs, each applied to the scored batch the loss reads (so TRL's own ``grpo`` loss
and HARGO's weighted loss are both covered):

- ``flip``: every advantage negated;
- ``zero``: the per-response weights zeroed (HARGO's ``response_weights``; GRPO's uniform 1/G is
  implicit in TRL's loss, so its equivalent is the advantages times 0);
- ``shift``: the completion mask moved one token to the right (the first completion token,
  the one the reward depends on, leaves the loss; one padding position enters it).
"""
from __future__ import annotations

import pytest

from hargo.config import as_config

torch = pytest.importorskip("torch")

STEPS = 12
LR = 1e-2
MARGIN = 0.10   # measured: >= 0.155 intact, <= 0 broken (module docstring)


def _rewarded(text: str) -> bool:
    return text[:1].isascii() and text[:1].islower()


def initial_reward(completions, **_) -> list[float]:
    """1.0 for a completion whose first character is a lowercase ASCII letter, else 0.0."""
    return [1.0 if _rewarded(c[0]["content"] if isinstance(c, list) else c) else 0.0
            for c in completions]


def expected_reward(model, tokenizer, prompts) -> float:
    """Mean over ``prompts`` of P(first completion token decodes to a rewarded text) at
    temperature 1: :func:`initial_reward`'s expectation under ``model``."""
    rewarded = torch.tensor([_rewarded(tokenizer.decode([i])) for i in range(len(tokenizer))])
    vals = []
    model.eval()
    with torch.no_grad():
        for p in prompts:
            ids = tokenizer.apply_chat_template(p, add_generation_prompt=True, return_tensors="pt",
                                                return_dict=True)["input_ids"]
            logits = model(ids).logits[0, -1, : len(tokenizer)].float()
            vals.append(float(torch.softmax(logits, -1)[rewarded].sum()))
    return sum(vals) / len(vals)


@pytest.fixture(scope="module")
def tiny_setup(tmp_path_factory):
    """A tiny random policy (2 layers of width 64, its 300-token BPE trained on synthetic task
    texts) and 8 syn_short prompts."""
    from hargo.data.synthetic import SyntheticConfig, generate
    from hargo.models.tiny import TinyPolicyConfig, build_tiny_policy

    train, _ = generate(SyntheticConfig(n_train=40, n_eval=4), seed=0)
    texts = [m["content"] for r in train for m in r["prompt"]] + [r["answer"] for r in train]
    cfg = TinyPolicyConfig(vocab_size=300, hidden_size=64, num_layers=2, num_heads=2,
                           intermediate_size=128, max_positions=256)
    model_dir = build_tiny_policy(tmp_path_factory.mktemp("tiny") / "policy", cfg, texts, seed=0)
    records = [r for r in train if r["task"] == "syn_short"][:8]
    return model_dir, records


def _params(seed: int):
    """The test bed's typed config (the synthetic tasks) with this test's RL knobs."""
    from hargo.compare.synthetic import stage_params
    from hargo.compare.synthetic_plan import plan
    from hargo.config import Config, params_dict
    from hargo.params import load_params

    params = load_params("params.yaml")
    q = params_dict(stage_params(as_config(params), plan(as_config(params)), seed))
    q["train"].update(threads=1, bf16=False)   # fp32 on every machine
    q["rl"].update(steps=STEPS, prompts_per_step=4, num_generations=8, max_new_tokens=1,
                   learning_rate=LR, temperature=1.0, save_steps=STEPS + 1)
    return Config.from_params(q, synthetic=True)


def _plant(trainer, bug: str | None) -> None:
    """Wrap the trainer's scored-batch method so that ``bug`` reaches the loss."""
    if bug is None:
        return
    inner = trainer._generate_and_score_completions

    def broken(inputs):
        out = inner(inputs)
        if bug == "flip":
            out["advantages"] = -out["advantages"]
        elif bug == "zero":
            out["response_weights"] = torch.zeros_like(out["response_weights"])
            if not trainer._hargo_loss:   # TRL's loss: uniform 1/G, folded into the advantages
                out["advantages"] = out["advantages"] * 0
        elif bug == "shift":
            m = out["completion_mask"]
            out["completion_mask"] = torch.cat([torch.zeros_like(m[:, :1]), m[:, :-1]], dim=1)
        return out

    trainer._generate_and_score_completions = broken


def learning_gain(model_dir, records, method: str, seed: int, bug: str | None, work) -> float:
    """Expected-reward gain of ``STEPS`` RL steps of ``method`` (seeded) with ``bug`` planted."""
    from hargo.hardware import setup_torch
    from hargo.models.loading import load_model, load_tokenizer
    from hargo.training.rl import build_trainer

    q = _params(seed)
    setup_torch(q)
    tok = load_tokenizer(model_dir)
    prompts = [r["prompt"] for r in records]
    before = expected_reward(load_model(model_dir, dtype="float32"), tok, prompts)
    trainer = build_trainer(q, method, model_dir, records, work, reward_funcs=[initial_reward])
    _plant(trainer, bug)
    trainer.train()
    model = trainer.accelerator.unwrap_model(trainer.model)
    return expected_reward(model, tok, prompts) - before


@pytest.mark.parametrize("method", ["grpo", "hargo"])
def test_rl_raises_the_expected_reward(tiny_setup, tmp_path, method):
    model_dir, records = tiny_setup
    gain = learning_gain(model_dir, records, method, seed=1, bug=None, work=tmp_path / "t")
    assert gain > MARGIN, f"{method}: {STEPS} steps raised the expected reward by {gain:+.3f}"


@pytest.mark.parametrize("bug", ["flip", "zero", "shift"])
@pytest.mark.parametrize("method", ["grpo", "hargo"])
def test_a_broken_signal_does_not_learn(tiny_setup, tmp_path, method, bug):
    """The same run with a planted bug gains less than the margin: the test above can fail."""
    model_dir, records = tiny_setup
    gain = learning_gain(model_dir, records, method, seed=1, bug=bug, work=tmp_path / "t")
    assert gain < MARGIN, f"{method} with {bug}: gain {gain:+.3f} (the bug went unnoticed)"
    if bug == "flip":
        assert gain < 0, f"{method}: a flipped advantage should lower the reward, got {gain:+.3f}"
