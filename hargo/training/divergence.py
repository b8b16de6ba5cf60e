"""Stop a training run that diverges, before anything of it is saved.

A run with ``rl.learning_rate=1e3`` used to exit 0 with a loss of 3.1e23, a KL of 9.7e24 and a
gradient norm of 5,164 at its second step, save the wrecked model and mark its MLflow run
FINISHED. Every trainer hargo builds (SFT, every RL method, the preference trainers, the
synthetic runs) now carries :class:`DivergenceGuard`: at each logged step it checks the loss, the
KL to the reference model and the gradient norm (before clipping) against
``train.divergence`` and raises :class:`TrainingDiverged` at the first value that is non-finite
or past its bound. The exception leaves the trainer before the step's checkpoint or the final
save, so the stage writes no output, and the stage's MLflow run ends FAILED with the message in
its ``hargo.error`` tag (:func:`hargo.tracking.stage_run`).

Bounds (params.yaml ``train.divergence``; defaults far above healthy runs, measured on this
project's runs: SFT loss <= ln(vocabulary) at the first step, ~11 for SmolLM2 and ~6 for the
tiny policy; gradient norms <= ~20 in SFT and RL; per-token KL <= ~0.8 in the longest synthetic
runs at lr 2e-4):

- ``max_loss``: |loss| above this is divergence (100);
- ``max_kl``: mean per-token KL above this (10 nats);
- ``max_grad_norm``: gradient norm above this (1,000; the divergent run above: 5,164).

transformers' ``logging_nan_inf_filter`` (default on) replaces a NaN/inf loss in the logs with
the window's mean, which would hide a non-finite loss from this guard: hargo's trainers turn it
off (the guard checks what was computed).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping

from transformers import TrainerCallback

__all__ = ["TrainingDiverged", "DivergenceBounds", "check_logs", "DivergenceGuard"]


class TrainingDiverged(RuntimeError):
    """A training run's loss, KL or gradient norm became non-finite or crossed its bound."""


@dataclass(frozen=True)
class DivergenceBounds:
    """``train.divergence`` (module docstring): each a positive finite number."""

    max_loss: float = 100.0
    max_kl: float = 10.0
    max_grad_norm: float = 1000.0

    def __post_init__(self):
        for name in ("max_loss", "max_kl", "max_grad_norm"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                raise ValueError(f"train.divergence.{name}: must be a finite number > 0, "
                                 f"got {v!r}")

    @classmethod
    def from_params(cls, params: Mapping) -> "DivergenceBounds":
        """From ``params["train"]["divergence"]`` (missing: the defaults).

        Raises:
            ValueError: an unknown key (named) or a bad bound.
        """
        d = dict((params.get("train") or {}).get("divergence") or {})
        unknown = sorted(set(d) - set(cls.__dataclass_fields__))
        if unknown:
            raise ValueError(f"train.divergence: unknown key(s) {unknown}; valid: "
                             f"{sorted(cls.__dataclass_fields__)}")
        return cls(**{k: float(v) for k, v in d.items()})


#: logged key -> the bound it is checked against (TRL's and transformers' log keys)
_CHECKED = (("loss", "max_loss"), ("kl", "max_kl"), ("grad_norm", "max_grad_norm"))


def check_logs(logs: Mapping, bounds: DivergenceBounds) -> str | None:
    """What in one step's ``logs`` says the run diverged, or None.

    Args:
        logs: the dict a ``TrainerCallback.on_log`` receives (``loss``, ``kl``, ``grad_norm``,
            ...; missing keys and non-numbers are not checked).
        bounds: the bounds.

    Returns:
        e.g. ``"loss = 3.1e+23 (bound |loss| <= 100)"`` or ``"grad_norm = nan (non-finite)"``.
    """
    for key, bound_name in _CHECKED:
        v = logs.get(key)
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            continue
        if not math.isfinite(v):
            return f"{key} = {v} (non-finite)"
        bound = getattr(bounds, bound_name)
        if abs(v) > bound:
            return f"{key} = {v:.4g} (bound |{key}| <= {bound:g}, train.divergence.{bound_name})"
    return None


class DivergenceGuard(TrainerCallback):
    """Raise :class:`TrainingDiverged` at the first logged step whose loss, KL or gradient norm
    is non-finite or past ``bounds`` (module docstring). ``what`` names the run in the message
    (e.g. ``"rl (hargo)"``)."""

    def __init__(self, bounds: DivergenceBounds, what: str = "training"):
        self.bounds = bounds
        self.what = what

    def on_log(self, args, state, control, logs=None, **kwargs):
        problem = check_logs(logs or {}, self.bounds)
        if problem is not None:
            raise TrainingDiverged(
                f"{self.what} diverged at step {state.global_step}: {problem}; learning rate "
                f"{args.learning_rate:g}. Nothing of this run was saved. Lower the learning "
                "rate, or raise the bound if the value is healthy for this model")
