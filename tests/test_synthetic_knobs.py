"""The synthetic test bed's knobs for the interference map (issue 40, item 3), each with
hand-computed values: per-task reward noise (``synthetic.data.noise_*``), per-task prompts per
step (``synthetic.rl.prompts_per_step_per_task``), the bed's own dynamic sampling
(``synthetic.rl.dynamic_sampling``), task-specific hedges (``synthetic.sft.hedge_style``), the
shared-surface conflict (``synthetic.data.conflict``), and that every method's loss knobs
(``rl.<method>.aggregation``, ``std_scope``, ...) reach the bed and its run fingerprint. At their
defaults every knob leaves the bed as it was (same records, SFT targets, reward function and
sampler). The last test (not ``fast``) trains two 2-step runs of a tiny untrained policy with
the knobs on (~10 s)."""
from __future__ import annotations

import copy
import random
from pathlib import Path

import pytest
import yaml

from hargo.config import as_config
from hargo.compare import synthetic as S
from hargo.compare.synthetic_plan import configuration, plan
from hargo.data.synthetic import (SYNTHETIC_TASKS, SyntheticConfig, SyntheticReward, generate,
                                  synthetic_reward)
from hargo.data.synthetic_hedges import MARKERS, hedge
from hargo.data.synthetic_noise import NoisyReward, noise_stream, reward_function
from hargo.params import ParamsError, validate_params
from hargo.training.sampling import EpochRepeatSampler, TaskQuotaSampler

ROOT = Path(__file__).resolve().parents[1]
LONG = "apple river stone cloud"


@pytest.fixture(scope="module")
def params() -> dict:
    return yaml.safe_load((ROOT / "params.yaml").read_text())


def _with(params: dict, **keys) -> dict:
    """A copy of ``params`` with each dotted key (``**{"synthetic.rl.pool": "all"}``) set."""
    q = copy.deepcopy(params)
    for key, value in keys.items():
        *path, last = key.split(".")
        d = q
        for k in path:
            d = d.setdefault(k, {})
        d[last] = value
    return q


# ------------------------------------------------------------------------- reward noise

@pytest.mark.fast
def test_reward_noise_adds_the_seeded_gauss_times_the_scale_unclipped():
    cfg = SyntheticConfig(noise_short=0.1, scale_short=2.0)
    fn = NoisyReward(cfg, seed=1)
    assert fn.__name__ == "synthetic_reward"
    kw = dict(task=["syn_short", "syn_yesno", "syn_short"], answer=["40", "yes", "40"],
              label=[None, "yes", None])
    out = fn(completions=["40", "yes", "41"], **kw)
    # syn_short's stream "hargo.synthetic.noise:1:syn_short", gauss(0, 0.1): -0.10837992915381725,
    # then 0.07116750193899224, 0.12237385150470255; times the scale 2; syn_yesno: no noise,
    # no draw. Clean rewards: 40 -> 1 (x2 = 2), 41 -> 0.5 (x2 = 1)
    assert out == [2.0 + 2 * -0.10837992915381725, 1.0, 1.0 + 2 * 0.07116750193899224]
    again = fn(completions=["40"], task=["syn_short"], answer=["40"], label=[None])
    assert again == [2.0 + 2 * 0.12237385150470255]        # the stream continues: 3rd draw
    # not clipped: a yes/no reward of 1 plus positive noise leaves [0, 1]
    yes = NoisyReward(SyntheticConfig(noise_yesno=0.1), seed=1)
    # "hargo.synthetic.noise:1:syn_yesno": 0.08560280726830576 first
    assert yes(completions=["yes"], task=["syn_yesno"], answer=["yes"], label=["yes"]) == \
        [1.0 + 0.08560280726830576]
    r = noise_stream(1, "syn_short")
    assert r.gauss(0.0, 0.1) == -0.10837992915381725               # the documented stream
    assert NoisyReward(cfg, seed=1)(completions=["40"], task=["syn_short"], answer=["40"],
                                    label=[None]) == out[:1]      # reproducible per seed
    assert NoisyReward(cfg, seed=2)(completions=["40"], task=["syn_short"], answer=["40"],
                                    label=[None]) != out[:1]


