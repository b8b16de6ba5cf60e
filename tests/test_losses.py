"""hargo.losses: the loss math of every RL method, against hand-computed values (the arithmetic
is written out next to each expectation) and against TRL 1.16's own expression, bit for bit."""
from __future__ import annotations

import math

import pytest
import torch

from hargo.losses import (AGGREGATIONS, KL_ESTIMATORS, POLICY_LOSSES, advantage_weighted_logprob,
                          aggregate, clip_fraction,
                          clipped_policy_loss, clipped_surrogate, clipped_value_loss,
                          explained_variance, gae_advantages, importance_ratio, kl_penalty,
                          masked_mean, masked_token_mean, policy_loss, register_aggregation,
                          register_kl, register_policy_loss, token_rewards, weighted_loss, whiten)

pytestmark = pytest.mark.fast

NAN = float("nan")


def t(x, dtype=torch.float32):
    return torch.tensor(x, dtype=dtype)


# --------------------------------------------------------------------------- masked means

def test_masked_mean_ignores_padding():
    x = t([[1.0, 3.0, NAN], [2.0, float("inf"), 5.0], [7.0, 7.0, 7.0]])
    mask = t([[1, 1, 0], [1, 0, 1], [0, 0, 0]])
    assert masked_mean(x, mask).tolist() == [2.0, 3.5, 0.0]
    bf = masked_mean(x.to(torch.bfloat16), mask)
    assert bf.dtype == torch.float32 and bf.tolist() == [2.0, 3.5, 0.0]
    assert masked_mean(x.double(), mask).dtype == torch.float64
    with pytest.raises(ValueError, match="same"):
        masked_mean(x, mask[:, :2])


def test_masked_token_mean_over_all_tokens_and_processes():
    x = t([[1.0, 3.0, NAN], [4.0, NAN, NAN]])
    mask = t([[1, 1, 0], [1, 0, 0]])
    # every token weighs the same: (1 + 3 + 4) / 3, not the mean of the row means (2 + 4) / 2
    assert masked_token_mean(x, mask).item() == pytest.approx(8 / 3)
    # another process holding sum 10 over 1 token: (8 + 10) / (3 + 1)
    other = t([10.0, 1.0])
    assert masked_token_mean(x, mask, reduce=lambda s: s + other).item() == pytest.approx(4.5)
    assert masked_token_mean(x, torch.zeros_like(mask)).item() == 0.0
    assert masked_token_mean(x.to(torch.bfloat16), mask).dtype == torch.float32
    with pytest.raises(ValueError, match="one shape"):
        masked_token_mean(x, mask[:, :2])


# ---------------------------------------------------------------------------- aggregation

def test_aggregate_modes_by_hand():
    L = t([[1.0, 3.0, NAN], [4.0, NAN, NAN]], ).requires_grad_(True)
    mask = t([[1, 1, 0], [1, 0, 0]])
    # response_mean (TRL grpo): row means 2 and 4, then their mean 3
    rm = aggregate(L, mask, "response_mean")
    assert rm.item() == pytest.approx(3.0)
    # token_mean (TRL bnpo / old PPO): (1 + 3 + 4) / 3
    assert aggregate(L, mask, "token_mean").item() == pytest.approx(8 / 3)
    rm.backward()
    # d/dL of (mean(L00, L01) + L10) / 2: 1/4, 1/4 and 1/2; padding (NaN) gets exactly 0
    assert L.grad.tolist() == [[0.25, 0.25, 0.0], [0.5, 0.0, 0.0]]
    with pytest.raises(ValueError, match="response_mean"):
        aggregate(L, mask, "seq_sum")
    with pytest.raises(ValueError, match="already registered"):
        register_aggregation("token_mean")(lambda x, m: x.sum())
    assert {"response_mean", "token_mean"} <= set(AGGREGATIONS)


