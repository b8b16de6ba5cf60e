"""hargo/metrics.py on hand-counted samples without the MiniLM model: a word-overlap scorer stands
in for the embedder (``similarity = |words(c) & words(r)| / |words(r)|``), so every PLP value is
known exactly and the whole metrics dict, key by key, can be checked in the fast lane that
scripts/mutation.sh judges with (test_metrics.py checks the same metrics with the real model)."""
from __future__ import annotations

import math
import warnings

import pytest

from hargo.metrics import compute_metrics, race_classification, score_samples, win_rate
from hargo.rewards import RewardConfig, TaskReward

pytestmark = pytest.mark.fast


class _WordScorer:
    """Share of the reference's words found in the completion; 0 when either side is blank."""

    def __init__(self):
        self.calls = []

    def similarity(self, completions, references):
        self.calls.append((list(completions), list(references)))
        out = []
        for c, r in zip(completions, references):
            wc, wr = set(c.casefold().split()), set(r.casefold().split())
            out.append(len(wc & wr) / len(wr) if wc and wr else 0.0)
        return out


def _race(i, task, label):
    return {"id": f"{task}-{i}", "task": task, "label": label, "answer": label,
            "prompt": [{"role": "user", "content": "Is there a data race?"}]}


def _qa(i, task, answer, question="Question?"):
    return {"id": f"{task}-{i}", "task": task, "answer": answer, "label": None,
            "prompt": [{"role": "user", "content": question}]}


PLP_REF = "CodeBERT is a bimodal pre-trained model for programming and natural languages."
HALF_REF = "OpenMP uses shared memory"          # 4 words; the completion below has 2 of them
M5 = "The Platinum 8480+ system has 4 accelerators."

# (sample, completion, reward, correct, extra fields) by hand
ROWS = [
    (_race(1, "race_c", "yes"), "Yes", 1.0, True, {"prediction": "yes"}),
    (_race(2, "race_c", "yes"), "yes, there is", 1.0, True, {"prediction": "yes"}),
    (_race(3, "race_c", "yes"), "No data race", 0.0, False, {"prediction": "no"}),
    (_race(4, "race_c", "yes"), "maybe", 0.0, False, {"prediction": None}),
    (_race(5, "race_c", "no"), "no", 1.0, True, {"prediction": "no"}),
    (_race(7, "race_fortran", "no"), "yes and no", 0.0, False, {"prediction": None}),
    (_race(8, "race_fortran", "no"), "No.", 1.0, True, {"prediction": "no"}),
    (_race(9, "race_fortran", "yes"), "YES", 1.0, True, {"prediction": "yes"}),
    (_race(10, "race_fortran", "yes"), [{"role": "assistant", "content": "yes"}], 1.0, True,
     {"prediction": "yes"}),
    (_qa(1, "mlperf", "3.0-2087"), "The ID is 3.0-2087.", 1.0, True, {"em": True}),
    (_qa(2, "mlperf", "1,024"), "1024 accelerators", 1.0, True, {"em": False}),   # numeric
    (_qa(3, "mlperf", "Habana Gaudi2, 8"), "Habana Gaudi2", 0.5, False, {"em": False}),
    (_qa(4, "mlperf", "Dell"), "Dellx", 0.0, False, {"em": False}),
    # the question names 8480: a restatement, not a second candidate (0.5 and no EM without it)
    (_qa(5, "mlperf", "4", "How many accelerators has the Platinum 8480+ system?"), M5, 1.0, True,
     {"em": True}),
    (_qa(1, "plp", PLP_REF), PLP_REF, 1.1, True, {"similarity": 1.0}),   # cosine 1 + bonus 0.1
    (_qa(2, "plp", PLP_REF), "", 0.0, False, {"similarity": 0.0}),       # blank: nothing
    (_qa(3, "plp", HALF_REF), "MPI uses distributed memory", 0.6, True,  # 0.5 >= threshold 0.5
     {"similarity": 0.5}),
]
SAMPLES = [r[0] for r in ROWS]
COMPLETIONS = [r[1] for r in ROWS]
TEXTS = [c if isinstance(c, str) else c[-1]["content"] for c in COMPLETIONS]


