"""Task rewards: race phrasing, each MLPerf tier, PLP with the real MiniLM (loaded once per
process through get_scorer), TRL-style dispatch, determinism and a Hypothesis fuzz test."""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hargo.rewards import (TASKS, RewardConfig, TaskReward, completion_text, get_scorer)
from hargo.rewards.mlperf import (MLPerfConfig, all_values_match, exact_match, keyword_overlap,
                                  keywords, mlperf_reward, normalise_number, numeric_match,
                                  numeric_tokens, partial_match, split_values)
from hargo.rewards.plp import PLPConfig, is_repetitive, plp_reward, plp_rewards
from hargo.rewards.race import extract_yes_no, race_reward


@pytest.fixture(scope="module")
def scorer():
    """The process-wide MiniLM scorer (loads the model once for the whole test process)."""
    s = get_scorer()
    s.similarity(["warm up"], ["warm up"])
    return s


# ------------------------------------------------------------------------------------- race

@pytest.mark.parametrize("text,expected", [
    ("yes", "yes"), ("no", "no"), ("Yes", "yes"), ("NO", "no"),
    ("   \n\tyes", "yes"), ("Yes.", "yes"), ("no!", "no"), ("**Yes**", "yes"), ("(no)", "no"),
    ("Yes, there is a data race", "yes"), ("No data race", "no"),
    ("Answer: yes", "yes"), ("There is no data race in this loop.", "no"),
    ("YES - the writes to a[i+1] conflict", "yes"), ("'no'", "no"),
    ("yes no", None), ("Yes. There is no synchronization, so no.", None),
    ("", None), ("   ", None), ("maybe", None), ("There is not a race", None),
    ("none", None), ("nobody knows", None), ("eyes", None), ("yesterday", None),
    ("yes_no", None), ("noyes", None), ("no2", None),
])
def test_extract_yes_no(text, expected):
    assert extract_yes_no(text) == expected


def test_race_reward():
    assert race_reward("Yes, there is a data race", "yes") == 1.0
    assert race_reward("No data race", "yes") == 0.0
    assert race_reward("no", " No ") == 1.0
    assert race_reward("yes and no", "no") == 0.0
    assert race_reward("", "no") == 0.0
    with pytest.raises(ValueError, match="race label"):
        race_reward("yes", "maybe")


# ------------------------------------------------------------------------------------ mlperf

def test_normalise_number_and_tokens():
    assert normalise_number("1,024") == normalise_number("1024.0") == normalise_number("01024") == "1024"
    assert normalise_number("1.50") == "1.5" and normalise_number("0.0") == "0"
    assert normalise_number("3.0-2087") == "3.0-2087"
    assert numeric_tokens("ID 3.0-2087 has 1,024 GPUs, 8x H100-SXM5-80GB and 2 CPUs.") == [
        "3.0-2087", "1024", "2"]


def test_exact_tier():
    assert exact_match("The ID is 3.0-2087.", "3.0-2087")
    assert exact_match("  habana GAUDI2  ", "Habana Gaudi2")
    assert exact_match("It is\nIntel(R) Xeon(R) Gold 6430.", "Intel(R) Xeon(R) Gold 6430")
    assert not exact_match("3.0-20871", "3.0-2087")           # word boundary after
    assert not exact_match("H3C8", "H3C")                     # word boundary after
    assert not exact_match("XH3C", "H3C")                     # word boundary before
    assert not exact_match("anything", "")
    assert mlperf_reward("Dell", "Dell") == 1.0
    assert mlperf_reward("The submitter is Dell.", "Dell") == 1.0


def test_numeric_tier():
    assert numeric_match("There are 1024 accelerators", "1,024")
    assert numeric_match("1,024", "1024.0")
    assert numeric_match("The ID is 3.0-2087", "3.0-2087.")
    assert not numeric_match("There are 1024 accelerators", "1,025")
    assert not numeric_match("80GB", "80")                    # part of a word, not a number
    assert not numeric_match("8 GPUs", "8 GPUs")              # reference is not a lone number
    assert mlperf_reward("1,024 GPUs", "1024.0") == 1.0


def test_multi_value_tiers():
    ans = "Habana Gaudi2, 8"
    assert split_values(ans) == ["habana gaudi2", "8"]
    assert split_values("1,024; 3.0-2087") == ["1,024", "3.0-2087"]
    assert all_values_match("8 of them, all Habana Gaudi2", ans)
    assert mlperf_reward("8 of them, all Habana Gaudi2", ans) == 1.0
    assert partial_match("Habana Gaudi2", ans) and not all_values_match("Habana Gaudi2", ans)
    assert mlperf_reward("Habana Gaudi2", ans) == 0.5
    assert not partial_match("nothing", ans)
    assert not partial_match("8", "8")                        # single value: not multi-value
    cfg = MLPerfConfig(partial=0.25)
    assert mlperf_reward("Habana Gaudi2", ans, cfg) == 0.25


