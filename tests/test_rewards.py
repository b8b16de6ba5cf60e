"""Task rewards: race phrasing, each MLPerf tier, PLP with the real MiniLM (loaded once per
process through get_scorer), TRL-style dispatch, determinism and a Hypothesis fuzz test."""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from hargo.rewards import (TASKS, RewardConfig, TaskReward, completion_text, get_scorer)
from hargo.rewards.mlperf import (MLPerfConfig, all_values_match, reference_occurs, keyword_overlap,
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

@pytest.mark.fast
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


@pytest.mark.fast
def test_race_reward():
    assert race_reward("Yes, there is a data race", "yes") == 1.0
    assert race_reward("No data race", "yes") == 0.0
    assert race_reward("no", " No ") == 1.0
    assert race_reward("yes and no", "no") == 0.0
    assert race_reward("", "no") == 0.0
    with pytest.raises(ValueError, match="race label"):
        race_reward("yes", "maybe")


# ------------------------------------------------------------------------------------ mlperf

@pytest.mark.fast
def test_normalise_number_and_tokens():
    assert normalise_number("1,024") == normalise_number("1024.0") == normalise_number("01024") == "1024"
    assert normalise_number("1.50") == "1.5" and normalise_number("0.0") == "0"
    assert normalise_number("3.0-2087") == "3.0-2087"
    assert numeric_tokens("ID 3.0-2087 has 1,024 GPUs, 8x H100-SXM5-80GB and 2 CPUs.") == [
        "3.0-2087", "1024", "2"]


@pytest.mark.fast
def test_exact_tier():
    assert reference_occurs("The ID is 3.0-2087.", "3.0-2087")
    assert reference_occurs("  habana GAUDI2  ", "Habana Gaudi2")
    assert reference_occurs("It is\nIntel(R) Xeon(R) Gold 6430.", "Intel(R) Xeon(R) Gold 6430")
    assert not reference_occurs("3.0-20871", "3.0-2087")           # word boundary after
    assert not reference_occurs("H3C8", "H3C")                     # word boundary after
    assert not reference_occurs("XH3C", "H3C")                     # word boundary before
    assert not reference_occurs("anything", "")
    assert mlperf_reward("Dell", "Dell") == 1.0
    assert mlperf_reward("The submitter is Dell.", "Dell") == 1.0


@pytest.mark.fast
def test_numeric_tier():
    assert numeric_match("There are 1024 accelerators", "1,024")
    assert numeric_match("1,024", "1024.0")
    assert numeric_match("The ID is 3.0-2087", "3.0-2087.")
    assert not numeric_match("There are 1024 accelerators", "1,025")
    assert not numeric_match("80GB", "80")                    # part of a word, not a number
    assert not numeric_match("8 GPUs", "8 GPUs")              # reference is not a lone number
    assert mlperf_reward("1,024 GPUs", "1024.0") == 1.0


@pytest.mark.fast
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


@pytest.mark.fast
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

@pytest.mark.fast
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


@pytest.mark.fast
def test_plp_config_from_params():
    cfg = PLPConfig.from_params({"format_bonus": 0.2, "length_budget": 100, "batch_size": 8,
                                 "unknown": 1})
    assert cfg.format_bonus == 0.2 and cfg.length_budget == 100 and cfg.batch_size == 8
    assert isinstance(cfg.length_budget, int)
    rc = RewardConfig.from_params({"plp": {"length_penalty": 0.01}, "mlperf": {"partial": 0.3}})
    assert rc.plp.length_penalty == 0.01 and rc.mlperf.partial == 0.3


@pytest.mark.fast
def test_scorer_is_lazy_and_cached():
    from hargo.rewards.plp import PLPScorer
    s = PLPScorer()
    assert not s.loaded
    assert get_scorer() is get_scorer()
    assert s.similarity(["", " "], ["a", ""]) == [0.0, 0.0] and not s.loaded  # empties: no model


# -------------------------------------------------------------------------------- dispatcher

@pytest.mark.fast
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


@pytest.mark.fast
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
    if task in ("race_c", "race_fortran"):
        # only "...\ud800 no" holds just one yes/no word, and it is degenerate (a run of one
        # character), so it earns 0 like the rest (rewards.answer.degenerate_scale)
        assert out == [0.0] * n


@pytest.mark.fast
def test_reward_config_from_committed_params(committed_params):
    rc = RewardConfig.from_params(committed_params["rewards"])
    assert rc.plp == PLPConfig.from_params(committed_params["rewards"]["plp"])
    assert rc.plp.embed_max_chars == committed_params["rewards"]["plp"]["embed_max_chars"]
    assert rc.mlperf.overlap_high == committed_params["rewards"]["mlperf"]["overlap_high"]


# ---------------------------------------------------------------------------------- hedging
# Issue 12 item 8: a completion that hedges (many candidates, both labels, the reference padded
# inside long text) earns less than the precise answer, for every task reward.

from hargo.rewards.mlperf import extra_candidates, mlperf_em, segments  # noqa: E402

#: MLPerf submitters (none contains another as a whole word)
_VENDORS = ["Dell", "NVIDIA", "HPE", "Lenovo", "Supermicro", "GIGABYTE", "ASUSTeK", "Fujitsu",
            "Azure", "xFusion", "Intel-HabanaLabs", "Krai", "IEI", "H3C", "CoreWeave"]
#: how a hedge joins its candidates
_JOINS = [", ", "; ", " or ", "\n", " | ", " / ", " and ", ", or ", " and/or "]
#: real PLP references (data/prepared/eval.jsonl)
_PLP_REFS = [
    "CodeBERT is the baseline used for clone detection in the POJ-104 dataset.",
    "The training set of the Devign dataset contains 21k code samples for defect detection "
    "analysis.",
    "Encoder-Decoder is the baseline model used for code repair in the Bugs2Fix dataset.",
    "The Bugs2Fix dataset supports the Java programming language.",
    "The task for the Cloze Test using the CT-all dataset is to predict tokens that come from "
    "the entire vocabulary.",
    "The BigCloneBench dataset can be used for clone detection tasks if the language is Java "
    "and the baseline is CodeBERT.",
]


@pytest.mark.fast
def test_issue_hedges_fixed_values():
    """The two cases of the issue: 1/k of the tier for k candidates, and not an exact match."""
    hedge = "0 1 2 4 8 16 32 64 128"
    assert extra_candidates(hedge, "8") == ["0", "1", "2", "4", "16", "32", "64", "128"]
    assert mlperf_reward(hedge, "8") == pytest.approx(1 / 9)        # was 1.0
    assert reference_occurs(hedge, "8") and not mlperf_em(hedge, "8")
    six = "Dell, NVIDIA, HPE, Lenovo, Supermicro, GIGABYTE"
    assert extra_candidates(six, "Dell") == ["nvidia", "hpe", "lenovo", "supermicro", "gigabyte"]
    assert mlperf_reward(six, "Dell") == pytest.approx(1 / 6)       # was 1.0
    assert not mlperf_em(six, "Dell")


@pytest.mark.fast
@pytest.mark.parametrize("completion,answer,question", [
    ("8", "8", ""), ("8 GPUs", "8", ""), ("There are 8 accelerators.", "8", ""),
    ("ID 3.0-2020 has 8 accelerators", "8", ""),                      # an id is not a count
    ("8 accelerators with NGC MXNet 23.04", "8", ""),                 # a version is not a count
    ("Dell", "Dell", ""), ("The submitter is Dell.", "Dell", ""),
    ("Dell PowerEdge XE9680", "Dell", ""), ("Dell, 8", "Dell", ""),   # 8 is no vendor
    ("The submitter is Dell, which builds the XE9680.", "Dell", ""),  # a clause, not a value
    ("Dell, Dell", "Dell", ""),                                       # the same answer twice
    ("8 of them, all Habana Gaudi2", "Habana Gaudi2, 8", ""),
    ("The ID is 3.0-2087.", "3.0-2087", ""),
    # restating the question is not hedging: its values are excused
    ("The system with the Intel(R) Xeon(R) Platinum 8480+ and NGC HugeCTR 23.04 has 4 "
     "accelerators.", "4", "If the system with ID 3.0-2052 has the processor Intel(R) Xeon(R) "
     "Platinum 8480+ and the software used is NGC HugeCTR 23.04, what is the number of "
     "accelerators?"),
    ("If the Submitter is Dell and there are 8 accelerators, the system is XE9680x8A100.",
     "XE9680x8A100", "What is the system if the submitter is Dell and the number of "
     "accelerators is 8?"),
])
def test_precise_answers_keep_full_credit(completion, answer, question):
    assert extra_candidates(completion, answer, question) == []
    assert mlperf_reward(completion, answer, question=question) == 1.0


@pytest.mark.fast
@pytest.mark.parametrize("completion,answer,question,expected", [
    ("The submitter is Dell or HPE", "Dell", "", 1 / 2),
    ("It could be Dell, or it could be HPE", "Dell", "", 1 / 2),
    ("3.0-2030, 3.0-2031", "3.0-2030", "", 1 / 2),
    ("8, 16 or 32 GPUs", "8", "", 1 / 3),
    ("Habana Gaudi2, 8, 16", "Habana Gaudi2, 8", "", 2 / 3),            # 2 of 3 values right
    ("Habana Gaudi2, NVIDIA H100", "Habana Gaudi2, 8", "", 0.5 * 1 / 2),  # partial tier, hedged
    ("Intel(R) Xeon(R) Platinum 8460H or Intel(R) Xeon(R) Platinum 8480+",
     "Intel(R) Xeon(R) Platinum 8460H", "", 1 / 2),
    ("The ID is 3.0-2062.\nThe ID is 3.0-2063.", "The ID is 3.0-2062.", "", 1 / 2),
    # the question's own 8480 is excused, but not without the question
    ("The Platinum 8480+ system has 4 accelerators.", "4", "", 1 / 2),
    ("The Platinum 8480+ system has 4 accelerators.", "4", "Processor Platinum 8480+?", 1.0),
])
def test_hedged_answers_values(completion, answer, question, expected):
    assert mlperf_reward(completion, answer, question=question) == pytest.approx(expected)
    assert mlperf_em(completion, answer, question) == (expected == 1.0
                                                       and reference_occurs(completion, answer))


@pytest.mark.fast
def test_segments_and_number_tokens():
    assert segments("Dell, or HPE") == [("Dell", False), ("HPE", True)]
    assert segments("A or B and C, D") == [("A", False), ("B", True), ("C", True), ("D", False)]
    assert segments("1,024 GPUs; 8") == [("1,024 GPUs", False), ("8", False)]
    # a clock speed holds no number (it held a phantom "2" before: a hedge candidate)
    assert numeric_tokens("Intel(R) Xeon(R) Gold 6338 CPU @ 2.00GHz") == ["6338"]
    assert numeric_tokens("It is 8.") == ["8"] and numeric_tokens("1.2.3") == []


@pytest.mark.fast
@settings(max_examples=60, deadline=None)
@given(ref=st.integers(0, 4096), others=st.sets(st.integers(0, 4096), min_size=1, max_size=8),
       join=st.sampled_from(_JOINS + [" "]), unit=st.sampled_from(["", " GPUs"]),
       data=st.data())
def test_mlperf_number_hedges_pay_one_over_k(ref, others, join, unit, data):
    """A number hedged with k other numbers earns 1/(k+1) < 1 = the precise answer."""
    others = sorted(others - {ref})
    if not others:
        return
    cands = data.draw(st.permutations([ref] + others))
    hedge = join.join(f"{x}{unit}" for x in cands)
    precise = f"{ref}{unit}"
    assert mlperf_reward(precise, str(ref)) == 1.0 and mlperf_em(precise, str(ref))
    assert mlperf_reward(hedge, str(ref)) == pytest.approx(1 / (len(others) + 1))
    assert not mlperf_em(hedge, str(ref))
    # every candidate named by the question: a restatement, not a hedge
    question = "Which of " + ", ".join(map(str, others)) + "?"
    assert mlperf_reward(hedge, str(ref), question=question) == 1.0


@pytest.mark.fast
@settings(max_examples=60, deadline=None)
@given(names=st.lists(st.sampled_from(_VENDORS), min_size=2, max_size=8, unique=True),
       join=st.sampled_from(_JOINS), prefix=st.sampled_from(["", "The submitter is "]),
       question=st.sampled_from(["", "Who is the submitter of the system with ID 3.0-2045?"]))
def test_mlperf_name_hedges_pay_one_over_k(names, join, prefix, question):
    """A name hedged with k other names earns 1/(k+1) < 1 = the precise answer, whatever the
    order, the separator, or a leading phrase taken from the question."""
    if prefix and not question:
        question = "Who is the submitter?"  # a frame is recognised through the question
    ref = names[0]
    for order in (names, names[::-1]):
        hedge = prefix + join.join(order)
        assert mlperf_reward(hedge, ref, question=question) == pytest.approx(1 / len(names))
        assert not mlperf_em(hedge, ref, question)
    assert mlperf_reward(prefix + ref, ref, question=question) == 1.0
    assert mlperf_em(prefix + ref, ref, question)


@pytest.mark.fast
@settings(max_examples=40, deadline=None)
@given(values=st.lists(st.sampled_from(_VENDORS), min_size=2, max_size=3, unique=True),
       extra=st.lists(st.sampled_from(_VENDORS), min_size=1, max_size=4, unique=True),
       join=st.sampled_from([", ", "; ", "\n"]))
def test_mlperf_multi_value_hedges_pay_precision(values, extra, join):
    """A multi-value reference hedged with e other values earns n / (n + e)."""
    extra = [x for x in extra if x not in values]
    ref = ", ".join(values)
    assert mlperf_reward(join.join(values), ref) == 1.0
    if extra:
        hedge = join.join(values + extra)
        assert mlperf_reward(hedge, ref) == pytest.approx(len(values) / (len(values) + len(extra)))


_RACE_HEDGES = ["{a} or {b}", "{a}/{b}", "{a}. Actually, {b}.", "{A}, or {b}, there may be a race",
                "Answer: {a}\nAnswer: {b}", "{A} -- {b} -- it depends on the schedule."]


@pytest.mark.fast
@settings(max_examples=60, deadline=None)
@given(label=st.sampled_from(["yes", "no"]), first=st.sampled_from(["yes", "no"]),
       template=st.sampled_from(_RACE_HEDGES),
       case=st.sampled_from([str.lower, str.upper, str.capitalize]))
def test_race_hedges_score_zero(label, first, template, case):
    """Naming both labels is no answer: 0 against either label; the precise label scores 1."""
    second = "no" if first == "yes" else "yes"
    hedge = template.format(a=case(first), b=case(second), A=first.capitalize())
    assert extract_yes_no(hedge) is None
    assert race_reward(hedge, label) == 0.0 < race_reward(case(label), label) == 1.0


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(i=st.integers(0, len(_PLP_REFS) - 1), k=st.integers(1, 3), data=st.data(),
       pad=st.lists(st.sampled_from(["the", "model", "runs", "fast", "on", "GPUs", "today",
                                     "and", "data", "is", "large"]), min_size=3, max_size=120))
def test_plp_hedges_score_below_the_reference(scorer, i, k, data, pad):
    """The reference alone beats (a) it listed with k other candidate sentences and (b) it
    padded inside unrelated text: dilution lowers the cosine (and past 400 characters the
    length penalty bites)."""
    ref = _PLP_REFS[i]
    others = data.draw(st.lists(st.sampled_from([r for r in _PLP_REFS if r != ref]),
                                min_size=k, max_size=k, unique=True))
    listing = " ".join(data.draw(st.permutations([ref] + others)))
    padding = " ".join(pad)
    cut = data.draw(st.integers(0, len(pad)))
    padded = " ".join(pad[:cut] + [ref] + pad[cut:])
    cfg = PLPConfig()
    precise, hedged, padded_r = plp_rewards([ref, listing, padded], [ref] * 3, cfg, scorer)
    assert hedged < precise and padded_r < precise
    assert precise == pytest.approx(1.1, abs=1e-5) and padding


@pytest.mark.fast
def test_task_reward_excuses_the_prompt():
    """TaskReward reads the question from the prompts TRL passes (string or conversation)."""
    fn = TaskReward(RewardConfig())
    c = "The Platinum 8480+ system has 4 accelerators."
    q = "If the processor is Intel(R) Xeon(R) Platinum 8480+, how many accelerators?"
    kw = dict(completions=[c, c, c], task=["mlperf"] * 3, answer=["4"] * 3)
    assert fn(prompts=[q, [{"role": "user", "content": q}], None], **kw) == [1.0, 1.0, 0.5]
    assert fn(**kw) == [0.5, 0.5, 0.5]


def _real_mlperf(real_raw_dir):
    from hargo.data.raw import instruction_prompt, load_file

    raws = load_file(real_raw_dir / "task1_ml_perf.json")
    return [(instruction_prompt(r["instruction"], r["input"]), r["output"]) for r in raws]


def test_real_references_keep_full_credit(real_raw_dir):
    """Every real MLPerf reference (1,820 raw records) scores 1.0 and is an exact match against
    itself, bare, wrapped in a phrase and after its restated question: the hedging rule
    changes no correct-form answer."""
    qa = _real_mlperf(real_raw_dir)
    assert len(qa) == 1820
    fn = TaskReward(RewardConfig())
    for form in ("{a}", "The answer is {a}.", "{q} The answer is {a}"):
        comps = [form.format(a=a, q=q) for q, a in qa]
        r = fn(prompts=[q for q, _ in qa], completions=comps, task=["mlperf"] * len(qa),
               answer=[a for _, a in qa])
        assert r == [1.0] * len(qa), form
        assert all(mlperf_em(c, a, q) for c, (q, a) in zip(comps, qa)), form


def test_real_alternative_numbers_are_hedges(real_raw_dir):
    """Questions with several different real answers that are numbers or ids (duplicates with
    conflicting outputs): listing them all earns 1/k of the precise answer's 1.0."""
    by_q: dict[str, set] = {}
    for q, a in _real_mlperf(real_raw_dir):
        by_q.setdefault(q, set()).add(a)
    groups = [(q, sorted(a)) for q, a in by_q.items()
              if len(a) > 1 and all(numeric_tokens(x) == [x] for x in a)]
    assert len(groups) >= 10
    for q, answers in groups:
        hedge = ", ".join(answers)
        for a in answers:
            assert mlperf_reward(a, a, question=q) == 1.0
            assert mlperf_reward(hedge, a, question=q) == pytest.approx(1 / len(answers))


# ------------------------------------------------------------------ number token boundaries
# A number reference matches a whole number token of the completion, never a digit run inside a
# longer number, id or name (module docstring of hargo.rewards.mlperf, "Token-boundary rule").

_SENTENCE = "The submitter is Dell and the number of processors is 2."


@pytest.mark.fast
@pytest.mark.parametrize("completion,answer,found", [
    # the bug: a digit run inside a clock speed, a decimal, an id
    ("2.00GHz", "2", False),
    ("Intel(R) Xeon(R) Gold 6338 CPU @ 2.00GHz", "2", False),
    ("3.0-2018", "0", False),
    ("The ID is 3.0-2018.", "0", False),
    ("3.0-2018", "2018", False), ("3.0-2018", "3.0", False), ("3.0-2018", "3", False),
    ("12 GPUs", "2", False), ("2.5", "2", False), ("0.2", "2", False), ("1,024", "1", False),
    ("1,024 GPUs", "24", False), ("0,1,2,4,8", "8", False), ("DGX-2", "2", False),
    ("tensorflow 2.11.0", "2", False), ("NGC MLPerf v2.1/2.5", "2", False),
    # a letter glued to a number makes a name: "v3.0" is a version, not the number 3.0
    ("v3.0", "3.0", False), ("MLPerf Training v3.0", "3.0", False), ("80GB", "80", False),
    ("H100", "100", False), ("8x H100", "8", False),
    # a sentence reference that ends with a number keeps the number boundary at its end
    ("The submitter is Dell and the number of processors is 2.00GHz", _SENTENCE, False),
    ("The submitter is Dell and the number of processors is 2.5.", _SENTENCE, False),
    # whole number tokens
    ("2 GPUs", "2", True), ("2", "2", True), ("(2)", "2", True), ("It is 2.", "2", True),
    ("**2**", "2", True), ("2/4", "2", True), ("8-GPU node", "8", True), ("3.0", "3.0", True),
    ("The ID is 3.0-2018.", "3.0-2018", True), ("1,024 GPUs", "1,024", True),
    ("3.0-2009, H3C", "3.0-2009", True),
    ("The submitter is Dell and the number of processors is 2 per node.", _SENTENCE, True),
    # names keep word boundaries, as before
    ("H3C8", "H3C", False), ("XH3C", "H3C", False), ("NVIDIA A100-80GB", "NVIDIA A100", True),
    ("dgxh100_n8", "dgxh100_n8", True), ("dgxh100_n86", "dgxh100_n8", False),
])
def test_number_reference_token_boundary(completion, answer, found):
    """``reference_occurs`` and ``numeric_match`` (and so the reward and EM) apply one rule: a
    number reference is found only as a whole number token."""
    assert reference_occurs(completion, answer) is found
    if len(numeric_tokens(answer)) == 1 and numeric_tokens(answer)[0] == normalise_number(
            answer.strip(".")):
        assert numeric_match(completion, answer) is found
    if not found:
        assert mlperf_reward(completion, answer) < 1.0 and not mlperf_em(completion, answer)


@pytest.mark.fast
def test_number_tokens_follow_the_boundary():
    """The completion's numbers (numeric_match, the hedging count) are cut by the same rule."""
    assert numeric_tokens("v3.0-2018 DGX-2 1,024GB 0,1,2 2.00GHz H100 80GB") == []
    assert numeric_tokens("8-GPU node, ID 3.0-2018, 1,024 GPUs; (2)") == [
        "8", "3.0-2018", "1024", "2"]
    # a clock speed is no alternative count, and no match
    assert extra_candidates("2 processors @ 2.40GHz", "2") == []
    assert mlperf_reward("2 processors @ 2.40GHz", "2") == 1.0
    assert mlperf_reward("Xeon @ 2.40GHz", "2") == 0.0
    assert keywords("2.00GHz, 3.0-2018, 0,1,2") == {"2.00ghz", "3.0-2018", "0,1,2"}


_DIGITS = st.text("0123456789", min_size=1, max_size=4)
_NUMBERS = st.one_of(st.integers(0, 10 ** 6).map(str),
                     st.tuples(st.integers(0, 999), st.integers(0, 999)).map("{0[0]}.{0[1]}".format))
_EMBED = {  # how a longer number, id or name holds the reference number n
    "prefix digits": lambda n, d: d.lstrip("0") + n if d.lstrip("0") else "1" + n,
    "suffix digits": lambda n, d: n + d,
    "decimal part": lambda n, d: n + "." + d,
    "integer part": lambda n, d: d + "." + n,
    "id head": lambda n, d: n + "-" + d,
    "id tail": lambda n, d: d + "-" + n,
    "round id": lambda n, d: "3.0-" + n,
    "thousands": lambda n, d: n + "," + d.rjust(3, "0")[:3],
    "after thousands": lambda n, d: d[:3] + "," + n,
}


@pytest.mark.fast
@settings(max_examples=300, deadline=None)
@given(n=_NUMBERS, d=_DIGITS, kind=st.sampled_from(sorted(_EMBED)),
       unit=st.sampled_from(["", " GPUs", "GHz", "x", "-GPU", "%"]),
       lead=st.sampled_from(["", "There are ", "The answer is ", "@ "]),
       trail=st.sampled_from(["", ".", " per node.", ", 8"]))
def test_number_inside_a_longer_number_never_matches(n, d, kind, unit, lead, trail):
    """A reference number n embedded in a longer number (prefix or suffix digits, a decimal or
    integer part, an id, a thousands group) is never found: no exact or numeric match, reward
    below 1, not EM; bare, it is found."""
    token = _EMBED[kind](n, d)
    if not unit[:1].isalpha():  # a number equal to n (8.0, 08) is n: numeric_match by design
        assume(normalise_number(token) != normalise_number(n))
    completion = f"{lead}{token}{unit}{trail}"
    assert not reference_occurs(completion, n), (completion, n)
    assert not numeric_match(completion, n), (completion, n)
    assert mlperf_reward(completion, n) < 1.0 and not mlperf_em(completion, n)
    sentence = f"The number of processors is {n}."
    assert not reference_occurs(f"The number of processors is {token}{unit}{trail}", sentence)
    assert reference_occurs(f"{lead}{n}{unit}{trail}", n) is not unit[:1].isalpha()


def test_real_numbers_match_whole_tokens_only(real_raw_dir):
    """Every real single-number reference (counts, ids) against every real reference text: found
    exactly when it is one of the text's tokens, cut at whitespace, punctuation and a hyphen
    before a letter (an oracle independent of the module's regexes), so "2" is not found in
    "@ 2.00GHz" nor "0" in "3.0-2018", but "16" is in "16-nodes-SPR-pytorch"."""
    import re

    texts = sorted({a for _, a in _real_mlperf(real_raw_dir)})
    numbers = [a for a in texts if numeric_tokens(a) == [a]]
    assert len(numbers) >= 20
    split = re.compile(r"[\s;:()@+/]+|,\s|\.$|\.\s|-(?=[^\W\d])")
    hits = 0
    for t in texts:
        tokens = set(split.split(t))
        for a in numbers:
            assert reference_occurs(t, a) is (a in tokens), (t, a)
            hits += a in tokens
    assert hits > len(numbers)  # the oracle does find numbers (each in itself, and more)
