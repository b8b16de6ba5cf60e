"""The split strategies (hargo/data/split.py) pinned to their exact behaviour, for the mutants of
scripts/mutation.sh the property tests of test_prepare.py let through: the paper strategy (no
fast test reached it), the seeding of each strategy, the eval-size tolerance, the fraction's
bounds and what ``near_duplicates`` counts.

The seeding is part of the data contract: ``random.Random("hargo-split:<strategy>:<seed>:<task>")``
decides which records are eval, so ``data/prepared`` (and its md5 in dvc.lock) stays the same
across versions only while these strings do. The oracles below re-implement each strategy from
its docstring with that seed, record by record."""
from __future__ import annotations

import random

import pytest

from hargo.data import split as S

pytestmark = pytest.mark.fast


def _rec(k: int, task: str, text: str) -> dict:
    return {"id": f"{task}-{k}", "task": task, "prompt": [{"role": "user", "content": text}]}


# two tasks interleaved, 13 and 7 records with distinct prompts (one record per group)
RECORDS = [_rec(k, "race_c" if k % 3 else "plp", f"question {k}") for k in range(20)]


def _ids(records):
    return [r["id"] for r in records]


def _paper_oracle(records, fraction, seed):
    """The docstring of split_paper: per task, a permutation by Random("hargo-split:paper:..."),
    its first floor(n * fraction) records to eval; both splits in input order."""
    eval_ids = set()
    for task in dict.fromkeys(r["task"] for r in records):
        ids = [r["id"] for r in records if r["task"] == task]
        random.Random(f"hargo-split:paper:{seed}:{task}").shuffle(ids)
        eval_ids |= set(ids[:int(len(ids) * fraction + 1e-9)])
    return ([r["id"] for r in records if r["id"] not in eval_ids],
            [r["id"] for r in records if r["id"] in eval_ids])


def _grouped_oracle(records, fraction, seed, key):
    """The docstring of split_grouped: per task, the groups (same key) in first-seen order,
    shuffled by Random("hargo-split:grouped:..."), each to eval while it fits the target."""
    eval_ids = set()
    for task in dict.fromkeys(r["task"] for r in records):
        rows = [r for r in records if r["task"] == task]
        groups: dict[str, list[str]] = {}
        for r in rows:
            groups.setdefault(key(r), []).append(r["id"])
        order = list(groups)
        random.Random(f"hargo-split:grouped:{seed}:{task}").shuffle(order)
        target, n = int(len(rows) * fraction + 1e-9), 0
        for g in order:
            if n + len(groups[g]) <= target:
                n += len(groups[g])
                eval_ids |= set(groups[g])
    return ([r["id"] for r in records if r["id"] not in eval_ids],
            [r["id"] for r in records if r["id"] in eval_ids])


@pytest.mark.parametrize("fraction", [0.1, 0.25, 0.5, 0.75])
@pytest.mark.parametrize("seed", [0, 1, 42])
def test_paper_split_is_the_seeded_per_task_permutation(seed, fraction):
    train, eval_ = S.split_paper(RECORDS, fraction, seed)
    assert (_ids(train), _ids(eval_)) == _paper_oracle(RECORDS, fraction, seed)
    # per task exactly floor(n * fraction): 13 race_c and 7 plp records
    for task, n in (("race_c", 13), ("plp", 7)):
        assert sum(r["task"] == task for r in eval_) == int(n * fraction)
    assert sorted(_ids(train + eval_)) == sorted(_ids(RECORDS))


def test_paper_split_by_hand_sizes_order_and_seed():
    """10 records of one task at 0.3: 3 eval, 7 train, each in input order; another seed or
    another task name draws another permutation; the same seed the same one."""
    recs = [_rec(k, "mlperf", "the same question") for k in range(10)]  # text is ignored
    train, eval_ = S.split_paper(recs, 0.3, 5)
    assert (len(train), len(eval_)) == (7, 3)
    assert _ids(eval_) == sorted(_ids(eval_), key=lambda i: int(i.split("-")[1]))
    assert _ids(train) == [i for i in _ids(recs) if i not in set(_ids(eval_))]
    assert S.split_paper(recs, 0.3, 5) == (train, eval_)
    draws = {tuple(_ids(S.split_paper(recs, 0.3, s)[1])) for s in range(8)}
    assert len(draws) > 1
    assert S.split_paper([], 0.5, 0) == ([], [])
    # 0.29 * 100 is 28.999999999999996: still 29 eval records, not 28
    hundred = [_rec(k, "plp", f"q{k}") for k in range(100)]
    assert len(S.split_paper(hundred, 0.29, 0)[1]) == 29


