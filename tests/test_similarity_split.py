"""The ``similarity`` split (hargo.data.split.split_similarity) and the token-set similarity it
shares with the nearest-train baseline (hargo.data.similarity): near-copies of a race kernel stay
in one split (``grouped`` can separate them), links chain, the split is seeded, a threshold of
1.0 is token-set equality, LSH finds what brute force finds, and prepare's nearest-train
statistics hold hand-computed values.

Crafted prompts are space-separated words, so a prompt's token set is its set of words."""
from __future__ import annotations

import json
import os
import random
import re
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
from config_helpers import config_with

from hargo.data import prepare as P
from hargo.data import similarity as Sim
from hargo.data import split as S
from hargo.vocab import TASKS

ROOT = Path(__file__).resolve().parents[1]
TINY = Path(__file__).parent / "data" / "hpc_tiny"


def _rec(rid: str, words, task: str = "race_c", label: str = "yes") -> dict:
    return {"id": rid, "task": task, "label": label,
            "prompt": [{"role": "user", "content": " ".join(words)}]}


def _kernel(k: int, n: int = 20) -> list[str]:
    """n words of its own: Jaccard 0 to every other kernel."""
    return [f"k{k}w{i}" for i in range(n)]


def _near_copy(words: list[str]) -> list[str]:
    """Another text of the kernel: one word changed, the rest reordered (Jaccard 19/21 for 20)."""
    return list(reversed(words[:-1])) + [words[-1] + "x"]


def _pairs_and_singletons(n_pairs=10, n_single=20) -> list[dict]:
    recs = []
    for k in range(n_pairs):
        w = _kernel(k)
        recs += [_rec(f"p{k}a", w), _rec(f"p{k}b", _near_copy(w))]
    recs += [_rec(f"s{k}", _kernel(100 + k)) for k in range(n_single)]
    return recs


@pytest.mark.fast
def test_tokens_and_jaccard_are_the_baselines():
    from hargo.evaluation import baselines as B

    assert B.kernel_tokens is Sim.kernel_tokens and B.jaccard is Sim.jaccard  # one copy
    w = _kernel(0)
    assert Sim.jaccard(Sim.kernel_tokens(_rec("a", w)["prompt"]),
                       Sim.kernel_tokens(_rec("b", _near_copy(w))["prompt"])) == 19 / 21


@pytest.mark.fast
def test_near_copies_stay_together_under_similarity_and_not_under_grouped():
    recs = _pairs_and_singletons()          # 40 records, eval target 20 at 0.5
    separated = 0
    for seed in range(6):
        train, eval_ = S.split_similarity(recs, 0.5, seed, threshold=0.85, num_perm=128)
        ids = {r["id"] for r in eval_}
        assert len(eval_) == 20 and len(train) == 20
        assert all((f"p{k}a" in ids) == (f"p{k}b" in ids) for k in range(10)), seed
        g_train, g_eval = S.split_grouped(recs, 0.5, seed)
        g_ids = {r["id"] for r in g_eval}
        separated += sum((f"p{k}a" in g_ids) != (f"p{k}b" in g_ids) for k in range(10))
    assert separated > 0  # different texts: grouped places them independently


@pytest.mark.fast
def test_a_chain_of_links_is_one_group():
    a, b, c = [f"w{i}" for i in range(0, 20)], [f"w{i}" for i in range(1, 21)], [f"w{i}" for i in range(2, 22)]
    ta, tb, tc = (frozenset(x) for x in (a, b, c))
    assert Sim.jaccard(ta, tb) == Sim.jaccard(tb, tc) == 19 / 21 > 0.85 > Sim.jaccard(ta, tc) == 18 / 22
    recs = [_rec("A", a), _rec("x", _kernel(7)), _rec("C", c), _rec("B", b), _rec("y", _kernel(8))]
    groups, info = S.similarity_groups(recs, 0.85, 128, seed=42)
    assert groups["race_c"] == [[0, 2, 3], [1], [4]]  # A, C, B; first-seen order
    assert info["race_c"] == {"linked_pairs": 2, "groups": 3, "multi_groups": 1,
                              "multi_records": 3, "largest": 3}
    # without B, A and C are apart
    groups, _ = S.similarity_groups([recs[k] for k in (0, 1, 2, 4)], 0.85, 128, seed=42)
    assert groups["race_c"] == [[0], [1], [2], [3]]