def _fn():
    scorer = _WordScorer()
    return TaskReward(RewardConfig(), scorer), scorer


def test_score_samples_record_by_record():
    fn, scorer = _fn()
    recs = score_samples(SAMPLES, COMPLETIONS, fn)
    expected = [{"id": s["id"], "task": s["task"], "completion": t, "reward": reward,
                 "chars": len(t), "correct": correct, "degenerate": None, **extra,
                 **({"label": s["label"]} if "prediction" in extra else {})}
                for (s, _, reward, correct, extra), t in zip(ROWS, TEXTS)]
    assert len(recs) == len(expected)
    for got, want in zip(recs, expected):
        assert got == pytest.approx(want), want["id"]
    # the PLP metric's similarity pass sees the plp completions and references only, in order
    assert scorer.calls[-1] == ([PLP_REF, "", "MPI uses distributed memory"],
                                [PLP_REF, PLP_REF, HALF_REF])


def test_compute_metrics_every_key_by_hand():
    """Pooled race: TP 4, FP 1, FN 2, TN 2 (two unparseable answers count as wrong)."""
    tp, fp, fn_, tn = 4, 1, 2, 2
    c_chars = [3, 13, 12, 5, 2]
    f_chars = [10, 3, 3, 3]
    m_chars = [len(t) for t in TEXTS[9:14]]
    p_chars = [len(PLP_REF), 0, len("MPI uses distributed memory")]
    expected = {
        "n": 17,
        "avg_score": (6 * 1.0 + (1 + 1 + 0.5 + 0 + 1) + (1.1 + 0 + 0.6)) / 17,
        "dr_f1": 8 / 11, "dr_precision": 4 / 5, "dr_recall": 4 / 6,
        "dr_confusion": {"tp": tp, "fp": fp, "fn": fn_, "tn": tn, "labels": ["yes", "no"],
                         "matrix": [[tp, fn_], [fp, tn]]},
        "dr_unparseable": 2,
        "dr_accuracy": 6 / 9,
        "dr_mcc": (tp * tn - fp * fn_) / math.sqrt((tp + fp) * (tp + fn_) * (tn + fp) * (tn + fn_)),
        "dr_balanced_accuracy": (4 / 6 + 2 / 3) / 2,
        "dr_yes_share": 5 / 9,            # yes, yes, (race_c) + unparseable-no -> yes, yes, yes
        "dr_always_yes_f1": 2 * (6 / 9) / (1 + 6 / 9), "dr_always_yes_accuracy": 6 / 9,
        "dr_f1_race_c": 2 / 3,            # TP 2, FN 2
        "dr_f1_race_fortran": 0.8,        # TP 2, FP 1
        "mlperf_em": 2 / 5, "plp_similarity": (1 + 0 + 0.5) / 3,
        "n_race_c": 5, "accuracy_race_c": 3 / 5,
        "mean_completion_chars_race_c": sum(c_chars) / 5, "median_completion_chars_race_c": 5.0,
        "n_race_fortran": 4, "accuracy_race_fortran": 3 / 4,
        "mean_completion_chars_race_fortran": 19 / 4,
        "median_completion_chars_race_fortran": 3.0,
        "n_mlperf": 5, "accuracy_mlperf": 3 / 5,
        "mean_completion_chars_mlperf": sum(m_chars) / 5,
        "median_completion_chars_mlperf": float(sorted(m_chars)[2]),
        "n_plp": 3, "accuracy_plp": 2 / 3,
        "mean_completion_chars_plp": sum(p_chars) / 3,
        "median_completion_chars_plp": float(sorted(p_chars)[1]),
        **{f"degenerate_share_{t}": 0.0 for t in ("race_c", "race_fortran", "mlperf", "plp")},
    }
    assert sum(f_chars) == 19 and sorted(c_chars)[2] == 5
    fn, _ = _fn()
    m = compute_metrics(SAMPLES, COMPLETIONS, reward_fn=fn)
    assert set(m) == set(expected)
    for k, v in expected.items():
        assert m[k] == (v if isinstance(v, (dict, int)) else pytest.approx(v)), k
    assert m["dr_mcc"] == pytest.approx(1 / math.sqrt(10))


