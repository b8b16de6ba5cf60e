"""The markdown report a pipeline flow run publishes as a Prefect artifact.

Pure functions from (evaluation metrics, MLflow run records, failure) to markdown, so the text
is tested without a Prefect or MLflow server; :func:`mlflow_runs` is the thin MLflow read.
"""
from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

# The report's columns, in this order, when present: `hargo summary`'s headline metrics, the
# pooled data-race precision/recall, the wall time of the model's evaluation (seconds).
REPORT_COLUMNS = ("dr_f1", "dr_mcc", "dr_auc", "dr_yes_share", "dr_precision", "dr_recall",
                  "plp_similarity", "mlperf_em", "avg_score", "win_rate", "wall_s")
# The untuned base model's entry: a baseline row like those flagged ``baseline: true``.
BASE = "base"
# metrics/eval.json's entry that describes the evaluation run, not a model.
RUN_ENTRY = "run"
SFT = "sft"


def per_model_metrics(eval_metrics: Mapping[str, Any]) -> dict[str, dict[str, float]]:
    """``metrics/eval.json`` (``{model: {metric: value}, "run": {...}}``, written by
    ``hargo.evaluation.evaluate``) -> ``{model: {metric: value}}``, scalar numbers only
    (``None``, strings and nested mappings such as ``dr_confusion`` left out)."""
    out: dict[str, dict[str, float]] = {}
    for name, metrics in eval_metrics.items():
        if name == RUN_ENTRY or not isinstance(metrics, Mapping):
            continue
        row = {k: v for k, v in metrics.items()
               if isinstance(v, (int, float)) and not isinstance(v, bool)}
        if row:
            out[str(name)] = row
    return out


def _fmt(v: Any) -> str:
    if v is None:
        return "—"
    if isinstance(v, float):
        return "nan" if math.isnan(v) else f"{v:.4f}"
    return str(v)


def metrics_table(eval_metrics: Mapping[str, Any]) -> str:
    """A markdown table, one row per evaluated model, columns :data:`REPORT_COLUMNS` that any
    model has (``—`` where a model lacks one, e.g. SFT's win rate); ``""`` when no model. The
    baselines (entries flagged ``baseline: true``, and the untuned ``base`` model) come first,
    marked ``(baseline)``, then SFT, then the methods."""
    rows = per_model_metrics(eval_metrics)
    if not rows:
        return ""
    present = {k for r in rows.values() for k in r}
    cols = [c for c in REPORT_COLUMNS if c in present]
    lines = ["| model | " + " | ".join(cols) + " |", "|---|" + "---:|" * len(cols)]
    baselines = {n for n, m in eval_metrics.items()
                 if n == BASE or isinstance(m, Mapping) and m.get("baseline") is True}

    def order(name: str) -> tuple[int, str]:  # the baselines, then SFT, then the methods
        return (0 if name in baselines else 1 if name == SFT else 2, name)

    for name in sorted(rows, key=order):
        label = f"{name} (baseline)" if name in baselines else name
        lines.append(f"| {label} | " + " | ".join(_fmt(rows[name].get(c)) for c in cols) + " |")
    return "\n".join(lines)


def run_link(tracking_uri: str, experiment_id: str, run_id: str) -> str:
    """A browsable link to an MLflow run: the server's UI for an http(s) tracking URI, else the
    path to open in ``mlflow ui`` (default http://127.0.0.1:5000) on that local store."""
    base = tracking_uri.rstrip("/") if tracking_uri.startswith(("http://", "https://")) \
        else "http://127.0.0.1:5000"
    return f"{base}/#/experiments/{experiment_id}/runs/{run_id}"


def render_report(*, status: str, params_path: str, overrides: Mapping[str, Any],
                  tracking_uri: str, experiment_id: str | None, parent_run_id: str | None,
                  runs: Sequence[Mapping[str, Any]], eval_metrics: Mapping[str, Any] | None,
                  steps: Sequence[Mapping[str, Any]], failure: str | None = None) -> str:
    """The whole report.

    Args:
        status: "Completed" or "Failed".
        runs: MLflow stage runs, each ``{"name", "run_id", "status"}``.
        steps: the pipeline's steps as run so far, each ``{"step", "state"}`` (``Completed``,
            ``UpToDate`` (DVC found the stage up to date: not run), ``Failed``).
        failure: "step <name> failed: <reason>" for a failed run; lines after the first (the
            output's tail of a failed DVC command) go into a text block.
    """
    out = [f"# hargo pipeline: {status}", ""]
    if failure:
        head, _, detail = failure.partition("\n")  # a DVC failure: its output's tail follows
        out += [f"**{head}**", ""]
        if detail.strip():
            out += ["~~~text", detail.strip(), "~~~", ""]
    out += [f"params: `{params_path}`" + (", overrides:" if overrides else ""), ""]
    if overrides:
        out += [f"- `{k}`: `{v!r}`" for k, v in overrides.items()] + [""]
    if steps:
        out += ["## Steps", "", "| step | state |", "|---|---|"]
        out += [f"| {s['step']} | {s['state']} |" for s in steps]
        out.append("")
    table = metrics_table(eval_metrics or {})
    out += ["## Evaluated models (metrics/eval.json)", "", table or "_no evaluation yet_", ""]
    out += ["## MLflow", "", f"tracking URI: `{tracking_uri}`"]
    if not tracking_uri.startswith(("http://", "https://")):
        out.append(f"(browse with `mlflow ui --backend-store-uri {tracking_uri}`)")
    out.append("")
    if parent_run_id and experiment_id is not None:
        out.append(f"pipeline run: [{parent_run_id}]"
                   f"({run_link(tracking_uri, experiment_id, parent_run_id)})")
        out.append("")
    if runs:
        out += ["| stage run | run id | status |", "|---|---|---|"]
        for r in runs:
            link = run_link(tracking_uri, experiment_id or "0", r["run_id"])
            out.append(f"| {r['name']} | [{r['run_id']}]({link}) | {r['status']} |")
        out.append("")
    return "\n".join(out)


def mlflow_runs(experiment_id: str, parent_run_id: str) -> list[dict[str, str]]:
    """The stage runs nested under ``parent_run_id`` (oldest first), as ``{name, run_id,
    status}``. Reads the store MLflow currently points at."""
    from mlflow.tracking import MlflowClient

    found = MlflowClient().search_runs(
        [experiment_id], filter_string=f"tags.`mlflow.parentRunId` = '{parent_run_id}'",
        order_by=["attributes.start_time ASC"], max_results=200)
    return [{"name": r.info.run_name, "run_id": r.info.run_id, "status": r.info.status}
            for r in found]
