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
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import subprocess
from pathlib import Path
from typing import Any, Iterator, Mapping

DOOR_ENV = "HARGO_DOOR"            # "dvc" (default) or "prefect"
PARENT_ENV = "HARGO_PARENT_RUN_ID"


def tracking_uri(root: str | Path = ".") -> str:
    """The tracking URI: ``$MLFLOW_TRACKING_URI`` or the local SQLite store under ``mlruns/``."""
    env = os.environ.get("MLFLOW_TRACKING_URI")
    if env:
        return env
    return f"sqlite:///{(Path(root).resolve() / 'mlruns' / 'mlflow.db')}"


def git_commit(root: str | Path = ".") -> str:
    """``HEAD``'s sha, suffixed ``-dirty`` when tracked files have changes; ``unknown`` outside git."""
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True,
                             text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, check=True).stdout.strip()
        return sha + ("-dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def data_version(root: str | Path = ".") -> str:
    """The DVC hash of the raw data (``data/raw/hpc-gpt.dvc``'s md5), or ``unknown``."""
    import yaml

    p = Path(root) / "data" / "raw" / "hpc-gpt.dvc"
    try:
        return str(yaml.safe_load(p.read_text())["outs"][0]["md5"])
    except (OSError, KeyError, IndexError, TypeError):
        return "unknown"


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


def pipeline_key(params: Mapping, root: str | Path = ".") -> str:
    """16 hex chars identifying (git commit, params): the parent run's key.

    The commit is taken without its ``-dirty`` mark: ``dvc repro`` itself rewrites tracked files
    (``dvc.lock``, metrics) between stages, and that must not split one pipeline run in two.
    """
    blob = json.dumps(params, sort_keys=True, default=str) + git_commit(root).removesuffix("-dirty")
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def setup(params: Mapping, root: str | Path = ".") -> str:
    """Point MLflow at the store and return the project experiment's id (created if missing).

    Raises:
        RuntimeError: the store cannot be opened or written (names the URI).
    """
    import mlflow

    uri = tracking_uri(root)
    name = params.get("mlflow", {}).get("experiment", "hargo")
    try:
        if uri.startswith("sqlite:///"):
            Path(uri[len("sqlite:///"):]).parent.mkdir(parents=True, exist_ok=True)
        mlflow.set_tracking_uri(uri)
        exp = mlflow.get_experiment_by_name(name)
        if exp is not None:
            return exp.experiment_id
        artifacts = None
        if uri.startswith("sqlite:///"):
            artifacts = (Path(root).resolve() / "mlruns" / "artifacts").as_uri()
        return mlflow.create_experiment(name, artifact_location=artifacts)
    except Exception as e:  # mlflow raises several types for an unusable store
        raise RuntimeError(f"MLflow store {uri} cannot be used: {type(e).__name__}: {e}") from e


def common_tags(params: Mapping, root: str | Path = ".") -> dict[str, str]:
    """Tags every hargo run carries: git commit, data version, door, seed."""
    return {
        "hargo.git_commit": git_commit(root),
        "hargo.data_version": data_version(root),
        "hargo.door": os.environ.get(DOOR_ENV, "dvc"),
        "hargo.seed": str(params.get("seed")),
    }


def parent_run_id(params: Mapping, root: str | Path = ".") -> str:
    """The pipeline's parent run: ``$HARGO_PARENT_RUN_ID`` or found/created by pipeline key."""
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
    for k, v in sorted(flatten(params).items()):
        client.log_param(run.info.run_id, k, str(v)[:6000])
    client.set_terminated(run.info.run_id)
    return run.info.run_id


def start_parent_run(params: Mapping, door: str, root: str | Path = ".",
                     extra_tags: Mapping[str, str] | None = None) -> str:
    """Create a new, RUNNING pipeline parent run for one orchestrated pipeline run (the Prefect
    pipeline flow), tagged with ``door`` and the params; return its id.

    The caller exports it as ``$HARGO_PARENT_RUN_ID`` so the stages nest under it, and ends it
    with ``MlflowClient().set_terminated(run_id, status)``. Unlike :func:`parent_run_id` it is
    not looked up by pipeline key: each orchestrated run gets its own parent.
    """
    from mlflow.tracking import MlflowClient

    exp_id = setup(params, root)
    tags = {**common_tags(params, root), "hargo.door": door, "hargo.kind": "pipeline",
            **(extra_tags or {})}
    client = MlflowClient()
    run = client.create_run(exp_id, run_name=f"pipeline-{door}", tags=tags)
    for k, v in sorted(flatten(params).items()):
        client.log_param(run.info.run_id, k, str(v)[:6000])
    return run.info.run_id


@contextlib.contextmanager
def stage_run(stage: str, params: Mapping, root: str | Path = ".",
              extra_tags: Mapping[str, str] | None = None,
              run_name: str | None = None) -> Iterator[Any]:
    """Open the MLflow child run of one stage, with the params and tags logged.

    The run is named ``run_name``, else ``<stage>-<hargo.method tag>``, else ``stage``.

    Yields the active ``mlflow.ActiveRun``; the run ends FINISHED, or FAILED when the body
    raises (the exception propagates).
    """
    import mlflow

    exp_id = setup(params, root)
    parent = parent_run_id(params, root)
    tags = {**common_tags(params, root), "mlflow.parentRunId": parent, "hargo.stage": stage,
            "hargo.kind": "stage", **(extra_tags or {})}
    if run_name is None:
        run_name = stage if not extra_tags or "hargo.method" not in extra_tags else \
            f"{stage}-{extra_tags['hargo.method']}"
    with mlflow.start_run(experiment_id=exp_id, run_name=run_name, tags=tags) as run:
        flat = {k: str(v)[:6000] for k, v in flatten(params).items()}
        keys = sorted(flat)
        for i in range(0, len(keys), 100):
            mlflow.log_params({k: flat[k] for k in keys[i:i + 100]})
        yield run