def test_keyword_tiers():
    ref = "The submitter is GIGABYTE and the number of processors is 2."
    assert keywords(ref) == {"submitter", "gigabyte", "number", "processors", "2"}
    # 4 of 5 keywords: 0.8 > 0.7
    assert keyword_overlap("submitter GIGABYTE, processors: 2", ref) == pytest.approx(0.8)
    assert mlperf_reward("submitter GIGABYTE, processors: 2", ref) == 0.2
    # 3 of 5: 0.6 > 0.4
    assert mlperf_reward("GIGABYTE has 2 processors", ref) == 0.1
    # 2 of 5: 0.4 is not > 0.4
    assert keyword_overlap("GIGABYTE 2", ref) == pytest.approx(0.4)
    assert mlperf_reward("GIGABYTE 2", ref) == 0.0
    assert mlperf_reward("", ref) == 0.0
    assert keywords("1,024 GPUs") == {"1024", "gpus"}
    assert keyword_overlap("x", "the is of") == 0.0


# --------------------------------------------------------------------------------------- plp

def test_is_repetitive():
    assert not is_repetitive("CodeBERT is a bimodal model pre-trained on code and text.")
    assert not is_repetitive("a b a b")                              # 2 of 2 trigrams distinct
    assert is_repetitive("the model the model the model the model")  # 2 of 6 distinct
    assert is_repetitive("yes yes yes yes yes")                      # 1 of 3 distinct
    assert not is_repetitive("yes yes yes yes")                      # 1 of 2: not < 0.5
    assert is_repetitive("x" * 17) and not is_repetitive("x" * 16)   # char run > 16
    assert is_repetitive("Answer: !!!!!!!!!!!!!!!!!!!!")
    assert not is_repetitive(" " * 100)                              # whitespace runs don't count


def test_plp_reward_values(scorer):
    ref = "CodeBERT is a bimodal pre-trained model for programming and natural languages."
    cfg = PLPConfig()
    assert plp_reward(ref, ref, cfg, scorer) == pytest.approx(1.0 + 0.1, abs=1e-5)
    assert plp_reward("", ref, cfg, scorer) == 0.0                     # no similarity, no bonus
    assert plp_reward("   ", ref, cfg, scorer) == 0.0
    sim = scorer.similarity(["A model for code."], [ref])[0]
    assert 0.0 < sim < 1.0
    assert plp_reward("A model for code.", ref, cfg, scorer) == pytest.approx(sim + 0.1, abs=1e-6)
    rep = "code code code code code code"
    sim_rep = scorer.similarity([rep], [ref])[0]
    assert plp_reward(rep, ref, cfg, scorer) == pytest.approx(sim_rep, abs=1e-6)   # no bonus
    long = ref + " " + " ".join(f"Sentence number {i} adds detail {i * i} about model {i + 7}."
                                for i in range(12))
    n = len(long)
    assert n > 400 and not is_repetitive(long)
    sim_long = scorer.similarity([long], [ref])[0]
    assert plp_reward(long, ref, cfg, scorer) == pytest.approx(
        sim_long + 0.1 - 0.0005 * (n - 400), abs=1e-6)
    assert plp_reward("z" * 10_000, ref, cfg, scorer) == -1.0           # floored at min_reward
    # batch equals one-by-one (same call is deterministic)
    batch = plp_rewards([ref, "A model for code.", ""], [ref] * 3, cfg, scorer)
    assert batch == pytest.approx([1.1, sim + 0.1, 0.0], abs=1e-5)


def test_plp_config_from_params():
    cfg = PLPConfig.from_params({"format_bonus": 0.2, "length_budget": 100, "batch_size": 8,
                                 "unknown": 1})
    assert cfg.format_bonus == 0.2 and cfg.length_budget == 100 and cfg.batch_size == 8
    assert isinstance(cfg.length_budget, int)
    rc = RewardConfig.from_params({"plp": {"length_penalty": 0.01}, "mlperf": {"partial": 0.3}})
    assert rc.plp.length_penalty == 0.01 and rc.mlperf.partial == 0.3


def test_scorer_is_lazy_and_cached():
    from hargo.rewards.plp import PLPScorer
    s = PLPScorer()
    assert not s.loaded
    assert get_scorer() is get_scorer()
    assert s.similarity(["", " "], ["a", ""]) == [0.0, 0.0] and not s.loaded  # empties: no model


# -------------------------------------------------------------------------------- dispatcher

