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

__all__ = ["PROMPTS_FILE", "EVAL_FILE", "METRIC_CODE", "metric_code_digest", "read_eval_identity"]

PROMPTS_FILE = "data/eval/prompts.json"      # the evaluate stage's chosen prompt ids
EVAL_FILE = "metrics/eval.json"
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
