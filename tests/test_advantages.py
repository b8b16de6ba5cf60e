"""HARGO / GRPO-family advantages and weights: method.md's worked example, a hand-computed HARGO
case over two batches, Hypothesis properties, EMA state, and the estimators' weights feeding
``hargo.losses.weighted_loss`` (the loss math itself is tested in tests/test_losses.py)."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from hargo.advantages import (ESTIMATORS, EMABaseline, HargoConfig, discrimination_weights,
                              estimate, group_advantage, group_rewards, needs_reference)
from hargo.losses import weighted_loss
from hargo.methods import method_names, methods_of_family

pytestmark = pytest.mark.fast

#: the estimators whose weights are normalised per group (each row sums to 1)
METHODS = ("grpo", "dr_grpo", "hargo", "hargo_b1", "hargo_b2", "hargo_uniform")
#: hargo's variants whose weights are normalised over the batch (they sum to N)
BATCH_METHODS = ("hargo_batch", "hargo_contrast")


def test_the_estimator_registry_holds_the_grpo_familys_estimators():
    """The built-in estimators are registered (others may be), every GRPO-family method names
    one, the method's needs_reference is its estimator's, and every method runs the one loss."""
    from hargo.advantages import ESTIMATORS

    family = methods_of_family("grpo_family")
    builtin = ("grpo", "dr_grpo", "hargo", "hargo_b1", "hargo_b2", "uniform_sample",
               "uniform_pop", "hargo_batch", "hargo_contrast")
    assert set(builtin) <= set(method_names("grpo_family"))
    assert {m.estimator for m in family} <= set(ESTIMATORS)
    assert {"grpo", "dr_grpo", "hargo", "hargo_b1", "hargo_b2", "hargo_uniform", "hargo_batch",
            "hargo_contrast"} <= set(ESTIMATORS)
    assert [(m.name, m.needs_reference) for m in family] == [
        (m.name, needs_reference(m.estimator)) for m in family]
    assert {m.loss for m in family} == {"weighted"}


def test_params_defaults_are_the_estimators_paper_constants():
    """rl.hargo's documented defaults (hargo.method_config, shown in the CLI's help) and
    HargoConfig's (the math) are the same paper values, so the two cannot drift apart."""
    from dataclasses import fields

    from hargo.advantages import HargoConfig
    from hargo.method_config import HargoParams

    from hargo.estimators import CONSTANTS

    config = {f.name: f.default for f in fields(HargoConfig) if f.name != "params"}
    assert tuple(config) == CONSTANTS     # what an estimator's registered defaults may set
    params = {f.name: f.default for f in fields(HargoParams) if f.name in config}
    assert params == config == {"alpha": 0.3, "rho": 0.9, "eps": 1e-6, "eps_w": 1e-6,
                                "std": "population", "std_eps": 1e-6, "std_scope": "group"}


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


# --------------------------------------------------------------------------- worked examples

def test_method_md_worked_example():
    """Binary rewards, G = 4, one correct: A = (+1.73, -0.58, -0.58, -0.58) (population std),
    d = (1, 1/3, 1/3, 1/3), w = (0.5, 1/6, 1/6, 1/6) before modulation."""
    out = estimate("hargo_b1", torch.tensor([[1.0, 0.0, 0.0, 0.0]]))
    # mean 0.25, population std sqrt(0.1875) = 0.4330: A = 0.75/0.4330 = 1.7321, -0.25/0.4330
    std = math.sqrt((0.75 ** 2 + 3 * 0.25 ** 2) / 4)
    assert out.advantages[0].tolist() == pytest.approx(
        [0.75 / (std + 1e-6), -0.25 / (std + 1e-6)] * 1 + [-0.25 / (std + 1e-6)] * 2, abs=1e-6)
    assert out.advantages[0, 0].item() == pytest.approx(1.73, abs=5e-3)
    assert out.advantages[0, 1].item() == pytest.approx(-0.58, abs=5e-3)
    assert out.discrimination[0].tolist() == pytest.approx([1, 1 / 3, 1 / 3, 1 / 3], abs=1e-5)
    assert out.weights[0].tolist() == pytest.approx([0.5, 1 / 6, 1 / 6, 1 / 6], abs=1e-6)
    assert out.confidence is None and out.baseline is None


def _hand_hargo(rewards, l, g, alpha=0.3, eps=1e-6, eps_w=1e-6):
    """method.md steps 1-5 for one group, in plain Python."""
    G = len(rewards)
    mean = sum(rewards) / G
    std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / G)
    A = [(r - mean) / (std + eps) for r in rewards]
    c = [_sigmoid(x - g) for x in l]
    M = [a * (1 + alpha * ci) for a, ci in zip(A, c)]
    mx = max(abs(m) for m in M)
    d = [abs(m) / (mx + eps) for m in M]
    s = sum(d)
    w = [1 / G] * G if s < eps_w else [di / s for di in d]
    return M, w, c, d


