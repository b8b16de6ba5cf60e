"""The task rewards (hargo/rewards) pinned where scripts/mutation.sh found the fast tests silent:
the PLP formula and the scorer's bookkeeping around the embedder (with a stand-in model whose
vectors are chosen by hand, so every cosine is known), TaskReward's dispatch and errors, the
completion/prompt readers, and the MLPerf rules' edges (number kinds, tier boundaries, the
hedging share, an empty question excusing nothing). test_rewards.py checks the same rewards
with the real MiniLM."""
from __future__ import annotations

import math

import numpy as np
import pytest

from hargo.rewards import (RewardConfig, TaskReward, check_task, completion_text,
                           question_text)
from hargo.rewards import plp as P
from hargo.rewards.mlperf import (MLPerfConfig, _names, _number_kind, extra_candidates,
                                  keyword_overlap, mlperf_em, mlperf_reward, normalise_number,
                                  partial_match, segments)
from hargo.rewards.plp import PLPConfig, PLPScorer, format_ok, is_repetitive, sanitise

pytestmark = pytest.mark.fast


# ------------------------------------------------------------------ a stand-in for MiniLM

class _FakeModel:
    """``SentenceTransformer.encode`` on a fixed table of vectors: normalised when asked (as
    the real model does), and "noisy" a float32-rounding hair past unit length, as real cosines
    of a text with itself come out (1.0000001)."""

    VECS = {"alpha": [1.0, 0.0, 0.0], "beta": [0.6, 0.8, 0.0], "delta": [0.0, 3.0, 4.0],
            "minus": [-1.0, 0.0, 0.0], "noisy": [1.0, 0.0, 0.0], "abcde": [0.0, 0.0, 1.0]}

    def __init__(self):
        self.calls = []

    def encode(self, texts, batch_size=32, normalize_embeddings=False, convert_to_numpy=True,
               show_progress_bar=None):
        self.calls.append({"texts": list(texts), "batch_size": batch_size,
                           "normalize_embeddings": normalize_embeddings,
                           "convert_to_numpy": convert_to_numpy,
                           "show_progress_bar": show_progress_bar})
        vecs = np.array([self.VECS[t] for t in texts], dtype=np.float64)
        if normalize_embeddings:
            vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
            vecs[[t == "noisy" for t in texts]] *= 1.0000003
        return vecs if convert_to_numpy else [list(v) for v in vecs]


def _scorer(**kw) -> tuple[PLPScorer, _FakeModel]:
    s = PLPScorer(**kw)
    s._model = _FakeModel()  # what the model property would load
    return s, s._model


def test_scorer_defaults_and_conversions():
    s = PLPScorer()
    assert (s.model_path, s.batch_size, s.max_chars, s.device) == (None, 64, 2048, "cpu")
    assert not s.loaded
    s = PLPScorer("/m", "8", 10.0, "cuda:1")
    assert (s.model_path, s.batch_size, s.max_chars, s.device) == ("/m", 8, 10, "cuda:1")
    assert isinstance(s.batch_size, int) and isinstance(s.max_chars, int)


def test_similarity_is_the_clamped_dot_product_of_normalised_embeddings():
    s, model = _scorer(batch_size=7)
    out = s.similarity(["alpha", "beta", "delta", "alpha", "noisy", "minus", "noisy"],
                       ["alpha", "alpha", "beta", "minus", "alpha", "noisy", "noisy"])
    # delta = (0, 3, 4) / 5 against beta (0.6, 0.8, 0): 0.48; noise past +-1 is clamped
    assert out == pytest.approx([1.0, 0.6, 0.48, -1.0, 1.0, -1.0, 1.0], abs=1e-12)
    assert max(out) <= 1.0 and min(out) >= -1.0
    assert all(isinstance(x, float) for x in out)
    # one pass; each distinct text once; L2-normalised numpy, batch_size, no progress bar
    assert len(model.calls) == 1
    call = model.calls[0]
    assert sorted(call["texts"]) == ["alpha", "beta", "delta", "minus", "noisy"]
    assert len(call["texts"]) == len(set(call["texts"]))
    assert (call["batch_size"], call["normalize_embeddings"], call["convert_to_numpy"],
            call["show_progress_bar"]) == (7, True, True, False)


