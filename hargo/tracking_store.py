"""The MLflow store itself: fail-fast checks, bounded HTTP retries, and re-rooting a moved
local store. Used by :func:`hargo.tracking.setup` before MLflow touches the store, and by
``hargo tracking-reroot``.

* :func:`check_store`: an unusable store fails within ~10 s naming the URI and the fix (MLflow's
  own retries take ~106 s on a bad SQLite path and ~249 s on an unreachable server).
* :data:`HTTP_RETRY_DEFAULTS` and :func:`log_http_retries`: a transient outage of a tracking
  server is retried with a bounded back-off, and every retry is logged.
* :func:`reroot`: a moved or copied project points its local store at its own artifacts.
* :func:`store_root`: the project whose ``mlruns/`` holds the local store, also from a DVC
  experiment's temporary workspace (``dvc exp run --temp`` / ``--queue``).

A store problem that a user must fix (a read-only, corrupt or damaged database file, a store
written by another MLflow version, a store another process holds locked, a deleted experiment)
is a :class:`TrackingStoreError`: one line naming the store (and experiment) and the fix, raised
before anything is written -- by MLflow (which creates the tables of a store missing any) or by
:func:`reroot` (which checks the store before it rewrites it).
"""
from __future__ import annotations

import os
import re
from pathlib import Path

from hargo.tracking_db import (PROBE_TIMEOUT_S, TrackingStoreError, check_database,  # noqa: F401
                               deleted_experiment, expected_tables, locked_error,
                               schema_revisions)

__all__ = ["HTTP_RETRY_DEFAULTS", "PROBE_TIMEOUT_S", "RETRY_LOGGER", "TrackingStoreError",
           "log_http_retries", "sqlite_path", "check_store", "check_database",
           "deleted_experiment", "schema_revisions", "expected_tables", "local_uri",
           "is_local_store", "reroot", "store_root"]


# MLflow's HTTP retry settings (mlflow/environment_variables.py) that hargo sets unless the
# user already did: a transient outage of a tracking server is retried with an exponential
# back-off of 1, 2, 4, 8 s (plus jitter) and a 30 s request timeout -- about a minute at most,
# instead of MLflow's default 7 retries x factor 2 x 120 s timeout (~4 min). Each retry is
# logged (:func:`log_http_retries`).
HTTP_RETRY_DEFAULTS = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "4",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "30",
}


RETRY_LOGGER = "hargo.tracking_store.retry"   # the logger name MLflow retries are relayed to


def log_http_retries() -> None:
    """Log each retry of an MLflow HTTP call as a WARNING on logger ``hargo.tracking_store.retry``.

    urllib3 (which MLflow's REST client retries through) records a retry only at DEBUG level
    (``Incremented Retry for (url=...)`` on logger ``urllib3.util.retry``), so an outage that
    MLflow rides out would otherwise leave no trace. Idempotent."""
    import logging

    src = logging.getLogger("urllib3.util.retry")
    if any(getattr(h, "_hargo", False) for h in src.handlers):
        return
    out = logging.getLogger(RETRY_LOGGER)

    class _Relay(logging.Handler):
        _hargo = True

        def emit(self, record: logging.LogRecord) -> None:
            if record.getMessage().startswith("Incremented Retry"):
                out.warning("MLflow tracking call failed, retrying (bounded back-off): %s",
                            record.getMessage())

    src.addHandler(_Relay(logging.DEBUG))
    if src.getEffectiveLevel() > logging.DEBUG:
        src.setLevel(logging.DEBUG)
        src.propagate = False     # keep urllib3's other DEBUG lines out of the root handlers


def sqlite_path(uri: str) -> Path | None:
    """The database file of a ``sqlite:///`` URI, else None."""
    return Path(uri[len("sqlite:///"):]) if uri.startswith("sqlite:///") else None