@pytest.mark.parametrize("seed", [0, 3, 11])
def test_grouped_split_is_the_seeded_shuffle_of_groups(seed):
    """Groups of sizes 1-3 (same prompt up to case and blanks) in two tasks, against the
    docstring's algorithm with the seed string: which groups are eval, exactly."""
    recs = []
    for k in range(30):
        task = "race_fortran" if k % 2 else "mlperf"
        q = k % 11
        recs.append(_rec(k, task, f"Q{q} " if k % 4 == 0 else f"q{q}"))
    key = lambda r: r["prompt"][0]["content"].strip().lower()  # noqa: E731
    for fraction in (0.2, 0.4):
        train, eval_ = S.split_grouped(recs, fraction, seed)
        assert (_ids(train), _ids(eval_)) == _grouped_oracle(recs, fraction, seed, key)


def test_the_two_strategies_and_the_tasks_draw_independently():
    """Singleton groups in first-seen order make the grouped split a permutation of records like
    the paper split: the strategy name and the task name in the seed make them differ."""
    def eval_of(fn, task, seed):
        recs = [_rec(k, task, f"q{k}") for k in range(40)]
        return tuple(int(i.split("-")[1]) for i in _ids(fn(recs, 0.25, seed)[1]))

    for seed in range(3):
        assert eval_of(S.split_grouped, "plp", seed) != eval_of(S.split_paper, "plp", seed)
        assert eval_of(S.split_grouped, "plp", seed) != eval_of(S.split_grouped, "race_c", seed)
        assert eval_of(S.split_paper, "plp", seed) != eval_of(S.split_paper, "race_c", seed)


def test_eval_size_tolerance_is_nine_decimals():
    """A product within 1e-9 below an integer is that integer (float error); one further below
    is not."""
    assert S.eval_size(10, 0.09999999997) == 1   # 0.9999999997: rounds to 1 at 9 decimals
    assert S.eval_size(10, 0.0999999997) == 0    # 0.999999997: a real shortfall
    assert S.eval_size(7, 0.5) == 3 and S.eval_size(0, 0.5) == 0


@pytest.mark.parametrize("fraction", [0.0, 1.0, -0.1, 1.5])
def test_fraction_bounds_are_open(fraction):
    for fn in (S.split_grouped, S.split_paper):
        with pytest.raises(ValueError, match=r"eval_fraction must be in \(0, 1\)"):
            fn(RECORDS, fraction, 0)
    S.check_fraction(1e-9)
    S.check_fraction(1 - 1e-9)


def test_near_duplicates_count_only_groups_written_two_ways():
    """An exact copy is not a near duplicate (one way of writing); a CRLF/case copy is, and the
    group counts all its records, exact copies included."""
    recs = [_rec(0, "plp", "What is X?"), _rec(1, "plp", "What is X?"),     # exact copies
            _rec(2, "plp", "Why Y?"), _rec(3, "plp", "why  y?"), _rec(4, "plp", "Why Y?"),
            _rec(5, "plp", "Lone"),
            _rec(6, "race_c", "a"), _rec(7, "race_c", "a")]
    assert S.near_duplicates(recs) == {"plp": {"groups": 1, "records": 3},
                                       "race_c": {"groups": 0, "records": 0}}
    by_id = lambda r: r["id"]  # noqa: E731  (every record its own text: no groups at all)
    assert S.near_duplicates(recs, by_id) == {"plp": {"groups": 0, "records": 0},
                                              "race_c": {"groups": 0, "records": 0}}
