"""The comparison report (hargo.stats, .aggregate, .report) on hand-computed fixtures."""
from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pytest
import yaml

from hargo.compare import aggregate, report
from hargo.stats import (f1_statistic, mean_std, paired_bootstrap_ci, paired_bootstrap_ci_seeds,
                         precision_statistic, race_f1_records, recall_statistic)
from hargo.config import as_config

ROOT = Path(__file__).resolve().parents[1]


# ----------------------------------------------------------------------------- stats

@pytest.mark.fast
def test_mean_std_exact():
    m, s = mean_std([1, 2, 3, 4])
    assert m == 2.5
    assert s == pytest.approx(math.sqrt(5 / 3), abs=1e-12)  # ddof=1: 5 / (4 - 1)
    assert mean_std([0.7]) == (0.7, 0.0)
    with pytest.raises(ValueError, match="^mean_std: no values$"):
        mean_std([])
    with pytest.raises(ValueError, match=r"^mean_std: values contain None or NaN: \[1.0, None\]$"):
        mean_std([1.0, None])


def _quantile(sorted_xs: list[float], q: float) -> float:
    """numpy's default (linear) quantile of an ascending list, written out: position
    ``q (R - 1)``, interpolated between its two neighbours."""
    pos = q * (len(sorted_xs) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_xs) - 1)
    return sorted_xs[lo] + (pos - lo) * (sorted_xs[hi] - sorted_xs[lo])


def _hand_bootstrap(a_runs, b_runs, statistic, resamples, confidence, seed):
    """The paired percentile bootstrap over seed pairs by loops: one ``(R, n)`` draw of prompt
    indices from ``default_rng(seed)`` shared by every seed pair; per resample the mean over
    seeds of ``statistic(a_s[idx]) - statistic(b_s[idx])``; the ``(1 -+ c) / 2`` quantiles."""
    n = len(a_runs[0])
    idx = np.random.default_rng(seed).integers(0, n, size=(resamples, n))
    diffs = []
    for row in idx:
        per_seed = [statistic(np.asarray([a[i] for i in row]))
                    - statistic(np.asarray([b[i] for i in row])) for a, b in zip(a_runs, b_runs)]
        diffs.append(sum(per_seed) / len(per_seed))
    diffs.sort()
    tail = (1 - confidence) / 2
    return _quantile(diffs, tail), _quantile(diffs, 1 - tail)


def _plain_mean(x) -> float:
    return sum(float(v) for v in x) / len(x)


@pytest.mark.fast
def test_bootstrap_bounds_recomputed_by_hand():
    """The interval's exact bounds, recomputed with the same RNG: the mean path (vectorised in
    the code), another confidence (0.8: the 0.1 and 0.9 quantiles), and a callable statistic
    (the code's per-resample loop) all agree with the loops of ``_hand_bootstrap``."""
    a = np.array([0.9, 0.1, 0.5, 0.7, 0.0, 1.0, 0.3])
    b = np.array([0.2, 0.4, 0.5, 0.1, 0.3, 0.6, 0.8])
    for conf, R, seed in ((0.95, 400, 3), (0.8, 101, 11)):
        ci = paired_bootstrap_ci(a, b, resamples=R, confidence=conf, seed=seed)
        low, high = _hand_bootstrap([a], [b], _plain_mean, R, conf, seed)
        assert ci["low"] == pytest.approx(low, abs=1e-12)
        assert ci["high"] == pytest.approx(high, abs=1e-12)
        assert ci["diff"] == pytest.approx(float(np.mean(a - b)), abs=1e-12)
        assert (ci["resamples"], ci["confidence"], ci["n_prompts"], ci["n_seeds"]) == (
            R, conf, 7, 1)
    # the same through the generic (non-vectorised) path: a statistic that is not mean_statistic
    ci = paired_bootstrap_ci(a, b, statistic=lambda x: float(np.mean(x)), resamples=101,
                             confidence=0.8, seed=11)
    assert (ci["low"], ci["high"]) == pytest.approx(
        _hand_bootstrap([a], [b], _plain_mean, 101, 0.8, 11), abs=1e-12)
    # a hand case small enough to read: R = 3, n = 2
    idx = np.random.default_rng(5).integers(0, 2, size=(3, 2))
    x, y = np.array([1.0, 0.0]), np.array([0.0, 0.0])
    diffs = sorted(float(x[row].mean()) for row in idx)
    ci = paired_bootstrap_ci(x, y, resamples=3, confidence=0.5, seed=5)
    # 0.25 and 0.75 quantiles of three sorted values: halfway between neighbours
    assert ci["low"] == pytest.approx((diffs[0] + diffs[1]) / 2, abs=1e-12)
    assert ci["high"] == pytest.approx((diffs[1] + diffs[2]) / 2, abs=1e-12)


@pytest.mark.fast
def test_bootstrap_defaults_and_a_statistic_other_than_the_mean():
    """Defaults: 2000 resamples, confidence 0.95, seed 0. A statistic other than the mean (the
    median here) must be applied to every resample, not replaced by the vectorised mean."""
    a = np.array([0.9, 0.1, 0.5, 0.7, 0.0, 1.0, 0.3])
    b = np.array([0.2, 0.4, 0.5, 0.1, 0.3, 0.6, 0.8])
    ci = paired_bootstrap_ci(a, b)
    assert (ci["resamples"], ci["confidence"]) == (2000, 0.95)
    assert (ci["low"], ci["high"]) == pytest.approx(
        _hand_bootstrap([a], [b], _plain_mean, 2000, 0.95, 0), abs=1e-12)
    ci = paired_bootstrap_ci_seeds([a], [b])               # the same defaults
    assert (ci["resamples"], ci["confidence"]) == (2000, 0.95)
    assert (ci["low"], ci["high"]) == pytest.approx(
        _hand_bootstrap([a], [b], _plain_mean, 2000, 0.95, 0), abs=1e-12)
    median = lambda x: float(np.median(x))  # noqa: E731
    ci = paired_bootstrap_ci_seeds([a], [b], median, resamples=300, seed=6)
    assert ci["diff"] == pytest.approx(0.5 - 0.4, abs=1e-12)
    assert (ci["low"], ci["high"]) == pytest.approx(
        _hand_bootstrap([a], [b], median, 300, 0.95, 6), abs=1e-12)


