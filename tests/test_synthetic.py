"""hargo.data.synthetic: seeded generation, schema, and the three reward shapes with
hand-computed values (pure Python, well under a second)."""
from __future__ import annotations

import random
from statistics import mean

import pytest

from hargo.data.synthetic import (SYNTHETIC_TASKS, SyntheticConfig, SyntheticReward,
                                  check_synthetic, generate, hedge, similarity,
                                  synthetic_reward)
from hargo.io import HargoInputError

pytestmark = pytest.mark.fast

SMALL = SyntheticConfig(n_train=30, n_eval=10)


def _reward(task, completion, answer=None, label=None, **cfg):
    return synthetic_reward(task, completion, answer, label, SyntheticConfig(**cfg))


# ------------------------------------------------------------------ generation

def test_same_seed_identical_different_seed_different():
    a = generate(SMALL, 7)
    assert a == generate(SMALL, 7)
    b = generate(SMALL, 8)
    for split_a, split_b in zip(a, b):
        for task in SYNTHETIC_TASKS:
            pa = [r["prompt"] for r in split_a if r["task"] == task]
            pb = [r["prompt"] for r in split_b if r["task"] == task]
            assert pa != pb, task


def test_counts_ids_schema_and_no_prompt_in_both_splits():
    train, eval_ = generate(SMALL, 0)
    assert len(train) == 3 * 30 and len(eval_) == 3 * 10
    check_synthetic(train)
    check_synthetic(eval_)
    assert train[0]["id"] == "syn_yesno-train-00000" and eval_[-1]["id"] == "syn_long-eval-00009"
    assert set(train[0]) == {"id", "task", "prompt", "answer", "label", "alt_answers", "source"}
    for task in SYNTHETIC_TASKS:
        tr = {r["prompt"][0]["content"] for r in train if r["task"] == task}
        ev = {r["prompt"][0]["content"] for r in eval_ if r["task"] == task}
        assert len(tr) == 30 and len(ev) == 10 and not tr & ev
    for r in train + eval_:
        assert (r["label"] in ("yes", "no")) == (r["task"] == "syn_yesno")
        if r["task"] == "syn_yesno":
            assert r["answer"] == r["label"]


def test_eval_split_does_not_depend_on_n_train():
    _, ev1 = generate(SyntheticConfig(n_train=5, n_eval=10), 3)
    _, ev2 = generate(SyntheticConfig(n_train=50, n_eval=10), 3)
    assert ev1 == ev2


def test_yesno_labels_balanced_on_1000():
    train, _ = generate(SyntheticConfig(n_train=1000, n_eval=0), 1)
    labels = [r["label"] for r in train if r["task"] == "syn_yesno"]
    assert len(labels) == 1000
    share = labels.count("yes") / 1000
    assert 0.45 <= share <= 0.55
    assert share == 0.5  # n // 2 of each by construction


def test_yesno_labels_are_true_facts():
    train, _ = generate(SyntheticConfig(n_train=300, n_eval=0, difficulty=4, yesno_question="mixed"), 2)
    for r in (r for r in train if r["task"] == "syn_yesno"):
        q = r["prompt"][0]["content"]
        xs = [int(t) for t in q.split("?")[0].split() if t.isdigit()]
        assert len(xs) == 4
        if q.startswith("Is the sum"):
            truth = sum(xs) % 2 == 0
        elif q.startswith("Does the list"):
            truth = len(set(xs)) < len(xs)
        else:
            truth = xs == sorted(xs)
        assert r["label"] == ("yes" if truth else "no"), q


def test_short_answer_is_the_sum():
    train, _ = generate(SyntheticConfig(n_train=50, n_eval=0, difficulty=3), 4)
    for r in (r for r in train if r["task"] == "syn_short"):
        xs = [int(t) for t in r["prompt"][0]["content"].split("?")[0].split() if t.isdigit()]
        assert len(xs) == 3 and all(1 <= x <= 30 for x in xs)
        assert r["answer"] == str(sum(xs))


def test_long_reference_lengths_and_ratio_to_yesno():
    cfg = SyntheticConfig(n_train=200, n_eval=0)
    train, _ = generate(cfg, 5)
    yes_no = mean(len(r["answer"]) for r in train if r["task"] == "syn_yesno")
    long_ = [r["answer"] for r in train if r["task"] == "syn_long"]
    assert all(len(a.split()) == cfg.long_answer_words for a in long_)
    assert yes_no == 2.5  # balanced "yes"/"no"
    assert mean(map(len, long_)) / yes_no >= 40