def test_hargo_hand_computed_two_batches():
    """Confidence with the EMA baseline over two batches, against plain-Python arithmetic."""
    cfg = HargoConfig(alpha=0.3, rho=0.9, eps=1e-6, eps_w=1e-6)
    base = EMABaseline(cfg.rho)
    # batch 1: one group of G = 3
    r1 = [[1.0, 0.0, 0.0]]
    l1 = [[-1.0, -2.0, -0.5]]
    out1 = estimate("hargo", torch.tensor(r1), torch.tensor(l1), base, cfg)
    g1 = (-1.0 - 2.0 - 0.5) / 3  # first batch initialises g (c uses g after the update)
    assert g1 == pytest.approx(-7 / 6)
    assert out1.baseline == pytest.approx(g1, abs=1e-12)
    M, w, c, d = _hand_hargo(r1[0], l1[0], g1)
    assert out1.advantages[0].tolist() == pytest.approx(M, abs=1e-6)
    assert out1.weights[0].tolist() == pytest.approx(w, abs=1e-6)
    assert out1.confidence[0].tolist() == pytest.approx(c, abs=1e-6)
    assert out1.discrimination[0].tolist() == pytest.approx(d, abs=1e-6)
    # c_1 = sigmoid(-1 + 7/6) = sigmoid(1/6) = 0.541571
    assert out1.confidence[0, 0].item() == pytest.approx(0.5415704832, abs=1e-6)

    # batch 2: two groups, the first without contrast
    r2 = [[0.5, 0.5, 0.5], [0.2, 0.9, 0.4]]
    l2 = [[-0.3, -0.4, -0.2], [-3.0, -1.5, -0.9]]
    out2 = estimate("hargo", torch.tensor(r2), torch.tensor(l2), base, cfg)
    g2 = 0.9 * g1 + 0.1 * (sum(l2[0]) + sum(l2[1])) / 6
    assert g2 == pytest.approx(-1.155, abs=1e-12)  # 0.9 * (-7/6) + 0.1 * (-6.3/6)
    assert out2.baseline == pytest.approx(g2, abs=1e-6)  # l arrives as float32
    assert base.value == pytest.approx(g2, abs=1e-6)
    for n in range(2):
        M, w, c, d = _hand_hargo(r2[n], l2[n], g2)
        assert out2.advantages[n].tolist() == pytest.approx(M, abs=1e-6)
        assert out2.weights[n].tolist() == pytest.approx(w, abs=1e-6)
        assert out2.confidence[n].tolist() == pytest.approx(c, abs=1e-6)
    assert out2.weights[0].tolist() == pytest.approx([1 / 3] * 3, abs=1e-7)
    assert out2.advantages[0].tolist() == [0.0, 0.0, 0.0]


def test_hargo_b2_weights_follow_confidence():
    r = [[1.0, 0.0, 0.0, 0.5]]
    l = [[-1.0, -0.2, -2.0, -0.7]]
    out = estimate("hargo_b2", torch.tensor(r), torch.tensor(l))
    g = sum(l[0]) / 4
    c = [_sigmoid(x - g) for x in l[0]]
    assert out.weights[0].tolist() == pytest.approx([ci / sum(c) for ci in c], abs=1e-6)
    M, _, _, _ = _hand_hargo(r[0], l[0], g)
    assert out.advantages[0].tolist() == pytest.approx(M, abs=1e-6)
    # alpha = 0 leaves no confidence signal: uniform
    out0 = estimate("hargo_b2", torch.tensor(r), torch.tensor(l), config=HargoConfig(alpha=0.0))
    assert out0.weights[0].tolist() == pytest.approx([0.25] * 4)


def test_grpo_matches_trl_formula():
    """grpo = TRL 1.16 GRPOTrainer (scale_rewards='group'): (r - mean) / (nanstd + 1e-4)."""
    from trl.trainer.utils import nanstd

    gen = torch.Generator().manual_seed(0)
    rewards = torch.rand(64, 4, generator=gen)
    rewards[3] = 1.0  # a group without contrast
    flat = rewards.reshape(-1)
    G = 4
    # TRL 1.16 grpo_trainer.py, _generate_and_score_completions, lines 2765-2787
    mean_grouped = torch.nanmean(flat.view(-1, G), dim=1).repeat_interleave(G, dim=0)
    std = nanstd(flat.view(-1, G), dim=1).repeat_interleave(G, dim=0)
    trl_adv = (flat - mean_grouped) / (std + 1e-4)
    ours = estimate("grpo", rewards).advantages.reshape(-1)
    torch.testing.assert_close(ours, trl_adv, rtol=1e-6, atol=1e-6)
    # hand check on one group: sample std of (1, 0, 0, 0) is 0.5
    out = estimate("grpo", torch.tensor([[1.0, 0.0, 0.0, 0.0]]))
    assert out.advantages[0].tolist() == pytest.approx([0.75 / 0.5001, -0.25 / 0.5001,
                                                        -0.25 / 0.5001, -0.25 / 0.5001], abs=1e-6)
    assert out.weights[0].tolist() == [0.25] * 4


