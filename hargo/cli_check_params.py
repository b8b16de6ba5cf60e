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

__all__ = ["check_methods_and_paths", "forget_stamp", "undo_experiment_values",
           "warn_learning_rates", "report_unstamped", "explain_fields"]


def check_methods_and_paths(checked: "Config") -> None:
    """The checks of the typed config ``checked`` that its fields cannot make: each
    method of ``rl.methods`` and ``compare.methods`` names an estimator, loss and KL estimator
    that exist (a typo in a method module), no path knob leaves where dvc.yaml declares it
    (:func:`hargo.config.dvc_paths.check_pipeline_paths`), and ``model.source`` is where the
    ``base_model`` stage will find it (:func:`hargo.config.model_source.check_source_reachable`).

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
    from hargo.config.model_source import ModelNotFoundError, check_source_reachable
    from hargo.params import ParamsError

    try:     # a path knob where dvc.yaml does not declare it: refused before any stage runs
        check_pipeline_paths(checked)
        check_source_reachable(checked.model)    # before DVC removes models/base
    except (ParamsError, ModelNotFoundError) as e:
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


def undo_experiment_values(params: str) -> None:
    """After a refused check of the pipeline's own params file ``params`` in a DVC experiment run
    in the workspace (``dvc exp run -S key=value``): put the file back as it was before the
    experiment. DVC writes the ``-S`` values into the workspace's params.yaml before it runs any
    stage and leaves them there when a stage fails, so a refused value stayed in the file and
    failed the next ``dvc exp run -S <other key>`` (issue 42 items 2 and 7).

    DVC keeps no copy of the file as it was, so it is rebuilt: the baseline revision's file
    (``git show $DVC_EXP_BASELINE_REV:params.yaml``) is restored byte for byte when applying the
    run's ``-S`` values to it (DVC's own ``apply_overrides``; the values read from the command
    line of the ``dvc exp run`` process that runs this stage) gives exactly the refused file,
    i.e. the file held nothing but the experiment's values beyond the committed ones. Otherwise
    (the file also held uncommitted edits of the user, or the ``-S`` values cannot be read, as
    under DVC's Python API) nothing is written: that file is the user's, and one yellow line says
    which commands show and undo the experiment's values. A temporary workspace (``--temp``,
    ``--queue``: the stage runs in a copy under ``.dvc/tmp/exps`` that DVC deletes) and a run by
    hand or by ``dvc repro`` (no ``$DVC_EXP_BASELINE_REV``) are left alone."""
    import os
    from pathlib import Path

    root, rev = os.environ.get("DVC_ROOT"), os.environ.get("DVC_EXP_BASELINE_REV")
    path = Path(params).resolve()
    if "DVC_STAGE" not in os.environ or not root or not rev or not path.is_file():
        return
    if path.parent != Path(root).resolve():     # a temporary copy, which DVC deletes
        return
    committed = _committed_bytes(path, rev)
    now = path.read_bytes()
    if committed is None or committed == now:
        return
    overrides = _exp_run_overrides(path)
    if overrides is not None and _with_overrides(committed, overrides) == _load(now):
        from hargo.io import atomic_write_bytes

        atomic_write_bytes(path, committed)
        typer.secho(f"{params}: restored as committed in {rev[:7]} (the refused "
                    f"`dvc exp run -S {' '.join(overrides)}` is not kept in it)",
                    fg="yellow", err=True)
        return
    typer.secho(f"{params} keeps this experiment's values (DVC wrote them, and the file also "
                f"differs from {rev[:7]} otherwise): `git diff {params}` shows them, "
                f"`git checkout {params}` restores the committed file", fg="yellow", err=True)


def _committed_bytes(path, rev: str) -> Optional[bytes]:
    """``path`` as committed in the git revision ``rev``; None where git has no such file."""
    import subprocess

    try:
        proc = subprocess.run(["git", "show", f"{rev}:./{path.name}"], cwd=path.parent,
                              capture_output=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    return proc.stdout if proc.returncode == 0 else None


def _exp_run_overrides(path) -> Optional[List[str]]:
    """The ``-S`` values for ``path`` of the ``dvc exp run`` process that runs this stage (an
    ancestor process; its command line parsed by DVC's own parser), ``[]`` for none; None when
    no ancestor is a ``dvc exp run``."""
    import os

    import psutil
    from dvc.cli import parse_args
    from dvc.utils.cli_parse import to_path_overrides

    for proc in psutil.Process().parents():
        try:
            argv, cwd = proc.cmdline(), proc.cwd()
        except psutil.Error:
            continue
        for i in range(len(argv) - 1):
            if argv[i] in ("exp", "experiments") and argv[i + 1] == "run":
                try:
                    args = parse_args(argv[i:])
                except SystemExit:
                    return None
                by_path = to_path_overrides(getattr(args, "set_param", None) or [])
                return [o for f, vals in by_path.items()
                        if os.path.abspath(os.path.join(cwd, f)) == str(path) for o in vals]
    return None


def _load(text: bytes):
    import yaml

    return yaml.safe_load(text)


def _with_overrides(committed: bytes, overrides: List[str]):
    """The committed file's content with ``overrides`` applied as DVC applies ``-S``."""
    import tempfile
    from pathlib import Path

    from dvc.utils.hydra import apply_overrides

    if not overrides:
        return _load(committed)
    with tempfile.TemporaryDirectory() as tmp:
        f = Path(tmp) / "params.yaml"
        f.write_bytes(committed)
        apply_overrides(str(f), overrides)
        return _load(f.read_bytes())


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
