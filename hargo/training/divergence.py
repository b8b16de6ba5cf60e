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

The training record: every model folder a training stage saves (SFT, RL, the preference methods)
holds ``training_record.json`` (:func:`training_record`, written inside the folder's atomic write
by :func:`hargo.models.loading.save_merged`): the bounds in force, how many logged steps were
checked and the peak |value| of each checked quantity with its step, over the run's whole log
history (a resumed run's too). The ``register`` stage reads it (:func:`check_training_record`)
and refuses a model whose record says it diverged or whose peaks are past the bounds in force at
registration (a run trained with raised bounds), or that has no record (a folder not saved by a
training stage).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Mapping, Sequence

from transformers import TrainerCallback

from hargo.config import Divergence

if TYPE_CHECKING:
    from hargo.config import Config

__all__ = ["TrainingDiverged", "DivergenceBounds", "check_logs", "DivergenceGuard",
           "TRAINING_RECORD", "training_record", "check_training_record"]

#: the file in every model folder a training stage saves (:func:`training_record`)
TRAINING_RECORD = "training_record.json"


class TrainingDiverged(RuntimeError):
    """A training run's loss, KL or gradient norm became non-finite or crossed its bound."""


_DEFAULTS = Divergence()     # the typed config's defaults (params.yaml train.divergence)


@dataclass(frozen=True)
class DivergenceBounds:
    """``train.divergence`` (module docstring): each a positive finite number; the defaults are
    the typed config's (:class:`hargo.config.Divergence`). :meth:`from_params` reads them from
    the typed config."""

    max_loss: float = _DEFAULTS.max_loss
    max_kl: float = _DEFAULTS.max_kl
    max_grad_norm: float = _DEFAULTS.max_grad_norm

    def __post_init__(self):
        for name in ("max_loss", "max_kl", "max_grad_norm"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                raise ValueError(f"train.divergence.{name}: must be a finite number > 0, "
                                 f"got {v!r}")

    @classmethod
    def of(cls, divergence: Divergence) -> "DivergenceBounds":
        """From the typed ``train.divergence`` block."""
        return cls(max_loss=float(divergence.max_loss), max_kl=float(divergence.max_kl),
                   max_grad_norm=float(divergence.max_grad_norm))

    @classmethod
    def from_params(cls, params: "Config") -> "DivergenceBounds":
        """From ``train.divergence`` of the typed config ``params`` (:class:`hargo.config.Config`;
        params.yaml leaving ``divergence`` out: the defaults). The bounds were checked when the
        config was built (an unknown key or a bad bound is refused there, by its dotted key:
        ``train.divergence.max_gradnorm: unknown key``), so this raises nothing."""
        return cls.of(params.train.divergence)


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


def training_record(log_history: Sequence[Mapping], bounds: DivergenceBounds) -> dict:
    """The training record of a run from its trainer's ``state.log_history``.

    Args:
        log_history: transformers' ``TrainerState.log_history``: one dict per logged step with
            ``step`` and some of ``loss``, ``kl``, ``grad_norm`` (other keys ignored).
        bounds: the bounds the run was checked against.

    Returns:
        ``{"diverged": bool, "problem": str | None, "bounds": {...}, "logged_steps": int,
        "peaks": {key: {"value": max |v|, "step": step}}}``; ``problem`` is the first logged
        step's :func:`check_logs` finding (``"step 2: loss = ..."``), ``diverged`` whether
        there is one. A non-finite value is its own peak.
    """
    peaks: dict[str, dict] = {}
    problem = None
    logged = 0
    for logs in log_history:
        seen = False
        for key, _ in _CHECKED:
            v = logs.get(key)
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                continue
            seen = True
            a = abs(float(v))
            old = peaks.get(key)
            if old is not None and not math.isfinite(old["value"]):
                continue   # the first non-finite value stays the peak
            if old is None or not math.isfinite(a) or a > old["value"]:
                peaks[key] = {"value": a, "step": int(logs.get("step", 0))}
        logged += seen
        if problem is None and seen:
            found = check_logs(logs, bounds)
            if found is not None:
                problem = f"step {int(logs.get('step', 0))}: {found}"
    return {"diverged": problem is not None, "problem": problem, "bounds": asdict(bounds),
            "logged_steps": logged, "peaks": peaks}


def check_training_record(model_dir: str | Path, bounds: DivergenceBounds,
                          what: str = "model folder") -> dict:
    """Read ``model_dir/training_record.json`` and refuse a model that diverged.

    Refused: no record, a record that is not a JSON object with ``diverged`` and ``peaks``, a
    record that says ``diverged``, and a peak that is non-finite or past ``bounds`` (the bounds
    in force now, which may be lower than those the run was trained under).

    Returns:
        The record.

    Raises:
        hargo.io.HargoInputError: naming the file and the field (``diverged`` or
            ``peaks.<key>``) and the value and step.
    """
    import json

    from hargo.io import HargoInputError

    path = Path(model_dir) / TRAINING_RECORD
    if not path.is_file():
        raise HargoInputError(path, f"{what} has no training record: only a model saved by a "
                              "hargo training stage (which records whether it diverged) can be "
                              "registered; re-run the stage that trains it")
    try:
        rec = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise HargoInputError(path, f"not a readable JSON training record ({e})") from None
    if not (isinstance(rec, dict) and isinstance(rec.get("diverged"), bool)
            and isinstance(rec.get("peaks"), dict)):
        raise HargoInputError(path, "not a training record (needs 'diverged' true/false and "
                              "'peaks')")
    if rec["diverged"]:
        raise HargoInputError(path, f"{what} diverged in training ({rec.get('problem')}): not "
                              "registered", field="diverged")
    for key, bound_name in _CHECKED:
        peak = rec["peaks"].get(key)
        if peak is None:
            continue
        v = peak.get("value") if isinstance(peak, dict) else None
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise HargoInputError(path, f"peak of {key} is not a number: {peak!r}",
                                  field=f"peaks.{key}")
        bound = getattr(bounds, bound_name)
        if not math.isfinite(v) or abs(v) > bound:   # a peak is |value|; a crafted -5e6 too
            raise HargoInputError(
                path, f"{what} diverged in training: |{key}| reached {v:.4g} at step "
                f"{peak.get('step')}, past train.divergence.{bound_name} = {bound:g}; not "
                "registered", field=f"peaks.{key}")
    return rec