def test_group_advantage_unbiased_and_unscaled_by_hand():
    """``unbiased=True`` divides by the sample std (G - 1), the default by the population std (G);
    ``scale=False`` only centres. Rewards (1, 0, 0, 0): mean 0.25, squared deviations sum 0.75,
    sample std sqrt(0.75 / 3) = 0.5, population std sqrt(0.75 / 4) = 0.4330."""
    r = torch.tensor([[1.0, 0.0, 0.0, 0.0], [0.5, 0.5, 0.5, 0.5]])
    unb = group_advantage(r, eps=1e-6, unbiased=True)
    assert unb.dtype == torch.float64
    assert unb[0].tolist() == pytest.approx([0.75 / 0.500001] + [-0.25 / 0.500001] * 3, abs=1e-12)
    assert unb[1].tolist() == [0.0] * 4
    pop = group_advantage(r, eps=0.1)  # a large eps shows it is added to the std, not elsewhere
    std = math.sqrt(0.75 / 4)
    assert pop[0].tolist() == pytest.approx([0.75 / (std + 0.1)] + [-0.25 / (std + 0.1)] * 3,
                                            abs=1e-12)
    assert group_advantage(r, scale=False)[0].tolist() == [0.75, -0.25, -0.25, -0.25]
    # the default eps is 1e-6
    assert group_advantage(r)[0, 0].item() == pytest.approx(0.75 / (std + 1e-6), abs=1e-12)
    # rounding residue in an all-equal group is forced to exactly 0 (0.1 * 3 / 3 != 0.1), per
    # group: the other group's spread does not matter
    tiny = torch.tensor([[0.1, 0.1, 0.1], [0.0, 1.0, 2.0]], dtype=torch.float64)
    assert group_advantage(tiny, scale=False)[0].tolist() == [0.0, 0.0, 0.0]
    assert group_advantage(tiny)[0].tolist() == [0.0, 0.0, 0.0]
    assert group_advantage(tiny, scale=False)[1].tolist() == [-1.0, 0.0, 1.0]


def test_discrimination_weights_by_hand():
    """d = |M| / (max |M| + eps), w = d / sum d; a group with sum d < eps_w falls back to 1/G.
    A large eps (0.5) makes its place in the formula visible."""
    M = torch.tensor([[2.0, -1.0, 0.0, 1.0], [0.0, 0.0, 0.0, 0.0], [1e-3, 0.0, 0.0, 0.0]],
                     dtype=torch.float64)
    d, w, flat = discrimination_weights(M, eps=0.5, eps_w=1e-2)
    assert d[0].tolist() == pytest.approx([2 / 2.5, 1 / 2.5, 0.0, 1 / 2.5], abs=1e-12)
    assert w[0].tolist() == pytest.approx([0.5, 0.25, 0.0, 0.25], abs=1e-12)
    # group 2: d = (0.001 / 0.501, 0, 0, 0), sum 0.001996 < eps_w = 0.01: uniform
    assert d[2, 0].item() == pytest.approx(1e-3 / 0.501, abs=1e-12)
    assert w[1].tolist() == [0.25] * 4 and w[2].tolist() == [0.25] * 4
    assert flat.tolist() == [[False], [True], [True]]
    # defaults eps = eps_w = 1e-6, and float32 input computed in float64
    d, w, flat = discrimination_weights(torch.tensor([[2.0, -1.0], [1e-3, 0.0]]))
    assert d.dtype == torch.float64
    assert d[0].tolist() == pytest.approx([2 / (2 + 1e-6), 1 / (2 + 1e-6)], abs=1e-15)
    assert w[1].tolist() == [1.0, 0.0] and flat.tolist() == [[False], [False]]
    # sum d exactly at eps_w is not below it: normalised weights, not 1/G
    d, w, flat = discrimination_weights(torch.tensor([[1.0, 1.0]], dtype=torch.float64),
                                        eps=0.0, eps_w=2.0)
    assert d.tolist() == [[1.0, 1.0]] and not flat.item() and w.tolist() == [[0.5, 0.5]]


def test_dr_grpo_centres_only():
    out = estimate("dr_grpo", torch.tensor([[1.0, 0.0, 0.5]]))
    assert out.advantages[0].tolist() == pytest.approx([0.5, -0.5, 0.0], abs=1e-7)
    assert out.weights[0].tolist() == pytest.approx([1 / 3] * 3)


# ------------------------------------------------------------------------------ registry/errors

def test_registry_and_errors():
    core = ("grpo", "dr_grpo", "hargo", "hargo_b1", "hargo_b2")
    assert [needs_reference(m) for m in core] == [False, False, True, False, True]
    with pytest.raises(ValueError, match=r"unknown advantage estimator 'ppo'.*dr_grpo.*hargo_b2"):
        estimate("ppo", torch.zeros(1, 4))
    with pytest.raises(ValueError, match="unknown"):
        needs_reference("nope")
    with pytest.raises(ValueError, match="needs ref_logprob"):
        estimate("hargo", torch.zeros(2, 4))
    with pytest.raises(ValueError, match="shape"):
        estimate("hargo", torch.zeros(2, 4), torch.zeros(2, 3))
    with pytest.raises(ValueError, match="G >= 2"):
        estimate("grpo", torch.zeros(3, 1))
    with pytest.raises(ValueError, match="NaN or inf"):
        estimate("hargo_b1", torch.tensor([[0.0, float("nan")]]))
    with pytest.raises(ValueError, match="NaN or inf"):
        estimate("hargo", torch.zeros(1, 2), torch.tensor([[0.0, -float("inf")]]))
    with pytest.raises(ValueError, match=r"rewards must be a \(N, G\) tensor, got torch.Size\(\[8\]\)"):
        estimate("grpo", torch.zeros(8))
    with pytest.raises(ValueError, match=r"rewards must be a \(N, G\) tensor, got <class 'list'>"):
        estimate("grpo", [[1.0, 0.0]])
    with pytest.raises(ValueError, match="rho"):
        HargoConfig(rho=1.0)


