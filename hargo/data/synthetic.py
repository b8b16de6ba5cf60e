"""Synthetic tasks with the reward heterogeneity of hargo's real tasks (method.md "Tasks and
rewards"), seeded and cheap: a controlled test bed for HARGO's weighting, where the reward
*shape* of each task is known and can be switched off (``homogeneous``).

Three tasks (``SYNTHETIC_TASKS``), each a copy of one real task's reward shape:

=============  =====================  ==============================  ===========================
task           copies                 question                        reference answer
=============  =====================  ==============================  ===========================
syn_yesno      race_c / race_fortran  yes/no about a short list of     ``"yes"`` / ``"no"``
                                      digits (is the last one even;    (label = answer), labels
                                      or sum parity, a repeat, sorted  balanced per split
                                      order: ``yesno_question``)
syn_short      mlperf                 the sum of a list of integers    the sum, e.g. ``"23"``
                                      (``conflict: shared_surface``:
                                      asked in syn_yesno's question)
syn_long       plp                    a list of words reversed or      the words, space-separated
                                      sorted alphabetically            (``long_answer_words``)
=============  =====================  ==============================  ===========================

Rewards (``synthetic_reward``; every reward is then multiplied by the task's ``scale_*``; the
test bed's training rewards may add noise, ``noise_*``: :mod:`hargo.data.synthetic_noise`):

syn_yesno, range {0, 1}
    ``1.0`` when ``hargo.rewards.race.extract_yes_no(completion) == label`` else ``0.0``: the race
    reward itself, so a completion naming both "yes" and "no" is a hedge and scores 0.
syn_short, range {0, 0.1/k, 0.2/k, 0.5/k, 1/k : k >= 1}
    The completion's numbers are its number tokens (``-?[0-9]+`` or ``-?[0-9]+.[0-9]+``, at most
    50 digits each side, not glued to a letter, digit, ``_`` or ``.``: ``"23"``, ``"23."`` and
    ``"-4"`` are numbers, ``"v23"``, ``"23rd"``, ``"2.3.4"`` and a 51-digit run are not,
    ``"23.0"`` equals ``"23"``). With ``y`` the reference,
    ``x`` the offered number closest to it and ``d = |x - y|``, the tier is (first that
    applies, in exact rational arithmetic)::

        1.0  d == 0                        (exact, MLPerf tier 1)
        0.5  d <= 0.05 * max(|y|, 1)       (within 5%,  MLPerf's "partial" tier)
        0.2  d <= 0.15 * max(|y|, 1)       (within 15%, MLPerf's keyword-overlap > 0.7 tier)
        0.1  d <= 0.30 * max(|y|, 1)       (within 30%, MLPerf's keyword-overlap > 0.4 tier)
        0.0  otherwise, or no number at all

    and the reward is ``tier / k`` for ``k`` distinct numbers offered (MLPerf's hedging share
    with one reference value: ``"23 or 24"`` earns 1/2). The prompt asks for the number alone;
    restating the addends (``"3 + 20 = 23"``) counts them as offered numbers (1/3).
syn_long, range [``long_min_reward``, 1]
    ``max(long_min_reward, sim - long_length_penalty * max(0, len(completion) - budget))`` with
    ``budget = ceil(long_budget_ratio * len(answer))`` characters (code points) and ``sim`` in
    [0, 1] the mean of the word-unigram and word-bigram multiset F1 between completion and
    reference (``similarity``; words are casefolded ``\\w+`` runs; bigram F1 is left out when
    the reference has a single word; 0 when either side has no word). PLP's shape (a
    continuous similarity minus a per-character penalty past a budget) without the MiniLM
    embedder, so it runs in microseconds on a CPU, and without PLP's format bonus, so the
    reference alone scores exactly the maximum 1.0. Padding and extra candidate lists dilute
    the precision of both F1s (and past the budget cost the penalty), so a hedge earns less.

``heterogeneity = h`` in [0, 1] blends the two: syn_short's and syn_long's reward is
``h * graded + (1 - h) * exact match`` (1: the graded rewards above; 0: the control below).

``homogeneous=True`` (the control): every task gets a 0/1 exact-match reward (still times its
scale), so the tasks differ in content and answer length but not in reward shape:

- syn_yesno: the yes/no reward above (already 0/1);
- syn_short: 1.0 when the completion offers exactly one distinct number and it equals the
  reference (the tier-1 case with k = 1), else 0.0;
- syn_long: 1.0 when the completion's casefolded ``\\w+`` word sequence equals the reference's
  (case, spacing and punctuation ignored; any length), else 0.0.

Records (``generate``) have the prepared-record schema of ``hargo.data.records`` /
``hargo.data.raw.make_record``: ``id`` (``"<task>-<split>-<index:05d>"``), ``task``, ``prompt``
(one user message), ``answer``, ``label`` (``"yes"``/``"no"`` on syn_yesno, else None),
``alt_answers`` (``[]``), ``source`` (``{"file": "synthetic:seed=<seed>", "index": i}``).
``check_synthetic`` runs ``hargo.data.records.check_prepared`` on them. The synthetic task names
are registered as test-bed tasks (``hargo/tasks/synthetic.py``, ``synthetic=True``), not in
``hargo.vocab.TASKS``; ``SyntheticReward`` is a TRL reward function for them with
``TaskReward``'s call signature.

Pure Python (``random``, ``re``, ``fractions``); deterministic per (config, seed): the same
seed gives identical records on every platform and Python version that keeps ``random.Random``'s
string seeding and ``randrange``/``shuffle``/``choice`` stable (CPython 3.11+).
"""
from __future__ import annotations

