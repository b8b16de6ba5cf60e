"""``hargo check-params``'s steps; the command itself (its options, help text and order of steps)
is :func:`hargo.cli.check_params`. Here: the checks beyond the typed config's fields (each
method's estimator, loss and KL names; the path knobs dvc.yaml declares), the stale stamp a
failed check by hand removes, what a check that writes no stamp says, and ``--explain``'s field
lines. A failed check is one red line on stderr and exit 2, as in every command.

Imports (inside the functions): :mod:`hargo.config`, :mod:`hargo.methods` and :mod:`hargo.params`;
nothing of the stages (the ``params`` stage lists this module among its deps: dvc.yaml).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, List, Optional

import typer

if TYPE_CHECKING:
    from hargo.config import Config

__all__ = ["check_methods_and_paths", "forget_stamp", "warn_learning_rates", "report_unstamped",
           "explain_fields"]


def check_methods_and_paths(checked: "Config") -> None:
    """The checks of the typed config ``checked`` that its fields cannot make: each
    method of ``rl.methods`` and ``compare.methods`` names an estimator, loss and KL estimator
    that exist (a typo in a method module), and no path knob leaves where dvc.yaml declares it
    (:func:`hargo.config.dvc_paths.check_pipeline_paths`).

    Raises:
        typer.Exit: code 2, after one red ``error: ...`` line."""
    from hargo.methods import get_method
    from hargo.methods._check import check_method_names

    cfg = checked
    compared = cfg.compare.methods if cfg.compare is not None else ()
    for name in dict.fromkeys([*cfg.rl.methods, *compared]):
        try:   # a typo in a method module's estimator / loss / KL name
            check_method_names(get_method(name))
        except ValueError as e:
            typer.secho(f"error: method {name!r}: {e}", fg="red", err=True)
            raise typer.Exit(2)
    from hargo.config.dvc_paths import check_pipeline_paths
    from hargo.params import ParamsError

    try:     # a path knob where dvc.yaml does not declare it: refused before any stage runs
        check_pipeline_paths(checked)
    except ParamsError as e:
        typer.secho(f"error: {e}", fg="red", err=True)
        raise typer.Exit(2)


def forget_stamp(params: str) -> None:
    """After a failed check of the pipeline's own params file ``params`` run by hand: remove the
    stamp an earlier check wrote (it would say the file passed) and say so. Under DVC
    (``$DVC_STAGE`` set) the stamp stays: DVC records nothing for a failed stage."""
    import os

    from hargo.params import CHECKED_STAMP, drop_checked_stamp

    if "DVC_STAGE" not in os.environ and drop_checked_stamp():
        typer.secho(f"removed {CHECKED_STAMP}: it said an earlier {params} passed",
                    fg="yellow", err=True)


def warn_learning_rates(checked: "Config") -> None:
    """One yellow warning line per implausible learning rate of the typed config ``checked``
    (:func:`hargo.params.implausible_learning_rates` of the file's entries, in its order:
    :func:`hargo.config.params_dict`)."""
    from hargo.config import params_dict
    from hargo.params import implausible_learning_rates

    for w in implausible_learning_rates(params_dict(checked)):
        typer.secho(f"warning: {w}", fg="yellow", err=True)


def report_unstamped(params: str, set_: Optional[List[str]], own: bool) -> None:
    """The line of a check that writes no stamp: ``params`` checked with the overrides ``set_``,
    or another file than the pipeline's params.yaml (``own`` False)."""
    from hargo.params import CHECKED_STAMP

    what = f"{params} with {', '.join(set_)}" if set_ else params
    why = "" if own else f": {CHECKED_STAMP} is params.yaml's, the pipeline's params file"
    typer.echo(f"{what}: valid (nothing written{why})")


def explain_fields(key: str) -> None:
    """Print the typed config's field lines (:func:`hargo.config.explain`) for ``key`` by
    dotted segments: the field ``key`` and the fields under it (``rl.hargo`` gives
    ``rl.hargo`` and ``rl.hargo.*``, not ``rl.hargo_b1``: issue 42); ``''`` lists them all. A
    task's entry of a per-task map (``rl.max_new_tokens.race_c``, which ``-S`` takes) prints
    the map's line, noting the entry. Only where no field is ``key``, the keys that start with
    it (an abbreviation: ``rl.ste`` gives ``rl.steps``).

    Raises:
        typer.Exit: code 2 when no field's key starts with ``key``, after an error line naming
            the nearest keys."""
    import difflib

    from hargo.config import explain as explain_lines
    from hargo.config.loading import declared

    lines = explain_lines()
    keys = [line.split(" ", 1)[0].rstrip(":") for line in lines]
    hits = [line for line, k in zip(lines, keys)
            if not key or k == key or k.startswith(key + ".")]
    if not hits and "." in key and declared(key):      # a per-task map's entry
        field, task = key.rsplit(".", 1)
        hits = [f"{line}  [{key}: the entry for task {task!r} of this per-task map]"
                for line, k in zip(lines, keys) if k == field]
    if not hits:   # no field by that name: an abbreviation of one (rl.ste -> rl.steps)
        hits = [line for line, k in zip(lines, keys) if k.startswith(key)]
    if not hits:
        near = difflib.get_close_matches(key, keys, n=3, cutoff=0.6)
        typer.secho(f"error: --explain {key}: no field's key starts with it"
                    + (f"; did you mean {', '.join(near)}?" if near else
                       "; hargo check-params --explain '' lists them all"), fg="red", err=True)
        raise typer.Exit(2)
    for line in hits:
        typer.echo(line)
