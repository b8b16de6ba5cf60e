"""MLflow tracking shared by every stage and both doors (DVC and Prefect).

Layout: one experiment for the project (``params.mlflow.experiment``); a *parent run* per
pipeline run; a *child run* per stage, nested under it through the ``mlflow.parentRunId`` tag
(the MLflow UI shows the nesting). The store is local by default: a SQLite backend
``mlruns/mlflow.db`` with artifacts under ``mlruns/artifacts``; ``MLFLOW_TRACKING_URI``
overrides it (e.g. a team's tracking server).

Which parent a stage joins: ``HARGO_PARENT_RUN_ID`` when set (the Prefect pipeline flow sets it),
else the parent run tagged with the same *pipeline key* -- a hash of the git commit and the
params -- so all stages of one ``dvc repro`` on one configuration meet under one parent even
though DVC runs each stage in its own process.

The experiment is tagged ``mlflow.experimentKind=custom_model_development`` (MLflow 3's UI
opens on its runs). A DVC-door parent spans the pipeline: each stage re-opens it (RUNNING) and
ends it (FINISHED/FAILED, end time = that stage's end, metric ``pipeline_wall_s``); the Prefect
door's parent is opened and closed by the flow. Training and evaluation runs log the prepared
split they read as an MLflow dataset (:func:`log_split`: DVC hash as digest, task counts as
profile), on the stage run and its parent. A moved or copied project re-roots its store's
artifact URIs on first use (:func:`hargo.tracking_store.reroot`); an unusable store fails
within ~10 s naming the URI and the fix (:func:`hargo.tracking_store.check_store`); HTTP
retries are bounded (:data:`hargo.tracking_store.HTTP_RETRY_DEFAULTS`).

Every function here takes the typed config (:class:`hargo.config.Config`); the parameters are
logged, and the pipeline key digested, as params.yaml has them (:func:`hargo.config.params_dict`).
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
from pathlib import Path
from typing import Any, Iterator, Mapping

from hargo import stage_inputs
from hargo.config import Config, params_dict
# re-exported: tracking.git_commit, tracking.StageTerminated, ... as before
from hargo.provenance import data_version, git_commit, pipeline_products  # noqa: F401
from hargo.signals import StageTerminated, terminate_as_exception  # noqa: F401
from hargo.tracking_store import (HTTP_RETRY_DEFAULTS, RETRY_LOGGER, TrackingStoreError,
                                  check_store, deleted_experiment, is_local_store, local_uri,
                                  log_http_retries, reroot, sqlite_path, store_root)

DOOR_ENV = "HARGO_DOOR"            # "prefect" (the flows set it); else door() says
PARENT_ENV = "HARGO_PARENT_RUN_ID"
EXP_NAME_ENV = "DVC_EXP_NAME"      # set by DVC for a `dvc exp run` (workspace, --temp, queue)
EXP_NAME_TAG = "hargo.dvc_experiment"


def tracking_uri(root: str | Path = ".") -> str:
    """The tracking URI: ``$MLFLOW_TRACKING_URI`` or the local SQLite store under the project's
    ``mlruns/`` (:func:`hargo.tracking_store.store_root`: the project's own store also from a DVC
    experiment's temporary workspace, where a relative ``sqlite:///`` URI is taken relative to
    the project too)."""
    env = os.environ.get("MLFLOW_TRACKING_URI")
    if env:
        db = sqlite_path(env)
        if db is not None and not db.is_absolute() and store_root(".") != Path("."):
            # relative to the working directory, which is DVC's temporary copy: the project's
            return f"sqlite:///{store_root('.') / db}"
        return env
    return local_uri(store_root(root))


def flatten(d: Mapping, prefix: str = "") -> dict[str, Any]:
    """``{"rl": {"beta": 0.02}}`` -> ``{"rl.beta": 0.02}`` (lists kept as values)."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping):
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


def _experiment_name(params: Config) -> str:
    """``mlflow.experiment`` (the section's default, ``hargo``, when params.yaml has none)."""
    return params.mlflow.experiment


def _seed(params: Config):
    """The pipeline's ``seed``."""
    return params.seed