@pytest.mark.fast
def test_same_text_after_normalisation_is_one_group_and_other_tasks_keep_grouped():
    w = _kernel(0)
    recs = [_rec("r0", w), _rec("r1", [x.upper() for x in w]),   # case: other tokens, same text
            _rec("r2", _kernel(1)),
            _rec("m0", ["mlperf", "q"], task="mlperf", label=None),
            _rec("m1", ["MLPERF ", "q"], task="mlperf", label=None),
            _rec("m2", ["mlperf", "q2"], task="mlperf", label=None)]
    assert Sim.jaccard(*(Sim.kernel_tokens(r["prompt"]) for r in recs[:2])) == 0.0
    groups, info = S.similarity_groups(recs, 0.9, 64, seed=1)
    assert groups == {"race_c": [[0, 1], [2]], "mlperf": [[3, 4], [5]]}
    assert set(info) == {"race_c"}
    more = [_rec(f"m{k}", ["mlperf", f"z{k}"], task="mlperf", label=None) for k in range(3, 30)]
    for seed in (0, 5):  # mlperf: the same eval as under grouped
        sim = [r["id"] for r in S.split_similarity(recs + more, 0.2, seed, 0.9, 64)[1] if r["task"] == "mlperf"]
        grp = [r["id"] for r in S.split_grouped(recs + more, 0.2, seed)[1] if r["task"] == "mlperf"]
        assert sim == grp


@pytest.mark.fast
def test_the_split_is_seeded():
    recs = _pairs_and_singletons(15, 30)
    runs = {seed: S.split_similarity(recs, 0.25, seed, 0.85, 128) for seed in (3, 4)}
    assert S.split_similarity(recs, 0.25, 3, 0.85, 128) == runs[3]
    assert [r["id"] for r in runs[3][1]] != [r["id"] for r in runs[4][1]]


def test_the_split_does_not_depend_on_string_hashing(tmp_path):
    """Set iteration order changes with PYTHONHASHSEED; the split must not."""
    code = ("import json, sys; sys.path.insert(0, 'tests'); from test_similarity_split import "
            "_pairs_and_singletons as f; from hargo.data.split import split_similarity as s; "
            "print(json.dumps([r['id'] for r in s(f(15, 30), 0.25, 3, 0.85, 128)[1]]))")
    outs = set()
    for hs in ("0", "1", "12345"):
        env = dict(os.environ, PYTHONHASHSEED=hs, PYTHONPATH=str(ROOT))
        outs.add(subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, check=True,
                                capture_output=True, text=True).stdout)
    assert len(outs) == 1
    assert json.loads(outs.pop()) == [r["id"] for r in S.split_similarity(
        _pairs_and_singletons(15, 30), 0.25, 3, 0.85, 128)[1]]


@pytest.mark.fast
def test_threshold_one_is_token_set_equality():
    w = _kernel(0)
    recs = [_rec("a", w), _rec("b", list(reversed(w)) + [w[0]]),   # same set, other text
            _rec("c", _near_copy(w)),                               # 19/21
            _rec("d", w[:19]),                                      # 19/20 = 0.95
            _rec("e", _kernel(1)), _rec("f", _kernel(1)[::-1])]     # same set
    groups, info = S.similarity_groups(recs, 1.0, 128, seed=0)
    by_set: dict[frozenset, list[int]] = {}
    for k, r in enumerate(recs):
        by_set.setdefault(Sim.kernel_tokens(r["prompt"]), []).append(k)
    assert groups["race_c"] == list(by_set.values()) == [[0, 1], [2], [3], [4, 5]]
    assert info["race_c"]["linked_pairs"] == 2


@pytest.mark.fast
def test_lsh_pairs_equal_brute_force_and_are_verified():
    rng = random.Random(0)
    vocab = [f"v{i}" for i in range(60)]
    base = [frozenset(rng.sample(vocab, 30)) for _ in range(8)]
    sets = []
    for b in base:  # 8 families of 8 sets, each its base with 0-4 words swapped
        for _ in range(8):
            drop = set(rng.sample(sorted(b), rng.randint(0, 4)))
            sets.append(frozenset((b - drop) | set(rng.sample(vocab, len(drop)))))
    for t in (0.6, 0.8, 0.9, 1.0):
        brute = [(i, j, Sim.jaccard(sets[i], sets[j])) for i in range(len(sets))
                 for j in range(i + 1, len(sets)) if Sim.jaccard(sets[i], sets[j]) >= t]
        assert Sim.similar_pairs(sets, t, 128, seed=42) == brute, t
        assert brute or t == 1.0


@pytest.mark.fast
def test_lsh_bands_and_bad_arguments():
    assert Sim.lsh_bands(128, 0.9) == (18, 7)
    assert Sim.lsh_bands(128, 1.0) == (2, 64)
    for n, t in ((128, 0.9), (128, 0.7), (64, 0.5)):
        b, r = Sim.lsh_bands(n, t)
        assert b * r <= n and b >= 2 and (1 - t ** r) ** b <= Sim.MAX_MISS
        assert r == n // 2 or (1 - t ** (r + 1)) ** (n // (r + 1)) > Sim.MAX_MISS  # the largest r
    for bad in (0.0, 1.5, -0.1, True, "0.9"):
        with pytest.raises(ValueError, match=r"data.split.similarity_threshold must be a number in \(0, 1\]"):
            S.split_similarity(_pairs_and_singletons(), 0.5, 0, bad, 128)
    with pytest.raises(ValueError, match="data.split.minhash_perm"):
        S.split_similarity(_pairs_and_singletons(), 0.5, 0, 0.9, 2)
    with pytest.raises(ValueError, match="record 'bad', field prompt: prompt has no user message"):
        S.split_similarity([{"id": "bad", "task": "race_c", "prompt": [{"role": "system", "content": "x"}]}],
                           0.5, 0, 0.9, 16)