def test_weighted_loss_hand_computed():
    L = t([[1.0, 3.0, 0.0], [4.0, 0.0, 0.0], [1.0, 1.0, 1.0], [6.0, 2.0, 0.0]],
          ).requires_grad_(True)
    mask = t([[1, 1, 0], [1, 0, 0], [1, 1, 1], [1, 1, 0]])
    per = [2.0, 4.0, 1.0, 4.0]  # token means
    # uniform 1/G (2 groups of 2): the mean over responses, i.e. the response_mean aggregation
    loss = weighted_loss(L, mask, torch.full((4,), 0.5), num_groups=2)
    assert loss.item() == pytest.approx(sum(per) / 4)
    assert loss.item() == pytest.approx(aggregate(L, mask, "response_mean").item())
    w = t([0.75, 0.25, 0.1, 0.9])
    loss = weighted_loss(L, mask, w, num_groups=2)
    assert loss.item() == pytest.approx((0.75 * 2 + 0.25 * 4 + 0.1 * 1 + 0.9 * 4) / 2)
    loss.backward()
    # d loss / d L[0, 0] = w0 / (2 tokens) / 2 groups; padding gets no gradient
    assert L.grad[0].tolist() == pytest.approx([0.75 / 2 / 2, 0.75 / 2 / 2, 0.0])
    bf = weighted_loss(L.detach().to(torch.bfloat16), mask, w.to(torch.bfloat16), 2)
    assert bf.dtype == torch.float32 and bf.item() == pytest.approx(3.1, abs=2e-2)
    with pytest.raises(ValueError, match="num_groups"):
        weighted_loss(L, mask, w, 0)
    with pytest.raises(ValueError, match=r"weights"):
        weighted_loss(L, mask, w[:3], 2)


def test_weighted_hargo_loss_nonuniform_weights_and_advantages():
    """The whole HARGO per-token loss (surrogate + beta * k3) through weighted_loss, by hand.

    2 groups of 2 responses, T = 3, ratio 1 (old = current log-probs) so the surrogate is -A per
    token; d = log pi_ref - log pi is 0 or ln 2 per token, so k3 is 0 or 2 - 1 - ln 2 = 0.30685.
    beta = 0.1. Padding holds NaN.
    """
    ln2 = math.log(2.0)
    k3 = 2.0 - 1.0 - ln2
    beta = 0.1
    A = t([1.0, -1.0, 0.5, -0.5])
    mask = t([[1, 1, 0], [1, 1, 1], [1, 0, 0], [1, 1, 1]])
    d = t([[0.0, ln2, NAN], [0.0, 0.0, 0.0], [ln2, NAN, NAN], [ln2, ln2, ln2]])
    logps = t([[-1.0, -2.0, NAN], [-0.5, -0.5, -0.5], [-3.0, NAN, NAN], [-1.0, -1.0, -1.0]])
    ref = logps + d
    surrogate, ratio = clipped_surrogate(logps, logps, A, 0.2, 0.28)
    per_token = surrogate + beta * kl_penalty(logps, ref, "k3") * ratio
    w = t([0.7, 0.3, 0.2, 0.8])
    loss = weighted_loss(per_token, mask, w, num_groups=2)
    # response means: i0 (-1 + 0) and (-1 + beta k3) over 2 tokens; i1: +1 on 3 tokens;
    # i2: -0.5 + beta k3 on 1 token; i3: +0.5 + beta k3 on every token
    L0 = (-1.0 + (-1.0 + beta * k3)) / 2      # -0.98466
    L1 = 1.0
    L2 = -0.5 + beta * k3                     # -0.46932
    L3 = 0.5 + beta * k3                      # 0.53069
    expected = (0.7 * L0 + 0.3 * L1 + 0.2 * L2 + 0.8 * L3) / 2    # -0.0292876
    assert loss.item() == pytest.approx(expected, abs=1e-6)
    assert expected == pytest.approx(-0.0292876, abs=1e-6)
    # the weights matter: uniform 1/G gives another value
    uniform = weighted_loss(per_token, mask, torch.full((4,), 0.5), num_groups=2)
    assert uniform.item() == pytest.approx((L0 + L1 + L2 + L3) / 4, abs=1e-6)
    assert abs(uniform.item() - expected) > 0.04     # 0.0192 vs -0.0293


