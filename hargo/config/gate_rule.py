"""The promotion gate's params rule: which ``register`` values the gate (:mod:`hargo.gate`)
accepts. It lives in the config package, below the gate, so that checking params.yaml (the
``params`` stage, :class:`hargo.config.Register`) imports no gate, statistics or numpy;
:mod:`hargo.gate` imports :func:`gate_metrics`, :class:`GateParams` and
:func:`check_gate_params` from here. Imports only :mod:`hargo.param_values`,
:mod:`hargo.config.names` and (for the metric list, from the task registry)
:mod:`hargo.config.registries`.
"""
from __future__ import annotations

import math
from typing import Mapping, NamedTuple

from hargo.config.names import check_model_name
from hargo.param_values import ParamsError

__all__ = ["gate_metrics", "GateParams", "check_gate_params"]


def gate_metrics() -> tuple[str, ...]:
    """Metrics of metrics/eval.json that can gate the champion, all higher-is-better
    (:mod:`hargo.gate` computes each from the per-prompt rows): the registered tasks' metrics of
    the ``gate`` view (:func:`hargo.tasks.headline_metrics`; the built-ins: ``dr_f1``,
    ``dr_precision``, ``dr_recall``, ``dr_f1_race_c``, ``dr_f1_race_fortran``,
    ``plp_similarity``, ``mlperf_em``), then ``avg_score``, ``win_rate`` and
    ``accuracy_<task>`` of each task. Read from the registry when called."""
    from hargo.config.registries import task_metric_keys, task_names

    return task_metric_keys("gate") + ("avg_score", "win_rate") + tuple(
        f"accuracy_{t}" for t in task_names())


class GateParams(NamedTuple):
    """The ``register`` params the gate reads (:func:`check_gate_params`)."""
    model_name: str
    gate_metrics: list[str]
    tolerance: float
    resamples: int
    confidence: float


def check_gate_params(params_register: Mapping) -> GateParams:
    """:class:`GateParams` from params.yaml ``register`` (``tolerance`` defaults to 0,
    ``resamples`` to 2000, ``confidence`` to 0.95).

    Raises:
        ParamsError: (a ValueError) empty model name or one MLflow's registry refuses
            (:func:`hargo.config.names.check_model_name`), unknown gate metric (names it and the
            valid ones), a negative or non-numeric tolerance, ``resamples`` not an integer
            >= 100, ``confidence`` outside (0, 1); each message names its ``register.<key>``.
    """
    name = params_register.get("model_name")
    if not isinstance(name, str) or not name.strip():
        raise ParamsError(f"register.model_name: expected a non-empty name, got {name!r}")
    check_model_name("register.model_name", name)      # MLflow's rule (hargo/config/names.py)
    gates = params_register.get("gate_metrics")
    if not isinstance(gates, list) or not gates:
        raise ParamsError(f"register.gate_metrics: expected a non-empty list, got {gates!r}")
    valid = gate_metrics()
    for g in gates:
        if g not in valid:
            raise ParamsError(f"register.gate_metrics: unknown gate metric {g!r}; valid "
                              f"(higher is better): {', '.join(valid)}")
    tol = params_register.get("tolerance", 0.0)
    if isinstance(tol, bool) or not isinstance(tol, (int, float)) or not math.isfinite(tol) \
            or tol < 0:
        raise ParamsError(f"register.tolerance: expected a finite number >= 0, got {tol!r}")
    res = params_register.get("resamples", 2000)
    if isinstance(res, bool) or not isinstance(res, int) or res < 100:
        raise ParamsError(f"register.resamples: expected an integer >= 100 (bootstrap "
                          f"resamples), got {res!r}")
    conf = params_register.get("confidence", 0.95)
    if isinstance(conf, bool) or not isinstance(conf, (int, float)) or not 0.0 < conf < 1.0:
        raise ParamsError(f"register.confidence: expected a number in (0, 1), got {conf!r}")
    return GateParams(name, list(gates), float(tol), int(res), float(conf))