def pipeline_key(params: Config, root: str | Path = ".") -> str:
    """16 hex chars identifying (git commit, params): the parent run's key. ``params``: the
    typed config, digested as params.yaml has it (:func:`hargo.config.params_dict`).

    The commit is taken without its ``-dirty`` mark: ``dvc repro`` itself rewrites tracked files
    (``dvc.lock``, metrics) between stages, and that must not split one pipeline run in two.
    """
    blob = (json.dumps(params_dict(params), sort_keys=True, default=str)
            + git_commit(root).removesuffix("-dirty"))
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
# The experiment type MLflow 3's UI reads from this experiment tag (its values, in the UI's
# ExperimentKind enum: "custom_model_development", "genai_development", "finetuning", ...).
# "custom_model_development" opens the experiment on its training runs, not on the GenAI
# traces overview. Source: mlflow/server/js (useUpdateExperimentKind, ExperimentKind).
TRAINING_KIND = "custom_model_development"

def setup(params: Config, root: str | Path = ".") -> str:
    """Point MLflow at the store and return the project experiment's id (created if missing).

    Before MLflow (or the re-root) touches the store, :func:`check_store` probes it (fails
    within ~10 s; a read-only, corrupt or damaged database, another MLflow version's schema, a
    deleted experiment: one line) and the HTTP retry defaults (:data:`HTTP_RETRY_DEFAULTS`) are
    set. The experiment is marked a model-training experiment (tag ``mlflow.experimentKind`` = ``custom_model_development``),
    also on an existing experiment that lacks the tag. A local store whose artifact location
    points into another folder (the project was moved or copied) is re-rooted here
    (:func:`reroot`).

    A SQLite store is created, migrated and given its experiment under :func:`store_lock`, so
    several processes may set up one fresh store at once. In a DVC experiment's temporary
    workspace the local store is the project's (:func:`hargo.tracking_store.store_root`).

    Raises:
        TrackingStoreError: the experiment is deleted (names it, the store and
            ``mlflow experiments restore``), or the store is read-only, corrupt, damaged,
            locked or of another MLflow version; nothing is written.
        RuntimeError: the store cannot be opened or written (names the URI and the fix).
    """
    uri = tracking_uri(root)
    name = _experiment_name(params)
    for k, v in HTTP_RETRY_DEFAULTS.items():
        os.environ.setdefault(k, v)
    log_http_retries()
    check_store(uri, contents=False)       # the folder and file: before the lock file is made
    with store_lock(uri):
        # the schema, tables and experiment: under the lock, where no other process is creating
        # the tables of a fresh store; before the re-root and before MLflow writes anything
        check_store(uri, experiment=name)
        return _setup_locked(uri, name, store_root(root))


def store_lock(uri: str, timeout_s: float = 600.0):
    """A lock held while MLflow creates or migrates a SQLite store and the project experiment:
    ``<db>.lock`` beside the database (``filelock``), so several processes opening one fresh
    store at once (parallel ``dvc exp`` runs, Prefect workers, spawned synthetic runs) do not
    race in MLflow's schema migration (``OperationalError: duplicate column name``) or in
    creating the experiment. Any other store: a no-op context.

    Raises:
        RuntimeError: the lock was not acquired within ``timeout_s`` (names the lock file).
    """

    from filelock import FileLock, Timeout

    db = sqlite_path(uri)
    if db is None:
        return contextlib.nullcontext()
    lock = FileLock(str(db) + ".lock", timeout=timeout_s)

    @contextlib.contextmanager
    def held():
        try:
            lock.acquire()
        except Timeout:
            raise RuntimeError(f"MLflow store {uri}: another process has held {lock.lock_file} "
                               f"for more than {timeout_s:.0f} s; if none is running, delete "
                               "that file") from None
        try:
            yield
        finally:
            lock.release()

    return held()


