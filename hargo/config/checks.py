"""The typed config's checks that belong to other modules' own rules: the promotion gate's
(:func:`hargo.gate.check_gate_params`) and the synthetic test bed's plan
(:func:`hargo.compare.synthetic_plan.plan`). Called lazily by :mod:`hargo.config` when a config
is built; they decide nothing a stage computes (the gate and the test bed read their own
modules), so, like :mod:`hargo.params`, this module is result-neutral for the stages' deps
(tests/test_stage_deps.py) and only the ``params`` stage lists what it imports.
"""
from __future__ import annotations

from typing import Mapping

from hargo.param_values import ParamsError

__all__ = ["gate", "synthetic"]


def gate(register: Mapping) -> None:
    """``register`` by the gate's own rule (one definition: :mod:`hargo.gate`).

    Raises:
        ParamsError: its message (``register.gate_metrics: unknown gate metric ...``)."""
    from hargo.gate import check_gate_params

    try:
        check_gate_params(register)
    except ValueError as e:
        raise ParamsError(str(e)) from None


def synthetic(params: Mapping) -> None:
    """params.yaml ``synthetic`` by the test bed's plan (unknown, missing and bad keys named
    ``synthetic.<block>.<key>``)."""
    from hargo.compare.synthetic_plan import plan

    plan(params)
