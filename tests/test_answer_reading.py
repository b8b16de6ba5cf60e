"""One reading rule for every reward and metric (hargo.rewards.text): Unicode NFKC with format
characters removed, and degenerate answers (past the task's character budget, or one repeated
unit) earning less than the plain answer and counting as no answer in the metrics. Issue 30,
item 3: each example of the issue, and other members of the same kinds."""
from __future__ import annotations

import unicodedata
from pathlib import Path

import pytest

from hargo.data.synthetic import synthetic_reward
from hargo.metrics import compute_metrics, score_samples
from hargo.params import ParamsError, load_params
from hargo.rewards import AnswerConfig, RewardConfig, TaskReward
from hargo.rewards.mlperf import exact_match, mlperf_em, mlperf_reward
from hargo.rewards.race import extract_yes_no, race_reward
from hargo.rewards.text import degenerate, is_repetitive, read_answer

PARAMS = str(Path(__file__).resolve().parents[1] / "params.yaml")

pytestmark = pytest.mark.fast


class _WordScorer:
    """Share of the reference's words found in the completion (a stand-in for MiniLM)."""

    def similarity(self, completions, references):
        out = []
        for c, r in zip(completions, references):
            wc, wr = set(c.casefold().split()), set(r.casefold().split())
            out.append(len(wc & wr) / len(wr) if wc and wr else 0.0)
        return out


def _fn(**answer) -> TaskReward:
    return TaskReward(RewardConfig(answer=AnswerConfig(**answer)), _WordScorer())


# ------------------------------------------------------------------ characters

@pytest.mark.parametrize("raw, read", [
    ("４０９６", "4096"),                 # fullwidth digits
    ("Ｙｅｓ", "Yes"),                    # fullwidth letters
    ("ye\u200bs", "yes"),               # zero-width space
    ("n\u200do", "no"),                 # zero-width joiner
    ("\ufeffyes", "yes"),               # byte-order mark
    ("Gau\u00addi2", "Gaudi2"),         # soft hyphen
    ("\u2060Dell\u200e", "Dell"),       # word joiner, left-to-right mark
    ("8\u00a0GPUs", "8 GPUs"),          # no-break space
    ("plain ASCII, kept as is.", "plain ASCII, kept as is."),
])
def test_read_answer(raw, read):
    assert read_answer(raw) == read
    assert read_answer(read_answer(raw)) == read_answer(raw)   # idempotent


def test_read_answer_removes_every_format_character():
    """The table is the whole Unicode category Cf of this Python, not a hand-picked list."""
    cf = [chr(c) for c in range(0x110000) if unicodedata.category(chr(c)) == "Cf"]
    assert len(cf) > 100
    assert read_answer("a" + "".join(cf) + "b") == "ab"


@pytest.mark.parametrize("completion, label", [
    ("ｙｅｓ", "yes"), ("ye\u200bs", "yes"), ("ＮＯ.", "no"), ("n\u200co", "no"),
    ("\ufeffYes, there is a data race.", "yes"),
])
def test_race_reads_unicode_forms_of_the_answer(completion, label):
    assert extract_yes_no(completion) == label
    assert race_reward(completion, label) == 1.0
    assert _fn()(completions=[completion], task=["race_c"], label=[label]) == [1.0]


@pytest.mark.parametrize("completion, answer", [
    ("４０９６", "4096"), ("4\u200b096", "4096"), ("The answer is ４０９６.", "4096"),
    ("Ｈａｂａｎａ Ｇａｕｄｉ２", "Habana Gaudi2"), ("Gau\u00addi2", "Gaudi2"),
])
def test_mlperf_reads_unicode_forms_of_the_answer(completion, answer):
    assert mlperf_reward(completion, answer) == 1.0
    assert exact_match(completion, answer) and mlperf_em(completion, answer)


def test_a_fullwidth_reference_reads_as_its_plain_form():
    assert mlperf_reward("4096", "４０９６") == 1.0