@pytest.mark.fast
def test_f1_records_edge_cases():
    """No positive label and no "yes" prediction: F1 is 0 (zero_division=0); records are int64
    (n, 2), also for no prompts; labels and predictions must pair up."""
    rec = race_f1_records(["no", "no"], ["no", "no"])
    assert rec.dtype == np.int64 and rec.tolist() == [[0, 0], [0, 0]]
    assert f1_statistic(rec) == 0.0
    assert race_f1_records([], []).shape == (0, 2)
    with pytest.raises(ValueError):
        race_f1_records(["yes", "no"], ["yes"])


@pytest.mark.fast
def test_precision_and_recall_statistics_by_hand():
    """TP 2, FP 1, FN 3 (an unparseable answer to a "yes" counts as "no"): precision 2/3,
    recall 2/5, F1 2*2 / (2*2 + 1 + 3) = 1/2; nothing predicted "yes" or no "yes" label: 0 (zero_division=0)."""
    rec = race_f1_records(["yes", "yes", "no", "yes", "yes", "yes", "no"],
                          ["yes", "yes", "yes", "no", None, "no", "no"])
    assert precision_statistic(rec) == pytest.approx(2 / 3)
    assert recall_statistic(rec) == pytest.approx(2 / 5)
    assert f1_statistic(rec) == pytest.approx(1 / 2)
    none_yes = race_f1_records(["yes", "no"], ["no", "no"])
    assert precision_statistic(none_yes) == 0.0 and recall_statistic(none_yes) == 0.0
    no_label = race_f1_records(["no", "no"], ["yes", "no"])
    assert recall_statistic(no_label) == 0.0 and precision_statistic(no_label) == 0.0
    assert recall_statistic(race_f1_records(["yes"], ["yes"])) == 1.0
    even = race_f1_records(["yes", "no", "yes"], ["yes", "yes", "no"])      # TP = FP = FN = 1
    assert precision_statistic(even) == 0.5 and recall_statistic(even) == 0.5


@pytest.mark.fast
def test_bootstrap_f1_bounds_recomputed_by_hand():
    """DR-F1's interval: F1 over the drawn prompts' records, two seeds sharing one draw."""
    labels = ["yes", "no", "yes", "no", "yes", "yes"]
    a1 = race_f1_records(labels, ["yes", "no", "no", "yes", "yes", None])
    a2 = race_f1_records(labels, ["yes", "yes", "yes", "no", "no", "yes"])
    b1 = race_f1_records(labels, ["no", "no", "no", "no", "yes", "yes"])
    b2 = race_f1_records(labels, ["yes", "yes", "yes", "yes", "yes", "yes"])
    ci = paired_bootstrap_ci_seeds([a1, a2], [b1, b2], f1_statistic, resamples=150, seed=2)
    low, high = _hand_bootstrap([a1, a2], [b1, b2], f1_statistic, 150, 0.95, 2)
    assert (ci["low"], ci["high"]) == pytest.approx((low, high), abs=1e-12)
    assert ci["low"] < ci["high"]


@pytest.mark.fast
def test_bootstrap_seeds_share_one_set_of_resampled_prompts():
    """Every resample applies ONE set of drawn prompt indices to all seed pairs.

    Seed 1's per-prompt difference is ``+e`` and seed 2's is ``-e``: on any shared draw the mean
    over seeds is exactly 0, so the interval is [0, 0]; independent draws per seed would give a
    spread. And the two-seed interval equals the hand loop with one shared draw."""
    e = np.array([0.0, 1.0, 0.2, 0.9, 0.4])
    base = np.array([0.3, 0.1, 0.6, 0.0, 0.5])
    ci = paired_bootstrap_ci_seeds([base + e, base], [base, base + e], resamples=300, seed=4)
    assert (ci["diff"], ci["low"], ci["high"]) == (0.0, 0.0, 0.0)
    # what per-seed draws would give (a second draw from the same generator): not [0, 0]
    rng = np.random.default_rng(4)
    i1, i2 = rng.integers(0, 5, size=(300, 5)), rng.integers(0, 5, size=(300, 5))
    indep = np.sort((e[i1].mean(axis=1) - e[i2].mean(axis=1)) / 2)
    assert indep[7] < -0.1 and indep[-8] > 0.1
    a = [np.array([0.9, 0.1, 0.5, 0.7, 0.0]), np.array([0.4, 0.4, 0.9, 0.2, 0.6])]
    b = [np.array([0.2, 0.4, 0.5, 0.1, 0.3]), np.array([0.0, 0.8, 0.1, 0.2, 0.6])]
    ci = paired_bootstrap_ci_seeds(a, b, resamples=250, confidence=0.9, seed=8)
    assert (ci["low"], ci["high"]) == pytest.approx(
        _hand_bootstrap(a, b, _plain_mean, 250, 0.9, 8), abs=1e-12)
    assert ci["diff"] == pytest.approx(((0.44 - 0.3) + (0.5 - 0.34)) / 2, abs=1e-12)


@pytest.mark.fast
def test_bootstrap_against_itself_is_zero():
    a = np.array([0.1, 0.9, 0.4, 0.4, 0.0, 1.0])
    ci = paired_bootstrap_ci(a, a, resamples=500, confidence=0.95, seed=3)
    assert (ci["diff"], ci["low"], ci["high"]) == (0.0, 0.0, 0.0)
    rec = race_f1_records(["yes", "no", "yes", "no"], ["yes", None, "no", "no"])
    ci = paired_bootstrap_ci(rec, rec, f1_statistic, resamples=200, seed=0)
    assert (ci["diff"], ci["low"], ci["high"]) == (0.0, 0.0, 0.0)