def test_config_and_baseline_validation():
    """Each bound of HargoConfig and EMABaseline, on both sides, with its message."""
    assert HargoConfig(alpha=0.0, rho=0.0).rho == 0.0            # both ends that are allowed
    for kw, msg in (({"alpha": -0.1}, "alpha must be finite and >= 0, got -0.1"),
                    ({"alpha": math.inf}, "alpha must be finite and >= 0, got inf"),
                    ({"alpha": math.nan}, "alpha must be finite"),
                    ({"rho": 1.0}, r"rho must lie in \[0, 1\), got 1.0"),
                    ({"rho": -0.1}, "rho must lie in"),
                    ({"eps": 0.0}, "eps must be finite and > 0, got 0.0"),
                    ({"eps": math.inf}, "eps must be finite and > 0, got inf"),
                    ({"eps_w": 0.0}, "eps_w must be finite and > 0, got 0.0")):
        with pytest.raises(ValueError, match=f"HargoConfig.{msg}"):
            HargoConfig(**kw)
    assert EMABaseline(0.0).rho == 0.0
    for rho in (1.0, -0.1):
        with pytest.raises(ValueError, match=rf"EMABaseline rho must lie in \[0, 1\), got {rho}"):
            EMABaseline(rho)
    b = EMABaseline(0.5)
    b.load_state_dict({"rho": 0.0, "value": None})               # allowed: rho 0, no value yet
    assert (b.rho, b.value) == (0.0, None)
    b.load_state_dict({"rho": 0.0, "value": -2})
    assert b.value == -2.0 and isinstance(b.value, float)
    for state, msg in (({"rho": 1.0, "value": 0.0}, r"rho must lie in \[0, 1\), got 1.0"),
                       ({"rho": 0.9, "value": math.inf}, "value must be finite, got inf"),
                       ({"value": 0.0}, "expected {'rho', 'value'}, got {'value': 0.0}")):
        with pytest.raises(ValueError, match=f"EMABaseline.load_state_dict: {msg}"):
            b.load_state_dict(state)
    assert (b.rho, b.value) == (0.0, -2.0)   # a refused state changes nothing


def test_flat_names_and_float32_outputs():
    """``flat()`` keys, and estimator outputs are float32 even under a float64 default dtype
    (``_uniform`` names its dtype) and computed in float64 from bfloat16 input."""
    r = torch.tensor([[1.0, 0.0, 0.0, 0.0]])
    l = torch.tensor([[-1.0, -2.0, -3.0, -4.0]])
    assert sorted(estimate("hargo", r, l).flat()) == ["advantages", "confidence",
                                                      "discrimination", "weights"]
    assert sorted(estimate("grpo", r).flat()) == ["advantages", "weights"]
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        for m in ("grpo", "dr_grpo"):
            assert estimate(m, r).weights.dtype == torch.float32, m
    finally:
        torch.set_default_dtype(old)
    # bfloat16 rewards: TRL's 0.75 / 0.5001 computed in float64 (bf16 arithmetic gives 1.5)
    out = estimate("grpo", r.to(torch.bfloat16))
    assert out.advantages[0, 0].item() == pytest.approx(0.75 / 0.5001, abs=1e-6)


def test_config_eps_and_eps_w_reach_the_estimator():
    """HargoConfig's std_eps, eps and eps_w are the ones used (not the functions' defaults).
    Rewards (1, 0, 0, 0), std_eps = eps = 1: std 0.4330, A = (0.5234, -0.1745 x3), d = |A| / (0.5234 + 1) =
    (0.3436, 0.1145 x3), sum d = 0.6873: below eps_w = 0.9 -> 1/G; above eps_w = 0.5 -> d / sum d
    = (1/2, 1/6 x3)."""
    r = torch.tensor([[1.0, 0.0, 0.0, 0.0]])
    std = math.sqrt(0.1875)
    A = [0.75 / (std + 1), -0.25 / (std + 1)]
    d = [A[0] / (A[0] + 1), -A[1] / (A[0] + 1)]
    out = estimate("hargo_b1", r, config=HargoConfig(eps=1.0, std_eps=1.0, eps_w=0.9))
    assert out.advantages[0].tolist() == pytest.approx([A[0]] + [A[1]] * 3, abs=1e-6)
    assert out.discrimination[0].tolist() == pytest.approx([d[0]] + [d[1]] * 3, abs=1e-6)
    assert out.weights[0].tolist() == [0.25] * 4
    out = estimate("hargo_b1", r, config=HargoConfig(eps=1.0, std_eps=1.0, eps_w=0.5))
    assert out.weights[0].tolist() == pytest.approx([0.5, 1 / 6, 1 / 6, 1 / 6], abs=1e-6)


def test_b2_falls_back_only_below_eps_w():
    """B2's fallback is ``alpha sum c < eps_w``: exactly at eps_w the weights are c / sum c."""
    r = torch.tensor([[1.0, 0.0, 0.0]])
    l = torch.tensor([[-1.0, -2.0, -4.0]])
    alpha = 0.3
    c = torch.sigmoid(l.to(torch.float64) - float(l.to(torch.float64).mean()))
    s = float((alpha * c).sum(dim=1, keepdim=True))
    at = estimate("hargo_b2", r, l, config=HargoConfig(alpha=alpha, eps_w=s))
    assert at.weights[0].tolist() == pytest.approx((c / c.sum()).tolist()[0], abs=1e-7)
    above = estimate("hargo_b2", r, l, config=HargoConfig(alpha=alpha, eps_w=s * 1.0001))
    assert above.weights[0].tolist() == pytest.approx([1 / 3] * 3)


