"""hargo's vocabulary of tasks, read from the task registry (:mod:`hargo.tasks`).

Each task is a registered :class:`hargo.tasks.Task` (one module of ``hargo/tasks/`` per task or
task family); the names here are views of that registry, computed when asked (``TASKS`` read
after a new task module is registered includes it):

``TASKS``
    the HPC-GPT tasks, in listing order (``race_c``, ``race_fortran``, ``mlperf``, ``plp``).
``RACE_TASKS``
    the yes/no tasks among them (kind ``yes_no``: the pooled Data Race F1 of
    :mod:`hargo.metrics`).
``TASK_DESCRIPTIONS``
    ``{task: description}``.

Methods are not listed here either: each is a registered object of :mod:`hargo.methods`.
"""
from __future__ import annotations

__all__ = ["TASKS", "RACE_TASKS", "TASK_DESCRIPTIONS", "is_race"]


def __getattr__(name: str):
    """``TASKS``, ``RACE_TASKS``, ``TASK_DESCRIPTIONS`` from the registry (module docstring)."""
    from hargo.tasks import tasks

    if name == "TASKS":
        return tuple(t.name for t in tasks())
    if name == "RACE_TASKS":
        return tuple(t.name for t in tasks() if t.kind == "yes_no")
    if name == "TASK_DESCRIPTIONS":
        return {t.name: t.description for t in tasks()}
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def is_race(task: str) -> bool:
    """Whether ``task`` is a registered yes/no HPC-GPT task (one of ``RACE_TASKS``)."""
    from hargo.tasks import tasks

    return any(t.name == task and t.kind == "yes_no" for t in tasks())