@pytest.mark.fast
def test_bootstrap_refuses_bad_arguments():
    a = np.array([0.1, 0.2])
    for kw in ({"resamples": 0}, {"confidence": 0.0}, {"confidence": 1.0}):
        with pytest.raises(ValueError, match="resamples=.* must be >= 1 and confidence"):
            paired_bootstrap_ci(a, a, **kw)
    with pytest.raises(ValueError, match="1 and 2 runs"):
        paired_bootstrap_ci_seeds([a], [a, a])
    with pytest.raises(ValueError, match="0 and 0 runs"):
        paired_bootstrap_ci_seeds([], [])
    with pytest.raises(ValueError, match=r"lengths \[2, 1\] and \[2, 2\]"):
        paired_bootstrap_ci_seeds([a, a[:1]], [a, a])
    with pytest.raises(ValueError, match="non-empty"):
        paired_bootstrap_ci(np.array([]), np.array([]))
    ci = paired_bootstrap_ci(a, a[::-1], resamples=1, seed=0)   # one resample is allowed
    assert ci["resamples"] == 1 and ci["low"] == ci["high"]


@pytest.mark.fast
def test_bootstrap_dominating_method_is_above_zero_and_seeded():
    rng = np.random.default_rng(0)
    b = rng.uniform(0, 0.8, size=40)
    a = b + rng.uniform(0.05, 0.2, size=40)  # a beats b on every prompt
    ci = paired_bootstrap_ci(a, b, resamples=1000, confidence=0.95, seed=7)
    assert 0.0 < ci["low"] <= ci["diff"] <= ci["high"]
    assert ci["diff"] == pytest.approx(float(np.mean(a - b)))
    assert ci == paired_bootstrap_ci(a, b, resamples=1000, confidence=0.95, seed=7)
    # unpaired noise would give a wider interval than the paired design
    assert ci["high"] - ci["low"] < 0.1


@pytest.mark.fast
def test_bootstrap_dr_f1_uses_f1_not_accuracy():
    labels = ["yes", "yes", "no", "no"]
    a = race_f1_records(labels, ["yes", "yes", "yes", "yes"])   # TP 2, FP 2: F1 = 4/6
    b = race_f1_records(labels, ["no", "no", "no", "no"])       # TP 0: F1 = 0
    assert a.tolist() == [[1, 1], [1, 1], [0, 1], [0, 1]]
    # both have accuracy 0.5: a mean-of-correct statistic would give a difference of 0
    ci = paired_bootstrap_ci(a, b, f1_statistic, resamples=300, seed=1)
    assert ci["diff"] == pytest.approx(2 / 3)
    # an unparseable answer is the wrong one: on "yes" a false negative
    assert race_f1_records(["yes"], [None]).tolist() == [[1, 0]]
    # seeds: the point estimate is the mean of the per-seed differences
    c = race_f1_records(labels, ["yes", "no", "no", "no"])      # TP 1, FN 1: F1 = 2/3
    ci2 = paired_bootstrap_ci_seeds([a, c], [b, b], f1_statistic, resamples=100, seed=1)
    assert ci2["diff"] == pytest.approx((2 / 3 + 2 / 3) / 2)
    assert ci2["n_seeds"] == 2 and ci2["n_prompts"] == 4
    with pytest.raises(ValueError):
        paired_bootstrap_ci(a, b[:3], f1_statistic)


# ----------------------------------------------------------------------------- fixture

EVAL = [
    {"id": "rc1", "task": "race_c", "label": "yes", "answer": "yes"},
    {"id": "rc2", "task": "race_c", "label": "no", "answer": "no"},
    {"id": "rf1", "task": "race_fortran", "label": "yes", "answer": "yes"},
    {"id": "rf2", "task": "race_fortran", "label": "no", "answer": "no"},
    {"id": "m1", "task": "mlperf", "label": None, "answer": "42"},
    {"id": "m2", "task": "mlperf", "label": None, "answer": "resnet"},
    {"id": "p1", "task": "plp", "label": None, "answer": "a parallel loop"},
    {"id": "p2", "task": "plp", "label": None, "answer": "a reduction"},
]
# per run: race predictions (rc1, rc2, rf1, rf2), mlperf em (m1, m2), plp (similarity, reward)
RUNS = {
    "sft": (["yes", "yes", "no", "no"], [False, False], [(0.4, 0.5), (0.6, 0.7)]),
    "grpo-s1": (["yes", "no", "no", "no"], [True, False], [(0.5, 0.6), (0.6, 0.7)]),
    "grpo-s2": (["yes", "yes", "yes", "no"], [False, False], [(0.4, 0.5), (0.6, 0.7)]),
    "hargo-s1": (["yes", "no", "yes", "no"], [True, True], [(0.7, 0.8), (0.8, 0.9)]),
    "hargo-s2": (["yes", "no", "yes", None], [True, False], [(0.6, 0.7), (0.7, 0.8)]),
}
# first-token yes/no scores of SFT's race rows (the other runs' rows predate the score: no AUC)
SFT_SCORES = [1.0, 0.5, 0.25, -1.0]
# the train split's race kernels (nearest-train's pool) and a plp record it ignores
TRAIN = [{"id": "t1", "task": "race_c", "label": "yes", "answer": "yes", "prompt": "question rc1"},
         {"id": "t2", "task": "race_fortran", "label": "no", "answer": "no",
          "prompt": "question rf2"},
         {"id": "t3", "task": "plp", "label": None, "answer": "x", "prompt": "question rc2"}]
# hand-computed: avg_score = sum of rewards / 8; DR-F1 = 2TP / (2TP + FP + FN)
AVG = {"sft": 3.2 / 8, "grpo-s1": 5.3 / 8, "grpo-s2": 4.2 / 8, "hargo-s1": 7.7 / 8,
       "hargo-s2": 5.5 / 8}