def test_every_reference_scores_the_max_in_both_modes():
    train, _ = generate(SMALL, 6)
    for homogeneous in (False, True):
        cfg = SyntheticConfig(homogeneous=homogeneous, scale_short=2.0)
        for r in train:
            expect = 2.0 if r["task"] == "syn_short" else 1.0
            assert synthetic_reward(r["task"], r["answer"], r["answer"], r["label"], cfg) == expect


def test_too_small_prompt_space_raises():
    # difficulty 2: syn_yesno has fewer than 500 distinct prompts (3 kinds of 2 small numbers)
    with pytest.raises(ValueError, match="could not draw 500 distinct syn_yesno prompts"):
        generate(SyntheticConfig(n_train=500, n_eval=0, difficulty=2), 0)


# ------------------------------------------------------------------ rewards

@pytest.mark.parametrize("completion,label,expected", [
    ("Yes.", "yes", 1.0), ("**no**", "no", 1.0), ("No", "yes", 0.0),
    ("yes or no", "yes", 0.0), ("yes or no", "no", 0.0),  # hedge: 0 against either label
    ("eyes", "yes", 0.0), ("", "no", 0.0),
])
def test_yesno_reward(completion, label, expected):
    assert _reward("syn_yesno", completion, label=label) == expected


@pytest.mark.parametrize("completion,expected", [
    ("40", 1.0), ("The sum is 40.", 1.0), ("40.0", 1.0),
    ("41", 0.5), ("38", 0.5),          # d <= 2 = 5% of 40
    ("43", 0.2), ("34", 0.2),          # 2 < d <= 6 = 15% of 40
    ("47", 0.1), ("52", 0.1),          # 6 < d <= 12 = 30% of 40
    ("53", 0.0), ("27", 0.0),          # d > 12
    ("no idea", 0.0), ("v40", 0.0), ("40th", 0.0),  # no number token
    ("40 or 41", 0.5),                 # hedge: tier 1.0 over k = 2 numbers
    ("39, 40 or 41", 1 / 3),
    ("41 or 43", 0.25),                # best tier 0.5 over k = 2
    ("40 or 40.0", 1.0),               # one distinct number
])
def test_short_reward_tiers(completion, expected):
    assert _reward("syn_short", completion, "40") == pytest.approx(expected, abs=1e-12)


def test_short_tiers_small_reference():
    # y = 4: 5% = 0.2 and 15% = 0.6 are below 1, 30% = 1.2: off by one is the 0.1 tier
    assert [_reward("syn_short", str(x), "4") for x in (4, 5, 3, 6)] == [1.0, 0.1, 0.1, 0.0]


REF = "apple river stone cloud"  # 23 characters: budget ceil(1.5 * 23) = 35


@pytest.mark.parametrize("completion,expected", [
    (REF, 1.0),
    ("Apple, River. stone cloud", 1.0),        # case and punctuation ignored, 25 chars
    ("cloud stone river apple", 0.5),          # unigram F1 1, bigram F1 0
    ("apple river", (2 / 3 + 1 / 2) / 2),      # uni p=1 r=1/2; bi p=1 r=1/3
    ("", 0.0),
    # hedge, 50 chars: uni F1 8/13, bi F1 6/11, minus 0.002 * (50 - 35)
    ("apple river stone cloud or apple river cloud stone", (8 / 13 + 6 / 11) / 2 - 0.03),
    (REF + " " * 100, 1.0 - 0.002 * (123 - 35)),  # same words, only the length penalty
    (REF + " x" * 1000, 0.0),                  # floored at long_min_reward
])
def test_long_reward(completion, expected):
    assert _reward("syn_long", completion, REF) == pytest.approx(expected, abs=1e-12)


