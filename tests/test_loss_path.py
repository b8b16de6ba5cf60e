"""The GRPO family's one loss path (hargo.training.grpo ``_group_weighted_loss`` over
hargo.losses.group_weighted_aggregate): GRPO, Dr. GRPO and a token-mean GRPO reproduce TRL
1.16's own ``grpo`` / ``dr_grpo`` / ``dapo`` loss and every trainable parameter's gradient, on a
batch of completions of unequal lengths with a zero-variance group, the clip active on both
sides, beta > 0 and gradient accumulation over two micro-batches; and the uniform-weight
control at GRPO's std convention is GRPO, bit for bit.

The stock ``trl.GRPOTrainer`` and hargo's ``HargoGRPOTrainer`` are built on the same fixed
batch (TRL's ``rollout_func``), their LoRA weights made identical and moved off the reference,
and an "old" policy 0.3 nats away per token is set so the clip binds.
"""
from __future__ import annotations

import copy

import pytest

from hargo.config import as_config
import torch

from rl_helpers import FIXED_GROUPS, G_FIXED, fixed_batch_params, fixed_inputs, fixed_rollout

# its own group (not test_rl.py's "rl"), so the scheduler can run it beside that long chain
pytestmark = pytest.mark.xdist_group("loss-path")

#: abs tolerance of the loss and of every gradient entry (issue 40: <= 1e-6)
TOL = 1e-6


@pytest.fixture(scope="module")
def fixed_params(committed_params, tiny_model_dir, tmp_path_factory):
    return fixed_batch_params(committed_params, tiny_model_dir,
                              tmp_path_factory.mktemp("loss-path"))


def _trainable(model) -> dict[str, torch.nn.Parameter]:
    return {n: p for n, p in model.named_parameters() if p.requires_grad}


def _set_lora(model, seed: int = 0) -> None:
    """Every LoRA weight to the same seeded values in any trainer: A and B random, so the policy
    differs from the reference (a non-zero KL term) and both trainers hold the same policy."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(_trainable(model).items()):
            p.copy_(torch.randn(p.shape, generator=gen) * (0.05 if "lora_B" in name else 0.2))


def _stock(params, tmp_path, loss_type: str, scale_rewards: str):
    from trl import GRPOTrainer

    from hargo.models.loading import load_model, load_tokenizer
    from hargo.rewards import RewardConfig, TaskReward
    from hargo.training.common import lora_config
    from hargo.training.rl import build_grpo_config, to_dataset

    tok = load_tokenizer(params["sft"]["out_dir"])
    tok.padding_side = "left"
    args = build_grpo_config(as_config(params), "grpo", tmp_path / f"stock-{loss_type}",
                             loss_type=loss_type, scale_rewards=scale_rewards)
    return GRPOTrainer(model=load_model(params["sft"]["out_dir"]),
                       reward_funcs=[TaskReward(RewardConfig.from_params(params["rewards"]))],
                       args=args, train_dataset=to_dataset([rec for rec, _ in FIXED_GROUPS]),
                       processing_class=tok, peft_config=lora_config(params["rl"]["lora"]),
                       rollout_func=fixed_rollout)


def _ours(params, method, tmp_path):
    from hargo.training.rl import build_trainer

    return build_trainer(as_config(params), method, params["sft"]["out_dir"],
                         [rec for rec, _ in FIXED_GROUPS], tmp_path / f"ours-{method}",
                         trainer_kwargs={"rollout_func": fixed_rollout})


def _scored(trainer) -> dict:
    """The fixed batch scored by ``trainer`` (its own advantages), with a shared "old" policy
    0.3 nats off per token (seeded), so ratios fall on both sides of the clip range."""
    trainer.model.train()
    _set_lora(trainer.model)
    inputs = trainer._generate_and_score_completions(fixed_inputs())
    gen = torch.Generator().manual_seed(1)
    inputs["old_per_token_logps"] = inputs["ref_per_token_logps"] + \
        0.3 * torch.randn(inputs["ref_per_token_logps"].shape, generator=gen)
    return inputs


def _micro_batches(inputs: dict, n: int) -> list[dict]:
    """``inputs`` split into ``n`` consecutive row slices (tensors of B rows are sliced; the rest,
    like ``num_items_in_batch``, is shared), as TRL's accumulation splits a generation batch."""
    B = inputs["completion_ids"].size(0)
    size = B // n
    out = []
    for k in range(n):
        rows = slice(k * size, (k + 1) * size)
        out.append({key: (v[rows] if isinstance(v, torch.Tensor) and v.dim() > 0
                          and v.size(0) == B else v) for key, v in inputs.items()})
    return out