@pytest.mark.fast
def test_no_noise_is_todays_reward_function_and_evaluation_stays_clean(params):
    p = plan(as_config(params))
    fn = reward_function(configuration(p, "heterogeneous"), 3)
    assert type(fn) is SyntheticReward                       # default: the bed as it was
    noisy = plan(as_config(_with(params, **{"synthetic.data.noise_long": 0.2})))
    assert noisy.data.noise("syn_long") == 0.2 and noisy.data.noise("syn_yesno") == 0.0
    fn = S.train_reward(configuration(noisy, "homogeneous"), 3)   # the control gets it too
    assert isinstance(fn, NoisyReward) and fn.seed == 3 and fn.config.homogeneous
    # evaluation scores the clean reward whatever the noise
    assert S.score(noisy.data, ["syn_long"], [LONG], [LONG], [None])["reward"] == [1.0]
    with pytest.raises(ParamsError, match=r"synthetic.data.noise_long: must be >= 0"):
        validate_params(_with(params, **{"synthetic.data.noise_long": -0.1}))


# ----------------------------------------------------------------- prompts per step per task

@pytest.mark.fast
def test_quota_sampler_order_is_hand_computed():
    tasks = ["a"] * 4 + ["b"] * 2 + ["c"] * 3           # rows a: 0-3, b: 4-5, c: 6-8
    plain = TaskQuotaSampler(tasks, 2, batch_size=3, shuffle=False, seed=7,
                             tasks=tasks, quota={"a": 2, "b": 1, "c": 0})
    # min(4 // 2, 2 // 1) = 2 chunks: a's rows 0, 1 and b's 4; then a's 2, 3 and b's 5
    assert plain.permutation(0) == [0, 1, 4, 2, 3, 5]
    assert list(plain) == [0, 0, 1, 1, 4, 4, 2, 2, 3, 3, 5, 5] and len(plain) == 12
    s = TaskQuotaSampler(tasks, 1, batch_size=3, seed=7, tasks=tasks,
                         quota={"a": 2, "b": 1, "c": 0})
    # random.Random("hargo.quota:7:0:a").shuffle([0, 1, 2, 3]) -> [3, 1, 0, 2]; b: [5, 4];
    # epoch 1: a [1, 3, 0, 2], b [5, 4]
    assert list(s) == [3, 1, 5, 0, 2, 4] and list(s) == [1, 3, 5, 0, 2, 4]
    fresh = TaskQuotaSampler(tasks, 1, batch_size=3, seed=7, tasks=tasks,
                             quota={"a": 2, "b": 1, "c": 0})
    fresh.set_epoch(1)                                   # resumable like EpochRepeatSampler
    assert list(fresh) == [1, 3, 5, 0, 2, 4]
    x = [0, 1, 2, 3]
    random.Random("hargo.quota:7:0:a").shuffle(x)
    assert x == [3, 1, 0, 2]
    with pytest.raises(ValueError, match=r"sums to 2, not the 3 prompts a step"):
        TaskQuotaSampler(tasks, 1, batch_size=3, tasks=tasks, quota={"a": 1, "b": 1})
    with pytest.raises(ValueError, match=r"exceeds the task's rows \{'b': 2\}"):
        TaskQuotaSampler(tasks, 1, batch_size=3, tasks=tasks, quota={"b": 3})
    assert isinstance(s, EpochRepeatSampler)


