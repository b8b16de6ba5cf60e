"""The registry's current champion, read back from MLflow: which version holds an alias, the
per-prompt evaluation rows it was gated with, and whether a new evaluation can be compared with
it. The ``register`` stage (:mod:`hargo.registry`) gates its candidates against what this
returns; the gate's rule itself is :mod:`hargo.gate`'s.
"""
from __future__ import annotations

import json
from typing import Mapping, Sequence

from hargo.gate import identity_mismatch, metric_values, pair_rows

__all__ = ["CANDIDATE", "CHAMPION", "IDENTITY_TAG", "ROWS_ARTIFACT", "not_found",
           "version_by_alias", "version_rows", "champion_reference"]

CANDIDATE = "candidate"
CHAMPION = "champion"
#: the version tag holding its evaluation's identity (JSON of :func:`hargo.gate.eval_identity`)
IDENTITY_TAG = "hargo.eval_identity"
#: where the register run keeps each version's per-prompt evaluation rows (the gate's evidence)
ROWS_ARTIFACT = "eval/{method}.per_prompt.json"


def not_found(e) -> bool:
    """Is ``e`` MLflow's "no such resource" (a missing model, alias, version or run)?"""
    return getattr(e, "error_code", "") in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE")


def version_by_alias(client, name: str, alias: str = CHAMPION):
    """The version of registered model ``name`` holding ``@alias``, or None (no registered
    model or no such alias yet).

    Raises:
        RuntimeError: the registry cannot be read (names the model and alias).
    """
    from mlflow.exceptions import MlflowException

    try:
        return client.get_model_version_by_alias(name, alias)
    except MlflowException as e:
        if not_found(e):
            return None
        raise RuntimeError(f"MLflow registry: cannot read {name}@{alias}: {e}") from e


def version_rows(client, mv, name: str) -> list[dict] | None:
    """The per-prompt evaluation rows a registered version was gated with (the artifact
    :data:`ROWS_ARTIFACT` of the run that registered it), or None when it has none (a version
    an older hargo registered, or its run was deleted).

    Raises:
        RuntimeError: the artifact is there but cannot be read, or is not a list of rows (names
            the version, the run and the path).
    """
    import mlflow

    method = (mv.tags or {}).get("hargo.method")
    if not method or not mv.run_id:
        return None
    path = ROWS_ARTIFACT.format(method=method)
    where = f"{name} v{mv.version} ({CHAMPION}): its per-prompt rows {path} in run {mv.run_id}"
    try:
        listed = {a.path for a in client.list_artifacts(mv.run_id, path.rsplit("/", 1)[0])}
    except Exception as e:  # noqa: BLE001 - a deleted run: nothing recorded; else a real fault
        if not_found(e):
            return None
        raise RuntimeError(f"{where} cannot be listed: {type(e).__name__}: {e}") from e
    if path not in listed:
        return None
    try:
        doc = mlflow.artifacts.load_dict(f"runs:/{mv.run_id}/{path}")
    except Exception as e:  # noqa: BLE001 - listed but unreadable: say so, do not guess
        raise RuntimeError(f"{where} cannot be read: {type(e).__name__}: {e}") from e
    rows = doc.get("rows") if isinstance(doc, dict) else None
    if not isinstance(rows, list) or not all(isinstance(r, dict) and "id" in r for r in rows):
        raise RuntimeError(f"{where} is not a list of rows with ids")
    return rows


def champion_reference(client, name: str, identity: Mapping, candidate_rows: Sequence[Mapping],
                       gate_metrics: Sequence[str]):
    """The current champion as the gate's reference.

    Args:
        identity: this evaluation's identity (:func:`hargo.gate.eval_identity`).
        candidate_rows: one candidate's per-prompt rows, to check the champion's pair with them.
        gate_metrics: the metrics the gate will compute on the champion's rows.

    Returns:
        ``(version, label, rows, not_comparable)``: ``version`` is None when no version holds
        ``@champion`` (then the other three are None, None, []); else ``label`` names it
        (``champion v3 (hargo)``), ``rows`` are its per-prompt rows (``[]`` when not comparable)
        and ``not_comparable`` lists why the evaluations differ (:func:`hargo.gate.identity_mismatch`,
        or that it has no rows recorded); ``[]`` when the gate can compare.

    Raises:
        RuntimeError: the registry cannot be read, or the champion's rows are there but cannot
            be read or paired with ``candidate_rows`` (nothing has been registered yet).
    """
    old = version_by_alias(client, name)
    if old is None:
        return None, None, [], []
    label = f"{CHAMPION} v{old.version} ({old.tags.get('hargo.method', '?')})"
    try:
        old_identity = json.loads(old.tags[IDENTITY_TAG])
    except (KeyError, ValueError):
        old_identity = None
    not_comparable = identity_mismatch(identity, old_identity)
    if not_comparable:
        return old, label, [], not_comparable
    rows = version_rows(client, old, name)
    if rows is None:
        return old, label, [], ["the champion has no per-prompt evaluation recorded "
                                f"({ROWS_ARTIFACT.format(method='<method>')})"]
    try:        # checked before anything is registered: it must pair and score
        paired = pair_rows(candidate_rows, rows)
        for g in gate_metrics:
            metric_values(paired, g)
    except ValueError as e:
        raise RuntimeError(f"{name} v{old.version} ({CHAMPION}): its per-prompt rows cannot be "
                           f"paired with this evaluation's ({e}); nothing was registered") from None
    return old, label, rows, []