F1 = {"sft": 0.5, "grpo-s1": 2 / 3, "grpo-s2": 0.8, "hargo-s1": 1.0, "hargo-s2": 0.8}


def _rows(run: str) -> list[dict]:
    race, em, plp = RUNS[run]
    out = []
    for rec, pred in zip(EVAL[:4], race):
        text = f"{pred or 'maybe'} ({run})"
        ok = pred == rec["label"]
        out.append({"id": rec["id"], "task": rec["task"], "completion": text, "chars": len(text),
                    "reward": float(ok), "correct": ok, "prediction": pred})
        if run == "sft":
            out[-1]["yes_no_score"] = SFT_SCORES[len(out) - 1]
    for rec, hit in zip(EVAL[4:6], em):
        text = (rec["answer"] if hit else "unknown") + f" ({run})"
        out.append({"id": rec["id"], "task": "mlperf", "completion": text, "chars": len(text),
                    "reward": 1.0 if hit else 0.0, "correct": hit, "em": hit})
    for rec, (sim, rew) in zip(EVAL[6:], plp):
        text = f"it is {rec['answer']} " * (1 + int(10 * sim)) + f"({run})"
        out.append({"id": rec["id"], "task": "plp", "completion": text, "chars": len(text),
                    "reward": rew, "correct": sim >= 0.5, "similarity": sim})
    return out


def _history(scale: float) -> list[dict]:
    return [{"step": s, **{f"{t}/reward_mean": scale * s / 2 for t in ("race_c", "race_fortran",
                                                                      "mlperf", "plp")},
             **{f"{t}/weight_mean": 0.25 for t in ("race_c", "mlperf")},
             **{f"{t}/weight_max": 0.25 + 0.1 * s for t in ("race_c", "mlperf")}}
            for s in (1, 2)]


def _make_fixture(root: Path) -> dict:
    from hargo.io import atomic_write_json, atomic_write_jsonl

    recs = [{**r, "prompt": [{"role": "user", "content": f"question {r['id']}"}],
             "alt_answers": [], "source": {"file": "x.json", "index": i}}
            for i, r in enumerate(EVAL)]
    atomic_write_jsonl(root / "data/prepared/eval.jsonl", recs)
    atomic_write_jsonl(root / "data/prepared/train.jsonl",
                       [{**r, "prompt": [{"role": "user", "content": r["prompt"]}],
                         "alt_answers": [], "source": {"file": "t.json", "index": i}}
                        for i, r in enumerate(TRAIN)])
    for run in RUNS:
        rows = _rows(run)
        d = root / "data/compare/eval" / run
        atomic_write_jsonl(d / "generations.jsonl", rows)
        atomic_write_json(d / "metrics.json", {"avg_score": AVG[run], "dr_f1": F1[run],
                                               "n": 8, "wall_s": 1.0})
        if run != "sft":
            method, seed = run.split("-s")
            atomic_write_json(root / "metrics/compare/train" / f"{run}.json",
                              {"method": method, "seed": int(seed), "run": run,
                               "prompts_seen": 4, "steps": 2, "wall_s": 10.0 * int(seed),
                               "history": _history(1.0 if method == "hargo" else 0.5)})
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    params["compare"].update(methods=["grpo", "hargo"], seeds=[1, 2], steps=2, prompts_per_step=2)
    params["compare"]["report"] = {"bootstrap_resamples": 400, "confidence": 0.95}
    params["evaluate"]["judge"] = "reward"
    return params


@pytest.mark.fast
def test_run_metrics_hand_computed():
    labels = {r["id"]: r["label"] for r in EVAL if r["label"]}
    for run in RUNS:
        m = aggregate.run_metrics(_rows(run), labels)
        assert m["avg_score"] == pytest.approx(AVG[run])
        assert m["dr_f1"] == pytest.approx(F1[run])
    m = aggregate.run_metrics(_rows("hargo-s2"), labels)
    assert m["mlperf_em"] == 0.5 and m["plp_similarity"] == pytest.approx(0.65)
    assert m["accuracy_race_fortran"] == 0.5 and m["accuracy_plp"] == 1.0
    # per-task mean task reward: race_c both right, race_fortran one of two, plp (0.7 + 0.8) / 2
    assert (m["reward_race_c"], m["reward_race_fortran"], m["reward_mlperf"]) == (1.0, 0.5, 0.5)
    assert m["reward_plp"] == pytest.approx(0.75)


@pytest.mark.fast
def test_mlperf_verbose_share_counts_answers_over_40_characters():
    """The paper's verbosity measure: an MLPerf completion of 41 characters is verbose, one of
    40 is not; other tasks' lengths do not count."""
    assert aggregate.VERBOSE_CHARS == 40
    rows = [{"id": f"m{i}", "task": "mlperf", "completion": "x" * n, "chars": n, "reward": 0.0,
             "correct": False, "em": False} for i, n in enumerate((40, 41, 3, 200))]
    rows.append({"id": "p1", "task": "plp", "completion": "y" * 500, "chars": 500,
                 "reward": 0.5, "correct": True, "similarity": 0.5})
    m = aggregate.run_metrics(rows, {})
    assert m["mlperf_verbose"] == 0.5                     # 41 and 200 of 40, 41, 3, 200
    pp = aggregate.per_prompt_values(rows, {})
    assert pp["mlperf_verbose"].tolist() == [0.0, 1.0, 0.0, 1.0]
    assert aggregate.run_metrics(rows[4:], {})["mlperf_verbose"] is None   # no MLPerf prompt
    assert "mlperf_verbose" not in aggregate.per_prompt_values(rows[4:], {})
    # the trivial baseline: the reference answers' own share (41 chars of 41 and 40)
    refs = [{"task": "mlperf", "answer": "a" * 41}, {"task": "mlperf", "answer": "b" * 40},
            {"task": "plp", "answer": "c" * 99}]
    assert aggregate.reference_verbose_share(refs) == 0.5
    assert aggregate.reference_verbose_share(refs[2:]) is None


