"""hargo's vocabulary: the tasks, defined once.

Everything that lists tasks (params validation, the CLI's help, the metrics, the report) imports
them from here.

Tasks (the four HPC-GPT fine-tuning files):

``race_c``, ``race_fortran``
    yes/no data-race detection on C and Fortran kernels (the *race tasks*: a 0/1 reward).
``mlperf``
    short facts about MLPerf benchmarks (tiered partial credit).
``plp``
    sentence-length answers about programming-language processing (embedding similarity).

Methods are not listed here: each is a registered object of :mod:`hargo.methods` (one module
per method or family), and whatever lists methods asks that registry.
"""
from __future__ import annotations

__all__ = ["TASKS", "RACE_TASKS", "TASK_DESCRIPTIONS", "is_race"]

TASKS: tuple[str, ...] = ("race_c", "race_fortran", "mlperf", "plp")
RACE_TASKS: tuple[str, ...] = ("race_c", "race_fortran")
TASK_DESCRIPTIONS: dict[str, str] = {
    "race_c": "data race yes/no, C kernels",
    "race_fortran": "data race yes/no, Fortran kernels",
    "mlperf": "MLPerf facts, short answers",
    "plp": "programming-language processing, sentence-length answers",
}


def is_race(task: str) -> bool:
    """Whether ``task`` is a yes/no race task."""
    return task in RACE_TASKS