def test_completion_text():
    assert completion_text("hi") == "hi"
    assert completion_text([{"role": "assistant", "content": "yes"}]) == "yes"
    assert completion_text([{"role": "user", "content": "q"},
                            {"role": "assistant", "content": "no"}]) == "no"
    assert completion_text([{"role": "assistant",
                             "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]) == "ab"
    assert completion_text([]) == ""
    with pytest.raises(TypeError):
        completion_text(3)


def test_task_reward_dispatch(scorer):
    fn = TaskReward(RewardConfig(), scorer)
    assert fn.__name__ == "task_reward"
    ref = "CodeSearchNet is a dataset of functions with documentation."
    out = fn(prompts=["p"] * 5,
             completions=[[{"role": "assistant", "content": "Yes, there is a data race"}],
                          "No data race", "The ID is 3.0-2087.", "Habana Gaudi2", ref],
             task=["race_c", "race_fortran", "mlperf", "mlperf", "plp"],
             answer=["yes", "no", "3.0-2087", "Habana Gaudi2, 8", ref],
             label=["yes", "yes", None, None, None], alt_answers=[[]] * 5)
    assert out == pytest.approx([1.0, 0.0, 1.0, 0.5, 1.1], abs=1e-5)
    assert fn(completions=["no"], task=["race_c"], label=["no"]) == [1.0]
    with pytest.raises(ValueError, match="unknown task 'sql'"):
        fn(completions=["x"], task=["sql"], answer=["y"])
    with pytest.raises(ValueError, match="'task' has 2 values for 1 completions"):
        fn(completions=["x"], task=["plp", "plp"], answer=["y"])
    with pytest.raises(ValueError, match="'answer'"):
        fn(completions=["x"], task=["mlperf"], answer=[None])


def test_no_plp_no_model():
    from hargo.rewards.plp import PLPScorer
    s = PLPScorer()
    TaskReward(RewardConfig(), s)(completions=["yes", "8"], task=["race_c", "mlperf"],
                                  answer=["yes", "8"], label=["yes", None])
    assert not s.loaded


# ------------------------------------------------------------------------------------- fuzz

_BIG = ["yes " * 250_000, "\x00\xff" * 500_000, "é漢🙂" * 300_000, "1," * 500_000,
        "3.0-" * 250_000 + "x", "a" * 1_000_000, "\ud800" * 1000 + "no"]
_junk = st.binary(max_size=300).map(lambda b: b.decode("utf-8", "surrogateescape"))
_texts = st.one_of(st.text(max_size=300), _junk, st.sampled_from(_BIG),
                   st.text(alphabet="yesno ,.-0123456789\n", max_size=200))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.data_too_large])
@given(completion=_texts, answer=st.one_of(st.text(min_size=1, max_size=60), _junk.filter(bool)),
       task=st.sampled_from(TASKS), label=st.sampled_from(["yes", "no"]))
def test_rewards_never_raise(scorer, completion, answer, task, label):
    fn = TaskReward(RewardConfig(), scorer)
    kw = dict(completions=[completion, [{"role": "assistant", "content": completion}]],
              task=[task] * 2, answer=[answer] * 2, label=[label] * 2)
    r1 = fn(**kw)
    r2 = fn(**kw)
    assert r1 == r2                                   # deterministic
    assert r1[0] == r1[1]                             # string and conversational agree
    assert all(isinstance(x, float) and -1.0 <= x <= 1.1 + 1e-6 for x in r1)


@pytest.mark.parametrize("task", TASKS)
def test_megabyte_and_junk_completions(scorer, task):
    """Every huge/junk completion, every task, explicitly (the fuzz test samples them)."""
    fn = TaskReward(RewardConfig(), scorer)
    n = len(_BIG)
    out = fn(completions=_BIG, task=[task] * n, answer=["Habana Gaudi2, 8"] * n,
             label=["no"] * n)
    assert len(out) == n and all(isinstance(x, float) for x in out)
    if task == "plp":  # all but the last are far past the 400-character budget: floored
        assert out[:-1] == [-1.0] * (n - 1)
        # "\ud800" * 1000 + "no": a run of U+FFFD, so repetitive (no bonus); 602 chars over budget
        sim = scorer.similarity([_BIG[-1]], ["Habana Gaudi2, 8"])[0]
        assert out[-1] == pytest.approx(sim - 0.0005 * 602, abs=1e-6)
    if task in ("race_c", "race_fortran"):  # only "...\ud800 no" holds just one yes/no word
        assert out == [0.0] * (n - 1) + [1.0]


def test_reward_config_from_committed_params(committed_params):
    rc = RewardConfig.from_params(committed_params["rewards"])
    assert rc.plp == PLPConfig.from_params(committed_params["rewards"]["plp"])
    assert rc.plp.embed_max_chars == committed_params["rewards"]["plp"]["embed_max_chars"]
    assert rc.mlperf.overlap_high == committed_params["rewards"]["mlperf"]["overlap_high"]