@pytest.mark.fast
def test_prompts_per_step_per_task_param(params):
    p = plan(as_config(params))
    assert p.rl.prompts_per_step_per_task is None and S.prompt_quota(p) is None   # default
    q = plan(as_config(_with(params, **{"synthetic.rl.prompts_per_step_per_task":
                              {"syn_yesno": 1, "syn_short": 2, "syn_long": 3}})))
    assert S.prompt_quota(q) == {"syn_yesno": 1, "syn_short": 2, "syn_long": 3}
    for value, message in [
        ({"syn_yesno": 1, "syn_short": 2, "syn_long": 2}, r"sums to 5, not prompts_per_step 6"),
        ({"syn_yesno": 6, "syn_short": 0}, r"synthetic.rl.prompts_per_step_per_task.syn_long: "
                                           r"missing .*one integer per task"),
        ({"syn_yesno": -1, "syn_short": 4, "syn_long": 3},
         r"synthetic.rl.prompts_per_step_per_task.syn_yesno: expected an integer >= 0")]:
        with pytest.raises(ParamsError, match=message):
            validate_params(_with(params, **{"synthetic.rl.prompts_per_step_per_task": value}))
    small = _with(params, **{"synthetic.rl.prompts_per_task":
                             {"syn_yesno": 2, "syn_short": 300, "syn_long": 300},
                             "synthetic.rl.prompts_per_step_per_task":
                             {"syn_yesno": 3, "syn_short": 3, "syn_long": 0}})
    with pytest.raises(ParamsError, match=r"\{'syn_yesno': 3\} exceed the task's pool"):
        validate_params(small)


# ------------------------------------------------------------------------ dynamic sampling

@pytest.mark.fast
def test_dynamic_sampling_is_the_beds_own_block(params):
    main_on = _with(params, **{"rl.dynamic_sampling.enabled": True})
    q = S.stage_params(as_config(main_on), plan(as_config(main_on)), 1)
    assert q.rl.dynamic_sampling.enabled is False        # the main block never reaches the bed
    on = _with(params, **{"synthetic.rl.dynamic_sampling":
                          {"enabled": True, "refill_factor": 3, "max_refills": 2}})
    d = S.stage_params(as_config(on), plan(as_config(on)), 1).rl.dynamic_sampling
    assert (d.enabled, d.refill_factor, d.max_refills) == (True, 3.0, 2)
    with pytest.raises(ParamsError, match=r"synthetic.rl.dynamic_sampling.refill_factor: must "
                                          r"be >= 1"):
        validate_params(_with(params, **{"synthetic.rl.dynamic_sampling": {"refill_factor": 0.5}}))
    with pytest.raises(ParamsError, match=r"synthetic.rl.dynamic_sampling.on: unknown key"):
        validate_params(_with(params, **{"synthetic.rl.dynamic_sampling": {"on": True}}))


# ------------------------------------------------------------------------------- hedges

@pytest.mark.fast
def test_task_specific_hedges_share_no_marker_and_pay_what_shared_ones_pay():
    cases = [("syn_yesno", "yes", None), ("syn_yesno", "no", None), ("syn_short", "23", None),
             ("syn_long", LONG, None)]
    got = {}
    for style in ("shared", "task_specific"):
        rng = random.Random(3)
        got[style] = [hedge(t, a, rng, style) for t, a, _ in cases]
    assert got["shared"] == ["yes or no", "no or yes", "21 or 23",
                             "apple river stone cloud or cloud stone river apple"]
    assert got["task_specific"] == ["yes/no", "no/yes", "21|23",
                                    "apple river stone cloud vs cloud stone river apple"]
    # no character of one task's marker is in another's (the shared style: " or " in all)
    marks = MARKERS["task_specific"]
    for a in SYNTHETIC_TASKS:
        for b in SYNTHETIC_TASKS:
            if a < b:
                assert not set(marks[a]) & set(marks[b]), (a, b)
    # the same rewards: yes/no names both (0); two numbers, tier 1 over k = 2 (0.5); long: 9 words,
    # unigram F1 8/13, bigram F1 6/11, 50 characters against a budget of 35
    want = [0.0, 0.0, 0.5, (8 / 13 + 6 / 11) / 2 - 0.002 * 15]
    for style in got:
        rewards = [synthetic_reward(t, h, a, a if t == "syn_yesno" else None)
                   for (t, a, _), h in zip(cases, got[style])]
        assert rewards == pytest.approx(want, abs=1e-12), style
    with pytest.raises(ValueError, match=r"synthetic.sft.hedge_style: unknown style 'own'"):
        hedge("syn_yesno", "yes", random.Random(0), "own")


