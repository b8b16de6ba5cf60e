"""What the typed config (:mod:`hargo.config`) asks the plug-in registries and the budget rules:
which methods have a params block, which tasks a per-task map may name, how a budget is checked.
One module for these look-ups, so the config's module imports no registry itself: a stage
that imports the config for its own section does not run the method or task modules because of
it (a stage that does run them lists ``hargo/methods`` / ``hargo/tasks`` in its deps itself;
tests/test_stage_deps.py treats this module as result-neutral, like :mod:`hargo.params`, which
imports the registries too)."""
from __future__ import annotations

from typing import Any

from hargo.param_values import ParamsError

__all__ = ["rl_methods", "compare_methods", "check_method", "task_names", "raw_file_tasks",
           "task_metric_keys",
           "tuned_tasks", "check_budget", "task_budget"]


def rl_methods() -> dict:
    """name -> Method of the RL methods with an ``rl.<name>`` block (a params dataclass)."""
    from hargo.methods import methods

    return {m.name: m for m in methods() if m.is_rl and m.params_class is not None}


def compare_methods() -> dict:
    """name -> Method of the methods with a ``compare.<name>`` block (not RL, a
    ``params_class``: :mod:`hargo.config.compare`'s)."""
    from hargo.methods import methods

    return {m.name: m for m in methods() if not m.is_rl and m.params_class is not None}


def check_method(key: str, name: Any, rl_only: bool = False) -> None:
    """``name`` is a registered method (an RL one with ``rl_only``); the error names ``key``.

    Raises:
        ParamsError: ``<key>: unknown method ...`` listing the valid ones."""
    from hargo.methods import RL_FAMILIES, get_method

    try:
        get_method(name, *(RL_FAMILIES if rl_only else ()))
    except ParamsError as e:
        raise ParamsError(f"{key}: {e}") from None


def task_names(synthetic: bool = False) -> tuple[str, ...]:
    """The registered tasks of one universe, the keys a per-task map may have: the HPC-GPT tasks
    (``synthetic=False``) or the synthetic test bed's (True)."""
    from hargo.tasks import task_names as names

    return names(bool(synthetic))


def task_metric_keys(view: str) -> tuple[str, ...]:
    """The keys of the HPC-GPT tasks' metrics that show in ``view`` (``summary``,
    ``headline``, ``report``, ``gate``), in column order (:func:`hargo.tasks.headline_metrics`).
    """
    from hargo.tasks import headline_metrics

    return tuple(m.key for m in headline_metrics(view))


def raw_file_tasks(synthetic: bool = False) -> list[str]:
    """The tasks of the universe read from the raw HPC-GPT files (``validate.task_counts`` must
    name each; none of the synthetic ones)."""
    from hargo.tasks import tasks

    return [t.name for t in tasks(bool(synthetic)) if t.raw_file]


def tuned_tasks(synthetic: bool = False) -> list[str]:
    """The tasks of the universe without budget defaults of their own: every per-task map must
    name them."""
    from hargo.tasks import tasks

    return [t.name for t in tasks(bool(synthetic)) if t.max_new_tokens is None]


def check_budget(value: Any, key: str, synthetic: bool = False):
    """:func:`hargo.generation_budget.check_budget` against the registered tasks of the universe
    (``synthetic``: the test bed's)."""
    from hargo.generation_budget import check_budget as check

    return check(value, key, task_names(synthetic))


def task_budget(value: Any, task: str, key: str) -> int:
    """:func:`hargo.generation_budget.task_budget`."""
    from hargo.generation_budget import task_budget as budget

    return budget(value, task, key)