def _setup_locked(uri: str, name: str, root: str | Path) -> str:
    import mlflow
    from mlflow.tracking import MlflowClient

    try:
        mlflow.set_tracking_uri(uri)
        if is_local_store(uri, root):      # however MLFLOW_TRACKING_URI spells it
            reroot(root, quiet=True, experiment=name)
        exp = mlflow.get_experiment_by_name(name)
        if exp is None:
            artifacts = None
            if sqlite_path(uri) is not None:
                artifacts = (Path(root).resolve() / "mlruns" / "artifacts").as_uri()
            exp_id = mlflow.create_experiment(name, artifact_location=artifacts,
                                              tags={EXPERIMENT_KIND_TAG: TRAINING_KIND})
        else:
            exp_id = exp.experiment_id
            if exp.lifecycle_stage != "active":     # a server's store (a SQLite one: above)
                raise deleted_experiment(uri, name, exp_id)
            if exp.tags.get(EXPERIMENT_KIND_TAG) != TRAINING_KIND:
                MlflowClient().set_experiment_tag(exp_id, EXPERIMENT_KIND_TAG, TRAINING_KIND)
        return exp_id
    except TrackingStoreError:
        raise
    except Exception as e:  # mlflow raises several types for an unusable store
        raise RuntimeError(f"MLflow store {uri} cannot be used: {type(e).__name__}: {e}") from e


def door() -> str:
    """``$HARGO_DOOR`` (the flows: ``prefect``), ``dvc`` under DVC (``$DVC_STAGE``), or ``cli``."""
    return os.environ.get(DOOR_ENV) or ("dvc" if os.environ.get("DVC_STAGE") else "cli")


def common_tags(params: Config, root: str | Path = ".") -> dict[str, str]:
    """Tags every hargo run carries: git commit, data version, door, seed; and, in a ``dvc exp
    run`` (workspace, ``--temp`` or queued), the DVC experiment's name (``hargo.dvc_experiment``:
    ``$DVC_EXP_NAME``, the name ``dvc exp show`` lists)."""
    tags = {
        "hargo.git_commit": git_commit(root),
        "hargo.data_version": data_version(root),
        "hargo.door": door(),
        "hargo.seed": str(_seed(params)),
    }
    if os.environ.get(EXP_NAME_ENV):
        tags[EXP_NAME_TAG] = os.environ[EXP_NAME_ENV]
    return tags


def parent_run_id(params: Config, root: str | Path = ".") -> str:
    """The pipeline's parent run: ``$HARGO_PARENT_RUN_ID`` or found/created by pipeline key.

    A parent created here starts RUNNING at the first stage's start; :func:`stage_run` re-opens
    it (RUNNING) for each later stage and closes it at each stage's end (see
    :func:`_close_parent`), so its duration spans the pipeline: from the first stage run on this
    (commit, params) key to the latest one -- a later ``dvc repro`` on the same key that re-runs
    a stage extends it.
    """
    from mlflow.tracking import MlflowClient

    if os.environ.get(PARENT_ENV):
        return os.environ[PARENT_ENV]
    exp_id = setup(params, root)
    key = pipeline_key(params, root)
    client = MlflowClient()
    found = client.search_runs([exp_id], filter_string=f"tags.`hargo.pipeline_key` = '{key}'",
                               max_results=1)
    if found:
        return found[0].info.run_id
    tags = {**common_tags(params, root), "hargo.pipeline_key": key, "hargo.kind": "pipeline"}
    run = client.create_run(exp_id, run_name=f"pipeline-{key[:8]}", tags=tags)
    for k, v in sorted(flatten(params_dict(params)).items()):
        client.log_param(run.info.run_id, k, str(v)[:6000])
    return run.info.run_id


def _reopen_parent(parent: str) -> None:
    """Mark a DVC-door parent RUNNING while one of its stages runs (MLflow keeps its start time;
    ``update_run`` sets the status only). A parent from ``$HARGO_PARENT_RUN_ID`` is left to its
    owner (the Prefect flow opens and closes it)."""
    from mlflow.tracking import MlflowClient

    if os.environ.get(PARENT_ENV) == parent:
        return
    MlflowClient().update_run(parent, status="RUNNING")


def _best_effort(fn, *args) -> None:
    """Run a parent-run bookkeeping call; a failure (the store went away after the retries) is
    a warning, not the stage's failure: the stage's own run and outputs are already written."""
    import logging

    try:
        fn(*args)
    except Exception as e:  # noqa: BLE001 - any store error; the stage's result stands
        logging.getLogger(RETRY_LOGGER).warning("could not update the pipeline parent run %s: "
                                                "%s: %s", args[0], type(e).__name__, e)