import math
import random
import re
from collections import Counter
from dataclasses import replace
from fractions import Fraction
from typing import Mapping, Sequence

from hargo.config.synthetic import SYNTHETIC_TASKS, SyntheticData
from hargo.data.synthetic_hedges import hedge
from hargo.rewards.race import canonical_label, extract_yes_no
from hargo.rewards.text import read_answer

__all__ = ["SYNTHETIC_TASKS", "SyntheticConfig", "generate", "hedge", "synthetic_reward",
           "similarity", "short_tier", "offered_numbers", "check_synthetic", "SyntheticReward",
           "LONG_WORDS"]


#: The real task whose prepared-record schema (and reward shape) each synthetic task copies.
SCHEMA_TASK: dict[str, str] = {"syn_yesno": "race_c", "syn_short": "mlperf", "syn_long": "plp"}

#: Vocabulary of the syn_long word lists: 64 distinct lowercase words, 3-8 letters.
LONG_WORDS: tuple[str, ...] = (
    "apple", "river", "stone", "cloud", "garden", "window", "silver", "forest",
    "candle", "bridge", "yellow", "harbor", "pencil", "marble", "thunder", "orange",
    "valley", "rocket", "basket", "planet", "shadow", "copper", "meadow", "castle",
    "violet", "anchor", "desert", "lantern", "pepper", "island", "mirror", "falcon",
    "winter", "spring", "summer", "autumn", "button", "carpet", "dragon", "engine",
    "feather", "ginger", "hammer", "jungle", "kettle", "ladder", "magnet", "needle",
    "oyster", "puzzle", "quartz", "ribbon", "saddle", "tunnel", "velvet", "walnut",
    "zebra", "cactus", "dolphin", "glacier", "helmet", "insect", "jacket", "lemon",
)


#: The knobs of the synthetic tasks: params.yaml ``synthetic.data``, the typed config's block
#: (:class:`hargo.config.synthetic.SyntheticData`: every field's type, default, range and help;
#: ``from_params`` builds one from a mapping, refusing an unknown key by name; a value out of
#: range raises a ValueError naming ``synthetic.data.<key>``), with ``scale(task)``.
SyntheticConfig = SyntheticData


def _check_task(task) -> str:
    if task not in SYNTHETIC_TASKS:
        raise ValueError(f"unknown synthetic task {task!r}; valid: {list(SYNTHETIC_TASKS)}")
    return task


# --------------------------------------------------------------------------- generation