def test_group_rewards():
    flat = torch.arange(8.0)
    assert group_rewards(flat, 4).tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]]
    with pytest.raises(ValueError, match=r"10 rewards do not split into groups of G=4 \(10 % 4 = 2\)"):
        group_rewards(torch.zeros(10), 4)
    assert group_rewards(flat, 1).shape == (8, 1)                 # G = 1 is a valid reshape
    with pytest.raises(ValueError, match="G must be >= 1, got 0"):
        group_rewards(flat, 0)
    with pytest.raises(ValueError, match="1-D"):
        group_rewards(torch.zeros(2, 4), 4)


def test_config_from_params(committed_params):
    import copy

    from hargo.methods import method_params

    p = copy.deepcopy(committed_params)
    p["rl"]["hargo"].update(alpha=0.5, rho=0.8, eps=1e-5, eps_w=1e-4)
    cfg = HargoConfig.of(method_params(p, "hargo"))
    assert (cfg.alpha, cfg.rho, cfg.eps, cfg.eps_w) == (0.5, 0.8, 1e-5, 1e-4)
    assert HargoConfig.of(method_params(committed_params, "hargo")) == HargoConfig()
    # B1 is alpha = 0 by definition; its block has no alpha
    b1 = HargoConfig.of(method_params(committed_params, "hargo_b1"))
    assert (b1.alpha, b1.eps, b1.eps_w) == (0.0, 1e-6, 1e-6)


def test_b1_does_not_touch_baseline():
    base = EMABaseline(0.9)
    estimate("hargo_b1", torch.tensor([[1.0, 0.0]]), torch.tensor([[-1.0, -2.0]]), base)
    assert base.value is None


# ----------------------------------------------------------------------------------- properties

@st.composite
def batches(draw):
    n = draw(st.integers(1, 5))
    g = draw(st.integers(2, 8))
    discrete = draw(st.booleans())
    if discrete:  # binary / tiered rewards: ties and all-equal groups are common
        elems = st.sampled_from([0.0, 0.1, 0.2, 0.5, 1.0])
    else:
        elems = st.floats(-1e6, 1e6, allow_nan=False, allow_infinity=False, width=32)
    r = draw(arrays(np.float32, (n, g), elements=elems))
    l = draw(arrays(np.float32, (n, g), elements=st.floats(-30, 0, width=32)))
    return torch.from_numpy(r), torch.from_numpy(l)


@settings(max_examples=150, deadline=None)
@given(batches(), st.sampled_from(METHODS), st.sampled_from([torch.float32, torch.bfloat16]))
def test_weight_properties(batch, method, dtype):
    r, l = batch
    r, l = r.to(dtype), l.to(dtype)
    out = estimate(method, r, l)
    for t in (out.advantages, out.weights):
        assert t.dtype == torch.float32 and t.shape == r.shape
        assert torch.isfinite(t).all()
    assert (out.weights >= 0).all()
    torch.testing.assert_close(out.weights.sum(dim=1), torch.ones(r.shape[0]), rtol=0, atol=1e-5)
    # equal-reward groups: 1/G and zero advantage
    flat = (r == r[:, :1]).all(dim=1)
    G = r.shape[1]
    assert torch.allclose(out.weights[flat], torch.full_like(out.weights[flat], 1 / G))
    assert (out.advantages[flat] == 0).all()


@settings(max_examples=100, deadline=None)
@given(batches(), st.sampled_from(["hargo", "hargo_b2"]))
def test_modulation_keeps_sign(batch, method):
    r, l = batch
    plain = estimate("hargo_b1", r).advantages
    mod = estimate(method, r, l).advantages
    assert torch.equal(torch.sign(mod), torch.sign(plain))
    assert (mod.abs() >= plain.abs() * (1 - 1e-6)).all()
    assert (mod.abs() <= plain.abs() * 1.3 * (1 + 1e-6)).all()


@settings(max_examples=100, deadline=None)
@given(batches(), st.sampled_from(METHODS + BATCH_METHODS), st.randoms(use_true_random=False))
def test_permutation_equivariance(batch, method, rnd):
    r, l = batch
    n, g = r.shape
    perm = torch.stack([torch.tensor(rnd.sample(range(g), g)) for _ in range(n)])
    a = estimate(method, r, l)
    b = estimate(method, torch.gather(r, 1, perm), torch.gather(l, 1, perm))
    for x, y in ((a.advantages, b.advantages), (a.weights, b.weights)):
        torch.testing.assert_close(torch.gather(x, 1, perm), y, rtol=1e-5, atol=1e-6)
    if a.confidence is not None:
        torch.testing.assert_close(torch.gather(a.confidence, 1, perm), b.confidence,
                                   rtol=1e-5, atol=1e-6)


def _contrast(advantages: torch.Tensor) -> torch.Tensor:
    """(N,) bool: the groups with clear contrast, ``max |A| > 1e-3`` (so ``sum d`` is about 1 or
    more, far above eps_w = 1e-6; a group with rewards apart by less than ~eps has tiny ``A`` and
    falls back to 1/G by step 5)."""
    return advantages.abs().amax(dim=1) > 1e-3