@pytest.mark.fast
def test_sft_cis_pair_sft_with_every_seed_by_hand():
    """Method minus SFT: SFT verbose on prompts 0-3, seed 1 on 0-1, seed 2 on 0 only ->
    (2/4 - 4/4 + 1/4 - 4/4) / 2 = -0.625; a method that equals SFT gets [0, 0]."""
    sft = np.array([1.0, 1.0, 1.0, 1.0])
    pp = {"sft": {"mlperf_verbose": sft, "avg_score": np.array([0.5, 0.5])},
          "grpo-s1": {"mlperf_verbose": np.array([1.0, 1.0, 0.0, 0.0]),
                      "avg_score": np.array([0.5, 0.5])},
          "grpo-s2": {"mlperf_verbose": np.array([1.0, 0.0, 0.0, 0.0]),
                      "avg_score": np.array([0.5, 0.5])},
          "dpo-s1": {"mlperf_verbose": sft, "avg_score": np.array([0.5, 0.5])},
          "dpo-s2": {"mlperf_verbose": sft, "avg_score": np.array([0.5, 0.5])}}
    ci = aggregate.sft_cis(pp, ["grpo", "dpo"], [1, 2], 500, 0.95, 0)
    assert list(ci) == ["grpo-sft", "dpo-sft"]
    assert set(ci["grpo-sft"]) == {"mlperf_verbose", "avg_score"}   # only metrics present
    v = ci["grpo-sft"]["mlperf_verbose"]
    assert v["diff"] == pytest.approx(-0.625) and v["n_seeds"] == 2 and v["n_prompts"] == 4
    # every resample keeps SFT at 1.0 and the runs at most 1.0: the whole interval <= 0
    assert v["low"] <= v["diff"] <= v["high"] <= 0.0
    assert (ci["dpo-sft"]["mlperf_verbose"]["low"], ci["dpo-sft"]["mlperf_verbose"]["high"]) \
        == (0.0, 0.0)


@pytest.mark.fast
def test_cumulative_mass_share_counts_an_unsampled_task_as_zero():
    # seed 1: step 1 race 1 of 4, step 2 race absent (NaN share, no mass key), 2 of total 6;
    # seed 2: step 1 no mass at all (every group zero-variance) -> no value yet, step 2 race 3 of 3
    h1 = [{"step": 1, "race_c/update_mass": 1.0, "all/update_mass": 4.0},
          {"step": 2, "all/update_mass": 2.0}]
    h2 = [{"step": 2, "race_c/update_mass": 3.0, "all/update_mass": 3.0},
          {"step": 1, "race_c/update_mass": 0.0, "all/update_mass": 0.0}]
    steps, vals = aggregate.cumulative_mass_share([h1, h2], "race_c")
    assert steps == [1, 2]
    assert vals == [pytest.approx(0.25), pytest.approx((1 / 6 + 1.0) / 2)]
    assert aggregate.cumulative_mass_share([[{"step": 1, "all/update_mass": float("nan")}]],
                                           "plp") == ([], [])


@pytest.mark.fast
def test_mean_curve_averages_seeds_per_step():
    h1 = [{"step": 1, "plp/reward_mean": 0.2}, {"step": 2, "plp/reward_mean": 0.4}]
    h2 = [{"step": 1, "plp/reward_mean": 0.4}, {"step": 2, "plp/reward_mean": None},
          {"step": 3, "plp/reward_mean": float("nan")}]
    assert aggregate.mean_curve([h1, h2], "plp/reward_mean") == ([1, 2], [pytest.approx(0.3), 0.4])


@pytest.mark.fast
def test_seed_summary_two_seeds_by_hand():
    per_run = {"grpo-s1": {"avg_score": 0.2, "dr_f1": 0.5, "mlperf_em": None},
               "grpo-s2": {"avg_score": 0.6, "dr_f1": 0.9, "mlperf_em": 1.0},
               "hargo-s1": {"avg_score": 1.0, "dr_f1": 1.0, "mlperf_em": 0.0},
               "hargo-s2": {"avg_score": 0.5, "dr_f1": 0.75, "mlperf_em": 1.0}}
    res = aggregate.seed_summary(per_run, ["grpo", "hargo"], [1, 2],
                                 keys=["avg_score", "dr_f1", "mlperf_em"])
    # two seeds a, b: mean (a + b) / 2, sample std sqrt(2 ((a - b) / 2)^2 / 1) = |a - b| / sqrt(2)
    r2 = math.sqrt(2)
    assert res["grpo"]["avg_score"] == {"mean": pytest.approx(0.4), "std": pytest.approx(0.4 / r2),
                                        "values": [0.2, 0.6]}
    assert res["grpo"]["dr_f1"]["mean"] == pytest.approx(0.7)
    assert res["grpo"]["dr_f1"]["std"] == pytest.approx(0.4 / r2)
    assert res["grpo"]["mlperf_em"] is None            # seed 1 has no MLPerf prompts
    assert res["hargo"]["avg_score"]["mean"] == pytest.approx(0.75)
    assert res["hargo"]["avg_score"]["std"] == pytest.approx(0.5 / r2)
    assert res["hargo"]["mlperf_em"] == {"mean": 0.5, "std": pytest.approx(1 / r2),
                                         "values": [0.0, 1.0]}


class _TieJudge:
    name = "tie"

    def compare_batch(self, samples, a, b):
        return [0] * len(samples)


