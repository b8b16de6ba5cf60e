"""Completion budgets per task: how many new tokens a rollout or an evaluation may generate.

The tasks' reference answers differ ~65x in length (``data/prepared/stats.json``
``answer_length``): a race answer is one word, an MLPerf fact a few, a PLP answer a sentence or
two. One budget for every task either cuts PLP answers (the RL default used to be 16 tokens for
all) or lets race completions ramble at the cost of the longest. A budget is therefore either one
integer (every task) or a mapping with one integer per task::

    rl:
      max_new_tokens: {race_c: 4, race_fortran: 4, mlperf: 32, plp: 64}

A budget is a *cap*: a completion ends at its end-of-sequence token or at its task's budget,
whichever comes first. Evaluation: vLLM gets one ``SamplingParams`` per budget, transformers runs
each batch to its largest. RL with transformers runs each step's generation to the largest
budget among its tasks (a step without a long-budget task is shorter); RL with vLLM generates to
the largest budget of all tasks and cuts each completion after. Pure Python.

A task may carry its own default (``hargo.tasks.Task.max_new_tokens`` /
``max_prompt_tokens``): a per-task mapping need not name such a task, which then gets its
default. The HPC-GPT tasks have none, so every mapping names them (their budgets are tuned in
params.yaml).
"""
from __future__ import annotations

from typing import Mapping, Sequence

from hargo.param_values import ParamsError

__all__ = ["check_budget", "max_budget", "task_budget", "row_budgets",
           "budget_record", "describe_budget"]


def _default(task: str, key: str) -> int | None:
    """The registered ``task``'s default for the budget ``key`` (None: unknown task, or none)."""
    from hargo.tasks import UnknownTaskError, get_task

    try:
        return get_task(task).default_budget(key)
    except UnknownTaskError:
        return None


def check_budget(value, key: str, tasks: Sequence[str] | None = None):
    """``value`` validated as a budget: an integer >= 1, or a non-empty mapping of task names to
    integers >= 1 (when ``tasks`` is given, only those tasks, and every one of them that has no
    default of its own for ``key``: ``hargo.tasks.Task.default_budget``).

    Returns:
        the int, or a plain ``dict`` (task -> int).

    Raises:
        ParamsError: anything else, naming ``key`` (and ``key.<task>``).
    """
    def one(v, k: str) -> int:
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ParamsError(f"{k}: expected an integer >= 1, got {v!r}")
        return int(v)

    if isinstance(value, Mapping):
        if not value:
            raise ParamsError(f"{key}: an empty mapping; give an integer or one per task")
        out = {str(t): one(v, f"{key}.{t}") for t, v in value.items()}
        if tasks is not None:
            missing = [t for t in tasks if t not in out and _default(t, key) is None]
            unknown = [t for t in out if t not in tasks]
            if missing or unknown:
                raise ParamsError(f"{key}: needs one budget per task {list(tasks)}"
                                  + (f"; missing {missing}" if missing else "")
                                  + (f"; unknown {unknown}" if unknown else ""))
        return out
    return one(value, key)


def max_budget(value, key: str = "max_new_tokens") -> int:
    """The largest budget (what a batch of mixed tasks may run to): of a mapping, its values'
    and the defaults for ``key`` of the registered tasks it does not name."""
    if not isinstance(value, Mapping):
        return int(value)
    from hargo.tasks import tasks

    defaults = [t.default_budget(key) for t in tasks(None) if t.name not in value]
    return max([*value.values(), *(d for d in defaults if d is not None)])


def task_budget(value, task: str, key: str = "max_new_tokens") -> int:
    """The budget of ``task``: the int, the mapping's entry, or for a task the mapping does not
    name, the task's own default for ``key`` (``hargo.tasks.Task.default_budget``).

    Raises:
        ParamsError: a mapping without ``task`` for a task without a default (names
            ``key.<task>``).
    """
    if not isinstance(value, Mapping):
        return int(value)
    if task not in value and _default(task, key) is not None:
        return int(_default(task, key))
    if task not in value:
        raise ParamsError(f"{key}.{task}: no budget for task {task!r} (given for "
                          f"{sorted(value)})")
    return int(value[task])


def row_budgets(value, tasks: Sequence[str], key: str = "max_new_tokens") -> list[int]:
    """One budget per row, for rows of the given tasks."""
    return [task_budget(value, t, key) for t in tasks]


def budget_record(value):
    """The JSON form of a budget for metrics and the evaluation identity: the int, or a dict with
    sorted task keys (so equal budgets compare and hash equal)."""
    return {t: int(value[t]) for t in sorted(value)} if isinstance(value, Mapping) else int(value)


def describe_budget(value) -> str:
    """``"16"`` or ``"race_c 4, race_fortran 4, mlperf 32, plp 64"`` for a console line."""
    if not isinstance(value, Mapping):
        return str(int(value))
    return ", ".join(f"{t} {int(v)}" for t, v in value.items())