def _loss_and_grads(trainer, inputs: dict, accumulation: int):
    """The summed micro-batch losses and every trainable parameter's accumulated gradient."""
    trainer.model.zero_grad()
    trainer.current_gradient_accumulation_steps = accumulation
    total = 0.0
    for mb in _micro_batches(inputs, accumulation):
        loss = trainer.compute_loss(trainer.model, mb)
        loss.backward()
        total += loss.item()
    grads = {n: p.grad.detach().clone() for n, p in _trainable(trainer.model).items()}
    return total, grads


def _assert_equal(a, b, tol=TOL):
    (loss_a, grads_a), (loss_b, grads_b) = a, b
    assert abs(loss_a - loss_b) <= tol, (loss_a, loss_b)
    assert grads_a.keys() == grads_b.keys() and grads_a
    worst = max(float((grads_a[n] - grads_b[n]).abs().max()) for n in grads_a)
    assert worst <= tol, f"max |grad difference| {worst:.3g} > {tol}"
    # the comparison is not vacuous: a real loss and real gradients
    assert abs(loss_a) > 1e-3
    assert max(float(g.abs().max()) for g in grads_a.values()) > 1e-3


#: (hargo method, params override of its block, TRL loss_type, TRL scale_rewards)
CASES = {
    "grpo": ("grpo", {}, "grpo", "group"),
    "dr_grpo": ("dr_grpo", {}, "dr_grpo", "none"),
    "grpo_token_mean": ("grpo", {"aggregation": "token_mean"}, "dapo", "group"),
}


@pytest.mark.parametrize("accumulation", [1, 2], ids=["ga1", "ga2"])
@pytest.mark.parametrize("case", list(CASES))
def test_one_loss_path_equals_trl_loss_and_gradients(case, accumulation, fixed_params,
                                                     tmp_path):
    method, block, loss_type, scale = CASES[case]
    params = copy.deepcopy(fixed_params)
    params["rl"][method] = {**params["rl"][method], **block}
    assert params["rl"][method]["beta"] == 0.02
    stock = _stock(params, tmp_path, loss_type, scale)
    ours = _ours(params, method, tmp_path)
    assert ours._hargo_loss and not hasattr(stock, "spec")
    in_s, in_o = _scored(stock), _scored(ours)

    # the batch: unequal completion lengths, one zero-variance group (all correct), both clips
    lengths = in_o["completion_mask"].sum(1)
    assert len(set(lengths.tolist())) > 1
    assert in_o["advantages"][8:].abs().max() == 0
    torch.testing.assert_close(in_o["advantages"], in_s["advantages"], atol=1e-6, rtol=0)
    assert in_o["response_weights"].tolist() == [1 / G_FIXED] * 12

    got_s = _loss_and_grads(stock, in_s, accumulation)
    got_o = _loss_and_grads(ours, in_o, accumulation)
    _assert_equal(got_o, got_s)
    last = {k: ours.hargo_metrics["train"][k][-accumulation:]
            for k in ("clip_ratio/low_mean", "clip_ratio/high_mean", "kl")}
    assert max(last["clip_ratio/low_mean"]) > 0 and max(last["clip_ratio/high_mean"]) > 0
    assert min(last["kl"]) > 0


def test_uniform_control_at_grpo_std_is_grpo_bit_for_bit(fixed_params, tmp_path):
    """``uniform_sample`` (HARGO's estimator path, weights 1/G, GRPO's sample std + 1e-4) gives
    GRPO's advantages, weights, loss and gradients exactly; ``uniform_pop`` (population std +
    1e-6) scales every advantage by sqrt(G / (G - 1)) (to within the eps), so it differs."""
    runs = {}
    for method in ("grpo", "uniform_sample", "uniform_pop"):
        tr = _ours(fixed_params, method, tmp_path)
        inputs = _scored(tr)
        runs[method] = inputs, _loss_and_grads(tr, inputs, 1)
    (in_g, (loss_g, grads_g)), (in_u, (loss_u, grads_u)) = runs["grpo"], runs["uniform_sample"]
    assert torch.equal(in_g["advantages"], in_u["advantages"])
    assert torch.equal(in_g["response_weights"], in_u["response_weights"])
    assert loss_g == loss_u
    assert all(torch.equal(grads_g[n], grads_u[n]) for n in grads_g)

    in_p = runs["uniform_pop"][0]
    nonzero = in_g["advantages"] != 0
    ratio = in_p["advantages"][nonzero] / in_g["advantages"][nonzero]
    torch.testing.assert_close(ratio, torch.full_like(ratio, (G_FIXED / (G_FIXED - 1)) ** 0.5),
                               atol=1e-3, rtol=0)
