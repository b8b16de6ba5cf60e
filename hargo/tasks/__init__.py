"""hargo's tasks as plug-ins: each task is one :class:`Task` object, registered by the module of
``hargo/tasks/`` that defines it, and everything that lists, rewards or scores tasks asks this
registry (the reward's dispatch, the metrics, training's accuracy, the data checks, the
comparison's aggregates, the params checks of the per-task maps).

Modules: ``race`` (race_c, race_fortran), ``mlperf``, ``plp``, ``synthetic`` (syn_yesno,
syn_short, syn_long). The package finds its modules itself (:func:`pkgutil.iter_modules` over
the package's ``__path__``, on the first query), so a new task is one new module here that calls
:func:`register_task`. docs/development.md, "Add a task", has the recipe.

Public API:

:func:`register_task`
    add a :class:`Task` (a module does this at import); a name can be registered once.
:func:`get_task`
    the task of a name; an unknown name raises :class:`UnknownTaskError` naming it and listing
    the valid names. An unknown task is an error everywhere, never PLP.
:func:`tasks` / :func:`task_names`
    the registered tasks in listing order (:attr:`Task.rank`, then name); the HPC-GPT tasks
    (``synthetic=False``) by default, the synthetic test-bed ones with ``synthetic=True``, all
    with ``synthetic=None``.
:func:`headline_metrics` / :func:`metric_tasks`
    the :class:`Metric` columns of one headline table (``hargo summary``, the DVC headline, the
    comparison report, the gate's metric list), built from every HPC-GPT task's
    :attr:`Task.headline` when asked; the tasks whose rows one metric pools.

Importing this package is cheap (no torch): the task modules import ``hargo.rewards`` lazily.
"""
from __future__ import annotations

import sys
from typing import Any

from hargo.plugins import discover, register

from hargo.tasks.base import (FULL_REWARD_TOL, KINDS, STATISTICS, VIEWS, Metric, RewardBatch,
                              ScoreBatch, Task)

__all__ = ["Task", "Metric", "KINDS", "VIEWS", "STATISTICS", "RewardBatch", "ScoreBatch",
           "FULL_REWARD_TOL", "UnknownTaskError", "register_task", "get_task", "tasks",
           "task_names", "headline_metrics", "metric_tasks", "mean"]

_REGISTRY: dict[str, Task] = {}
_discovered = False


class UnknownTaskError(ValueError):
    """A task name that is not registered (or not of the kind asked for)."""


def mean(xs) -> float | None:
    """The mean of ``xs`` as a float, None when empty (a metric of an absent task)."""
    xs = list(xs)
    return float(sum(xs) / len(xs)) if xs else None


def register_task(task: Task) -> Task:
    """Register ``task`` and return it (refused: a name taken, not a :class:`Task`;
    :func:`hargo.plugins.register` raises)."""
    return register(_REGISTRY, task, Task, "hargo.tasks.Task")


def _discover() -> None:
    """Import every module of this package once (each registers its tasks)."""
    discover(sys.modules[__name__])


def tasks(synthetic: bool | None = False) -> tuple[Task, ...]:
    """The registered tasks in listing order (:attr:`Task.rank`, then name): the HPC-GPT tasks
    (default), the synthetic test-bed tasks (``synthetic=True``) or all (None)."""
    _discover()
    return tuple(sorted((t for t in _REGISTRY.values()
                         if synthetic is None or t.synthetic == synthetic),
                        key=lambda t: (t.rank, t.name)))


def task_names(synthetic: bool | None = False) -> tuple[str, ...]:
    """Names of :func:`tasks`."""
    return tuple(t.name for t in tasks(synthetic))


def get_task(name: Any, where: str = "", synthetic: bool | None = None) -> Task:
    """The registered task ``name`` (of the kind asked for by ``synthetic``: see :func:`tasks`).

    Args:
        where: where the name was read (a record id, a completion's position), put in the error.

    Raises:
        UnknownTaskError: unknown name; the message names it (and ``where``) and lists the
            valid names.
    """
    _discover()
    t = _REGISTRY.get(name) if isinstance(name, str) else None
    if t is None or (synthetic is not None and t.synthetic != synthetic):
        loc = f" ({where})" if where else ""
        raise UnknownTaskError(f"unknown task {name!r}{loc}; valid tasks: "
                               f"{list(task_names(synthetic))}")
    return t


def headline_metrics(view: str) -> tuple[Metric, ...]:
    """The columns of one headline table: the :class:`Metric` objects of the HPC-GPT tasks'
    :attr:`Task.headline` that show in ``view`` (:meth:`Metric.shows_in`), each key once (the
    first task's, in listing order), ordered by the metric's rank (its task's when None), then
    the tasks' order, then the order of declaration. The tables add their own columns that are
    no task's (``avg_score``, ``win_rate``, ``accuracy_<task>``, ...).

    Raises:
        ValueError: ``view`` is not one of :data:`VIEWS`.
    """
    if view not in VIEWS:
        raise ValueError(f"headline_metrics: unknown view {view!r} (valid: {', '.join(VIEWS)})")
    seen: dict[str, tuple] = {}
    for i, t in enumerate(tasks()):
        for j, m in enumerate(t.headline):
            if m.key not in seen:
                seen[m.key] = (t.rank if m.rank is None else m.rank, i, j, m)
    return tuple(m for *_, m in sorted(seen.values(), key=lambda x: x[:3]) if m.shows_in(view))


def metric_tasks(key: str) -> tuple[str, ...]:
    """The HPC-GPT tasks whose :attr:`Task.headline` declares metric ``key`` (listing order):
    the tasks whose rows the metric pools (``dr_f1``: race_c and race_fortran)."""
    return tuple(t.name for t in tasks() if any(m.key == key for m in t.headline))
