"""The GPU check's tracking: an MLflow-free log written there, replayed into MLflow here.

MLflow is not on the GPU machine and does not travel (mlflow 3.17 with its dependencies is far
more than the 64 MiB a call may carry), so the run writes an MLflow-free tracking log,
``tracking.jsonl``: one JSON object per line, ``{"run", "type": param | metric | tag |
artifact, "key", "value", "step", "ts"}`` (:class:`Tracker`). ``python -m hargo.gpu_check
--import-mlflow DIR`` replays it here into the MLflow store (``MLFLOW_TRACKING_URI``, else the
project's): one parent run with a child run per part, the files of DIR as artifacts
(:func:`import_mlflow`).
"""
from __future__ import annotations

import contextlib
import json
import math
import time
from pathlib import Path
from typing import Any, Mapping

from hargo.gpu_check.common import _clean, _json_default
from hargo.io import jsonl_lines


class Tracker:
    """The MLflow-free tracking log: JSON lines appended to ``path`` (see the module docstring)."""

    def __init__(self, path: Path):
        self.path = Path(path)

    def _write(self, run: str, type_: str, key: str, value, step: int | None = None) -> None:
        rec = {"run": run, "type": type_, "key": key, "value": _clean(value), "step": step,
               "ts": round(time.time(), 3)}
        with self.path.open("a", encoding="utf-8") as f:
            f.write(json.dumps(rec, default=_json_default) + "\n")

    def params(self, run: str, values: Mapping[str, Any]) -> None:
        for k, v in values.items():
            self._write(run, "param", str(k), v if isinstance(v, (int, float, str, bool))
                        or v is None else json.dumps(v, default=_json_default))

    def metrics(self, run: str, values: Mapping[str, Any], step: int | None = None) -> None:
        for k, v in values.items():
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                continue
            if isinstance(v, float) and not math.isfinite(v):
                continue
            self._write(run, "metric", str(k), float(v), step)

    def tag(self, run: str, key: str, value: str) -> None:
        self._write(run, "tag", key, str(value))

    def artifact(self, run: str, name: str) -> None:
        self._write(run, "artifact", "file", name)


def import_mlflow(src: Path, tracking_uri: str | None = None,
                  experiment: str = "hargo-gpu-check") -> str:
    """Replay ``src/tracking.jsonl`` into MLflow (a parent run, one child run per part) and log
    the other files of ``src`` as artifacts. Returns the parent run id."""
    import mlflow

    src = Path(src)
    if tracking_uri:
        mlflow.set_tracking_uri(tracking_uri)
    mlflow.set_experiment(experiment)
    recs = [json.loads(line) for line in jsonl_lines((src / "tracking.jsonl").read_text(
        encoding="utf-8"))]
    by_run: dict[str, list[dict]] = {}
    for r in recs:
        by_run.setdefault(r["run"], []).append(r)
    results = {}
    if (src / "results.json").is_file():
        results = json.loads((src / "results.json").read_text(encoding="utf-8"))
    name = f"gpu-check {results.get('started', '')}".strip()
    with mlflow.start_run(run_name=name) as parent:
        mlflow.set_tags({"hargo.kind": "gpu-check", "hargo.dry_run": str(results.get(
            "dry_run")), "hargo.passed": str(results.get("passed"))})
        for f in sorted(src.iterdir()):
            if f.is_file() and f.name != "tracking.jsonl":
                mlflow.log_artifact(str(f))
        mlflow.log_artifact(str(src / "tracking.jsonl"))
        for run, rows in by_run.items():
            ctx = contextlib.nullcontext() if run == "run" else \
                mlflow.start_run(run_name=run, nested=True)
            with ctx:
                params = {r["key"]: str(r["value"])[:6000] for r in rows if r["type"] == "param"}
                if params:
                    mlflow.log_params(params)
                for r in rows:
                    if r["type"] == "metric" and r["value"] is not None:
                        mlflow.log_metric(r["key"].replace("%", "pct"), float(r["value"]),
                                          step=int(r["step"] or 0))
                    elif r["type"] == "tag":
                        mlflow.set_tag(r["key"], r["value"])
        return parent.info.run_id