def test_compute_metrics_threshold_and_precomputed_rewards():
    fn, scorer = _fn()
    # the rule is the plp task's (hargo.tasks.plp), on the reward (cosine + 0.1 format bonus):
    # rewards 1.1, 0, 0.6 (cosines 1, 0, 0.5). A stricter threshold: the 0.6 answer is no longer
    # correct
    assert compute_metrics(SAMPLES, COMPLETIONS, reward_fn=fn,
                           plp_correct_threshold=0.6)["accuracy_plp"] == pytest.approx(2 / 3)
    assert compute_metrics(SAMPLES, COMPLETIONS, reward_fn=fn,
                           plp_correct_threshold=0.7)["accuracy_plp"] == pytest.approx(1 / 3)
    plp = [k for k, s in enumerate(SAMPLES) if s["task"] == "plp"]
    m = compute_metrics([SAMPLES[k] for k in plp], [COMPLETIONS[k] for k in plp],
                        rewards=[0.3, 0.2, 0.1], reward_fn=fn, plp_correct_threshold=0.25)
    # the rewards given are used as is (also by the correctness rule: only 0.3 >= 0.25); the
    # similarity still comes from reward_fn's scorer
    assert m["avg_score"] == pytest.approx(0.2)
    assert m["plp_similarity"] == pytest.approx(0.5) and m["accuracy_plp"] == pytest.approx(1 / 3)
    assert scorer.calls[-1][1] == [PLP_REF, PLP_REF, HALF_REF]
    # no race sample: every race metric is None, no race key per task
    for k in ("dr_f1", "dr_precision", "dr_recall", "dr_confusion", "dr_unparseable",
              "dr_accuracy", "dr_mcc", "dr_balanced_accuracy", "dr_yes_share",
              "dr_always_yes_f1", "dr_always_yes_accuracy", "dr_f1_race_c",
              "dr_f1_race_fortran", "mlperf_em"):
        assert m[k] is None, k
    assert "n_race_c" not in m and "accuracy_mlperf" not in m
    with pytest.raises(ValueError, match="3 samples but 2 rewards"):
        score_samples(SAMPLES[:3], COMPLETIONS[:3], fn, rewards=[1.0, 1.0])


def test_race_only_metrics_need_no_scorer():
    """Race and mlperf samples send no text to the embedder; the per-language F1 is computed
    on that language's rows only."""
    class _NoScorer:
        def similarity(self, completions, references):
            assert not completions and not references, "the embedder was called"
            return []

    fn = TaskReward(RewardConfig(), _NoScorer())
    rows = [r for r in ROWS if r[0]["task"] != "plp"]
    m = compute_metrics([r[0] for r in rows], [r[1] for r in rows], reward_fn=fn)
    assert m["dr_f1_race_c"] == pytest.approx(2 / 3) and m["dr_f1_race_fortran"] == pytest.approx(0.8)
    assert m["plp_similarity"] is None and "n_plp" not in m


def test_bad_samples_name_the_record():
    fn, _ = _fn()
    with pytest.raises(ValueError, match=r"^sample #1: not a dict$"):
        compute_metrics([SAMPLES[0], "race_c"], ["yes", "no"], reward_fn=fn)
    with pytest.raises(ValueError, match=r"unknown task 'sql' \(sample id '#0'\)"):
        compute_metrics([{"task": "sql", "answer": "a"}], ["a"], reward_fn=fn)
    with pytest.raises(ValueError, match=r"sample id 'm-1', field 'answer': expected a string, "
                                         r"got 5$"):
        compute_metrics([{"id": "m-1", "task": "mlperf", "answer": 5}], ["5"], reward_fn=fn)


