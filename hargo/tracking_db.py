"""The SQLite file of a local MLflow store, checked without writing to it (split from
:mod:`hargo.tracking_store`, which re-exports these names): readable and writable, an SQLite
database, of this MLflow's schema revision, with every table this MLflow expects, its experiment
active. Each problem is a :class:`TrackingStoreError`, one line naming the store and the fix."""
from __future__ import annotations

import functools
import os
import re
from pathlib import Path

__all__ = ["TrackingStoreError", "check_database", "deleted_experiment", "schema_revisions",
           "expected_tables", "locked_error", "PROBE_TIMEOUT_S"]

PROBE_TIMEOUT_S = 5.0   # the fail-fast probe of a store, seconds per attempt
_SQLITE_HEADER = b"SQLite format 3\x00"    # the first 16 bytes of every SQLite database file
# the modules whose ORM classes make MLflow's ``Base.metadata`` (mlflow/store/db/utils.py
# imports exactly these before ``_all_tables_exist``)
_ORM_MODULES = ("store/tracking/dbmodels/models.py", "store/model_registry/dbmodels/models.py",
                "store/workspace/dbmodels/models.py")


class TrackingStoreError(RuntimeError):
    """A tracking store (or its experiment) that hargo must not write to as it is; the message
    is one line naming the store and the fix."""


def locked_error(uri: str, db: Path, timeout_s: float, e: Exception) -> TrackingStoreError:
    return TrackingStoreError(
        f"MLflow store {uri} is locked: another process has held {db} for more "
        f"than {timeout_s:g} s ({e}). Fix: let that process finish or stop it "
        f"(`fuser {db}` names it; e.g. a stuck `mlflow ui` or a stage still "
        "running), then run again")


def _writable(path: Path) -> bool:
    """May this process write ``path``? (``os.access``: also False for an immutable file
    (``chattr +i``) or one on a read-only mount, for root too.)"""
    return os.access(path, os.W_OK)