def test_surrogate_value_is_zero_but_advantage_weighted_logprob_carries_its_gradient():
    """One pass per rollout (old = current log-probs): GRPO's surrogate (uniform 1/G, advantages
    of mean 0 per group) is 0 in value, its gradient is not, and it equals minus the gradient
    of the mean advantage-weighted log-prob, whose value is written out here.

    1 group of G = 2, T = 3: A = (+1, -1); response 0 has 2 tokens (log-probs -1, -2), response 1
    has 3 (-0.5, -1.5, -1); padding holds 0 (as TRL's log-probs).
    """
    A = t([1.0, -1.0])
    mask = t([[1, 1, 0], [1, 1, 1]])
    logps = t([[-1.0, -2.0, 0.0], [-0.5, -1.5, -1.0]]).requires_grad_(True)
    surrogate, _ = clipped_surrogate(logps, logps.detach(), A, 0.2, 0.2)
    loss = weighted_loss(surrogate, mask, torch.full((2,), 0.5), num_groups=1)
    assert loss.item() == 0.0                   # (-1 * 1 + 1 * 1) / 2
    loss.backward()
    # d loss / d logp[i, t] = -w_i A_i / |y_i| (N = 1): -0.5/2 on response 0, +0.5/3 on response 1
    assert logps.grad[0].tolist() == pytest.approx([-0.25, -0.25, 0.0])
    assert logps.grad[1].tolist() == pytest.approx([1 / 6, 1 / 6, 1 / 6])

    # uniform weights: G w = 1, values A_i * mean_t logp: (+1)(-1.5) = -1.5, (-1)(-1) = +1
    v = advantage_weighted_logprob(logps, A, mask, torch.full((2,), 0.5), group_size=2)
    assert v.tolist() == pytest.approx([-1.5, 1.0]) and not v.requires_grad
    assert advantage_weighted_logprob(logps, A, mask).tolist() == pytest.approx([-1.5, 1.0])
    # -grad of mean(v) w.r.t. logps is the surrogate's gradient
    x = logps.detach().clone().requires_grad_(True)
    obj = (A[:, None] * torch.where(mask.bool(), x, 0.0)).sum(1) / mask.sum(1)
    (-obj.mean()).backward()
    torch.testing.assert_close(x.grad, logps.grad)
    # HARGO weights (0.75, 0.25): G w = (1.5, 0.5) -> (-2.25, 0.5)
    w = t([0.75, 0.25])
    assert advantage_weighted_logprob(logps, A, mask, w, 2).tolist() == pytest.approx([-2.25, 0.5])
    # per-token advantages (PPO): mean_t A_t logp_t; response 1: (2 * -0.5 + 0 + 1 * -1) / 3
    At = t([[1.0, 1.0, 5.0], [2.0, 0.0, 1.0]])
    assert advantage_weighted_logprob(logps, At, mask).tolist() == pytest.approx([-1.5, -2 / 3])
    with pytest.raises(ValueError, match="weights"):
        advantage_weighted_logprob(logps, A, mask, w[:1], 2)
    with pytest.raises(ValueError, match="group_size"):
        advantage_weighted_logprob(logps, A, mask, w, 0)


# ---------------------------------------------------------------------- clipped surrogate

# ratios r and advantages A of the 2x3 example; eps_low = 0.2, eps_high = 0.28 -> [0.8, 1.28]
RATIOS = [[1.5, 1.1, 0.5], [0.5, 1.5, 0.9]]
ADV = [2.0, -1.0]