def test_similarity_blank_sides_and_the_character_cap():
    s, model = _scorer(max_chars=5)
    # a blank side scores 0 and is not embedded; each side is cut to 5 characters first
    out = s.similarity(["   ", "alpha", "abcdefgh", "alpha"], ["alpha", "\n", "alpha", "abcde+++"])
    assert out == pytest.approx([0.0, 0.0, 0.0, 0.0])
    assert sorted(model.calls[0]["texts"]) == ["abcde", "alpha"]
    assert s.similarity(["", " "], ["alpha", ""]) == [0.0, 0.0]
    assert len(model.calls) == 1  # nothing left to embed: no model call
    with pytest.raises(ValueError, match=r"^PLPScorer.similarity: 2 completions vs 1 references$"):
        s.similarity(["a", "b"], ["a"])


def test_embed_sends_the_capped_sanitised_texts():
    s, model = _scorer(max_chars=5, batch_size=3)
    out = s.embed(["alpha+tail", "beta"])
    assert out.shape == (2, 3)
    assert np.allclose(np.linalg.norm(out, axis=1), 1.0)
    assert model.calls == [{"texts": ["alpha", "beta"], "batch_size": 3,
                            "normalize_embeddings": True, "convert_to_numpy": True,
                            "show_progress_bar": False}]


def test_sanitise_replaces_lone_surrogates_with_one_replacement_character():
    assert sanitise("a\ud800b\udfffc", 10) == "a\ufffdb\ufffdc"
    assert sanitise("abcdef", 3) == "abc"


# ------------------------------------------------------------------------- the PLP formula

class _TableScorer:
    """Similarity by a table keyed on the completion (the reference is ignored)."""

    def __init__(self, table):
        self.table = table
        self.calls = []

    def similarity(self, completions, references):
        self.calls.append((list(completions), list(references)))
        return [self.table.get(c, 0.0) for c in completions]


def _distinct_words(n_chars: int) -> str:
    """Non-repetitive text of exactly n_chars characters (all words distinct)."""
    words, k = [], 0
    while len(" ".join(words)) < n_chars:
        words.append(f"w{k}")
        k += 1
    text = " ".join(words)[:n_chars]
    assert not is_repetitive(text) and len(text) == n_chars
    return text


def test_plp_reward_formula_by_hand():
    at_budget, past = _distinct_words(400), _distinct_words(500)
    huge = _distinct_words(5000)
    scorer = _TableScorer({"A fine answer.": 0.5, "x" * 17: 0.2, at_budget: 0.3, past: 0.3,
                           huge: 0.9, "   ": 0.0})
    comps = ["A fine answer.", "x" * 17, at_budget, past, huge, "   "]
    out = P.plp_rewards(comps, ["ref"] * 6, PLPConfig(), scorer)
    assert out == pytest.approx([
        0.5 + 0.1,                       # bonus
        0.2,                             # repetitive: no bonus
        0.3 + 0.1,                       # 400 characters: no penalty yet
        0.3 + 0.1 - 0.0005 * 100,        # 100 past the budget
        -1.0,                            # 0.9 + 0.1 - 2.3, floored at min_reward
        0.0,                             # blank: no bonus
    ])
    assert scorer.calls == [(comps, ["ref"] * 6)]
    assert all(isinstance(x, float) for x in out)
    # the defaults are PLPConfig()'s, and one completion is the batch of one
    assert P.plp_rewards(comps, ["ref"] * 6, None, scorer) == out
    assert P.plp_reward(past, "ref", None, scorer) == pytest.approx(0.35)
    assert P.plp_reward(past, "ref", PLPConfig(), scorer) == out[3]