def _close_parent(parent: str, status: str) -> None:
    """End a DVC-door parent at the end of a stage (:func:`end_pipeline_run`). Each later stage
    re-opens it (:func:`_reopen_parent`) and moves the end on, so it spans the pipeline."""
    if os.environ.get(PARENT_ENV) == parent:
        return
    end_pipeline_run(parent, status)


def end_pipeline_run(parent: str, status: str) -> None:
    """End a pipeline parent run now: status ``status`` (FINISHED or FAILED), end time = now,
    and metric ``pipeline_wall_s`` = end - the parent's start (seconds: the pipeline's wall
    time up to its latest stage). Source: MlflowClient.set_terminated / log_metric
    (https://mlflow.org/docs/latest/api_reference/python_api/mlflow.client.html)."""
    import time

    from mlflow.tracking import MlflowClient

    client = MlflowClient()
    end_ms = int(time.time() * 1000)
    start_ms = client.get_run(parent).info.start_time
    client.log_metric(parent, "pipeline_wall_s", round((end_ms - start_ms) / 1000, 3),
                      timestamp=end_ms)
    client.set_terminated(parent, status=status, end_time=end_ms)


def start_parent_run(params: Config, door: str, root: str | Path = ".",
                     extra_tags: Mapping[str, str] | None = None) -> str:
    """Create a RUNNING parent run for one orchestrated pipeline run (the Prefect pipeline
    flow), tagged with ``door`` and the params; return its id. The caller exports it as
    ``$HARGO_PARENT_RUN_ID`` so the stages nest under it (leaving its status alone) and ends it
    with :func:`end_pipeline_run`; unlike :func:`parent_run_id`, never looked up by key."""
    from mlflow.tracking import MlflowClient

    exp_id = setup(params, root)
    tags = {**common_tags(params, root), "hargo.door": door, "hargo.kind": "pipeline",
            **(extra_tags or {})}
    client = MlflowClient()
    run = client.create_run(exp_id, run_name=f"pipeline-{door}", tags=tags)
    for k, v in sorted(flatten(params_dict(params)).items()):
        client.log_param(run.info.run_id, k, str(v)[:6000])
    return run.info.run_id


@contextlib.contextmanager
def stage_run(stage: str, params: Config, root: str | Path = ".",
              extra_tags: Mapping[str, str] | None = None,
              run_name: str | None = None) -> Iterator[Any]:
    """Open the MLflow child run of one stage, with the params and tags logged.

    The run is named ``run_name``, else ``<stage>-<hargo.method tag>``, else ``stage``.

    Yields the active ``mlflow.ActiveRun``; the run ends FINISHED, or FAILED when the body
    raises or when the params file or a declared dependency of the stage changed while it ran
    (:func:`hargo.stage_inputs.check`; the exception propagates; its type and message go to the run's ``hargo.error`` tag,
    e.g. a diverged training's step and value), or KILLED on SIGTERM
    (:func:`terminate_as_exception`) or SIGINT; the pipeline parent is closed with the same
    status.
    """
    import mlflow

    exp_id = setup(params, root)
    parent = parent_run_id(params, root)
    tags = {**common_tags(params, root), "mlflow.parentRunId": parent, "hargo.stage": stage,
            "hargo.kind": "stage", **(extra_tags or {})}
    if run_name is None:
        run_name = stage if not extra_tags or "hargo.method" not in extra_tags else \
            f"{stage}-{extra_tags['hargo.method']}"
    _best_effort(_reopen_parent, parent)
    status = "FAILED"
    try:
        with terminate_as_exception(), \
                mlflow.start_run(experiment_id=exp_id, run_name=run_name, tags=tags) as run:
            flat = {k: str(v)[:6000] for k, v in flatten(params_dict(params)).items()}
            keys = sorted(flat)
            for i in range(0, len(keys), 100):
                mlflow.log_params({k: flat[k] for k in keys[i:i + 100]})
            try:
                yield run
                # the params file or a declared dep changed while the stage ran: FAILED, and the
                # error (ParamsError / DependencyChanged) ends the stage (DVC records nothing)
                stage_inputs.check()
            except BaseException as e:   # the run ends FAILED or KILLED; say why in the run
                _best_effort(mlflow.set_tag, "hargo.error", f"{type(e).__name__}: {e}"[:5000])
                if isinstance(e, (StageTerminated, KeyboardInterrupt)):
                    status = "KILLED"
                    _best_effort(mlflow.end_run, "KILLED")
                raise
        status = "FINISHED"
    finally:
        _best_effort(_close_parent, parent, status)