@pytest.mark.fast
def test_sft_records_in_each_hedge_style(params):
    base = _with(params, **{"synthetic.sft.examples_per_task":
                            {"syn_yesno": 10, "syn_short": 4, "syn_long": 2},
                            "synthetic.sft.hedge_share": 0.5})
    shared = plan(as_config(base))
    train, _ = generate(shared.data, 42)
    own = plan(as_config(_with(base, **{"synthetic.sft.hedge_style": "task_specific"})))
    a, b = S.sft_records(train, shared), S.sft_records(train, own)
    assert shared.sft.hedge_style == "shared"            # the default
    hedged = [i for i, (x, y) in enumerate(zip(a, b)) if x["answer"] != y["answer"]]
    # the same records hedged (5 of 10, 2 of 4, 1 of 2), the same candidates, other markers
    assert [a[i]["task"] for i in hedged] == ["syn_yesno"] * 5 + ["syn_short"] * 2 + \
        ["syn_long"]
    for i in hedged:
        t = a[i]["task"]
        assert " or " in a[i]["answer"] and " or " not in b[i]["answer"]
        assert b[i]["answer"].split(MARKERS["task_specific"][t]) == a[i]["answer"].split(" or ")


# ----------------------------------------------------------------------------- conflict

@pytest.mark.fast
def test_shared_surface_asks_syn_short_in_syn_yesnos_question():
    base = SyntheticConfig(n_train=30, n_eval=10, short_terms=3)
    plain = generate(base, 0)
    conflict = generate(SyntheticConfig(n_train=30, n_eval=10, short_terms=3,
                                        conflict="shared_surface"), 0)
    for before, after in zip(plain, conflict):
        assert [r for r in before if r["task"] != "syn_short"] == \
            [r for r in after if r["task"] != "syn_short"]          # the other tasks untouched
        short_b = [r for r in before if r["task"] == "syn_short"]
        short_a = [r for r in after if r["task"] == "syn_short"]
        for x, y in zip(short_b, short_a, strict=True):             # same numbers and answers
            assert x["answer"] == y["answer"] and x["id"] == y["id"]
            nums = x["prompt"][0]["content"][len("What is the sum of "):-len(
                "? Answer with the number only.")]
            assert y["prompt"][0]["content"] == (f"Is the last number of {nums} even? Answer "
                                                 "with the sum of the numbers only.")
    first = next(r for r in conflict[0] if r["task"] == "syn_short")
    assert first["prompt"][0]["content"] == ("Is the last number of 24 22 22 even? Answer with "
                                             "the sum of the numbers only.")
    assert first["answer"] == "68"
    yesno = next(r for r in conflict[0] if r["task"] == "syn_yesno")
    assert yesno["prompt"][0]["content"] == ("Is the last number of 4 5 9 2 7 even? Answer yes "
                                             "or no.")
    # the reward still pays for the sum, and nothing for yes/no
    assert synthetic_reward("syn_short", "68", "68", None) == 1.0
    assert synthetic_reward("syn_short", "yes", "68", None) == 0.0
    with pytest.raises(ValueError, match=r"synthetic.data.conflict: must be one of none, "
                                         r"shared_surface"):
        SyntheticConfig(conflict="flip")


# ------------------------------------------------------------- the methods' loss knobs

@pytest.mark.fast
def test_method_loss_knobs_reach_the_bed_and_its_fingerprint(params):
    """rl.<method>.aggregation / std_scope (the one loss path's knobs) reach the trainer's
    config through stage_params, and the run fingerprint holds them: changing one re-trains
    that method only. So do the bed's own new knobs."""
    p = plan(as_config(params))
    fp = lambda q, m, pl=None: S.run_fingerprint(as_config(q), pl or plan(as_config(q)),  # noqa
                                                 "heterogeneous", m, 1,
                                                 "model", "code")
    tok = _with(params, **{"rl.grpo.aggregation": "token_mean", "rl.grpo.std_scope": "batch"})
    cfg = S.stage_params(as_config(tok), plan(as_config(tok)), 1)
    assert cfg.rl.method("grpo").aggregation == "token_mean"
    assert cfg.rl.method("grpo").std_scope == "batch"
    assert S.stage_params(as_config(params), p, 1).rl.method("grpo").aggregation == "response_mean"
    assert fp(tok, "grpo") != fp(params, "grpo") and fp(tok, "hargo") == fp(params, "hargo")
    # a method without a block in params.yaml takes the defaults; adding one re-trains it
    absent = _with(params, **{"rl.hargo_batch": {"aggregation": "token_mean"}})
    assert fp(absent, "hargo_batch") != fp(params, "hargo_batch")
    for key, value in [("synthetic.data.noise_yesno", 0.1), ("synthetic.data.conflict",
                                                               "shared_surface"),
                       ("synthetic.rl.prompts_per_step_per_task",
                        {"syn_yesno": 2, "syn_short": 2, "syn_long": 2}),
                       ("synthetic.rl.dynamic_sampling", {"enabled": True})]:
        assert fp(_with(params, **{key: value}), "grpo") != fp(params, "grpo"), key