def test_plp_reward_follows_its_config():
    cfg = PLPConfig(format_bonus=0.3, length_budget=10, length_penalty=0.01, min_reward=-0.2)
    twenty = _distinct_words(20)
    scorer = _TableScorer({twenty: 0.5, "short": 0.5, _distinct_words(100): 0.0})
    assert P.plp_reward(twenty, "r", cfg, scorer) == pytest.approx(0.5 + 0.3 - 0.01 * 10)
    assert P.plp_reward("short", "r", cfg, scorer) == pytest.approx(0.8)
    assert P.plp_reward(_distinct_words(100), "r", cfg, scorer) == pytest.approx(-0.2)  # floor
    # the repetition constants decide the bonus
    assert format_ok("a a a a", PLPConfig())                      # 2 trigrams, 1 distinct: 0.5
    assert not format_ok("a a a a", PLPConfig(repetition_ngram=1))  # 4 unigrams, 1 distinct
    assert not format_ok("a a a a", PLPConfig(repetition_min_distinct=0.6))
    assert not format_ok("xxxx", PLPConfig(repetition_max_char_run=3))
    assert format_ok("xxx", PLPConfig(repetition_max_char_run=3))
    assert not format_ok(" \n\t", PLPConfig()) and format_ok("ok", PLPConfig())


def test_plp_rewards_default_scorer_is_the_shared_one(monkeypatch):
    """No scorer given: the process-wide one for the config's batch size and character cap."""
    asked = []
    scorer = _TableScorer({"hi": 0.25})

    def fake_get_scorer(**kw):
        asked.append(kw)
        return scorer

    monkeypatch.setattr(P, "get_scorer", fake_get_scorer)
    cfg = PLPConfig(batch_size=5, embed_max_chars=99)
    assert P.plp_rewards(["hi"], ["r"], cfg) == pytest.approx([0.35])
    assert asked == [{"batch_size": 5, "max_chars": 99}]
    assert P.plp_reward("hi", "r") == pytest.approx(0.35)
    assert asked[-1] == {"batch_size": 64, "max_chars": 2048}


def test_is_repetitive_with_two_ngrams():
    """Two n-grams are enough to judge: 1 distinct of 2 is 0.5, repetitive below 0.6."""
    assert is_repetitive("yes yes yes yes", min_distinct=0.6)
    assert not is_repetitive("yes yes yes yes", min_distinct=0.5)
    assert not is_repetitive("yes yes yes", min_distinct=0.9)   # one trigram: too short to judge


# ------------------------------------------------------------------------- TaskReward

def test_task_reward_dispatch_without_the_model():
    scorer = _TableScorer({"plp answer": 0.5, "other plp": 0.2})
    fn = TaskReward(RewardConfig(), scorer)
    assert fn.scorer is scorer and fn.config == RewardConfig()
    out = fn(prompts=["p"] * 6,
             completions=["other plp", [{"role": "assistant", "content": "Yes"}], "plp answer",
                          "The ID is 3.0-2087.", "Habana Gaudi2", "no"],
             task=["plp", "race_c", "plp", "mlperf", "mlperf", "race_fortran"],
             answer=["r1", "yes", "r2", "3.0-2087", "Habana Gaudi2, 8", "no"],
             label=[None, "yes", None, None, None, "yes"])
    assert out == pytest.approx([0.3, 1.0, 0.6, 1.0, 0.5, 0.0])
    assert all(isinstance(x, float) for x in out)
    assert scorer.calls == [(["other plp", "plp answer"], ["r1", "r2"])]
    # the configured constants reach each task's reward
    cfg = RewardConfig(plp=PLPConfig(format_bonus=0.3), mlperf=MLPerfConfig(partial=0.25))
    out = TaskReward(cfg, scorer)(completions=["plp answer", "Habana Gaudi2"],
                                  task=["plp", "mlperf"], answer=["r", "Habana Gaudi2, 8"])
    assert out == pytest.approx([0.8, 0.25])
    # a default TaskReward has the default constants
    assert TaskReward().config == RewardConfig()
    assert TaskReward(scorer=scorer)(completions=["Habana Gaudi2"], task="mlperf",
                                     answer="Habana Gaudi2, 8") == [0.5]