@settings(max_examples=100, deadline=None)
@given(batches(), st.sampled_from(["hargo", "hargo_b1"]))
def test_weights_are_proportional_to_abs_modulated_advantage(batch, method):
    """Steps 4-5: ``w_i = d_i / sum d = |M_i| / sum_j |M_j|`` (eps cancels) in a group with
    contrast; ``d_i = |M_i| / (max_j |M_j| + eps)``. Uniform weights would fail this."""
    r, l = batch
    out = estimate(method, r, l)
    M = out.advantages.to(torch.float64).abs()
    c = _contrast(M)
    want = M / M.sum(dim=1, keepdim=True)
    torch.testing.assert_close(out.weights.to(torch.float64)[c], want[c], rtol=1e-5, atol=1e-6)
    want_d = M / (M.amax(dim=1, keepdim=True) + 1e-6)
    torch.testing.assert_close(out.discrimination.to(torch.float64), want_d, rtol=1e-5, atol=1e-6)
    assert (out.discrimination.amax(dim=1)[c] > 0.99).all()  # the largest |M| has d ~ 1


@settings(max_examples=100, deadline=None)
@given(batches(), st.sampled_from(["hargo", "hargo_b2"]))
def test_confidence_and_modulation_follow_the_formula(batch, method):
    """Steps 2-3 on a fresh baseline: ``g = mean(l)`` of the batch, ``c = sigmoid(l - g)``,
    ``M = A (1 + alpha c)`` with B1's ``A``. Confidence 0 (or a dropped alpha) fails this."""
    r, l = batch
    cfg = HargoConfig(alpha=0.7)
    out = estimate(method, r, l, config=cfg)
    g = l.to(torch.float64).mean().item()
    assert out.baseline == pytest.approx(g, rel=1e-9, abs=1e-9)
    c = torch.sigmoid(l.to(torch.float64) - g)
    torch.testing.assert_close(out.confidence.to(torch.float64), c, rtol=1e-6, atol=1e-7)
    A = estimate("hargo_b1", r).advantages.to(torch.float64)
    torch.testing.assert_close(out.advantages.to(torch.float64), A * (1 + 0.7 * c),
                               rtol=1e-5, atol=1e-6)


@settings(max_examples=100, deadline=None)
@given(batches())
def test_hargo_with_alpha_zero_is_b1(batch):
    """``alpha = 0``: ``M = A``, so HARGO's advantages and weights are exactly B1's."""
    r, l = batch
    full = estimate("hargo", r, l, config=HargoConfig(alpha=0.0))
    b1 = estimate("hargo_b1", r, l)
    assert torch.equal(full.advantages, b1.advantages)
    assert torch.equal(full.weights, b1.weights)
    assert torch.equal(full.discrimination, b1.discrimination)


@settings(max_examples=100, deadline=None)
@given(batches(), st.sampled_from([0.1, 0.3, 1.0]))
def test_b2_weights_are_proportional_to_confidence(batch, alpha):
    """B2: ``w_i = alpha c_i / sum_j alpha c_j = c_i / sum_j c_j`` in a group with contrast (alpha
    cancels), 1/G in a group without. The code also falls back to 1/G when ``alpha sum c <
    eps_w`` (reference log-probs far below the baseline), so such groups are left out here."""
    r, l = batch
    out = estimate("hargo_b2", r, l, config=HargoConfig(alpha=alpha))
    c = out.confidence.to(torch.float64)
    has = _contrast(out.advantages) & (alpha * c.sum(dim=1) > 2e-6)
    torch.testing.assert_close(out.weights.to(torch.float64)[has],
                               (c / c.sum(dim=1, keepdim=True))[has], rtol=1e-5, atol=1e-6)
    G = r.shape[1]
    flat = (r == r[:, :1]).all(dim=1)  # all rewards equal: 1/G
    assert torch.equal(out.weights[flat], torch.full_like(out.weights[flat], 1 / G))


@st.composite
def rewards_with_spread(draw):
    """Rewards in [0, 1] whose groups each have a std >= 0.05 (so eps = 1e-6 is negligible
    against it), as float64."""
    n = draw(st.integers(1, 4))
    g = draw(st.integers(2, 6))
    r = draw(arrays(np.float64, (n, g), elements=st.floats(0, 1, allow_nan=False)))
    r[:, 0], r[:, 1] = 0.0, 1.0  # a spread of 1 in each group: std >= 1 / G >= 0.16
    return torch.from_numpy(r)


@settings(max_examples=100, deadline=None)
@given(rewards_with_spread(), st.floats(-100, 100), st.floats(0.01, 100),
       st.sampled_from(["hargo", "hargo_b1", "hargo_b2", "grpo"]))