def test_clipped_surrogate_2x3_hand_computed_both_clips_bind():
    logps = torch.log(t(RATIOS, torch.float64)).requires_grad_(True)
    old = torch.zeros(2, 3, dtype=torch.float64)
    loss, ratio = clipped_surrogate(logps, old, t(ADV, torch.float64), 0.2, 0.28)
    # L = -min(r A, clip(r, 0.8, 1.28) A)
    # row 0, A = +2:  r=1.5: -min(3.0, 2.56) = -2.56 (high clip binds)
    #                 r=1.1: -min(2.2, 2.2)  = -2.2
    #                 r=0.5: -min(1.0, 1.6)  = -1.0  (unclipped term is the smaller: no clip)
    # row 1, A = -1:  r=0.5: -min(-0.5, -0.8) = 0.8  (low clip binds)
    #                 r=1.5: -min(-1.5, -1.28) = 1.5 (unclipped term is the smaller: no clip)
    #                 r=0.9: 0.9
    assert loss.tolist() == [pytest.approx([-2.56, -2.2, -1.0]), pytest.approx([0.8, 1.5, 0.9])]
    assert ratio.tolist() == [pytest.approx(r) for r in RATIOS]
    loss.sum().backward()
    # d(-r A)/d log r = -r A where the unclipped term is active, 0 where the clip binds
    assert logps.grad.tolist() == [pytest.approx([0.0, -2.2, -1.0]),
                                   pytest.approx([0.0, 1.5, 0.9])]

    low, high, region = clip_fraction(ratio, t(ADV, torch.float64), 0.2, 0.28)
    assert low.tolist() == [[False, False, False], [True, False, False]]
    assert high.tolist() == [[True, False, False], [False, False, False]]
    assert region.tolist() == [[True, False, False], [True, False, False]]
    # the clip fraction as logged: 2 of 6 tokens; with the last token of each row masked, 2 of 4
    mask = t([[1, 1, 0], [1, 1, 0]])
    assert masked_token_mean(region.float(), torch.ones(2, 3)).item() == pytest.approx(1 / 3)
    assert masked_token_mean(region.float(), mask).item() == pytest.approx(0.5)
    assert masked_mean(region.float(), mask).tolist() == [0.5, 0.5]


def test_clipped_surrogate_delta_caps_the_ratio_for_negative_advantages():
    logps = torch.log(t(RATIOS, torch.float64))
    old = torch.zeros(2, 3, dtype=torch.float64)
    loss, ratio = clipped_surrogate(logps, old, t(ADV, torch.float64), 0.2, 0.28, delta=1.4)
    # row 1 token 1 (r=1.5, A=-1): -min(min(1.5, 1.4) * -1, 1.28 * -1) = 1.4 instead of 1.5;
    # row 0 token 0 (r=1.5, A=+2): -min(2.8, 2.56) = -2.56 unchanged
    assert loss.tolist() == [pytest.approx([-2.56, -2.2, -1.0]), pytest.approx([0.8, 1.4, 0.9])]
    assert ratio[1, 1].item() == pytest.approx(1.5)      # the returned ratio is not capped
    # TRL logs the capped ratio: with delta = 1.2 < 1.28 the high clip never shows
    _, high, _ = clip_fraction(ratio, t(ADV, torch.float64), 0.2, 0.28, delta=1.2)
    assert not high.any()


def _trl_1_16_grpo_per_token_loss(per_token_logps, old_per_token_logps, advantages, eps_low,
                                  eps_high, delta):
    """TRL 1.16 ``GRPOTrainer._compute_loss`` lines for loss_type grpo (copied)."""
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(1)
    log_ratio = per_token_logps - old_per_token_logps
    coef_1 = torch.exp(log_ratio)
    coef_2 = torch.clamp(coef_1, 1 - eps_low, 1 + eps_high)
    if delta is not None:
        coef_1 = torch.clamp(coef_1, max=delta)
    per_token_loss1 = coef_1 * advantages
    per_token_loss2 = coef_2 * advantages
    return -torch.min(per_token_loss1, per_token_loss2), coef_1


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("delta", [None, 1.5])
def test_clipped_surrogate_is_trl_bit_for_bit(dtype, delta):
    gen = torch.Generator().manual_seed(0)
    logps = (-torch.rand(6, 9, generator=gen) * 3).to(dtype)
    old = (logps.float() + 0.4 * torch.randn(6, 9, generator=gen)).to(dtype)
    adv = torch.randn(6, generator=gen).to(dtype)
    ours, ratio = clipped_surrogate(logps, old, adv, 0.2, 0.28, delta)
    trl, coef_1 = _trl_1_16_grpo_per_token_loss(logps, old, adv, 0.2, 0.28, delta)
    assert ours.dtype == dtype and torch.equal(ours, trl)
    assert torch.equal(ratio, torch.exp(logps - old))
    # the clip indicators equal TRL's (computed on its delta-capped coef_1)
    a = adv.unsqueeze(1)
    trl_low = (coef_1 < 1 - 0.2) & (a < 0)
    trl_high = (coef_1 > 1 + 0.28) & (a > 0)
    low, high, region = clip_fraction(ratio, adv, 0.2, 0.28, delta)
    assert torch.equal(low, trl_low) and torch.equal(high, trl_high)
    assert torch.equal(region, trl_low | trl_high) and region.any()