def test_task_reward_columns_broadcast_and_are_optional():
    fn = TaskReward(RewardConfig(), _TableScorer({}))
    # one task name / answer for the whole batch
    assert fn(completions=["8 GPUs", "16"], task="mlperf", answer="8") == [1.0, 0.0]
    # race needs no answer, mlperf no label
    assert fn(completions=["no", "yes"], task=["race_c", "race_c"], label=["no", "no"]) == [1.0, 0.0]
    assert fn(completions=["8"], task=["mlperf"], answer=["8"]) == [1.0]


@pytest.mark.parametrize("kwargs,message", [
    (dict(completions=None, task=["plp"]), r"^task_reward: completions are required$"),
    (dict(completions=["x"], task=None), r"^task_reward: column 'task' is required$"),
    (dict(completions=["x"], task=["plp", "plp"]),
     r"^task_reward: column 'task' has 2 values for 1 completions$"),
    (dict(completions=["x"], task=["mlperf"], answer=["a", "b"]),
     r"^task_reward: column 'answer' has 2 values for 1 completions$"),
    (dict(completions=["x"], task=["race_c"], label=["yes", "no"]),
     r"^task_reward: column 'label' has 2 values for 1 completions$"),
    (dict(completions=["x"], task=["mlperf"], answer=["a"], prompts=["p", "q"]),
     r"^task_reward: column 'prompts' has 2 values for 1 completions$"),
    (dict(completions=["yes", "x"], task=["race_c", "sql"], label=["yes", None]),
     r"^unknown task 'sql' \(completion 1\); valid tasks: "),
    (dict(completions=["yes", "x"], task=["race_c", "mlperf"], label=["yes", None]),
     r"^task_reward: completion 1 needs a string 'answer', got None$"),
    (dict(completions=["yes", "x", "y"], task=["race_c", "plp", "plp"], answer=["yes", "a", 3],
          label=["yes", None, None]),
     r"^task_reward: completion 2 needs a string 'answer', got 3$"),
])
def test_task_reward_errors_name_the_column_and_the_completion(kwargs, message):
    fn = TaskReward(RewardConfig(), _TableScorer({}))
    with pytest.raises(ValueError, match=message):
        fn(**kwargs)


def test_check_task_message():
    assert check_task("plp") == "plp"
    with pytest.raises(ValueError, match=r"^unknown task 'sql'; valid tasks: \['race_c', "):
        check_task("sql")
    with pytest.raises(ValueError, match=r"^unknown task None \(row 3\); valid tasks"):
        check_task(None, "row 3")


def test_task_reward_without_prompts_excuses_nothing():
    """No question: the values a completion offers are all candidates ("XXXX" included)."""
    fn = TaskReward(RewardConfig(), _TableScorer({}))
    assert fn(completions=["Dell or XXXX"], task=["mlperf"], answer=["Dell"]) == [0.5]
    assert fn(completions=["Dell or XXXX"], task=["mlperf"], answer=["Dell"],
              prompts=["Is it Dell or XXXX?"]) == [1.0]


# --------------------------------------------------------------- completion and prompt text

def test_completion_text_shapes():
    assert completion_text({"role": "assistant", "content": "hi"}) == "hi"
    assert completion_text({"role": "assistant"}) == ""
    assert completion_text([{"role": "assistant"}]) == ""
    assert completion_text([{"role": "assistant", "content": None}]) == ""
    assert completion_text([{"role": "assistant", "content": 42}]) == "42"
    parts = [{"type": "image_url"}, "a", {"type": "text", "text": "b"}, 7]
    assert completion_text([{"role": "assistant", "content": parts}]) == "ab7"
    assert completion_text({"content": ("x", {"text": "y"})}) == "xy"
    with pytest.raises(TypeError, match=r"^completion must be a str or a list of chat messages, "
                                        r"got int$"):
        completion_text(3)
    with pytest.raises(TypeError, match="got list"):
        completion_text(["not a message"])