def check_store(uri: str, timeout_s: float | None = None, *, experiment: str | None = None,
                contents: bool = True) -> None:
    """Fail fast when the tracking store ``uri`` cannot be used, before MLflow's own retries
    (which take ~106 s on a bad SQLite path and ~249 s on an unreachable server) and before
    anything is written to it (by MLflow, which creates the tables of a store that lacks any,
    or by hargo's :func:`reroot`).

    * ``sqlite:///PATH``: the folder is created if missing and must be writable (a probe file is
      written and removed); an existing database file must be readable and writable
      (:func:`check_database`: a read-only file is refused, not left to fail in MLflow's first
      write), an SQLite database (not a corrupt or foreign file), of this MLflow's schema (not a
      newer MLflow's, not an older one's: :func:`schema_revisions`) with every table this MLflow
      expects (:func:`expected_tables`; a damaged store is refused, where MLflow would
      "create the initial tables" in it), ``experiment`` (when named) active, and give its write
      lock within ``timeout_s`` (default :data:`PROBE_TIMEOUT_S`; else: locked by another
      process). ``contents=False``: the folder and file only (no schema, tables, experiment:
      :func:`hargo.tracking.setup` checks those under its store lock, where no other process is
      creating the tables). ``sqlite://PATH`` (a host form SQLite has not) is refused.
    * ``http(s)://HOST[:PORT]``: a TCP connection must open within ``timeout_s``, then
      ``GET /health`` (the MLflow server's health endpoint) must answer without a 5xx.
    * anything else (``databricks``, a file store, ...) is left to MLflow.

    Raises:
        TrackingStoreError: a store problem a user must fix (read-only, corrupt, damaged,
            locked, another MLflow version's, a deleted experiment): one line naming the store
            and the fix.
        RuntimeError: any other unusable store (names the URI, the cause and the fix).
    """
    timeout_s = PROBE_TIMEOUT_S if timeout_s is None else timeout_s
    if uri.startswith("sqlite:") and not uri.startswith("sqlite:///"):
        raise RuntimeError(
            f"MLflow store {uri} cannot be used: a SQLite store URI needs three slashes. Fix: "
            f"sqlite:///relative/path.db or sqlite:////absolute/path.db")
    db = sqlite_path(uri)
    if db is not None:
        _check_sqlite_store(uri, db, timeout_s, experiment, contents)
        return
    _check_http_store(uri, timeout_s)


def _check_sqlite_store(uri: str, db: Path, timeout_s: float, experiment: str | None,
                        contents: bool) -> None:
    """:func:`check_store` of a ``sqlite:///`` store at ``db``: its folder created and writable,
    then :func:`check_database`, then its write lock given within ``timeout_s``."""
    import sqlite3

    try:
        db.parent.mkdir(parents=True, exist_ok=True)
        probe = db.parent / f".hargo-probe-{os.getpid()}"
        probe.write_text("")
        probe.unlink()
    except OSError as e:
        raise RuntimeError(
            f"MLflow store {uri} cannot be used: {type(e).__name__}: {e}. Fix: make "
            f"{db.parent} a writable folder (or set MLFLOW_TRACKING_URI to a usable store)"
        ) from e
    if not db.exists():
        return                                  # a new store: MLflow creates it
    check_database(uri, db, experiment, contents=contents)
    try:
        con = sqlite3.connect(f"{db.resolve().as_uri()}?mode=rw", uri=True, timeout=timeout_s,
                              isolation_level=None)
        try:
            con.execute("BEGIN IMMEDIATE")     # the write lock MLflow will need
            con.execute("ROLLBACK")
        finally:
            con.close()
    except sqlite3.OperationalError as e:
        if "locked" in str(e) or "busy" in str(e):
            raise locked_error(uri, db, timeout_s, e) from None
        raise RuntimeError(
            f"MLflow store {uri} cannot be used: {type(e).__name__}: {e}. Fix: make "
            f"{db.parent} a writable folder (or set MLFLOW_TRACKING_URI to a usable store)"
        ) from e


def _check_http_store(uri: str, timeout_s: float) -> None:
    """:func:`check_store` of an ``http(s)://`` store: a TCP connection within ``timeout_s``,
    then ``GET /health`` answered without a 5xx. Any other scheme is left to MLflow."""
    import socket
    import urllib.error
    import urllib.request
    from urllib.parse import urlparse

    url = urlparse(uri)
    if url.scheme not in ("http", "https"):
        return
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        with socket.create_connection((url.hostname, port), timeout=timeout_s):
            pass
        health = f"{uri.rstrip('/')}/health"
        try:
            with urllib.request.urlopen(health, timeout=timeout_s) as r:
                r.read(64)
        except urllib.error.HTTPError as e:
            if e.code < 500:     # it answered (e.g. 401 behind auth, 404 behind a proxy)
                return
            raise
    except (OSError, urllib.error.URLError) as e:
        raise RuntimeError(
            f"MLflow store {uri} cannot be used: {type(e).__name__}: {e}. Fix: start the "
            f"tracking server (mlflow server --host {url.hostname} --port {port}) or unset "
            f"MLFLOW_TRACKING_URI to use the local store mlruns/mlflow.db"
        ) from e


def store_root(root: str | Path = ".") -> Path:
    """The project folder whose ``mlruns/`` holds the local store for a stage run in ``root``.

    That is ``root`` itself, except in a DVC experiment's temporary workspace (``dvc exp run
    --temp``, ``dvc exp run --queue`` + ``dvc queue start``): DVC runs the stage in a copy under
    ``<project>/.dvc/tmp/exps/`` that it deletes afterwards, and exports the project's root as
    ``$DVC_ROOT``; the runs must land in the project's store, not in a store inside the copy.
    """
    root = Path(root)
    dvc_root = os.environ.get("DVC_ROOT")
    if not dvc_root:
        return root
    project = Path(dvc_root).resolve()
    here = root.resolve()
    if here != project and (project / ".dvc" / "tmp") in here.parents:
        return project
    return root