SPLITS = ("train", "eval")


def split_digest(path: str | Path, root: str | Path = ".") -> str:
    """The DVC md5 of a prepared split: its ``outs`` entry in ``<root>/dvc.lock`` when that
    entry's recorded size matches the file (the lock describes this file), else the file's md5
    (what DVC would record). Raises FileNotFoundError when the file is missing."""
    import yaml

    path = Path(path)
    data = path.read_bytes()
    lock = Path(root) / "dvc.lock"
    try:
        rel = path.resolve().relative_to(Path(root).resolve()).as_posix()
        stages = yaml.safe_load(lock.read_text()).get("stages", {})
        for st in stages.values():
            for out in st.get("outs", []) or []:
                if out.get("path") == rel and int(out.get("size", -1)) == len(data):
                    return str(out["md5"])
    except (OSError, ValueError, AttributeError, yaml.YAMLError):
        pass
    return hashlib.md5(data).hexdigest()


def split_dataset(split: str, params: Config, root: str | Path = "."):
    """An MLflow dataset (``mlflow.data.meta_dataset.MetaDataset``: metadata only, the data
    stay in DVC) for the prepared split ``data/prepared/<split>.jsonl``:

    * name ``hpc-gpt-<split>``, digest = :func:`split_digest` (the DVC content hash),
    * source = the file's path relative to the project (a local artifact source),
    * profile = ``{"num_rows": N, "tasks": {task: n}}`` (the UI shows it with the dataset).

    Raises:
        FileNotFoundError: the split is missing (run ``hargo prepare``).
    """
    from mlflow.data.dataset_source_registry import (
        get_registered_sources,
        resolve_dataset_source,
    )
    from mlflow.data.meta_dataset import MetaDataset

    from hargo.io import jsonl_lines

    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    out_dir = params.data.out_dir
    path = Path(root) / out_dir / f"{split}.jsonl"
    digest = split_digest(path, root)
    counts: dict[str, int] = {}
    for line in jsonl_lines(path.read_text(encoding="utf-8")):
        task = str(json.loads(line).get("task"))
        counts[task] = counts.get(task, 0) + 1
    profile = {"num_rows": sum(counts.values()), "tasks": dict(sorted(counts.items()))}

    class _SplitDataset(MetaDataset):
        @property
        def profile(self):
            return profile

        def to_dict(self):
            return {**super().to_dict(), "profile": json.dumps(profile)}

    # a local path matches several registered sources: name the local one (MLflow would warn)
    local = [c for c in get_registered_sources() if c.__name__ == "LocalArtifactDatasetSource"]
    source = resolve_dataset_source(f"{out_dir}/{split}.jsonl",
                                    candidate_sources=local[-1:] or None)
    return _SplitDataset(source, name=f"hpc-gpt-{split}", digest=digest)


def log_split(split: str, context: str, params: Config, root: str | Path = ".") -> None:
    """Log the prepared split as an input of the active run (``mlflow.log_input``, context
    ``training`` or ``evaluation``) and of its pipeline parent, with input tags
    ``hargo.tasks.<task>`` = count, so the UI's Dataset column names the data version."""
    import mlflow
    from mlflow.entities import DatasetInput, InputTag
    from mlflow.tracking import MlflowClient

    ds = split_dataset(split, params, root)
    tags = {f"hargo.tasks.{t}": str(n) for t, n in ds.profile["tasks"].items()}
    mlflow.log_input(ds, context=context, tags=tags)
    run = mlflow.active_run()
    parent = run.data.tags.get("mlflow.parentRunId") if run is not None else None
    if parent:
        entity = DatasetInput(ds._to_mlflow_entity(), [InputTag("mlflow.data.context", context),
                                                       *[InputTag(k, v) for k, v in tags.items()]])
        MlflowClient().log_inputs(parent, datasets=[entity])