@pytest.mark.fast
def test_components_and_summary_by_hand():
    assert Sim.components(6, [(4, 5), (1, 3, 0.9), (3, 4)]) == [[0], [1, 3, 4, 5], [2]]
    s = Sim.similarity_summary([0.8, 0.0, 1.0, 0.6], threshold=0.75)
    assert s == {"n": 4, "median": 0.7, "p90": 1.0, "max": 1.0, "share_ge_0_9": 0.25,
                 "share_ge_threshold": 0.5}
    assert Sim.similarity_summary([k / 10 for k in range(1, 11)], 0.5)["p90"] == 0.9  # 9th of 10
    assert Sim.similarity_summary([], 0.5) == {"n": 0, "median": None, "p90": None, "max": None,
                                               "share_ge_0_9": None, "share_ge_threshold": None}


@pytest.mark.fast
def test_eval_nearest_train_by_hand():
    train = [_rec("t1", "a b c d".split()), _rec("t2", "e f g h".split()),
             _rec("tf", "a b c x".split(), task="race_fortran")]   # another task: not in c's pool
    eval_ = [_rec("e1", "d c b a".split()),        # 4/4 = 1.0 (t1)
             _rec("e2", "a b c x".split()),        # 3/5 = 0.6 (t1), not 1.0 (tf is Fortran)
             _rec("e3", "e f g h i".split()),      # 4/5 = 0.8 (t2)
             _rec("e4", ["z"])]                    # 0.0
    out = P.eval_nearest_train(train, eval_, threshold=0.75)
    assert out == {"race_c": {"n": 4, "median": 0.7, "p90": 1.0, "max": 1.0, "share_ge_0_9": 0.25,
                              "share_ge_threshold": 0.5},
                   "race_fortran": {"n": 0, "median": None, "p90": None, "max": None,
                                    "share_ge_0_9": None, "share_ge_threshold": None}}


def _params(out, strategy, threshold=0.95, seed=42):
    return {"seed": seed, "data": {"raw_dir": str(TINY), "out_dir": str(out), "conflicts": "majority",
                                   "split": {"strategy": strategy, "eval_fraction": 0.1,
                                             "similarity_threshold": threshold, "minhash_perm": 128}}}


def _read(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


@pytest.mark.parametrize("strategy", ["grouped", "similarity", "paper"])
def test_prepare_writes_the_nearest_train_statistics(tmp_path, strategy):
    P.prepare(config_with(_params(tmp_path, strategy)))
    stats = json.loads((tmp_path / "stats.json").read_text())
    train, eval_ = _read(tmp_path / "train.jsonl"), _read(tmp_path / "eval.jsonl")
    near = stats["eval_nearest_train"]
    assert near["threshold"] == 0.95
    toks = lambda r: set(re.findall(r"\w+|[^\w\s]", r["prompt"][0]["content"]))
    for t in ("race_c", "race_fortran"):   # recomputed here by brute force from the definition
        pool = [toks(r) for r in train if r["task"] == t]
        vals = sorted(max(len(q & p) / len(q | p) for p in pool)
                      for q in (toks(r) for r in eval_ if r["task"] == t))
        assert near[t]["median"] == round(statistics.median(vals), 4)
        assert near[t]["n"] == len(vals) > 0
        assert near[t]["max"] == round(vals[-1], 4)
        assert near[t]["share_ge_threshold"] == round(sum(v >= 0.95 for v in vals) / len(vals), 4)
        assert near[t]["share_ge_0_9"] == round(sum(v >= 0.9 for v in vals) / len(vals), 4)
    if strategy == "similarity":
        assert near["race_c"]["share_ge_threshold"] == near["race_fortran"]["share_ge_threshold"] == 0.0
        assert set(stats["similarity_groups"]) == {"race_c", "race_fortran"}
    else:
        assert "similarity_groups" not in stats
    assert sum(stats["counts"][t]["train"] + stats["counts"][t]["eval"] for t in TASKS) == len(train) + len(eval_)


def test_prepare_refuses_a_bad_threshold(tmp_path):
    p = _params(tmp_path, "similarity", threshold=0.0)
    with pytest.raises(ValueError, match=r"data.split.similarity_threshold: must be > 0, got 0.0"):
        P.prepare(config_with(p))
    del p["data"]["split"]["similarity_threshold"]
    with pytest.raises(ValueError, match="data.split.similarity_threshold: missing"):
        P.prepare(config_with(p))
    assert not (tmp_path / "train.jsonl").exists()
