"""Reward properties with exact values on fuzzed text (issue 17: the fuzz test in
tests/test_rewards.py only bounds every reward to [-1, 1.1]).

- race (race_c, race_fortran): the correct label alone, in any case, inside any surrounding text
  that holds no other yes/no word, scores exactly 1.0 and the wrong label exactly 0.0; the
  label glued to a word character (``yesterday``, ``no2``, ``yes_``) is no answer (0 for both).
- mlperf: a reference answered verbatim up to casing, whitespace runs, outer quotes and
  trailing sentence punctuation scores exactly 1.0 and is an exact match (EM); a number
  reference in another spelling of the same number (``1,024`` = ``1024`` = ``1024.0``) too;
  the reference inside a longer number or word scores below 1.

No model (PLP's MiniLM is not used), so these are ``fast``. The hedge rules have their own
property tests in tests/test_rewards.py.
"""
from __future__ import annotations

import re

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from hargo.rewards import RewardConfig, TaskReward
from hargo.rewards.mlperf import reference_occurs, mlperf_em, mlperf_reward
from hargo.rewards.race import race_reward

pytestmark = pytest.mark.fast

_CASES = [str.lower, str.upper, str.capitalize, str.swapcase, str.title]
_YES_NO_WORD = re.compile(r"\b(yes|no)\b", re.IGNORECASE)
# filler: letters (so words such as "not", "none", "eyes" occur), digits, code punctuation,
# non-ASCII letters and whitespace
_filler = st.text(alphabet=st.sampled_from(list("abenosty yesno NOT;(){}[]=+*<>,.:!?-_'\"\n\t01é漢")),
                  max_size=80).filter(lambda t: not _YES_NO_WORD.search(t))
_left_edge = st.sampled_from(["", " ", "\n", "(", "**", "'", "Answer: ", "; ", "-> "])
_right_edge = st.sampled_from(["", " ", ".", "!", ")", "**", ",", ".\n", "'"])


@settings(max_examples=200, deadline=None)
@given(label=st.sampled_from(["yes", "no"]), case=st.sampled_from(_CASES), before=_filler,
       after=_filler, left=_left_edge, right=_right_edge,
       task=st.sampled_from(["race_c", "race_fortran"]))
def test_race_label_alone_in_any_text_scores_exactly_one(label, case, before, after, left,
                                                         right, task):
    # the label must stand as a word: what touches it is whitespace/punctuation or the edge
    prefix = before + (" " if before and not left else "") + left
    suffix = right + (" " if after and not right else "") + after
    completion = prefix + case(label) + suffix
    assume(not re.search(r"\w$", prefix) and not re.match(r"\w", suffix))
    wrong = "no" if label == "yes" else "yes"
    assert race_reward(completion, label) == 1.0
    assert race_reward(completion, wrong) == 0.0
    fn = TaskReward(RewardConfig())
    conv = [{"role": "assistant", "content": completion}]
    assert fn(completions=[completion, conv, completion], task=[task] * 3,
              label=[label, label, wrong]) == [1.0, 1.0, 0.0]


@settings(max_examples=100, deadline=None)
@given(label=st.sampled_from(["yes", "no"]), case=st.sampled_from(_CASES), before=_filler,
       glue=st.sampled_from(["terday", "2", "_", "s", "body", "é"]),
       glue_before=st.booleans())
def test_race_label_glued_to_a_word_is_no_answer(label, case, before, glue, glue_before):
    word = glue + case(label) if glue_before else case(label) + glue
    completion = before + " " + word
    assert race_reward(completion, "yes") == race_reward(completion, "no") == 0.0


# ------------------------------------------------------------------------------------ mlperf

#: reference shapes of the MLPerf Training v3.0 table: names, systems, processors, ids, counts,
#: versions and a sentence
_REFERENCES = ["Dell", "NVIDIA", "Habana Gaudi2", "XE9680x8A100", "dgxh100_n8",
               "Intel(R) Xeon(R) Platinum 8480+", "NGC MXNet 23.04", "3.0-2087", "8", "128",
               "NVIDIA H100-SXM5-80GB", "The submitter is Dell and the number of processors is 2."]
_WS_RUNS = st.sampled_from([" ", "  ", "\n", "\t", " \n "])
_QUOTES = st.sampled_from([("", ""), ('"', '"'), ("'", "'"), ("“", "”"), ("`", "`")])
_END = st.sampled_from(["", ".", "!", "?", ";", ":", ",", " .", ".\n"])


def _respace(text: str, runs: list[str]) -> str:
    words = text.split(" ")
    out = words[0]
    for i, w in enumerate(words[1:]):
        out += runs[i % len(runs)] + w
    return out


@settings(max_examples=200, deadline=None)
@given(ref=st.sampled_from(_REFERENCES), case=st.sampled_from(_CASES),
       runs=st.lists(_WS_RUNS, min_size=1, max_size=4), quotes=_QUOTES, end=_END,
       lead=st.sampled_from(["", " ", "\n\n"]))
def test_mlperf_reference_up_to_case_space_quotes_punctuation_is_exact(ref, case, runs, quotes,
                                                                        end, lead):
    completion = lead + quotes[0] + _respace(case(ref), runs) + quotes[1] + end
    assert reference_occurs(completion, ref)
    assert mlperf_reward(completion, ref) == 1.0
    assert mlperf_em(completion, ref)
    fn = TaskReward(RewardConfig())
    assert fn(completions=[completion], task=["mlperf"], answer=[ref]) == [1.0]


@settings(max_examples=100, deadline=None)
@given(n=st.integers(1000, 10**7), form=st.sampled_from(["plain", "commas", "decimal"]),
       frame=st.sampled_from(["{}", "{} GPUs", "There are {} accelerators.", "({})"]))
def test_mlperf_number_in_another_spelling_is_exact(n, form, frame):
    spelled = {"plain": str(n), "commas": f"{n:,}", "decimal": f"{n}.0"}[form]
    for ref in (str(n), f"{n:,}"):
        assert mlperf_reward(frame.format(spelled), ref) == 1.0
        assert mlperf_reward(frame.format(n + 1), ref) < 1.0      # another number is not it


_WORD_GLUE = [("1", ""), ("", "1"), ("", "x"), ("x", ""), ("_", ""), ("", "_")]
_NUMBER_GLUE = [("3.0-", ""), ("", ".5"), ("", ",000"), ("1,", ""), ("0.", "")]


@settings(max_examples=100, deadline=None)
@given(ref=st.sampled_from(["8", "128", "2087", "Dell", "H3C"]), data=st.data())
def test_mlperf_reference_inside_a_longer_token_is_not_exact(ref, data):
    """A word character glued to either edge, and for a number also a decimal part, a thousands
    group or an id prefix, makes another token (a hyphen after a name does not: ``A100`` is in
    ``A100-80GB`` by the module's rule)."""
    glue = data.draw(st.sampled_from(_WORD_GLUE + (_NUMBER_GLUE if ref.isdigit() else [])))
    completion = glue[0] + ref + glue[1]
    assert not reference_occurs(completion, ref)
    assert mlperf_reward(completion, ref) < 1.0 and not mlperf_em(completion, ref)