def local_uri(root: str | Path = ".") -> str:
    """The default local store's URI (``sqlite:///<root>/mlruns/mlflow.db``)."""
    return f"sqlite:///{(Path(root).resolve() / 'mlruns' / 'mlflow.db')}"


# Columns of MLflow's SQL schema that hold artifact URIs/paths (mlflow/store/tracking/dbmodels
# and mlflow/store/model_registry/dbmodels); a missing one (older schema) is skipped.
_URI_COLUMNS = (("experiments", "artifact_location"), ("runs", "artifact_uri"),
                ("logged_models", "artifact_location"), ("model_versions", "source"),
                ("model_versions", "storage_location"))


def is_local_store(uri: str, root: str | Path = ".") -> bool:
    """Is ``uri`` the project's own store ``<root>/mlruns/mlflow.db``, however it is spelled
    (``sqlite:///mlruns/mlflow.db`` relative to the working directory, as MLflow reads it, or
    an absolute path with ``.`` or ``..`` in it)?"""
    db = sqlite_path(uri)
    if db is None:
        return False
    return os.path.realpath(db) == os.path.realpath(Path(root) / "mlruns" / "mlflow.db")


def reroot(root: str | Path = ".", quiet: bool = False,
           experiment: str | None = None) -> dict[str, int]:
    """Re-root the local store ``<root>/mlruns/mlflow.db`` after the project folder moved.

    MLflow stores artifact locations as absolute ``file://`` URIs (a relative
    ``artifact_location`` is resolved to an absolute one when the experiment is created), so a
    moved or copied project would look for its artifacts in the old clone. This finds the old
    store folder ``<old>/mlruns`` from hargo's experiment (artifact location
    ``<old>/mlruns/artifacts``, a ``file:`` URI or an absolute path) and rewrites every URI or
    path under it to the same place under ``<root>/mlruns``, in experiments (MLflow's
    ``Default`` one too, when it was created in the project: ``<old>/mlruns/0``), runs, logged
    models and model versions. Locations elsewhere (another folder, a remote artifact store) are
    left alone. Idempotent; does nothing without a store.

    The store is checked first (:func:`check_database`; ``experiment``, when named, must be
    active): a store hargo must not write to is refused before it is rewritten.

    Returns:
        ``{"<table>.<column>": rows changed}`` (empty when nothing moved).

    Raises:
        TrackingStoreError: the store is read-only, corrupt, damaged, of another MLflow
            version, or ``experiment`` is deleted (one line naming the store and the fix).
    """
    import sqlite3
    from urllib.parse import unquote, urlparse

    db = Path(root).resolve() / "mlruns" / "mlflow.db"
    new = (Path(root).resolve() / "mlruns").as_uri()
    if not db.is_file():
        return {}
    check_database(local_uri(root), db, experiment)    # every check before the first write
    changed: dict[str, int] = {}
    con = sqlite3.connect(db, timeout=PROBE_TIMEOUT_S)
    try:
        try:
            rows = con.execute("SELECT artifact_location FROM experiments").fetchall()
        except sqlite3.OperationalError:        # a new, empty store: MLflow creates the tables
            return {}
        # the old store folder, from hargo's experiment(s) (".../mlruns/artifacts"); local
        # locations only (a file: URI or an absolute path), never a remote artifact store's
        olds = {loc.split("/mlruns/artifacts")[0] + "/mlruns"
                for (loc,) in rows if loc and "/mlruns/artifacts" in loc
                and (loc.startswith("file:") or loc.startswith("/"))}
        olds.discard(new)
        for old in sorted(olds):
            for variant in {old, urlparse(old).path, unquote(urlparse(old).path)}:
                target = new if variant.startswith("file:") else unquote(urlparse(new).path)
                for table, col in _URI_COLUMNS:
                    try:
                        cur = con.execute(
                            f"UPDATE {table} SET {col} = ? || substr({col}, ?) "
                            f"WHERE {col} = ? OR substr({col}, 1, ?) = ?",
                            (target, len(variant) + 1, variant, len(variant) + 1,
                             variant + "/"))
                    except sqlite3.OperationalError:   # table/column absent in this schema
                        continue
                    if cur.rowcount:
                        key = f"{table}.{col}"
                        changed[key] = changed.get(key, 0) + cur.rowcount
        con.commit()
    finally:
        con.close()
    if changed and not quiet:
        print(f"[tracking] re-rooted {db} to {new}: {changed}", flush=True)
    elif changed:
        print(f"[tracking] the project moved: re-rooted its MLflow store to {new}", flush=True)
    return changed
