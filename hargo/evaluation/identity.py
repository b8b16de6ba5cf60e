"""Which evaluation a model's metrics come from: its identity, read from the evaluate stage's
outputs (``metrics/eval.json``'s ``run`` block, ``data/eval/prompts.json``) and the scoring code.

The identity itself and the comparison of two identities are pure functions in
:mod:`hargo.gate` (:func:`hargo.gate.eval_identity`, :func:`hargo.gate.identity_mismatch`); the
``register`` stage records it on every registered version and refuses to compare a candidate with
a champion evaluated differently.
"""
from __future__ import annotations

import json
from pathlib import Path

from hargo.gate import eval_identity
from hargo.io import HargoInputError

__all__ = ["PROMPTS_FILE", "EVAL_FILE", "ROWS_DIR", "METRIC_CODE", "GATE_FIELDS",
           "metric_code_digest", "read_eval_identity", "read_eval_rows"]

PROMPTS_FILE = "data/eval/prompts.json"      # the evaluate stage's chosen prompt ids
EVAL_FILE = "metrics/eval.json"
ROWS_DIR = "data/eval"                       # per-model rows: data/eval/<model>.jsonl
#: the per-prompt fields the registry gate reads (and records with each registered version)
GATE_FIELDS = ("id", "task", "label", "prediction", "reward", "correct", "em", "similarity", "win")
#: the code that scores answers (part of an evaluation's identity), relative to the hargo package
METRIC_CODE = ("metrics.py", "judges.py", "rewards")
PACKAGE_DIR = Path(__file__).resolve().parents[1]


def metric_code_digest() -> str:
    """First 16 hex digits of the SHA-256 of the scoring code (:data:`METRIC_CODE`: the rewards,
    metrics and judges modules), file names and contents in path order."""
    import hashlib

    pkg = PACKAGE_DIR
    h = hashlib.sha256()
    for rel in METRIC_CODE:
        for f in sorted((pkg / rel).rglob("*.py")) if (pkg / rel).is_dir() else [pkg / rel]:
            h.update(str(f.relative_to(pkg)).encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def read_eval_identity(root: str | Path) -> dict:
    """This evaluation's identity (:func:`hargo.gate.eval_identity`) from ``metrics/eval.json``'s
    ``run`` block, ``data/eval/prompts.json`` and the installed scoring code.

    Raises:
        FileNotFoundError: no ``data/eval/prompts.json`` (run the evaluate stage).
        HargoInputError: the file is not JSON or has no ``ids`` list.
    """
    root = Path(root)
    path = root / PROMPTS_FILE
    if not path.exists():
        raise FileNotFoundError(f"{path} not found: run the evaluate stage first (hargo evaluate)")
    try:
        ids = json.loads(path.read_text(encoding="utf-8"))["ids"]
        if not isinstance(ids, list):
            raise TypeError
    except (ValueError, KeyError, TypeError, UnicodeDecodeError):
        raise HargoInputError(path, "expected a JSON object with an 'ids' list", field="ids") \
            from None
    try:
        run = json.loads((root / EVAL_FILE).read_text(encoding="utf-8")).get("run") or {}
    except (OSError, ValueError, AttributeError):
        run = {}
    return eval_identity(run, ids, metric_code_digest())


def read_eval_rows(root: str | Path, models) -> dict[str, list[dict]]:
    """Each model's per-prompt evaluation rows (``data/eval/<model>.jsonl``), cut to
    :data:`GATE_FIELDS` (the completion text is left out).

    Returns:
        ``{model: [row, ...]}`` in the file's prompt order.

    Raises:
        FileNotFoundError: a model's rows are missing (run the evaluate stage).
        HargoInputError: a row is not JSON or has no ``id`` / ``task`` (names file and line).
    """
    from hargo.io import read_jsonl

    out = {}
    for m in models:
        path = Path(root) / ROWS_DIR / f"{m}.jsonl"
        if not path.is_file():
            raise FileNotFoundError(f"{path} not found: run the evaluate stage first "
                                    "(hargo evaluate) with the same rl.methods")
        rows = read_jsonl(path)
        for i, r in enumerate(rows):
            if not isinstance(r, dict) or "id" not in r or "task" not in r:
                raise HargoInputError(path, "expected a JSON object with 'id' and 'task'",
                                      record=i, field="id")
        out[m] = [{k: r[k] for k in GATE_FIELDS if k in r} for r in rows]
    return out