def check_database(uri: str, db: Path, experiment: str | None = None, *,
                   contents: bool = True) -> None:
    """Check an existing SQLite store file ``db`` (of ``uri``) without writing to it: readable
    and writable, an SQLite database, and (``contents``) of this MLflow's schema revision, with
    every table this MLflow expects, and ``experiment`` (when named) active.
    A file without tables (a new store) passes: MLflow creates them.

    Raises:
        TrackingStoreError: one line naming the store, the problem and the fix.
    """
    import sqlite3

    if not os.access(db, os.R_OK):
        raise TrackingStoreError(
            f"MLflow store {uri} cannot be read: {db} is not readable by this user. Fix: make "
            f"it readable and writable (chmod u+rw {db}) or set MLFLOW_TRACKING_URI to another "
            "store")
    if not _writable(db):
        raise TrackingStoreError(
            f"MLflow store {uri} is read-only: {db} cannot be written (its permissions, an "
            f"immutable flag or a read-only mount), so no run can be logged. Fix: make it "
            f"writable (chmod u+w {db}; chattr -i {db} if immutable) or set "
            "MLFLOW_TRACKING_URI to another store")
    corrupt = (f"MLflow store {uri} is not an SQLite database ({db} is corrupt or another "
               f"kind of file). Fix: move it aside (mv {db} {db}.bad), then restore it from a "
               "backup, or let the next stage start a new, empty store there")
    try:
        with open(db, "rb") as f:
            head = f.read(len(_SQLITE_HEADER))
    except OSError as e:
        raise TrackingStoreError(f"MLflow store {uri} cannot be read: {e}. Fix: make {db} "
                                 "readable or set MLFLOW_TRACKING_URI to another store") from None
    if head and head != _SQLITE_HEADER:
        raise TrackingStoreError(corrupt)
    if not contents:
        return
    try:
        con = sqlite3.connect(f"{db.resolve().as_uri()}?mode=ro", uri=True,
                              timeout=PROBE_TIMEOUT_S)
        try:
            tables = {t for (t,) in con.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table'")}
            _check_schema(con, uri, db, tables)
            if experiment is not None and "experiments" in tables:  # else a new store
                _check_experiment(con, uri, experiment)
        finally:
            con.close()
    except sqlite3.OperationalError as e:
        if "locked" in str(e) or "busy" in str(e):
            raise locked_error(uri, db, PROBE_TIMEOUT_S, e) from None
        raise TrackingStoreError(f"{corrupt} ({type(e).__name__}: {e})") from None
    except sqlite3.DatabaseError as e:           # "file is not a database", "malformed"
        raise TrackingStoreError(f"{corrupt} ({type(e).__name__}: {e})") from None


def _check_experiment(con, uri: str, name: str) -> None:
    """Refuse a deleted experiment ``name`` (MLflow would refuse its runs: ``The experiment 1
    must be in the 'active' state``); an absent one passes (it is created)."""
    row = con.execute("SELECT experiment_id, lifecycle_stage FROM experiments WHERE name = ?",
                      (name,)).fetchone()
    if row is not None and row[1] != "active":
        raise deleted_experiment(uri, name, row[0])


def deleted_experiment(uri: str, name: str, exp_id) -> TrackingStoreError:
    """The one-line error of a deleted experiment ``name`` (id ``exp_id``) in store ``uri``."""
    return TrackingStoreError(
        f"MLflow experiment {name!r} (id {exp_id}) in store {uri} is deleted, so no "
        f"run can be logged to it. Fix: MLFLOW_TRACKING_URI={uri} mlflow experiments "
        f"restore -x {exp_id} (or set mlflow.experiment in params.yaml to a new "
        "name)")


@functools.lru_cache(maxsize=1)
def schema_revisions() -> tuple[set[str], set[str]]:
    """(every schema revision this MLflow knows, its head revisions), read from the alembic
    migration scripts MLflow ships (``mlflow/store/db_migrations/versions/*.py``: each names its
    ``revision`` and ``down_revision``) without importing MLflow. Empty sets where the scripts
    are not found (the schema check is then left to MLflow)."""
    root = _mlflow_dir()
    if root is None:
        return set(), set()
    versions = root / "store" / "db_migrations" / "versions"
    known: set[str] = set()
    parents: set[str] = set()
    for f in versions.glob("*.py"):
        text = f.read_text(encoding="utf-8", errors="replace")
        rev = re.search(r"^revision\s*=\s*[\"']([0-9a-zA-Z_]+)[\"']", text, re.MULTILINE)
        down = re.search(r"^down_revision\s*=\s*(.*)$", text, re.MULTILINE)
        if rev:
            known.add(rev.group(1))
        if down:
            parents.update(re.findall(r"[\"']([0-9a-zA-Z_]+)[\"']", down.group(1)))
    return known, known - parents


def _mlflow_dir() -> Path | None:
    import importlib.util

    spec = importlib.util.find_spec("mlflow")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


@functools.lru_cache(maxsize=1)
def expected_tables() -> frozenset[str]:
    """The tables this MLflow expects in a store: what ``mlflow.store.db.utils.
    _all_tables_exist`` compares with (``Base.metadata.tables``; when one is missing,
    MLflow's SqlAlchemyStore logs "Creating initial MLflow database tables..." and creates them
    in the store), read from the ``__tablename__`` of the ORM modules it imports, without
    importing MLflow. Empty where they are not found (the check is then left to MLflow)."""
    root = _mlflow_dir()
    out: set[str] = set()
    for rel in _ORM_MODULES if root else ():
        try:
            text = (root / rel).read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        out.update(re.findall(r"^\s+__tablename__\s*=\s*[\"']([A-Za-z0-9_]+)[\"']", text,
                              re.MULTILINE))
    return frozenset(out)


def _check_schema(con, uri: str, db: Path, tables: set[str]) -> None:
    """Refuse a SQLite store whose schema this MLflow cannot use: one from a newer MLflow (a
    revision it does not know; ``mlflow db upgrade`` cannot help), an older one (``mlflow db
    upgrade`` migrates it), or a damaged one (tables, or the schema revision, missing: MLflow
    would create the missing tables in it). A new, empty store passes (MLflow ignores its
    ``alembic_*`` tables too)."""
    if all(t.startswith("alembic_") or t.startswith("sqlite_") for t in tables):
        return                                       # a new store: MLflow creates the tables
    damaged = (f"MLflow store {uri} is damaged: {{what}}, so MLflow would write new tables "
               f"into it. Fix: move {db} aside and restore it from a backup (or set "
               "MLFLOW_TRACKING_URI to another store)")
    row = (con.execute("SELECT version_num FROM alembic_version").fetchone()
           if "alembic_version" in tables else None)
    if row is None:
        raise TrackingStoreError(damaged.format(what="it has tables but no schema revision "
                                                     "(alembic_version)"))
    known, heads = schema_revisions()
    if not known:
        return
    import importlib.metadata

    version = importlib.metadata.version("mlflow")
    if row[0] not in known:
        raise TrackingStoreError(
            f"MLflow store {uri} was written by a newer MLflow than this one ({version}): its "
            f"schema revision {row[0]} is unknown here. Fix: upgrade MLflow where hargo runs "
            f"(pip install -U mlflow) to the version that wrote {db}, or set "
            "MLFLOW_TRACKING_URI to another store")
    if row[0] not in heads:
        raise TrackingStoreError(
            f"MLflow store {uri} has an older schema (revision {row[0]}) than MLflow {version} "
            f"uses. Fix: back up {db}, then run `mlflow db upgrade {uri}`")
    missing = sorted(expected_tables() - tables)
    if missing:
        raise TrackingStoreError(damaged.format(
            what=f"table{'s' if len(missing) > 1 else ''} {', '.join(missing[:5])}"
                 f"{f' and {len(missing) - 5} more' if len(missing) > 5 else ''} missing"))