def _yesno_example(rng: random.Random, label: str, n: int, question: str = "mixed"
                   ) -> tuple[str, str]:
    """(question, label) with the given label. ``question="last_even"``: is the last of ``n``
    digits even; ``"mixed"``: one of three kinds drawn by ``rng`` (sum parity, a repeated
    number, sorted order)."""
    want = label == "yes"
    if question == "last_even":
        xs = [rng.randint(1, 9) for _ in range(n)]
        xs[-1] = rng.choice((2, 4, 6, 8) if want else (1, 3, 5, 7, 9))
        return f"Is the last number of {_join(xs)} even? Answer yes or no.", label
    kind = rng.randrange(3)
    hi = max(9, 2 * n)  # enough distinct values for a list without repeats
    if kind == 0:  # sum parity
        xs = [rng.randint(1, 9) for _ in range(n)]
        if (sum(xs) % 2 == 0) != want:
            xs[-1] = xs[-1] + 1 if xs[-1] < 9 else xs[-1] - 1
        q = f"Is the sum of {_join(xs)} even?"
    elif kind == 1:  # a repeated number
        xs = rng.sample(range(1, hi + 1), n)
        if want:
            i, j = rng.sample(range(n), 2)
            xs[j] = xs[i]
        q = f"Does the list {_join(xs)} contain a repeated number?"
    else:  # sorted in increasing order (non-strict)
        xs = [rng.randint(1, 9) for _ in range(n)]
        if want:
            xs.sort()
        else:
            if len(set(xs)) == 1:  # all equal: no order of them is unsorted
                xs[0] = xs[0] % 9 + 1
            while xs == sorted(xs):
                rng.shuffle(xs)
        q = f"Is the list {_join(xs)} sorted in non-decreasing order?"
    return q + " Answer yes or no.", label


def _short_example(rng: random.Random, n: int, conflict: str = "none") -> tuple[str, str]:
    """(question, sum) of ``n`` integers in 1..10n; ``conflict="shared_surface"`` asks it in
    syn_yesno's ``last_even`` question (the same draws, so the same numbers and answer)."""
    xs = [rng.randint(1, 10 * n) for _ in range(n)]
    if conflict == "shared_surface":
        return (f"Is the last number of {_join(xs)} even? Answer with the sum of the numbers "
                "only.", str(sum(xs)))
    return (f"What is the sum of {_join(xs)}? Answer with the number only.", str(sum(xs)))


def _long_example(rng: random.Random, n_words: int) -> tuple[str, str]:
    words = [rng.choice(LONG_WORDS) for _ in range(n_words)]
    if rng.randrange(2) == 0:
        how, answer = "in reverse order", words[::-1]
    else:
        how, answer = "in alphabetical order", sorted(words)
    return (f"Write the following words {how}, separated by single spaces: {' '.join(words)}",
            " ".join(answer))


def _join(xs) -> str:
    return " ".join(str(x) for x in xs)