@pytest.mark.fast
def test_aggregate_fixture_runs_by_hand():
    labels = {r["id"]: r["label"] for r in EVAL if r["label"]}
    rows = {run: _rows(run) for run in RUNS}
    train = {m: {s: {"history": _history(1.0 if m == "hargo" else 0.5)} for s in (1, 2)}
             for m in ("grpo", "hargo")}
    agg = aggregate.aggregate(EVAL, rows, labels, train, ["grpo", "hargo"], [1, 2],
                              aggregate.RecordingJudge(_TieJudge()))
    r2 = math.sqrt(2)
    grpo, hargo = agg.results["grpo"], agg.results["hargo"]
    assert grpo["avg_score"]["mean"] == pytest.approx((5.3 + 4.2) / 16)
    assert grpo["avg_score"]["std"] == pytest.approx((5.3 - 4.2) / 8 / r2)
    assert grpo["dr_f1"]["mean"] == pytest.approx((2 / 3 + 0.8) / 2)
    assert grpo["dr_f1"]["std"] == pytest.approx((0.8 - 2 / 3) / r2)
    # PLP similarity per seed: (0.5 + 0.6) / 2 and (0.4 + 0.6) / 2
    assert grpo["plp_similarity"]["mean"] == pytest.approx(0.525)
    assert grpo["plp_similarity"]["std"] == pytest.approx(0.05 / r2)
    assert hargo["avg_score"]["mean"] == pytest.approx(0.825)
    assert hargo["avg_score"]["std"] == pytest.approx(0.275 / r2)
    assert hargo["mlperf_em"]["values"] == [1.0, 0.5]
    assert hargo["accuracy_race_c"] == {"mean": 1.0, "std": 0.0, "values": [1.0, 1.0]}
    # every verdict a tie: WinRate 0.5 for every seed, per-prompt scores 0.5
    assert grpo["win_rate"] == {"mean": 0.5, "std": 0.0, "values": [0.5, 0.5]}
    assert agg.per_prompt["hargo-s1"]["win_rate"].tolist() == [0.5] * 8
    assert agg.per_run["sft"]["win_rate"] is None and "sft" not in agg.wins
    assert agg.confusion == {"sft": [[1, 1, 0], [1, 1, 0]], "grpo": [[3, 1, 0], [1, 3, 0]],
                             "hargo": [[4, 0, 0], [0, 3, 1]]}
    assert list(agg.histories) == ["grpo", "hargo"] and len(agg.histories["hargo"]) == 2
    assert len(agg.chars["hargo"]["plp"]) == 4 and len(agg.chars["sft"]["plp"]) == 2


@pytest.mark.fast
def test_bootstrap_cis_order_and_notes():
    pp = {f"{m}-s{s}": {"avg_score": np.array([0.1 * s, 0.5])} for m in ("grpo", "hargo", "dpo")
          for s in (1, 2)}
    ci, notes = aggregate.bootstrap_cis(pp, ["dpo", "hargo", "grpo"], [1, 2], 50, 0.9, 0)
    assert list(ci) == ["hargo-grpo", "hargo-dpo"] and notes == []
    assert list(ci["hargo-grpo"]) == ["avg_score"] and ci["hargo-grpo"]["avg_score"]["diff"] == 0.0
    assert aggregate.bootstrap_cis(pp, ["grpo"], [1, 2], 50, 0.9, 0)[0] == {}
    assert "grpo is not in" in aggregate.bootstrap_cis(pp, ["hargo", "dpo"], [1, 2], 50, 0.9,
                                                       0)[1][0]