def test_synthetic_rewards_read_by_the_same_rule():
    assert synthetic_reward("syn_yesno", "ｙｅｓ", None, "yes") == 1.0
    assert synthetic_reward("syn_short", "２３", "23", None) == 1.0
    assert synthetic_reward("syn_short", "2\u200b3", "23", None) == 1.0


# ------------------------------------------------------------------ hedges are not exact matches

@pytest.mark.parametrize("completion, answer", [
    ("0 1 2 4 8 16 32 64 128", "8"),
    ("Dell, HPE, Lenovo, NVIDIA, Supermicro, Inspur", "Dell"),
    ("8 or 16", "8"),
    ("It has 4, 8 or 16 accelerators.", "8"),
    ("Dell or HPE", "Dell"),
    ("3.0-2087; 3.0-2088", "3.0-2087"),
])
def test_a_hedge_is_not_an_exact_match(completion, answer):
    assert not exact_match(completion, answer)
    assert not mlperf_em(completion, answer)
    assert mlperf_reward(completion, answer) < 1.0


@pytest.mark.parametrize("completion, answer", [
    ("8", "8"), ("8 GPUs", "8"), ("Dell", "Dell"), ("The submitter is Dell.", "Dell"),
    ("Dell PowerEdge XE9680", "Dell"), ("The ID is 3.0-2087.", "3.0-2087"),
])
def test_the_plain_answer_is_an_exact_match(completion, answer):
    assert exact_match(completion, answer) and mlperf_reward(completion, answer) == 1.0


# ------------------------------------------------------------------ degenerate answers

def test_the_issues_degenerate_answers_earn_less_than_the_plain_answer():
    fn = _fn()
    race = fn(completions=["yes " * 250_000, "yes"], task=["race_c"] * 2, label=["yes"] * 2)
    assert race == [0.0, 1.0]
    mlperf = fn(completions=["4096 " * 100_000, "4096"], task=["mlperf"] * 2,
                answer=["4096"] * 2)
    assert mlperf == [0.0, 1.0]


@pytest.mark.parametrize("task, completion, kw, reason", [
    ("race_c", "yes yes yes yes yes", {"label": "yes"}, "repetitive"),         # short, repeated
    ("race_fortran", "No. " * 6, {"label": "no"}, "repetitive"),
    ("race_c", "yes" + "!" * 17, {"label": "yes"}, "repetitive"),               # a character run
    ("race_c", "Yes, the loop writes a[i]. " + "Thread %d reads it. " * 120, {"label": "yes"},
     "over_budget"),
    ("mlperf", "8 8 8 8 8 8", {"answer": "8"}, "repetitive"),
    ("mlperf", "Dell " + "lorem ipsum dolor sit amet " * 80, {"answer": "Dell"}, "over_budget"),
])
def test_degenerate_kinds(task, completion, kw, reason):
    fn = _fn()
    assert fn.degenerate(completion, task) == reason
    n = dict(task=[task], label=[kw.get("label")], answer=[kw.get("answer")])
    assert fn(completions=[completion], **n) == [0.0]
    half = _fn(degenerate_scale=0.5)(completions=[completion], **n)
    plain = fn(completions=[kw.get("label") or kw.get("answer")], **n)
    assert plain == [1.0] and half == [0.5]      # the plain answer earns more, either scale


@pytest.mark.parametrize("task, completion", [
    ("race_c", "Yes. The loop writes a[i+1] while another thread reads a[i]."),
    ("race_c", "no"), ("mlperf", "The system has 8 accelerators and 2 processors."),
    ("mlperf", "Dell, 8"),
    ("plp", "CodeBERT is a bimodal pre-trained model for programming and natural languages, "
            "trained on code and text pairs from six programming languages."),
])
def test_honest_answers_are_not_degenerate(task, completion):
    assert _fn().degenerate(completion, task) is None