def test_shift_and_scale_invariance(r, shift, scale, method):
    """``A = (r - mean) / (std + eps)`` does not change when every reward is shifted by a
    constant (up to rounding). A positive scale ``k`` gives ``k (r - mean) / (k std + eps) =
    A (std + eps) / (std + eps / k)``: invariant only up to eps (GRPO's eps is TRL's 1e-4, sample
    std), which this checks exactly. ``w = |M| / sum |M|`` is invariant (the group's common factor
    cancels; B2's weights do not read rewards at all). Dr. GRPO's ``r - mean`` scales by ``k``."""
    l = -torch.arange(r.numel(), dtype=torch.float64).reshape(r.shape) / 3
    a = estimate(method, r, l)
    b = estimate(method, r * scale + shift, l)
    eps, correction = (1e-4, 1) if method == "grpo" else (1e-6, 0)
    std = r.std(dim=1, keepdim=True, correction=correction)
    factor = (std + eps) / (std + eps / scale)
    torch.testing.assert_close(b.advantages.to(torch.float64),
                               a.advantages.to(torch.float64) * factor, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(b.weights, a.weights, rtol=1e-5, atol=1e-6)
    d = estimate("dr_grpo", r * scale + shift).advantages.to(torch.float64)
    torch.testing.assert_close(d, scale * estimate("dr_grpo", r).advantages.to(torch.float64),
                               rtol=1e-4, atol=1e-4 * scale)


def test_extreme_finite_rewards_no_nan():
    big = torch.tensor([[3.4e38, -3.4e38, 1.0, 0.0], [1e-30, 0.0, 0.0, 0.0]])
    for m in METHODS + BATCH_METHODS:
        out = estimate(m, big, torch.tensor([[-1e4, 0.0, -5.0, -1.0]] * 2))
        assert torch.isfinite(out.advantages).all() and torch.isfinite(out.weights).all(), m


# ------------------------------------------------------------------------------------ EMA state

def test_ema_update_and_round_trip():
    b = EMABaseline(0.9)
    assert b.value is None
    assert b.update(-2.0) == -2.0
    assert b.update(-1.0) == pytest.approx(0.9 * -2.0 + 0.1 * -1.0)
    restored = EMABaseline()
    restored.load_state_dict(json.loads(json.dumps(b.state_dict())))
    assert restored.rho == 0.9 and restored.value == b.value
    with pytest.raises(ValueError):
        restored.load_state_dict({"rho": 0.9})
    with pytest.raises(ValueError, match="finite"):
        b.update(float("nan"))


def test_resumed_equals_uninterrupted():
    gen = torch.Generator().manual_seed(1)
    batches_ = [((torch.rand(3, 4, generator=gen) > 0.5).float(),
                 -3 * torch.rand(3, 4, generator=gen)) for _ in range(5)]
    full = EMABaseline(0.9)
    ref = [estimate("hargo", r, l, full) for r, l in batches_]
    first = EMABaseline(0.9)
    resumed = [estimate("hargo", r, l, first) for r, l in batches_[:2]]
    state = json.loads(json.dumps(first.state_dict()))  # checkpoint
    second = EMABaseline(0.5)  # a fresh trainer; load_state_dict restores rho too
    second.load_state_dict(state)
    resumed += [estimate("hargo", r, l, second) for r, l in batches_[2:]]
    for a, b in zip(ref, resumed):
        assert torch.equal(a.advantages, b.advantages) and torch.equal(a.weights, b.weights)
        assert a.baseline == b.baseline
    assert full.value == second.value


# ---------------------------------------------------------------------------------------- loss

def test_estimator_feeds_loss():
    """One loss for all estimators: weights flattened in TRL's group-major order."""
    r = torch.tensor([[1.0, 0.0, 0.0, 0.0]])
    out = estimate("hargo_b1", r)
    L = torch.tensor([[1.0], [2.0], [2.0], [2.0]])
    loss = weighted_loss(L, torch.ones(4, 1), out.flat()["weights"], num_groups=1)
    assert loss.item() == pytest.approx(0.5 * 1 + 3 * (1 / 6) * 2, abs=1e-6)


def test_benchmark_script_runs(capsys, monkeypatch):
    """The micro-benchmark (benchmarks/bench_weights.py) times every estimator, drops the warm-up
    call, takes the median, and prints ms, the ratio to GRPO and the share of an RL step. A fake
    clock makes call k (0 = warm-up) of an estimator take ``base * (k + 1)`` ms, so with 3 repeats
    the median is ``3 * base`` (with the warm-up it would be ``2.5 * base``)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_weights.py"
    spec = importlib.util.spec_from_file_location("bench_weights", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    rows = mod.main(["--groups", "64", "--repeats", "3"])   # the real estimators run
    assert [m for m, _ in rows] == list(ESTIMATORS)
    assert all(ms > 0 for _, ms in rows)
    capsys.readouterr()

    base = {"grpo": 2.0, "dr_grpo": 1.0, "hargo": 5.0, "hargo_b1": 4.0, "hargo_b2": 6.0}
    base.update({m: 3.0 + i for i, m in enumerate(ESTIMATORS) if m not in base})
    base = {m: base[m] for m in ESTIMATORS}   # the registry's order, as the benchmark's rows
    now, calls = [0.0], {}

    def fake_estimate(method, rewards, ref, baseline, cfg):
        assert rewards.shape == (64, 4) and ref.shape == (64, 4)
        k = calls.get(method, 0)
        calls[method] = k + 1
        now[0] += base[method] * (k + 1) / 1e3

    monkeypatch.setattr(mod, "estimate", fake_estimate)
    monkeypatch.setattr(mod.time, "perf_counter", lambda: now[0])
    rows = mod.main(["--groups", "64", "--repeats", "3"])
    assert calls == {m: 4 for m in base}
    assert rows == [(m, pytest.approx(3 * b, abs=1e-9)) for m, b in base.items()]
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "64 groups x G=4 (256 responses), 1 thread(s), median of 3 runs"
    # hargo: 15 ms, 2.50 x grpo's 6 ms, 15 ms of a 100 s step = 0.015 %
    assert out[2 + list(base).index("hargo")].split() == ["hargo", "15.000", "2.50", "0.01500%"]
    # one table row per estimator, in order, each parsing to (ms, x grpo, % of a 100 s step)
    assert out[1].split()[:2] == ["estimator", "ms"] and out[2 + len(base)] == ""
    table = [line.split() for line in out[2:2 + len(base)]]
    assert [r[0] for r in table] == list(base)
    for (m, ms, ratio, pct), (_, b) in zip(table, base.items()):
        assert (float(ms), float(ratio), float(pct.rstrip("%"))) == pytest.approx(
            (3 * b, b / base["grpo"], 3 * b / 1e3 / 100 * 100), abs=5e-3), m
    slowest = 3 * max(base.values())
    assert out[-1] == f"slowest estimator: {slowest:.2f} ms = {slowest / 1e5:.1e} of one ~100 s " \
                      "RL step on this CPU (negligible)."


# ------------------------------------------------------------ std conventions, batch variants

def test_std_conventions_by_hand():
    """Rewards (1, 0, 0, 0): centred (0.75, -0.25 x3); population std sqrt(0.1875) = 0.4330,
    sample std 0.5; batch scope over two groups (1,0,0,0), (1,1,0,0): the 8 rewards' population
    std is sqrt(0.375 - 0.140625) = 0.4841 (mean 3/8)."""
    r = torch.tensor([[1.0, 0.0, 0.0, 0.0]])
    pop = HargoConfig(std="population", std_eps=1e-6).advantage(r)
    assert pop[0].tolist() == pytest.approx([0.75 / (math.sqrt(0.1875) + 1e-6)]
                                            + [-0.25 / (math.sqrt(0.1875) + 1e-6)] * 3, abs=1e-9)
    smp = HargoConfig(std="sample", std_eps=1e-4).advantage(r)
    assert smp[0, 0].item() == pytest.approx(0.75 / 0.5001, abs=1e-9)
    assert HargoConfig(std="none").advantage(r)[0].tolist() == [0.75, -0.25, -0.25, -0.25]
    two = torch.tensor([[1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 0.0, 0.0]])
    batch = HargoConfig(std="population", std_eps=1e-6, std_scope="batch").advantage(two)
    s = math.sqrt(3 / 8 - (3 / 8) ** 2)
    assert batch[1].tolist() == pytest.approx([0.5 / (s + 1e-6)] * 2 + [-0.5 / (s + 1e-6)] * 2,
                                              abs=1e-9)
    assert batch[0, 0].item() == pytest.approx(0.75 / (s + 1e-6), abs=1e-9)
    with pytest.raises(ValueError, match="std must be one of population, sample, none"):
        HargoConfig(std="unbiased")
    with pytest.raises(ValueError, match="std_scope must be one of group, batch"):
        HargoConfig(std_scope="prompt")


def test_batch_variants_by_hand():
    """Groups (1,0,0,0) and (1,1,0,0), population std. hargo_contrast: |r - mean| is
    (.75, .25 x3) and (.5 x4), sums 1.5 and 2, so w = 2 x (.75, .25, .25, .25, .5 x4) / 3.5: the
    second group gets 8/7 of the update, the first 6/7. hargo_batch at alpha 0 (B1's M = A):
    |A| = (1.7320, 0.5773 x3) and (1 x4), sum 7.4641: w = 2 |A| / 7.4641. An all-equal group
    gets weight 0; a batch with no contrast at all gets 1/G."""
    r = torch.tensor([[1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 0.0, 0.0]])
    out = estimate("hargo_contrast", r)
    want = [2 * x / 3.5 for x in (0.75, 0.25, 0.25, 0.25, 0.5, 0.5, 0.5, 0.5)]
    assert out.weights.reshape(-1).tolist() == pytest.approx(want, abs=1e-6)
    assert out.weights[1].sum().item() == pytest.approx(8 / 7, abs=1e-6)
    l = torch.zeros(2, 4)
    b = estimate("hargo_batch", r, l, config=HargoConfig(alpha=0.0))
    A = [math.sqrt(3), 1 / math.sqrt(3)]
    total = A[0] + 3 * A[1] + 4
    want = [2 * x / total for x in (A[0], A[1], A[1], A[1], 1, 1, 1, 1)]
    assert b.weights.reshape(-1).tolist() == pytest.approx(want, abs=1e-5)
    flat = torch.tensor([[1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]])
    for m in BATCH_METHODS:
        w = estimate(m, flat, torch.zeros(2, 4)).weights
        assert w[1].tolist() == [0.0] * 4 and w.sum().item() == pytest.approx(2.0, abs=1e-6), m
        w = estimate(m, torch.ones(2, 4), torch.zeros(2, 4)).weights
        assert w.tolist() == [[0.25] * 4] * 2, m


@settings(max_examples=100, deadline=None)
@given(batches(), st.sampled_from(BATCH_METHODS))
def test_batch_weights_sum_to_the_group_count(batch, method):
    r, l = batch
    out = estimate(method, r, l)
    assert (out.weights >= 0).all() and torch.isfinite(out.weights).all()
    assert out.weights.sum().item() == pytest.approx(r.shape[0], rel=1e-4)


def test_the_torch_free_choice_lists_are_the_estimators():
    """hargo.method_config keeps torch-free copies of the std kinds and scopes and the
    aggregation modes for the params checks; they must be the math's own lists."""
    from hargo.advantages import STD_KINDS, STD_SCOPES
    from hargo.losses import AGGREGATIONS
    from hargo.method_config import AGGREGATION_MODES
    from hargo.method_config import STD_KINDS as KINDS
    from hargo.method_config import STD_SCOPES as SCOPES

    assert KINDS == STD_KINDS and SCOPES == STD_SCOPES
    assert set(AGGREGATION_MODES) == set(AGGREGATIONS)