def test_long_reference_is_max_and_padding_past_budget_scores_less():
    train, _ = generate(SMALL, 9)
    ref = next(r["answer"] for r in train if r["task"] == "syn_long")
    padded = ref + " " + " ".join(ref.split()[:5]) * 20
    assert len(padded) > 1.5 * len(ref)
    top = _reward("syn_long", ref, ref)
    assert top == 1.0
    assert _reward("syn_long", padded, ref) < top
    assert _reward("syn_long", ref + "\n" * 200, ref) == pytest.approx(
        1.0 - 0.002 * (len(ref) + 200 - -(-3 * len(ref) // 2)))


def test_similarity_bounds_and_single_word_reference():
    assert similarity("zebra", "zebra") == 1.0
    assert similarity("zebra apple", "zebra") == pytest.approx(2 / 3)  # unigram F1 only
    assert similarity("!!!", "zebra") == 0.0


@pytest.mark.parametrize("task,completion,answer,label,expected", [
    ("syn_yesno", "Yes.", "yes", "yes", 1.0), ("syn_yesno", "yes or no", "yes", "yes", 0.0),
    ("syn_short", "40", "40", None, 1.0), ("syn_short", "The sum is 40.", "40", None, 1.0),
    ("syn_short", "41", "40", None, 0.0), ("syn_short", "40 or 41", "40", None, 0.0),
    ("syn_short", "40 or 40.0", "40", None, 1.0),
    ("syn_long", REF, REF, None, 1.0), ("syn_long", "Apple, River. stone cloud", REF, None, 1.0),
    ("syn_long", REF + " " * 500, REF, None, 1.0),  # no length penalty in the control
    ("syn_long", "cloud stone river apple", REF, None, 0.0),
    ("syn_long", "apple river", REF, None, 0.0),
])
def test_homogeneous_rewards_are_exact_0_1(task, completion, answer, label, expected):
    assert _reward(task, completion, answer, label, homogeneous=True) == expected


def test_homogeneous_gives_only_0_or_1_over_many_completions():
    cfg = SyntheticConfig(homogeneous=True)
    train, _ = generate(SMALL, 11)
    seen = {t: set() for t in SYNTHETIC_TASKS}
    for r in train:
        ref = r["answer"]
        for c in (ref, ref + " extra", "yes", "no", "yes or no", "12", "12 13", ref.upper(),
                  " ".join(ref.split()[::-1]), ""):
            seen[r["task"]].add(synthetic_reward(r["task"], c, ref, r["label"], cfg))
    for task in SYNTHETIC_TASKS:
        assert seen[task] == {0.0, 1.0}, task


def test_heterogeneous_gives_partial_credit_where_homogeneous_does_not():
    assert _reward("syn_short", "41", "40") == 0.5
    assert _reward("syn_long", "cloud stone river apple", REF) == 0.5
    assert _reward("syn_short", "41", "40", homogeneous=True) == 0.0
    assert _reward("syn_long", "cloud stone river apple", REF, homogeneous=True) == 0.0


def test_reward_scale_multiplies():
    kw = dict(scale_yesno=0.5, scale_short=2.5, scale_long=3.0)
    assert _reward("syn_yesno", "yes", label="yes", **kw) == 0.5
    assert _reward("syn_yesno", "no", label="yes", **kw) == 0.0
    assert _reward("syn_short", "41", "40", **kw) == 1.25
    assert _reward("syn_short", "40", "40", homogeneous=True, **kw) == 2.5
    assert _reward("syn_long", "cloud stone river apple", REF, **kw) == 1.5
    assert _reward("syn_long", REF, REF, homogeneous=True, **kw) == 3.0


def test_bad_data_raises_but_no_completion_does():
    with pytest.raises(ValueError, match="unknown synthetic task"):
        _reward("race_c", "yes", label="yes")
    with pytest.raises(ValueError, match="'yes' or 'no'"):
        _reward("syn_yesno", "yes", label=None)
    with pytest.raises(ValueError, match="must be a number"):
        _reward("syn_short", "40", "forty")
    with pytest.raises(ValueError, match="non-empty string answer"):
        _reward("syn_long", "x", None)
    assert _reward("syn_short", "9" * 51, "40") == 0.0  # no number token: too long
    assert _reward("syn_short", "40 " + "9" * 10000, "40") == 1.0
    for c in ("", "\x00\ud800", "9" * 10000, "4" * 50, "é" * 5000, "1.2.3 -4 v5 6th"):
        for task, a, lab in (("syn_yesno", "yes", "no"), ("syn_short", "40", None),
                             ("syn_long", REF, None)):
            r = _reward(task, c, a, lab)
            assert 0.0 <= r <= 1.0


# ------------------------------------------------------------------ config, checker, TRL

def test_from_params():
    cfg = SyntheticConfig.from_params({"n_train": 10, "n_eval": 4.0, "difficulty": 3,
                                       "long_answer_words": 30, "homogeneous": True,
                                       "scale_short": 2})
    assert cfg == SyntheticConfig(n_train=10, n_eval=4, difficulty=3, long_answer_words=30,
                                  homogeneous=True, scale_short=2.0)
    assert SyntheticConfig.from_params(None) == SyntheticConfig()
    with pytest.raises(ValueError, match=r"synthetic.data.n_trian: unknown key"):
        SyntheticConfig.from_params({"n_trian": 3})
    with pytest.raises(ValueError, match="true or false"):
        SyntheticConfig.from_params({"homogeneous": "yes"})
    with pytest.raises(ValueError, match="integer"):
        SyntheticConfig.from_params({"n_train": 2.5})
    with pytest.raises(ValueError, match="difficulty"):
        SyntheticConfig.from_params({"difficulty": 1})
    with pytest.raises(ValueError, match="scale_long"):
        SyntheticConfig(scale_long=-1.0)


def test_check_synthetic_rejects_bad_records():
    train, _ = generate(SMALL, 0)
    bad = [dict(train[0], label=None)] + train[1:]
    with pytest.raises(HargoInputError, match="syn_yesno-train-00000"):
        check_synthetic(bad)
    with pytest.raises(ValueError, match="unknown synthetic task"):
        check_synthetic([dict(train[0], task="plp")])


def test_trl_reward_function():
    fn = SyntheticReward(SyntheticConfig(scale_long=2.0))
    out = fn(prompts=None,
             completions=[[{"role": "assistant", "content": "Yes"}], "41", REF],
             task=["syn_yesno", "syn_short", "syn_long"], answer=["yes", "40", REF],
             label=["yes", None, None])
    assert out == [1.0, 0.5, 2.0]
    assert fn.__name__ == "synthetic_reward"


# ----------------------------------------------------------------------------- hedges

def test_hedge_of_each_task_pays_less_than_the_answer():
    rng = random.Random(3)
    assert hedge("syn_yesno", "yes", rng) == "yes or no"
    assert hedge("syn_yesno", "no", rng) == "no or yes"
    assert synthetic_reward("syn_yesno", "yes or no", None, "yes") == 0.0
    short = hedge("syn_short", "23", rng)
    nums = sorted(int(x) for x in short.split(" or "))
    assert 23 in nums and len(nums) == 2 and 1 <= abs(nums[0] - nums[1]) <= 3
    assert synthetic_reward("syn_short", short, "23", None) == 0.5      # tier 1 over 2 numbers
    ans = "apple river stone cloud"
    long = hedge("syn_long", ans, rng)
    assert long == "apple river stone cloud or cloud stone river apple"
    # unigram F1: p = 4/9, r = 1 -> 8/13; bigram F1: 3 of 8 pairs, r = 1 -> 6/11; budget 35 chars,
    # the hedge has 50: penalty 0.002 * 15
    want = (8 / 13 + 6 / 11) / 2 - 0.002 * (len(long) - 35)
    assert synthetic_reward("syn_long", long, ans, None) == pytest.approx(want)
    homogeneous = SyntheticConfig(homogeneous=True)
    assert synthetic_reward("syn_short", short, "23", None, homogeneous) == 0.0
    assert synthetic_reward("syn_long", long, ans, None, homogeneous) == 0.0
    with pytest.raises(ValueError, match="unknown synthetic task"):
        hedge("plp", "x", rng)


def test_heterogeneity_blends_graded_and_exact_rewards():
    """h * graded + (1 - h) * exact for syn_short and syn_long; h = 0 is the control's reward
    on every completion; yes/no is 0/1 either way."""
    from hargo.data.synthetic import similarity, synthetic_reward

    half = SyntheticConfig(heterogeneity=0.5)
    # syn_short: 24 against 23 is within 5% (tier 0.5), not exact: 0.5 * 0.5 + 0.5 * 0
    assert synthetic_reward("syn_short", "24", "23", None, half) == pytest.approx(0.25)
    assert synthetic_reward("syn_short", "23", "23", None, half) == 1.0
    ref, part = "apple river stone", "apple river"
    # unigram F1 0.8, bigram F1 2/3: similarity 11/15; not exact
    assert similarity(part, ref) == pytest.approx(11 / 15)
    assert synthetic_reward("syn_long", part, ref, None, half) == pytest.approx(0.5 * 11 / 15)
    zero, homo = SyntheticConfig(heterogeneity=0.0), SyntheticConfig(homogeneous=True)
    for task, completion, answer in [("syn_short", "24", "23"), ("syn_short", "23 or 24", "23"),
                                     ("syn_short", "23", "23"), ("syn_long", part, ref),
                                     ("syn_long", ref, ref), ("syn_long", ref + " " + ref, ref)]:
        assert synthetic_reward(task, completion, answer, None, zero) == \
            synthetic_reward(task, completion, answer, None, homo), (task, completion)
    assert synthetic_reward("syn_yesno", "yes", None, "yes", half) == 1.0
    assert SyntheticConfig.from_params({"heterogeneity": "0.333"}).heterogeneity == 0.333
    with pytest.raises(ValueError, match=r"synthetic.data.heterogeneity: must be <= 1"):
        SyntheticConfig(heterogeneity=1.5)
