"""Loading and checking ``params.yaml``: the one place the pipeline's knobs live.

Both doors into the pipeline (``dvc repro`` through the CLI, and the Prefect flows) load params
here, apply per-run overrides (``"rl.hargo.beta=0.04"`` style, as ``dvc exp run -S``) and validate
them *before* any work starts, so that a bad value fails fast with the parameter's dotted name.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable, Mapping

from hargo.config import CHARS_PER_TOKEN_BOUND, GENERATION_BACKENDS  # noqa: F401 (public here)
from hargo.config.loading import (ParamsLoader, apply_overrides, get,  # noqa: F401 (public here)
                                  read_params_file)
from hargo.param_values import ParamsError, as_number  # noqa: F401  (public here too)


#: The output of the ``params`` stage (dvc.yaml's first stage; ``hargo check-params``).
CHECKED_STAMP = "reports/params-valid.txt"


def checked_text(params_path: str | Path = "params.yaml") -> str:
    """The stamp's content for ``params_path``: the same for every valid file at that path, so
    a valid change re-runs only the stages that read the changed keys, never the stages
    downstream of the stamp as such."""
    return (f"{Path(params_path).as_posix()} passed hargo.params.validate_params; every stage "
            "of dvc.yaml and compare/dvc.yaml depends on this file\n")


#: The stamp's content for the pipeline's params.yaml (what dvc.lock records).
CHECKED_TEXT = checked_text("params.yaml")


def drop_checked_stamp(root: str | Path = ".") -> bool:
    """Remove :data:`CHECKED_STAMP` under ``root`` (a check by hand that failed: the stamp would
    still say an earlier params.yaml passed). Returns whether there was one. Under DVC
    (``$DVC_STAGE`` set) the CLI keeps it instead: the stage's output is ``persist``, DVC
    records nothing for a failed stage, and the other stages stay up to date."""
    stamp = Path(root) / CHECKED_STAMP
    if stamp.is_file():
        stamp.unlink()
        return True
    return False


def write_checked_stamp(params_path: str | Path = "params.yaml", root: str | Path = ".") -> Path:
    """The ``params`` stage: validate ``params_path`` (:func:`load_params`), then write each RL
    method's resolved knobs (:func:`hargo.resolved_params.write_method_blocks`, what the RL
    stages depend on) and :data:`CHECKED_STAMP` under ``root`` (its text: :func:`checked_text`
    of ``params_path``). Returns the stamp's path.

    Every other stage depends on the stamp, so ``dvc repro`` and ``dvc exp run -S key=value``
    run this stage first: DVC deletes a stage's outputs just before running it, so a value that
    fails here stops the run before any stage's outputs are touched (DVC already removed the
    stamp itself, which makes the next ``dvc repro`` check again).

    Raises:
        FileNotFoundError: ``params_path`` does not exist.
        ParamsError: the first invalid key, by name (:func:`validate_params`).
    """
    from hargo.io import atomic_write_text
    from hargo.resolved_params import write_method_blocks

    params = load_params(Path(root) / params_path)
    write_method_blocks(params, root)       # reports/method-params/<method>.json
    return atomic_write_text(Path(root) / CHECKED_STAMP, checked_text(params_path))


#: The range a learning rate is plausible in, for full fine-tuning and LoRA alike (the paper's
#: SFT uses 2e-5, LoRA recipes 1e-4 to 2e-4, the tiny synthetic policy 1e-3); outside it
#: ``check-params`` warns, since a run at 1e3 diverges at its second step.
PLAUSIBLE_LEARNING_RATE = (1e-7, 1e-2)


def implausible_learning_rates(params: Mapping) -> list[str]:
    """One warning per ``*learning_rate`` parameter outside :data:`PLAUSIBLE_LEARNING_RATE`,
    naming the key, its value and the range (empty: all plausible)."""
    lo, hi = PLAUSIBLE_LEARNING_RATE
    out = []

    def walk(d, prefix):
        for k, v in d.items():
            key = f"{prefix}{k}"
            if isinstance(v, Mapping):
                walk(v, key + ".")
            elif str(k).endswith("learning_rate") and isinstance(v, (int, float)) \
                    and not isinstance(v, bool) and not lo <= v <= hi:
                out.append(f"{key} = {v:g} is outside the plausible range [{lo:g}, {hi:g}]; "
                           "a run may diverge (train.divergence stops it) or not move")

    walk(params, "")
    return out


def load_params(path: str | Path = "params.yaml",
                overrides: Mapping[str, Any] | Iterable[str] | None = None) -> dict:
    """Load ``path``, apply ``overrides`` and validate; the dict, its numbers normalised (the
    typed config of the same file: :func:`hargo.config.load_config`).

    Raises:
        FileNotFoundError: ``path`` does not exist.
        ParamsError: see :func:`validate_params`.
    """
    params = apply_overrides(read_params_file(path), overrides)
    validate_params(params)
    return params


def validate_params(params: Mapping):
    """Check every parameter the stages use, before any of them runs: build the typed config
    (:class:`hargo.config.Config`, whose fields carry the checks), normalising the numbers of
    ``params`` in place (``"1e-5"`` -> ``1e-05``, ``4.0`` -> ``4`` for an integer). Returns the
    :class:`~hargo.config.Config`.

    Raises:
        ParamsError: naming the first bad parameter by its dotted path, e.g.
            ``rl.num_generations: must be >= 2, got 1`` or ``rl.stepz: unknown key (known: ...)``.
    """
    from hargo.config import _build_root

    return _build_root(params)