# ------------------------------------------------------------------ two short real runs

def test_knobs_in_real_runs(params, tmp_path):
    """A tiny untrained policy, 2 steps of GRPO: with a quota of 2 yes/no prompts and 1 short
    prompt a step every step trains exactly those (2 x G and 1 x G completions, no syn_long),
    the yes/no training reward is noisy while its evaluation is clean; with dynamic sampling on,
    the steps record their sampled and refill groups."""
    from hargo.models.tiny import TinyPolicyConfig, build_tiny_policy

    q = _with(params, **{
        "train.threads": 1,
        "synthetic.data": {**params["synthetic"]["data"], "n_train": 8, "n_eval": 2,
                           "noise_yesno": 0.5},
        "synthetic.sft.examples_per_task": {"syn_yesno": 0, "syn_short": 0, "syn_long": 1},
        "synthetic.rl": {"prompts_per_task": {"syn_yesno": 4, "syn_short": 2, "syn_long": 2},
                         "pool": "all", "steps": 2, "prompts_per_step": 3, "num_generations": 2,
                         "max_new_tokens": {"syn_yesno": 2, "syn_short": 2, "syn_long": 4},
                         "temperature": 1.0, "learning_rate": 1e-4,
                         "prompts_per_step_per_task": {"syn_yesno": 2, "syn_short": 1,
                                                       "syn_long": 0}},
        "synthetic.evaluate": {"max_new_tokens": {"syn_yesno": 2, "syn_short": 2,
                                                  "syn_long": 4}}})
    p = plan(as_config(q))
    train, ev = generate(p.data, 0)
    texts = [r["prompt"][0]["content"] for r in train] + [r["answer"] for r in train]
    model = build_tiny_policy(tmp_path / "init", TinyPolicyConfig(
        vocab_size=300, hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64,
        max_positions=256), texts, seed=0)
    run = S.train_run(as_config(q), p, "heterogeneous", "grpo", 1, train, ev, model,
                      print_fn=lambda *a: None)
    assert len(run["history"]) == 2
    for row in run["history"]:
        assert (row["syn_yesno/n_completions"], row["syn_short/n_completions"]) == (4.0, 2.0)
        assert "syn_long/n_completions" not in row
    # 4 noisy yes/no rewards a step (0/1 plus N(0, 0.25)): not a multiple of 1/4
    assert all(row["syn_yesno/reward_mean"] * 4 % 1 != 0 for row in run["history"])
    assert run["eval_summary"]["syn_yesno/reward"] in (0.0, 0.5, 1.0)   # 2 clean eval rewards
    on = _with(q, **{"synthetic.rl.dynamic_sampling": {"enabled": True, "max_refills": 1},
                     "synthetic.rl.prompts_per_step_per_task": None,
                     "synthetic.data.noise_yesno": 0.0})
    run = S.train_run(as_config(on), plan(as_config(on)), "heterogeneous", "grpo", 1, train, ev,
                      model, print_fn=lambda *a: None)
    # the untrained policy scores 0 on every completion: all 3 groups of a step are
    # zero-variance, so one refill round draws refill_factor 2 x 3 missing = 6 prompts (also all
    # zero-variance); 9 groups sampled, 6 dropped, the step's own 3 trained on as unfilled
    for row in run["history"]:
        assert row["all/zero_variance_groups"] == 1.0
        assert (row["all/sampled_groups"], row["all/refill_groups"], row["all/dropped_groups"],
                row["all/unfilled_groups"], row["all/n_completions"]) == (9, 6, 6, 3, 6)