def test_report_renders_from_fixture(tmp_path, mlflow_uri):
    import mlflow

    params = _make_fixture(tmp_path)
    out = report.run(as_config(params), root=tmp_path)

    md = (tmp_path / "reports/comparison.md").read_text()
    # hargo AvgScore over seeds: mean (7.7/8 + 5.5/8)/2 = 0.825, sample std 0.275/sqrt(2)
    hargo_row = next(l for l in md.splitlines() if l.startswith("| HARGO "))
    assert "0.8250 ± 0.1945" in hargo_row
    assert "90.00 ± 14.14" in hargo_row                 # DR-F1 1.0 and 0.8, in percent
    assert "81.25 ± 8.84" in hargo_row                  # WinRate 7/8 and 6/8 vs SFT
    sft_row = next(l for l in md.splitlines() if l.startswith("| SFT "))
    assert "50.00" in sft_row and "0.4000" in sft_row and "±" not in sft_row
    assert "paper (Qwen2.5-0.5B-Instruct)" in md
    assert re.search(r"HARGO: paper \(Qwen2\.5-0\.5B-Instruct\) +\| +54\.62 \| +91\.30", md)
    assert re.search(r"HARGO - GRPO, AvgScore: \+0\.231\d \[[-+]\d\.\d{4}, \+\d\.\d{4}\]", md)
    assert "judge: task-reward" in md and "seeds: 1, 2" in md
    assert "2 steps x 2 prompts = 4 prompts" in md
    assert "data version: unknown" in md

    html = (tmp_path / "reports/comparison.html").read_text()
    assert html.count("data:image/png;base64,") == 5 and "HARGO - GRPO" in html
    for name in ("confusion", "reward_curves", "weight_curves", "update_mass_share",
                 "answer_lengths"):
        assert (tmp_path / "reports/comparison" / f"{name}.png").read_bytes()[:4] == b"\x89PNG"

    s = json.loads((tmp_path / "metrics/compare/summary.json").read_text())
    assert s["results"]["hargo"]["avg_score"]["mean"] == pytest.approx(0.825)
    assert s["results"]["hargo"]["avg_score"]["std"] == pytest.approx(0.275 / math.sqrt(2))
    assert s["results"]["grpo"]["dr_f1"]["values"] == [pytest.approx(2 / 3), pytest.approx(0.8)]
    assert s["runs"]["hargo-s1"]["win_rate"] == 0.875 and s["runs"]["hargo-s2"]["win_rate"] == 0.75
    assert (s["runs"]["hargo-s2"]["win_wins"], s["runs"]["hargo-s2"]["win_ties"],
            s["runs"]["hargo-s2"]["win_losses"]) == (5, 2, 1)
    assert s["sft"]["dr_f1"] == 0.5 and s["sft"]["win_rate"] is None
    # the DVC metrics: SFT's values and each method's mean over seeds, headline metrics only
    head = json.loads((tmp_path / "metrics/compare/headline.json").read_text())["compare"]
    assert set(head) == {"sft", "grpo", "hargo"}
    assert head["hargo"]["avg_score"] == pytest.approx(0.825)
    assert head["grpo"]["dr_f1"] == pytest.approx((2 / 3 + 0.8) / 2)
    assert head["hargo"]["win_rate"] == pytest.approx((0.875 + 0.75) / 2)
    assert head["sft"]["dr_f1"] == 0.5 and "win_rate" not in head["sft"]   # None: left out
    assert set(head["hargo"]) <= {"dr_f1", "dr_mcc", "mlperf_em", "plp_similarity",
                                  "avg_score", "win_rate"}
    ci = s["ci"]["hargo-grpo"]
    assert ci["avg_score"]["diff"] == pytest.approx(((7.7 - 5.3) / 8 + (5.5 - 4.2) / 8) / 2)
    assert ci["dr_f1"]["diff"] == pytest.approx(((1.0 - 2 / 3) + (0.8 - 0.8)) / 2)
    assert set(ci) == {"win_rate", "dr_f1", "plp_similarity", "mlperf_em", "mlperf_verbose",
                       "avg_score", "reward_race_c", "reward_race_fortran", "reward_mlperf",
                       "reward_plp"}
    # each method minus SFT (SFT paired with every seed): AvgScore (7.7 - 3.2) / 8 and
    # (5.5 - 3.2) / 8 averaged; DR-F1 (1.0 - 0.5) and (0.8 - 0.5) averaged; no WinRate row
    assert list(s["sft_ci"]) == ["grpo-sft", "hargo-sft"]
    hs = s["sft_ci"]["hargo-sft"]
    assert "win_rate" not in hs and "mlperf_verbose" in hs
    assert hs["avg_score"]["diff"] == pytest.approx((4.5 + 2.3) / 16)
    assert hs["dr_f1"]["diff"] == pytest.approx(0.4)
    assert s["sft_ci"]["grpo-sft"]["avg_score"]["diff"] == pytest.approx((2.1 + 1.0) / 16)
    assert hs["mlperf_verbose"] == {**hs["mlperf_verbose"], "diff": 0.0, "low": 0.0, "high": 0.0}
    assert "## Each method minus SFT" in md
    # the fixture's MLPerf references ("42", "resnet") are short: the baseline share is 0
    assert s["reference_mlperf_verbose"] == 0.0 and "the reference answers themselves, 0.0%" in md
    assert re.search(r"\| HARGO - SFT +\| +AvgScore \| +\+0\.4250 \|", md)
    assert out["sft_ci"]["hargo-sft"]["avg_score"]["diff"] == pytest.approx(0.425)
    # per-task reward: hargo - grpo on plp, seed pairs ((0.8+0.9)-(0.6+0.7))/2 and (0.7+0.8-1.2)/2
    assert ci["reward_plp"]["diff"] == pytest.approx((0.2 + 0.15) / 2)
    assert all(c["low"] <= c["diff"] <= c["high"] for c in ci.values())
    # the AvgScore interval exactly: per-prompt rewards of each seed pair, the report's resamples,
    # confidence and bootstrap seed (params.seed), one shared draw, by the hand loop
    rewards = {run: np.array([r["reward"] for r in _rows(run)]) for run in RUNS}
    low, high = _hand_bootstrap([rewards["hargo-s1"], rewards["hargo-s2"]],
                                [rewards["grpo-s1"], rewards["grpo-s2"]], _plain_mean, 400, 0.95,
                                int(params["seed"]))
    assert (ci["avg_score"]["low"], ci["avg_score"]["high"]) == pytest.approx((low, high),
                                                                            abs=1e-12)
    assert f"HARGO - GRPO, AvgScore: +0.2313 [{low:+.4f}, {high:+.4f}]" in md
    # hargo's seeds summed: s1 all right; s2 an unparsed answer to a "no"
    assert s["confusion"]["counts"]["hargo"] == [[4, 0, 0], [0, 3, 1]]
    assert s["confusion"]["counts"]["sft"] == [[1, 1, 0], [1, 1, 0]]
    assert s["judge"] == "task-reward" and s["budget"]["prompts_per_method"] == 4
    assert out["ci"]["hargo-grpo"]["avg_score"]["diff"] == pytest.approx(0.23125)

    runs = mlflow.search_runs(filter_string="tags.`hargo.kind` = 'comparison'",
                              search_all_experiments=True)
    assert len(runs) == 1 and runs.iloc[0]["run_id"] == out["run_id"]
    assert runs.iloc[0]["metrics.hargo/avg_score_mean"] == pytest.approx(0.825)
    assert runs.iloc[0]["metrics.ci/hargo-sft/avg_score_diff"] == pytest.approx(0.425)
    arts = {a.path for a in mlflow.MlflowClient().list_artifacts(out["run_id"], "comparison")}
    assert {"comparison/comparison.md", "comparison/comparison.html",
            "comparison/summary.json", "comparison/figures"} <= arts