def test_surrogate_errors_and_registry():
    x = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="differ"):
        clipped_surrogate(x, torch.zeros(2, 4), torch.zeros(2), 0.2, 0.2)
    with pytest.raises(ValueError, match="advantages"):
        clipped_surrogate(x, x, torch.zeros(3), 0.2, 0.2)
    with pytest.raises(ValueError, match="advantages"):
        clip_fraction(x, torch.zeros(2, 2), 0.2, 0.2)
    assert policy_loss("clipped_surrogate") is clipped_surrogate
    assert torch.equal(importance_ratio(x, x), torch.ones(2, 3))
    with pytest.raises(ValueError, match="clipped_surrogate"):
        policy_loss("vanilla")
    with pytest.raises(ValueError, match="already registered"):
        register_policy_loss("clipped_surrogate")(clipped_surrogate)

    @register_policy_loss("_test_plain")
    def plain(logps, old_logps, advantages, eps_low, eps_high, **kw):
        r = torch.exp(logps - old_logps)
        return -r * advantages.unsqueeze(1), r

    try:
        loss, _ = policy_loss("_test_plain")(x, x, t([1.0, -2.0]), 0.2, 0.2)
        assert loss.tolist() == [[-1.0] * 3, [2.0] * 3]
    finally:
        del POLICY_LOSSES["_test_plain"]


# -------------------------------------------------------------------------- KL estimators

def test_kl_estimators_by_hand():
    # token 0: r = pi_ref / pi = 1/2 (d = log r = -ln 2); token 1: r = 2 (d = ln 2)
    ln2 = math.log(2.0)
    logps = t([[math.log(0.5), math.log(0.25)]], torch.float64)
    ref = t([[math.log(0.25), math.log(0.5)]], torch.float64)
    # k1 = -log r: ln 2, -ln 2
    assert kl_penalty(logps, ref, "k1").tolist()[0] == pytest.approx([ln2, -ln2])
    # k2 = (log r)^2 / 2: 0.2402 both
    assert kl_penalty(logps, ref, "k2").tolist()[0] == pytest.approx([ln2 ** 2 / 2] * 2)
    # k3 = r - 1 - log r: 0.5 - 1 + ln 2 = 0.19315; 2 - 1 - ln 2 = 0.30685
    assert kl_penalty(logps, ref, "k3").tolist()[0] == pytest.approx([ln2 - 0.5, 1 - ln2])
    assert kl_penalty(logps, ref).tolist() == kl_penalty(logps, ref, "k3").tolist()