def test_zero_division_is_zero_without_a_warning():
    """No "yes" predicted: precision and F1 are 0 (zero_division=0), and sklearn's
    UndefinedMetricWarning is not raised into the evaluation log."""
    from sklearn.exceptions import UndefinedMetricWarning

    with warnings.catch_warnings():
        warnings.simplefilter("error", UndefinedMetricWarning)
        out = race_classification(["yes", "no"], ["no", "no"])
    assert out["precision"] == 0.0 and out["f1"] == 0.0 and out["recall"] == 0.0
    assert out["confusion"] == {"tp": 0, "fp": 0, "fn": 1, "tn": 1, "labels": ["yes", "no"],
                                "matrix": [[0, 1], [0, 1]]}


class _LengthJudge:
    """Prefers the longer completion (1), the shorter loses (-1), equal lengths tie (0)."""

    name = "by-length"

    def compare(self, sample, a, b):
        assert isinstance(sample, dict) and sample["task"] in ("race_c", "plp"), sample
        return (len(a) > len(b)) - (len(a) < len(b))


class _BatchLengthJudge(_LengthJudge):
    name = "by-length-batch"

    def __init__(self):
        self.batches = []

    def compare_batch(self, samples, a, b):
        self.batches.append((list(a), list(b)))
        return [self.compare(s, x, y) for s, x, y in zip(samples, a, b)]


WR_SAMPLES = [_race(k, "race_c", "yes") for k in range(4)] + [_qa(1, "plp", PLP_REF)]
WR_A = ["longer", [{"role": "assistant", "content": "aaaa"}], "x", "same", "tie!"]
WR_B = ["s", "bb", "much longer", "diff", "four"]


@pytest.mark.parametrize("make_judge", [_LengthJudge, _BatchLengthJudge], ids=["compare", "batch"])
def test_win_rate_counts_wins_ties_and_losses(make_judge):
    """Verdicts by length: 1, 1, -1, 0, 0: (2 wins + 0.5 * 2 ties) / 5 = 0.6."""
    judge = make_judge()
    out = win_rate(WR_SAMPLES, WR_A, WR_B, judge)
    assert out == {"win_rate": pytest.approx(0.6), "wins": 2, "ties": 2, "losses": 1, "n": 5,
                   "judge": judge.name, "verdicts": [1, 1, -1, 0, 0]}
    if isinstance(judge, _BatchLengthJudge):  # completion texts, conversations unwrapped
        assert judge.batches == [(["longer", "aaaa", "x", "same", "tie!"], WR_B)]
    back = win_rate(WR_SAMPLES, WR_B, WR_A, judge)
    assert (back["wins"], back["ties"], back["losses"]) == (1, 2, 2)
    assert back["verdicts"] == [-1, -1, 1, 0, 0]
    assert back["win_rate"] == pytest.approx(0.4)
    assert win_rate([], [], [], judge) == {"win_rate": None, "wins": 0, "ties": 0, "losses": 0,
                                           "n": 0, "judge": judge.name, "verdicts": []}


def test_win_rate_refuses_bad_verdicts_and_lengths():
    class _Fixed(_BatchLengthJudge):
        def __init__(self, verdicts):
            super().__init__()
            self.verdicts = verdicts

        def compare_batch(self, samples, a, b):
            return list(self.verdicts)

    for bad in ([1, 1, 1, 1, 2], [1, 1, 1, 1, -2], [1, 1, 1, 1], [1, 1, 1, 1, None]):
        with pytest.raises(ValueError, match="verdicts must be 1, 0 or -1"):
            win_rate(WR_SAMPLES, WR_A, WR_B, _Fixed(bad))
    assert win_rate(WR_SAMPLES, WR_A, WR_B, _Fixed([-1] * 5))["losses"] == 5
    with pytest.raises(ValueError, match=r"^5 samples but 4 baseline completions$"):
        win_rate(WR_SAMPLES, WR_A, WR_B[:4], _LengthJudge())
    with pytest.raises(ValueError, match=r"^5 samples but 4 completions$"):
        win_rate(WR_SAMPLES, WR_A[:4], WR_B, _LengthJudge())
