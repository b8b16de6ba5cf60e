"""The :class:`Task` object: what hargo needs to know about one task, in one place.

Pure Python (no torch): a task points at its reward math in :mod:`hargo.rewards` (or
:mod:`hargo.data.synthetic`), it does not copy it. The two batch functions a task carries take
the batch of one task only (the callers group a mixed batch by task and ask each task):

``reward(batch: RewardBatch) -> list[float]``
    the undamped task reward of each completion (``TaskReward`` then scales degenerate ones).
``score(batch: ScoreBatch) -> list[dict]``
    per completion, the evaluation fields the task feeds into its metrics (race: ``label``,
    ``prediction``; mlperf: ``em``; plp: ``similarity``); :func:`hargo.metrics.score_samples`
    adds ``correct`` from :meth:`Task.correct`.

and one summary function:

``summarize(rows: list[dict]) -> dict``
    the task's own metrics (keys among :attr:`Task.metrics`) from its scored rows (those of
    ``score_samples``); an empty list gives each metric None (the task is absent).

Which of its metrics a task shows in the headline tables (``hargo summary``, the DVC headline,
the comparison report, the promotion gate's metric list) are its :attr:`Task.headline`
:class:`Metric` objects; where its records come from is :attr:`Task.raw_file` or
:attr:`Task.records`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

__all__ = ["Task", "Metric", "KINDS", "VIEWS", "STATISTICS", "RewardBatch", "ScoreBatch",
           "FULL_REWARD_TOL"]

#: What a task's answer is: ``yes_no`` (a 0/1 label), ``short_answer`` (a short fact, tiered
#: partial credit), ``sentence`` (a sentence-length answer, graded by similarity).
KINDS: tuple[str, ...] = ("yes_no", "short_answer", "sentence")
#: A reward counts as the full reward 1.0 within this tolerance.
FULL_REWARD_TOL = 1e-6
#: Where a :class:`Metric` shows: ``summary`` (a column of ``hargo summary``), ``headline``
#: (``metrics/headline.json`` and ``metrics/compare/headline.json``: the DVC metrics),
#: ``report`` (a column of the comparison report's results table, with bootstrap intervals),
#: ``gate`` (a metric ``register.gate_metrics`` may name).
VIEWS: tuple[str, ...] = ("summary", "headline", "report", "gate")
#: How a metric follows from its per-prompt values: ``mean`` (of ``float(row[field])``), or
#: ``f1`` / ``precision`` / ``recall`` of the yes/no records (``label``, ``row[field]`` the
#: predicted "yes"/"no"/None; :func:`hargo.stats.race_f1_records`).
STATISTICS: tuple[str, ...] = ("mean", "f1", "precision", "recall")


@dataclass(frozen=True)
class Metric:
    """A metric a task shows in the headline tables (:attr:`Task.headline`).

    The key is computed by ``hargo.metrics.compute_metrics`` (the task's ``summarize``, or the
    pooled yes/no metrics) or by evaluation (``dr_auc``); the tables only show it. A key
    declared by several tasks is one column, its per-prompt values pooled over their rows (the
    Data Race F1 of race_c and race_fortran).

    Attributes:
        key: its key in ``metrics/eval.json`` (e.g. ``plp_similarity``).
        label: the column's label (``hargo summary``, the comparison report).
        field: the field of the task's scored rows (:func:`hargo.metrics.score_samples`) the
            metric is computed from, prompt by prompt (the report's bootstrap and the gate
            resample them); None: not computable from the rows, so not in the ``report`` or
            ``gate`` views whatever ``views`` says.
        statistic: one of :data:`STATISTICS`.
        percent: the comparison report shows it in percent (a share), else as a fraction.
        views: where it shows, among :data:`VIEWS`.
        rank: column order among every task's metrics (then the tasks' order, then the order of
            declaration); None: its task's :attr:`Task.rank`.

    Raises:
        ValueError: at construction, an empty key or label, an unknown statistic or view.
    """

    key: str
    label: str
    field: str | None = None
    statistic: str = "mean"
    percent: bool = False
    views: tuple[str, ...] = VIEWS
    rank: int | None = None

    def __post_init__(self):
        for attr in ("key", "label"):
            if not isinstance(getattr(self, attr), str) or not getattr(self, attr).strip():
                raise ValueError(f"Metric {self.key!r}: {attr} must be a non-empty string")
        if self.statistic not in STATISTICS:
            raise ValueError(f"Metric {self.key!r}: statistic {self.statistic!r} (valid: "
                             f"{', '.join(STATISTICS)})")
        bad = [v for v in self.views if v not in VIEWS]
        if bad:
            raise ValueError(f"Metric {self.key!r}: unknown view(s) {bad} (valid: "
                             f"{', '.join(VIEWS)})")

    def shows_in(self, view: str) -> bool:
        """Whether it shows in ``view`` (``report`` and ``gate`` need a per-prompt
        :attr:`field`)."""
        return view in self.views and (self.field is not None or view in ("summary",
                                                                            "headline"))


@dataclass(frozen=True)
class RewardBatch:
    """The completions of one task within a reward call (aligned lists of equal length).

    Attributes:
        index: each completion's position in the whole batch (for error messages).
        texts: completion texts (``hargo.rewards.completion_text``).
        answers: reference answers (str or None), labels: race labels (str or None),
        questions: the prompt's last message (``""`` when none).
        reward_fn: the calling :class:`hargo.rewards.TaskReward` (its ``config`` and ``scorer``).
    """

    index: Sequence[int]
    texts: Sequence[str]
    answers: Sequence[Any]
    labels: Sequence[Any]
    questions: Sequence[str]
    reward_fn: Any

    def answer(self, j: int) -> str:
        """The reference answer of the ``j``-th completion of the batch.

        Raises:
            ValueError: not a string (names the completion's position in the whole batch)."""
        a = self.answers[j]
        if not isinstance(a, str):
            raise ValueError(f"task_reward: completion {self.index[j]} needs a string 'answer', "
                             f"got {a!r}")
        return a


@dataclass(frozen=True)
class ScoreBatch:
    """The samples of one task within :func:`hargo.metrics.score_samples` (aligned lists).

    Attributes:
        samples: the prepared records; texts: their completions' texts; rewards: their rewards;
        degenerate: ``TaskReward.degenerate`` of each (None: not degenerate);
        reward_fn: the :class:`hargo.rewards.TaskReward` (its scorer gives the PLP cosine).
    """

    samples: Sequence[dict]
    texts: Sequence[str]
    rewards: Sequence[float]
    degenerate: Sequence[str | None]
    reward_fn: Any


@dataclass(frozen=True, eq=False)
class Task:
    """One task of hargo (registered with :func:`hargo.tasks.register_task`).

    Attributes:
        name: the task's name (records' ``task`` field, metric names ``accuracy_<name>``, the
            keys of params.yaml's per-task maps).
        description: one line for the docs and help.
        kind: one of :data:`KINDS`.
        reward: batch reward function (module docstring); the math lives in ``hargo/rewards``.
        score: batch scoring function for evaluation (module docstring).
        summarize: its own metrics from its scored rows (module docstring); None: none.
        correct_threshold: the task's one correctness rule: a completion is correct when it is
            not degenerate and its reward is >= this value (1.0 minus :data:`FULL_REWARD_TOL`
            for an exact answer). Training's accuracy (``hargo.training.rl_logging``) and
            evaluation's ``accuracy_<task>`` (``hargo.metrics``) both ask :meth:`correct`.
        metrics: the metric keys of ``hargo.metrics.compute_metrics`` the task feeds besides the
            per-task ``n_``/``accuracy_``/... ones (race: the pooled ``dr_f1`` ... of every
            yes/no task and its own ``dr_f1_<name>``, mlperf: ``mlperf_em``, plp:
            ``plp_similarity``).
        headline: the metrics it shows in the headline tables (:class:`Metric`; ``hargo
            summary``, the DVC headline, the comparison report, the gate's metric list), each
            table built from the registry (:func:`hargo.tasks.headline_metrics`).
        labelled: its records carry a yes/no ``label`` (race), checked by the reward and the
            metrics; otherwise a string ``answer``.
        raw_file: where its raw records are (a JSON array of ``{instruction, input, output}``
            strings, read by ``hargo.data.raw.load_raw``): a file name (no folder part) is in
            the raw data folder (``data.raw_dir``: HPC-GPT's files); a path with a folder part
            is read where it is (relative to the working directory, the repository root under
            DVC; a file outside ``data.raw_dir`` is no dependency of the ``prepare`` stage
            unless dvc.yaml lists it). None: no raw file.
        records: instead of a raw file, a function of no argument returning its raw records
            (a list of ``{instruction, input, output}`` dicts of strings, checked as a raw
            file's are) for the ``prepare`` and ``validate`` stages: a task module that makes its
            own records needs no data file (its code is a dependency of both stages through
            ``hargo/tasks``). None: no generated records. At most one of ``raw_file`` and
            ``records``.
        synthetic: a test-bed task of ``hargo.data.synthetic`` (records generated, not read;
            reward :class:`hargo.data.synthetic.SyntheticReward`).
        max_new_tokens, max_prompt_tokens: default generation budget (completion tokens) and
            prompt cap (prompt tokens), used where a per-task map of params.yaml
            (``rl.max_new_tokens``, ``evaluate.max_new_tokens``,
            ``compare.evaluate.max_new_tokens``; ``rl.max_prompt_tokens``, ...) does not name
            the task (:func:`hargo.generation_budget.task_budget`). None (the HPC-GPT tasks):
            no default, every such map must name the task (its budgets are tuned there).
        rank: listing order (tables, metric order); ties broken by name.

    Raises:
        ValueError: at construction, an unknown kind, an empty name or description, a
            budget that is not None or an integer >= 1, a headline entry that is not a
            :class:`Metric`, or both ``raw_file`` and ``records``.
    """

    name: str
    description: str
    kind: str
    reward: Callable[[RewardBatch], list[float]]
    score: Callable[[ScoreBatch], list[dict]]
    summarize: Callable[[list[dict]], dict] | None = None
    correct_threshold: float = 1.0 - FULL_REWARD_TOL
    metrics: tuple[str, ...] = ()
    headline: tuple[Metric, ...] = ()
    labelled: bool = False
    raw_file: str | None = None
    records: Callable[[], list[dict]] | None = None
    synthetic: bool = False
    max_new_tokens: int | None = None
    max_prompt_tokens: int | None = None
    rank: int = 100

    def __post_init__(self):
        for attr in ("name", "description"):
            if not isinstance(getattr(self, attr), str) or not getattr(self, attr).strip():
                raise ValueError(f"Task {self.name!r}: {attr} must be a non-empty string")
        if self.kind not in KINDS:
            raise ValueError(f"Task {self.name!r}: kind {self.kind!r} (valid: {', '.join(KINDS)})")
        for attr in ("max_new_tokens", "max_prompt_tokens"):
            v = getattr(self, attr)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise ValueError(f"Task {self.name!r}: {attr} must be None or an integer >= 1, "
                                 f"got {v!r}")
        if not all(isinstance(m, Metric) for m in self.headline):
            raise ValueError(f"Task {self.name!r}: headline must hold hargo.tasks.Metric "
                             f"objects, got {self.headline!r:.120}")
        if self.raw_file is not None and self.records is not None:
            raise ValueError(f"Task {self.name!r}: give raw_file or records, not both")

    def correct(self, reward: float | None, degenerate: str | None = None,
                threshold: float | None = None) -> bool:
        """The task's correctness rule: not ``degenerate``, and ``reward`` (the task reward,
        after ``TaskReward``'s degenerate scaling) >= ``threshold`` (default
        :attr:`correct_threshold`). A None or NaN reward is never correct."""
        if reward is None or reward != reward or degenerate is not None:
            return False
        return reward >= (self.correct_threshold if threshold is None else threshold)

    def default_budget(self, key: str) -> int | None:
        """Its default for the per-task map ``key`` (a dotted params key ending in
        ``max_new_tokens`` or ``max_prompt_tokens``), or None (no default: the map must name the
        task)."""
        leaf = key.rsplit(".", 1)[-1]
        return getattr(self, leaf) if leaf in ("max_new_tokens", "max_prompt_tokens") else None

    def __repr__(self) -> str:
        return f"Task({self.name!r}, kind={self.kind!r})"