def test_k1_and_k3_are_unbiased_k2_is_not():
    """pi = (0.5, 0.5), pi_ref = (0.25, 0.75): KL(pi || pi_ref) = 0.5 ln 2 + 0.5 ln(2/3) = 0.14384.
    The expectation under pi of k1 and k3 is the KL; that of k2 is not (0.5 * (ln2^2 + ln1.5^2)
    / 2 = 0.16121)."""
    pi, ref = t([0.5, 0.5], torch.float64), t([0.25, 0.75], torch.float64)
    kl = 0.5 * math.log(2.0) + 0.5 * math.log(2 / 3)
    assert kl == pytest.approx(0.143841, abs=1e-6)
    e = {k: float((pi * kl_penalty(pi.log(), ref.log(), k)).sum()) for k in ("k1", "k2", "k3")}
    assert e["k1"] == pytest.approx(kl) and e["k3"] == pytest.approx(kl)
    assert e["k2"] == pytest.approx(0.5 * (math.log(2) ** 2 + math.log(1.5) ** 2) / 2)
    assert abs(e["k2"] - kl) > 0.01


def test_k3_is_trl_bit_for_bit_and_registry():
    gen = torch.Generator().manual_seed(3)
    logps, ref = -torch.rand(4, 7, generator=gen) * 4, -torch.rand(4, 7, generator=gen) * 4
    trl = torch.exp(ref - logps) - (ref - logps) - 1     # TRL 1.16 per_token_kl
    assert torch.equal(kl_penalty(logps, ref, "k3"), trl)
    assert (kl_penalty(logps, ref, "k3") >= 0).all()
    with pytest.raises(ValueError, match="k1"):
        kl_penalty(logps, ref, "low_var")
    with pytest.raises(ValueError, match="differ"):
        kl_penalty(logps, ref[:, :3], "k1")
    with pytest.raises(ValueError, match="already registered"):
        register_kl("k3")(lambda a, b: a - b)

    @register_kl("_test_abs")
    def _abs(a, b):
        return (a - b).abs()

    try:
        assert torch.equal(kl_penalty(logps, ref, "_test_abs"), (logps - ref).abs())
    finally:
        del KL_ESTIMATORS["_test_abs"]


# ------------------------------------------------------------------------------------ GAE

R = [[0.0, 0.0, 1.0]]
V = [[0.1, 0.2, 0.3]]


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
    with pytest.raises(ValueError, match="one shape"):
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


# ------------------------------------------------------------------------------ PPO losses

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
    # token weights (vLLM importance-sampling ratio) scale each token's term: (-1.2 * 2 + 1.5) / 2
    lw, _ = clipped_policy_loss(logps, old, adv, t([[1, 1, 0]]), 0.2,
                                token_weights=t([[2.0, 1.0, 1.0]]))
    assert lw.item() == pytest.approx((-2.4 + 1.5) / 2)
    # clip_high separately: 1.5 < 1 + 0.6, so the A>0 token is no longer clipped
    lh, ch = clipped_policy_loss(logps, old, adv, t([[1, 1, 0]]), 0.2, clip_high=0.6)
    assert lh.item() == pytest.approx((-1.5 + 1.5) / 2) and ch.item() == 0.0


def test_explained_variance():
    ret, mask = t([[1.0, 2.0, 3.0, 50.0]]), t([[1, 1, 1, 0]])
    assert explained_variance(ret, ret, mask) == pytest.approx(1.0)
    assert explained_variance(torch.zeros_like(ret), ret, mask) == pytest.approx(0.0)
    # V = 2 + (R - 2) / 2: R - V = (R - 2) / 2, so Var(R - V) = Var(R) / 4 -> 0.75
    assert explained_variance(2 + (ret - 2) / 2, ret, mask) == pytest.approx(0.75)
    # V = (1, 2, 2): R - V = (0, 0, 1), mean 1/3, Var = (1/9 + 1/9 + 4/9) / 3 = 2/9;
    # Var(R) = 2/3, so 1 - (2/9) / (2/3) = 2/3; a second process with the same rows keeps it
    v = t([[1.0, 2.0, 2.0, -7.0]])
    assert explained_variance(v, ret, mask) == pytest.approx(2 / 3)
    assert explained_variance(v, ret, mask, reduce=lambda s: 2 * s) == pytest.approx(2 / 3)
    assert math.isnan(explained_variance(ret, torch.ones_like(ret), mask))
    assert math.isnan(explained_variance(ret, ret, torch.zeros_like(mask)))
