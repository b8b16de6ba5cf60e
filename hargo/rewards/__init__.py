"""Task rewards, dispatched by each sample's ``task`` (method.md "The paper's tasks, rewards").

``TaskReward`` is the entry point: a TRL reward function (``reward_funcs=[TaskReward(cfg)]``)
taking the batch's completions and the samples' metadata columns (``task``, ``answer``,
``label``) as keyword lists and returning one float per completion. The HARGO weighting never
sees the task; only the choice of reward does.

=============  ===========================  =============================================
task           reward                       module
=============  ===========================  =============================================
race_c         yes/no matches the label     ``hargo.rewards.race``
race_fortran   yes/no matches the label     ``hargo.rewards.race``
mlperf         tiered 1 / 0.5 / 0.2 / 0.1   ``hargo.rewards.mlperf``
plp            MiniLM cosine + format/len   ``hargo.rewards.plp``
=============  ===========================  =============================================

Which reward a task gets is the task's own (``Task.reward`` of its module in ``hargo/tasks``,
which points at the math here); ``TaskReward`` groups a batch by task and asks each task. A task
that is not registered (or a synthetic test-bed task) is an error naming it, never PLP's reward.

Hedging is never paid in full: a completion that offers several answers earns
less than the precise one. race: a completion with both "yes" and "no" has no answer and scores 0
(``extract_yes_no``); mlperf: the tier is multiplied by the share of offered candidates that are
reference values, 1/k for k candidates (``hargo.rewards.mlperf.extra_candidates``; the prompt's
own values are excused); plp: padding and extra candidate sentences dilute the MiniLM cosine and
past the length budget cost the length penalty, so the reference alone scores highest.

Every reward reads a completion by one rule (``hargo.rewards.text``: NFKC, format characters
removed), and a degenerate completion -- past its task's character budget or made of one
repeated unit -- earns ``rewards.answer.degenerate_scale`` (0) times its positive reward, so
``"yes " * 250000`` earns less than ``"yes"``.

Rewards never raise on any completion string (empty, megabytes long, binary junk, any Unicode)
and are deterministic.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from hargo.config.rewards import block_items
from hargo.rewards.mlperf import MLPerfConfig, exact_match, mlperf_em, mlperf_reward
from hargo.rewards.plp import PLPConfig, PLPScorer, get_scorer, plp_rewards
from hargo.rewards.race import extract_yes_no, race_reward
from hargo.rewards.text import AnswerConfig, degenerate, read_answer, scale_degenerate

__all__ = ["TASKS", "RACE_TASKS", "RewardConfig", "TaskReward", "reward_columns", "completion_text",
           "question_text",
           "MLPerfConfig", "PLPConfig", "PLPScorer", "get_scorer", "extract_yes_no",
           "exact_match", "mlperf_em", "race_reward", "mlperf_reward", "plp_rewards", "check_task",
           "AnswerConfig", "degenerate", "read_answer"]



def __getattr__(name: str):
    """``TASKS`` and ``RACE_TASKS``, re-exported from :mod:`hargo.vocab` (read from the task
    registry when asked)."""
    if name in ("TASKS", "RACE_TASKS"):
        import hargo.vocab

        return getattr(hargo.vocab, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def check_task(task, where: str = "") -> str:
    """Return ``task`` if it is a registered HPC-GPT task (:func:`hargo.tasks.get_task`), else
    raise :class:`hargo.tasks.UnknownTaskError` (a ValueError) naming it (and ``where``) and
    listing the valid tasks."""
    from hargo.tasks import get_task

    return get_task(task, where, synthetic=False).name


@dataclass(frozen=True)
class RewardConfig:
    """Constants of all task rewards (params.yaml ``rewards``): the typed config's blocks
    (:class:`hargo.config.rewards.PLPReward`, ``MLPerfReward``, ``AnswerRule``, named
    ``PLPConfig``, ``MLPerfConfig``, ``AnswerConfig`` here)."""

    plp: PLPConfig = field(default_factory=PLPConfig)
    mlperf: MLPerfConfig = field(default_factory=MLPerfConfig)
    answer: AnswerConfig = field(default_factory=AnswerConfig)

    @classmethod
    def from_params(cls, rewards) -> "RewardConfig":
        """From params.yaml ``rewards`` (blocks ``plp``, ``mlperf`` and ``answer``): the typed
        section (:class:`hargo.config.Rewards`, e.g. ``cfg.rewards``), or the mapping as
        params.yaml has it (a missing block keeps its defaults), or None (all defaults).

        Raises:
            ValueError: see :meth:`AnswerConfig.from_params`; ValueError, TypeError: a
                constant that is not a number."""
        blocks = block_items(rewards)
        return cls(plp=PLPConfig.from_params(blocks.get("plp")),
                   mlperf=MLPerfConfig.from_params(blocks.get("mlperf")),
                   answer=AnswerConfig.from_params(blocks.get("answer")))


def completion_text(c) -> str:
    """The text of one completion as TRL passes it: a string, or a conversational list of
    messages (``[{"role": "assistant", "content": "..."}]``: the last message's content), or one
    message dict. A content given as parts (``[{"type": "text", "text": ...}]``) is joined.

    Raises TypeError for anything else (a programming error, not a bad completion).
    """
    if isinstance(c, str):
        return c
    if isinstance(c, dict):
        return _content_text(c.get("content", ""))
    if isinstance(c, (list, tuple)):
        if not c:
            return ""
        last = c[-1]
        if isinstance(last, dict):
            return _content_text(last.get("content", ""))
    raise TypeError(f"completion must be a str or a list of chat messages, got {type(c).__name__}")


def question_text(prompt) -> str:
    """The question of one prompt as TRL passes it: a string, or the last message's content of a
    conversational prompt (as ``completion_text``); ``""`` for None or any other shape (the
    question only excuses restated values, so an unreadable one excuses nothing)."""
    try:
        return "" if prompt is None else completion_text(prompt)
    except TypeError:
        return ""


def _content_text(content) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, (list, tuple)):
        return "".join(p.get("text", "") if isinstance(p, dict) else str(p) for p in content)
    return str(content)


def _column(name: str, values, n: int) -> list:
    if values is None:
        raise ValueError(f"task_reward: column '{name}' is required")
    if isinstance(values, str) or not hasattr(values, "__len__"):
        values = [values] * n
    values = list(values)
    if len(values) != n:
        raise ValueError(f"task_reward: column '{name}' has {len(values)} values for {n} completions")
    return values


def reward_columns(completions, task, answer, label, name: str = "task_reward"):
    """The columns a reward function gets from TRL, checked: ``(texts, tasks, answers, labels)``,
    one per completion (``answer``/``label`` None: a list of None).

    Raises:
        ValueError: ``completions`` or ``task`` missing, or a column of the wrong length.
    """
    if completions is None:
        raise ValueError(f"{name}: completions are required")
    texts = [completion_text(c) for c in completions]
    n = len(texts)
    tasks = _column("task", task, n)
    answers = [None] * n if answer is None else _column("answer", answer, n)
    labels = [None] * n if label is None else _column("label", label, n)
    return texts, tasks, answers, labels


class TaskReward:
    """TRL-compatible reward function dispatching on each sample's task.

    Args:
        config: reward constants (default ``RewardConfig()``).
        scorer: the PLP embedder; None: the process-wide ``get_scorer(...)`` built from
            ``config.plp`` at the first plp sample (the model loads only if plp samples come).

    ``__name__`` is ``"task_reward"`` (TRL names the logged reward column after it).
    """

    __name__ = "task_reward"

    def __init__(self, config: RewardConfig | None = None, scorer: PLPScorer | None = None):
        self.config = config or RewardConfig()
        self._scorer = scorer

    @property
    def scorer(self) -> PLPScorer:
        if self._scorer is None:
            self._scorer = get_scorer(batch_size=self.config.plp.batch_size,
                                      max_chars=self.config.plp.embed_max_chars)
        return self._scorer

    def __call__(self, prompts=None, completions=None, task=None, answer=None, label=None,
                 **kwargs) -> list[float]:
        """Rewards of a batch.

        Args:
            prompts: list of N prompts (strings or conversational message lists; the last
                message's content is the question), or None. Only mlperf uses them: the values
                the question gives are not counted as hedged candidates (``mlperf_reward``).
            completions: list of N completions (strings or conversational message lists).
            task: list of N task names (or one name for all).
            answer: list of N reference answers (mlperf, plp; may be None for race samples).
            label: list of N race labels ("yes"/"no"; may be None for other tasks).
            **kwargs: other dataset columns TRL forwards (ignored).

        Returns:
            N floats, in order.

        Raises:
            ValueError: missing/mismatched columns, an unknown task (named), a bad race label.
        """
        texts, tasks, answers, labels = reward_columns(completions, task, answer, label)
        n = len(texts)
        questions = [""] * n if prompts is None else [
            question_text(p) for p in _column("prompts", prompts, n)]
        from hargo.tasks import RewardBatch, get_task

        by_task: dict[str, list[int]] = {}
        for i, t in enumerate(tasks):
            by_task.setdefault(check_task(t, f"completion {i}"), []).append(i)
        out: list[float | None] = [None] * n
        for t, idx in by_task.items():
            batch = RewardBatch(index=idx, texts=[texts[i] for i in idx],
                                answers=[answers[i] for i in idx],
                                labels=[labels[i] for i in idx],
                                questions=[questions[i] for i in idx], reward_fn=self)
            vals = get_task(t).reward(batch)
            if len(vals) != len(idx):
                raise ValueError(f"task_reward: task {t!r} returned {len(vals)} rewards for "
                                 f"{len(idx)} completions")
            for i, v in zip(idx, vals):
                out[i] = v
        return [float(scale_degenerate(v, self.degenerate(text, t), self.config.answer))
                for v, text, t in zip(out, texts, tasks)]

    def degenerate(self, completion: str, task: str) -> str | None:
        """Why ``completion`` is a degenerate answer to ``task`` (``"over_budget"``,
        ``"repetitive"``) or None: ``hargo.rewards.text.degenerate`` with
        ``config.answer``. A degenerate completion's positive reward is multiplied by
        ``config.answer.degenerate_scale``; the metrics count it as no answer."""
        return degenerate(read_answer(completion), task, self.config.answer)

    def plp_similarity(self, completions: list, references: list[str]) -> list[float]:
        """Plain MiniLM cosine of each completion with its reference (the PLP metric)."""
        return self.scorer.similarity([completion_text(c) for c in completions], list(references))