def test_question_text_reads_what_it_can():
    assert question_text(None) == ""
    assert question_text(3) == ""                      # unreadable: excuses nothing
    assert question_text("q?") == "q?"
    assert question_text([{"role": "user", "content": "q?"}]) == "q?"


# ------------------------------------------------------------------------------- mlperf

def test_normalise_number_edges():
    assert normalise_number("3.0-2080") == "3.0-2080"   # an id keeps its trailing zero
    assert normalise_number("0.5") == "0.5" and normalise_number("00.50") == "0.5"
    assert normalise_number(".5") == "0.5" and normalise_number("000") == "0"


def test_number_kinds_decide_the_other_candidates():
    assert [_number_kind(t) for t in ("3.0-2087", "23.04", "8")] == ["id", "decimal", "integer"]
    # a count is hedged only by other counts, an id by ids, a version by versions
    assert extra_candidates("8 GPUs, version 23.04, ID 3.0-2020, 16 nodes", "8") == ["16"]
    assert extra_candidates("3.0-2087 or 3.0-2088 with 8 GPUs and NGC 23.04", "3.0-2087") == [
        "3.0-2088"]
    assert extra_candidates("23.04 or 23.09 on 3.0-2020 with 8 GPUs", "23.04") == ["23.09"]


def test_names_excuse_a_segment_initial_capital():
    assert _names("The ID is 3.0-2063") == {"id", "3.0-2063"}
    assert _names("A1 node") == {"a1"}
    assert _names("Dell node") == set()


def test_segments_strip_quotes_and_punctuation():
    assert segments('"Dell", or HPE.') == [("Dell", False), ("HPE", True)]


def test_a_restated_segment_does_not_end_the_scan():
    """"the submitter" restates the question; the bare "HPE" after it is still a candidate."""
    assert extra_candidates("Dell; the submitter; HPE", "Dell", "Who is the submitter?") == ["hpe"]
    assert mlperf_reward("Dell; the submitter; HPE", "Dell", question="Who is the submitter?") == 0.5


def test_an_empty_question_excuses_nothing():
    assert extra_candidates("Dell or XXXX", "Dell") == ["xxxx"]
    assert not mlperf_em("Dell or XXXX", "Dell")
    assert mlperf_reward("Dell or XXXX", "Dell") == 0.5


def test_multi_value_tier_edges():
    ans = "Habana Gaudi2, 8"
    assert not partial_match("8 of them, all Habana Gaudi2", ans)     # all found: not partial
    assert mlperf_reward("", ans) == 0.0                               # none found, nothing said
    assert mlperf_reward("the", ans) == 0.0
    # no hedge: the tier itself, exactly (not base * found / found)
    cfg = MLPerfConfig(partial=0.1)
    assert mlperf_reward("a1 b2 c3", "a1, b2, c3, d4", cfg) == 0.1


def test_keyword_tier_boundaries_and_hedges():
    ref = "alpha beta gamma delta epsilon zeta eta theta iota kappa"   # 10 keywords
    assert keyword_overlap("alpha beta gamma delta epsilon zeta eta", ref) == 0.7
    assert mlperf_reward("alpha beta gamma delta epsilon zeta eta", ref) == 0.1  # 0.7: not > 0.7
    assert mlperf_reward("alpha beta gamma delta epsilon zeta eta theta", ref) == 0.2
    # a keyword tier counts one value found: one extra candidate halves it
    sentence = "The submitter is GIGABYTE and the number of processors is 2."
    assert mlperf_reward("submitter GIGABYTE, processors: 2 or Dell", sentence) == \
        pytest.approx(0.2 / 2)
    assert mlperf_reward("GIGABYTE has 2 processors or Dell", sentence) == pytest.approx(0.1 / 2)
    assert math.isclose(mlperf_reward("submitter GIGABYTE, processors: 2", sentence), 0.2)