def test_report_race_table_against_baselines_by_hand(tmp_path, mlflow_uri):
    """Race labels yes, no, yes, no (rc1, rc2, rf1, rf2).

    always-yes: F1 = 2*2/(2*2 + 2) = 2/3, MCC 0, AUC 0.5, yes share 1.
    nearest-train over {question, <id>} token sets: rc1 = t1 (1.0, yes); rc2 and rf1 tie at 1/3
    with t1 (yes) and t2 (no): t1 first in the file, yes; rf2 = t2 (no). Predictions yes, yes,
    yes, no: tp 2, fp 1, tn 1: F1 4/5, MCC (2*1 - 0) / sqrt(3*2*2*1) = 1/sqrt(3), yes share
    3/4; scores 2/3, 0, 0, -2/3: AUC (1 + 1 + 0.5 + 1) / 4 = 0.875.
    SFT (yes, yes, no, no): tp = fp = fn = tn = 1: F1 0.5, MCC 0, yes share 0.5; scores 1.0,
    0.5, 0.25, -1.0: yes (1.0, 0.25) above no (0.5, -1.0) in 3 of 4 pairs, AUC 0.75.
    HARGO: s1 all right (F1 1, MCC 1, yes 0.5); s2 the unparsed answer to rf2 counts as "yes"
    (F1 0.8, MCC 1/sqrt(3), yes 0.75); no scores, no AUC.
    With base generations (a copy of SFT's) the base row equals SFT's."""
    import shutil

    params = _make_fixture(tmp_path)
    report.run(as_config(params), root=tmp_path)
    race = json.loads((tmp_path / "metrics/compare/summary.json").read_text())["race"]
    ay, nn = race["baselines"]["always-yes"], race["baselines"]["nearest-train"]
    assert ay == pytest.approx({"dr_f1": 2 / 3, "dr_mcc": 0.0, "dr_auc": 0.5,
                                "dr_yes_share": 1.0})
    assert nn == pytest.approx({"dr_f1": 0.8, "dr_mcc": 1 / math.sqrt(3), "dr_auc": 0.875,
                                "dr_yes_share": 0.75})
    assert "base" not in race["baselines"]
    assert race["sft"] == pytest.approx({"dr_f1": 0.5, "dr_mcc": 0.0, "dr_auc": 0.75,
                                         "dr_yes_share": 0.5})
    h = race["methods"]["hargo"]
    assert h["dr_mcc"]["values"] == pytest.approx([1.0, 1 / math.sqrt(3)])
    assert h["dr_mcc"]["mean"] == pytest.approx((1 + 1 / math.sqrt(3)) / 2)
    assert h["dr_yes_share"]["mean"] == pytest.approx(0.625) and h["dr_auc"] is None
    md = (tmp_path / "reports/comparison.md").read_text()
    assert "Data race detection against baselines" in md
    row = lambda name: [c.strip() for c in next(  # noqa: E731  (in the race table)
        l for l in md.split("against baselines")[1].splitlines()
        if l.startswith(f"| {name}")).split("|")[2:6]]
    assert row("always-yes (baseline)") == ["0.667", "0.000", "0.500", "1.000"]
    assert row("nearest-train (baseline)") == ["0.800", "0.577", "0.875", "0.750"]
    assert row("HARGO  ") == ["0.900 ± 0.141", "0.789 ± 0.299", "-", "0.625 ± 0.177"]
    assert "base model was not evaluated here" in md

    shutil.copytree(tmp_path / "data/compare/eval/sft", tmp_path / "data/compare/eval/base")
    report.run(as_config(params), root=tmp_path)
    race = json.loads((tmp_path / "metrics/compare/summary.json").read_text())["race"]
    assert race["baselines"]["base"] == race["sft"]
    md = (tmp_path / "reports/comparison.md").read_text()
    assert row("base model (baseline)") == ["0.500", "0.000", "0.750", "0.500"]
    assert "base model was not evaluated here" not in md


def test_report_without_grpo_notes_and_missing_inputs(tmp_path, mlflow_uri):
    params = _make_fixture(tmp_path)
    params["compare"]["methods"] = ["hargo"]
    out = report.run(as_config(params), root=tmp_path)
    md = (tmp_path / "reports/comparison.md").read_text()
    assert "grpo is not in compare.methods" in md and out["ci"] == {}

    params["compare"]["methods"] = ["grpo", "hargo"]
    (tmp_path / "metrics/compare/train/hargo-s2.json").unlink()
    with pytest.raises(FileNotFoundError, match=r"hargo-s2\.json.*compare_train"):
        report.run(as_config(params), root=tmp_path)
    (tmp_path / "data/compare/eval/grpo-s1/generations.jsonl").unlink()
    with pytest.raises(FileNotFoundError, match=r"grpo-s1/generations\.jsonl.*compare_eval"):
        report.run(as_config(params), root=tmp_path)
    params["compare"]["methods"] = ["dpo"]
    with pytest.raises(FileNotFoundError, match="compare_eval"):
        report.run(as_config(params), root=tmp_path)


def test_report_rejects_stale_metrics(tmp_path, mlflow_uri):
    from hargo.io import HargoInputError, atomic_write_json

    params = _make_fixture(tmp_path)
    atomic_write_json(tmp_path / "data/compare/eval/hargo-s1/metrics.json", {"avg_score": 0.5})
    with pytest.raises(HargoInputError, match=r"hargo-s1/metrics\.json, field 'avg_score'"):
        report.run(as_config(params), root=tmp_path)


def test_report_preference_methods_need_pair_stats(tmp_path, mlflow_uri):
    import shutil

    from hargo.io import atomic_write_json

    params = _make_fixture(tmp_path)
    for s in (1, 2):  # a "dpo" run with grpo's outputs
        shutil.copytree(tmp_path / f"data/compare/eval/grpo-s{s}",
                        tmp_path / f"data/compare/eval/dpo-s{s}")
        doc = json.loads((tmp_path / f"metrics/compare/train/grpo-s{s}.json").read_text())
        atomic_write_json(tmp_path / f"metrics/compare/train/dpo-s{s}.json",
                          {**doc, "method": "dpo", "history": []})
    params["compare"]["methods"] = ["hargo", "dpo"]
    with pytest.raises(FileNotFoundError, match=r"data/preferences/stats\.json.*preferences"):
        report.run(as_config(params), root=tmp_path)
    atomic_write_json(tmp_path / "data/preferences/stats.json", {"pairs": 12, "ties_dropped": 4})
    out = report.run(as_config(params), root=tmp_path)
    md = (tmp_path / "reports/comparison.md").read_text()
    assert "grpo is not in compare.methods" in md
    assert "pairs 12, ties_dropped 4" in md
    assert out["ci"]["hargo-dpo"]["avg_score"]["diff"] == pytest.approx(0.23125)