def test_a_negative_reward_stays_negative():
    """PLP's floor is -1: a degenerate plp answer keeps its penalty (scaling by 0 would raise
    it to 0, a reward for degenerating)."""
    fn = _fn()
    big = "word " * 2000          # 10,000 characters: past plp's 4,096 and repetitive
    assert fn.degenerate(big, "plp") == "over_budget"
    out = fn(completions=[big], task=["plp"], answer=["a reference sentence"])
    assert out[0] < 0


def test_metrics_count_a_degenerate_answer_as_no_answer():
    fn = _fn()
    samples = [
        {"id": "r1", "task": "race_c", "label": "yes", "answer": "yes"},
        {"id": "r2", "task": "race_c", "label": "no", "answer": "no"},
        {"id": "m1", "task": "mlperf", "answer": "4096", "label": None},
        {"id": "m2", "task": "mlperf", "answer": "4096", "label": None},
    ]
    completions = ["yes " * 250_000, "no", "4096 " * 100_000, "４０９６"]
    recs = score_samples(samples, completions, fn)
    assert [r["degenerate"] for r in recs] == ["over_budget", None, "over_budget", None]
    assert recs[0]["prediction"] is None and recs[0]["correct"] is False
    assert recs[2]["em"] is False and recs[2]["correct"] is False
    assert recs[3]["em"] is True and recs[3]["correct"] is True
    m = compute_metrics(samples, completions, reward_fn=fn)
    # race: the degenerate "yes" is unparseable, a false negative: TP 0, FN 1, TN 1
    assert m["dr_unparseable"] == 1 and m["dr_recall"] == 0.0 and m["dr_accuracy"] == 0.5
    assert m["mlperf_em"] == 0.5 and m["accuracy_mlperf"] == 0.5
    assert m["degenerate_share_race_c"] == 0.5 and m["degenerate_share_mlperf"] == 0.5
    assert m["avg_score"] == pytest.approx((0 + 1 + 0 + 1) / 4)


def test_is_repetitive_needs_more_than_a_few_words():
    assert not is_repetitive("yes")
    assert not is_repetitive("yes yes yes yes")       # 2 trigrams, 1 distinct: 0.5, not < 0.5
    assert is_repetitive("yes yes yes yes yes")


def test_degenerate_tests_the_budget_before_scanning():
    assert degenerate("a b " * 1_000_000, "race_c") == "over_budget"
    assert degenerate("a b c d", "unknown_task") is None     # no budget: only repetition counts


# ------------------------------------------------------------------ params

def test_params_refuse_a_budget_below_what_generation_allows():
    with pytest.raises(ParamsError, match=r"rewards.answer.max_chars.race_c: 2048 .* "
                                          r"evaluate.max_new_tokens .* >= 4096"):
        load_params(PARAMS, ["evaluate.max_new_tokens=512"])
    load_params(PARAMS, ["evaluate.max_new_tokens=512",
                         "rewards.answer.max_chars={race_c: 4096, race_fortran: 4096, "
                         "mlperf: 4096, plp: 4096}"])


@pytest.mark.parametrize("override, match", [
    ("rewards.answer.degenerate_scale=1", "must be < 1"),
    ("rewards.answer.degenerate_scale=-0.1", "must be >= 0"),
    ("rewards.answer.repetition_min_distinct=0", "must be > 0"),
])
def test_params_refuse_bad_answer_constants(override, match):
    with pytest.raises(ParamsError, match=match):
        load_params(PARAMS, [override])


def test_answer_config_from_committed_params():
    p = load_params(PARAMS)
    rc = RewardConfig.from_params(p["rewards"])
    assert rc.answer.max_chars == {"race_c": 2048, "race_fortran": 2048, "mlperf": 2048,
                                   "plp": 4096}
    assert rc.answer.degenerate_scale == 0.0
    with pytest.raises(ValueError, match="unknown key"):
        AnswerConfig.from_params({"max_char": 3})