def _split_records(task: str, split: str, n: int, config: SyntheticConfig, seed: int,
                   seen: set[str]) -> list[dict]:
    """``n`` records of one task and split; prompts already in ``seen`` are redrawn (so no
    prompt is in both splits or twice in one), and the new prompts are added to ``seen``."""
    rng = random.Random(f"hargo.synthetic:{seed}:{task}:{split}")
    labels: list[str | None] = [None] * n
    if task == "syn_yesno":  # balanced: exactly half yes (the odd one drawn), then shuffled
        labels = ["yes", "no"] * (n // 2) + ([rng.choice(("yes", "no"))] if n % 2 else [])
        rng.shuffle(labels)
    out = []
    for i in range(n):
        for _ in range(1000):
            if task == "syn_yesno":
                q, answer = _yesno_example(rng, labels[i], config.difficulty,
                                               config.yesno_question)
            elif task == "syn_short":
                q, answer = _short_example(rng, config.short_terms or config.difficulty,
                                           config.conflict)
            else:
                q, answer = _long_example(rng, config.long_answer_words)
            if q not in seen:
                break
        else:
            raise ValueError(f"synthetic: could not draw {n} distinct {task} prompts for the "
                             f"{split} split; raise difficulty or long_answer_words")
        seen.add(q)
        out.append({
            "id": f"{task}-{split}-{i:05d}",
            "task": task,
            "prompt": [{"role": "user", "content": q}],
            "answer": answer,
            "label": labels[i],
            "alt_answers": [],
            "source": {"file": f"synthetic:seed={seed}", "index": i},
        })
    return out


def generate(config: SyntheticConfig, seed: int) -> tuple[list[dict], list[dict]]:
    """``(train_records, eval_records)``: ``config.n_train`` / ``config.n_eval`` records of each
    task in ``SYNTHETIC_TASKS`` (schema in the module docstring), ordered by task then index.

    Deterministic per (config, seed). Each (seed, task, split) has its own random stream, so the
    eval split does not depend on ``n_train``. No prompt occurs twice: within a task the eval
    prompts are drawn first and a train draw equal to one is redrawn. syn_yesno labels are
    balanced in each split (``n // 2`` of each, the odd one drawn). ``homogeneous`` and the
    scales change only the reward, not the records.

    Raises:
        ValueError: the prompt space is too small for the counts asked (tiny difficulty).
    """
    seed = int(seed)
    train: list[dict] = []
    eval_: list[dict] = []
    for task in SYNTHETIC_TASKS:
        seen: set[str] = set()
        eval_ += _split_records(task, "eval", config.n_eval, config, seed, seen)
        train += _split_records(task, "train", config.n_train, config, seed, seen)
    return train, eval_


def check_synthetic(records: Sequence[Mapping], where: str = "synthetic") -> None:
    """Check synthetic records with the prepared-record checker
    (``hargo.data.records.check_prepared``), each synthetic task standing in for the real task
    whose schema it copies (``SCHEMA_TASK``: syn_yesno needs a yes/no label like race_c, the
    others a string answer); an unknown task raises first.

    Raises:
        ValueError: a task outside ``SYNTHETIC_TASKS``.
        hargo.io.HargoInputError: what ``check_prepared`` raises (the message names the record's
            id, which starts with its synthetic task).
    """
    from hargo.data.records import check_prepared

    for r in records:
        _check_task(r.get("task") if isinstance(r, Mapping) else None)
    check_prepared(where, [dict(r, task=SCHEMA_TASK[r["task"]]) for r in records],
                   require_answer=True)


# --------------------------------------------------------------------------- rewards

# A number token: ASCII digits, at most 50 before and 50 after the point (a longer digit run is
# no number: it would only cost time), not glued to a word character or a decimal point on
# either side (so "v23", "23rd", "1.2.3" hold no number); a trailing period is allowed ("23.").
_NUMBER = re.compile(r"(?<![\w.])-?[0-9]{1,50}(?:\.[0-9]{1,50})?(?!\w|\.\d)")
_WORDS = re.compile(r"\w+")

#: syn_short tiers: (largest relative distance d / max(|y|, 1), reward); d == 0 is tier 1.0.
SHORT_TIERS: tuple[tuple[Fraction, float], ...] = (
    (Fraction(5, 100), 0.5), (Fraction(15, 100), 0.2), (Fraction(30, 100), 0.1))


def offered_numbers(completion: str) -> list[Fraction]:
    """The distinct numbers of a completion (number tokens as in the module docstring), in
    order of first appearance, as exact fractions (``"23.0"`` and ``"23"`` are one number)."""
    out: dict[Fraction, None] = {}
    for tok in _NUMBER.findall(completion):
        out.setdefault(Fraction(tok), None)
    return list(out)


def short_tier(x: Fraction, y: Fraction) -> float:
    """The syn_short tier of an offered number ``x`` for the reference ``y``: 1.0 equal, then
    0.5 / 0.2 / 0.1 within 5% / 15% / 30% of ``max(|y|, 1)``, else 0.0 (exact arithmetic)."""
    d = abs(Fraction(x) - Fraction(y))
    if d == 0:
        return 1.0
    base = max(abs(Fraction(y)), Fraction(1))
    for limit, reward in SHORT_TIERS:
        if d <= limit * base:
            return reward
    return 0.0


def _short_reward(completion: str, answer: str, homogeneous: bool) -> float:
    y = Fraction(answer.strip())
    xs = offered_numbers(completion)
    if not xs:
        return 0.0
    if homogeneous:
        return 1.0 if xs == [y] else 0.0
    return max(short_tier(x, y) for x in xs) / len(xs)


def _f1(a: Counter, b: Counter) -> float:
    common = sum((a & b).values())
    if common == 0:
        return 0.0
    p, r = common / sum(a.values()), common / sum(b.values())
    return 2 * p * r / (p + r)


def similarity(completion: str, reference: str) -> float:
    """syn_long's similarity in [0, 1]: the mean of the word-unigram and word-bigram multiset
    F1 of ``completion`` against ``reference`` (casefolded ``\\w+`` words; the unigram F1 alone
    when the reference has one word; 0.0 when either has no word). 1.0 exactly when both have
    the same multisets of words and of adjacent word pairs (so for the same word sequence)."""
    c = _WORDS.findall(completion.casefold())
    r = _WORDS.findall(reference.casefold())
    if not c or not r:
        return 0.0
    uni = _f1(Counter(c), Counter(r))
    if len(r) < 2:
        return uni
    bi = _f1(Counter(zip(c, c[1:])), Counter(zip(r, r[1:])))
    return (uni + bi) / 2


def _long_reward(completion: str, answer: str, config: SyntheticConfig) -> float:
    if config.homogeneous:
        return 1.0 if _WORDS.findall(completion.casefold()) == \
            _WORDS.findall(answer.casefold()) else 0.0
    budget = math.ceil(config.long_budget_ratio * len(answer))
    r = similarity(completion, answer) - config.long_length_penalty * max(
        0, len(completion) - budget)
    return max(config.long_min_reward, r)


def _blend(config: SyntheticConfig, graded: float, exact) -> float:
    """``h * graded + (1 - h) * exact()`` with ``h = config.heterogeneity`` (``graded`` alone
    when h is 1 or the rewards are already the homogeneous ones)."""
    h = config.heterogeneity
    if h == 1 or config.homogeneous:
        return graded
    return h * graded + (1 - h) * exact()


def synthetic_reward(task: str, completion: str, answer: str | None, label: str | None,
                     config: SyntheticConfig | None = None) -> float:
    """The reward of one completion (formulas and ranges in the module docstring), times
    ``config.scale(task)``.

    Args:
        task: one of ``SYNTHETIC_TASKS``.
        completion: the model's text, read by ``hargo.rewards.text.read_answer`` (NFKC, format
            characters removed) like every reward's.
        answer: the reference (syn_short: an integer string; syn_long: the word list); unused
            by syn_yesno.
        label: syn_yesno's ``"yes"``/``"no"`` (any case); unused by the others.
        config: ``SyntheticConfig()`` when None.

    Raises:
        ValueError: an unknown task, a bad syn_yesno label, or a missing/non-numeric reference
            (bad data; never because of the completion).
    """
    config = config or SyntheticConfig()
    _check_task(task)
    completion = read_answer(completion)
    if task == "syn_yesno":
        r = 1.0 if extract_yes_no(completion) == canonical_label(label) else 0.0
    else:
        if not isinstance(answer, str) or not answer.strip():
            raise ValueError(f"synthetic_reward: {task} needs a non-empty string answer, "
                             f"got {answer!r}")
        if task == "syn_short":
            if not _NUMBER.fullmatch(answer.strip()):
                raise ValueError(f"synthetic_reward: syn_short answer must be a number, "
                                 f"got {answer!r}")
            r = _blend(config, _short_reward(completion, answer, config.homogeneous),
                       lambda: _short_reward(completion, answer, True))
        else:
            r = _blend(config, _long_reward(completion, answer, config),
                       lambda: _long_reward(completion, answer, replace(config, homogeneous=True)))
    return float(r * config.scale(task))


class SyntheticReward:
    """TRL reward function for the synthetic tasks, with ``hargo.rewards.TaskReward``'s call
    signature (``prompts``, ``completions``, ``task``, ``answer``, ``label`` keyword lists;
    completions as strings or chat messages); one ``synthetic_reward`` per completion.
    ``__name__`` is ``"synthetic_reward"``."""

    __name__ = "synthetic_reward"

    def __init__(self, config: SyntheticConfig | None = None):
        self.config = config or SyntheticConfig()

    def __call__(self, prompts=None, completions=None, task=None, answer=None, label=None,
                 **kwargs) -> list[float]:
        from hargo.rewards import reward_columns

        texts, tasks, answers, labels = reward_columns(completions, task, answer, label,
                                                       "synthetic_reward")
        return [synthetic_reward(t, x, a, lab, self.config)
                for t, x, a, lab in zip(tasks, texts, answers, labels)]
