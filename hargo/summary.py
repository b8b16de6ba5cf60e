"""``hargo summary``: the table that ends the main job.

Per model (SFT, the always-yes race baseline on the same prompts, then each method of
``rl.methods``) from ``metrics/eval.json``: DR-F1 with the Matthews correlation (MCC, 0 for any
constant answer) and the share of "yes" answers beside it, PLP similarity, MLPerf EM, AvgScore, WinRate against SFT (the judge is named in the header) and
generation speed; the alias each model's registered version holds, from ``metrics/register.json``.
Per stage: the wall time of its MLflow child run under this pipeline's parent run (the parent of
``$HARGO_PARENT_RUN_ID``, else the one tagged with this commit's and params' pipeline key,
``hargo.tracking.pipeline_key``). A stage with no run under that parent did not run this time:
DVC found it up to date and skipped it, so it shows as ``cached``. Nothing here writes to MLflow.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Mapping

__all__ = ["STAGES", "stage_names", "collect", "render", "run"]

STAGES = ("prepare", "validate", "base_model", "sft", "rl", "evaluate", "register")
EVAL_FILE = "metrics/eval.json"
REGISTER_FILE = "metrics/register.json"
COLUMNS = (("dr_f1", "DR-F1"), ("dr_mcc", "DR MCC"), ("dr_yes_share", "yes share"),
           ("plp_similarity", "PLP sim"), ("mlperf_em", "MLPerf EM"), ("avg_score", "AvgScore"))
#: The trivial race baseline beside the models: "yes" to every race prompt of the same eval set
#: (its F1 looks respectable, its MCC is 0; a model whose MCC is near 0 learned nothing).
ALWAYS_YES = "always-yes"


def stage_names(params: Mapping) -> list[str]:
    """The pipeline's stages in DVC order, ``rl@<method>`` for each of ``rl.methods``."""
    out = []
    for s in STAGES:
        if s == "rl":
            out.extend(f"rl@{m}" for m in params["rl"]["methods"])
        else:
            out.append(s)
    return out


def _find_parent(client, exp_id: str, params: Mapping, root: Path) -> str | None:
    from hargo.tracking import PARENT_ENV, pipeline_key

    if os.environ.get(PARENT_ENV):
        return os.environ[PARENT_ENV]
    key = pipeline_key(params, root)
    found = client.search_runs([exp_id], filter_string=f"tags.`hargo.pipeline_key` = '{key}'",
                               max_results=1)
    return found[0].info.run_id if found else None


def stage_times(params: Mapping, root: str | Path = ".") -> tuple[dict[str, dict], str | None]:
    """Wall time per stage from MLflow.

    Returns ``({stage: {"status": "ran" | "failed" | "running" | "cached", "seconds": float |
    None}}, note)``: ``note`` explains when no time could be read (no store, no parent run).
    A stage run several times under the parent counts its latest run.
    """
    import mlflow
    from mlflow.tracking import MlflowClient

    from hargo.tracking import tracking_uri

    root = Path(root)
    names = stage_names(params)
    out = {s: {"status": "cached", "seconds": None} for s in names}
    uri = tracking_uri(root)
    try:
        mlflow.set_tracking_uri(uri)
        client = MlflowClient(uri)
        exp = client.get_experiment_by_name(params.get("mlflow", {}).get("experiment", "hargo"))
        if exp is None:
            return out, f"no MLflow experiment in {uri}: no stage logged a run"
        parent = _find_parent(client, exp.experiment_id, params, root)
        if parent is None:
            return out, ("no pipeline run for this commit and params in MLflow: every stage was "
                         "cached by DVC")
        runs = client.search_runs([exp.experiment_id],
                                  filter_string=f"tags.`mlflow.parentRunId` = '{parent}'",
                                  order_by=["attributes.start_time ASC"], max_results=1000)
    except Exception as e:  # the summary is informational: report, do not fail the job
        return out, f"MLflow store {uri} unreadable ({type(e).__name__}: {e})"
    for r in runs:
        stage = r.data.tags.get("hargo.stage")
        if stage == "rl":
            stage = f"rl@{r.data.tags.get('hargo.method')}"
        if stage not in out:
            continue
        st, end = r.info.start_time, r.info.end_time
        seconds = (end - st) / 1000.0 if st and end else None
        status = {"FINISHED": "ran", "FAILED": "failed", "KILLED": "failed"}.get(
            r.info.status, "running")
        out[stage] = {"status": status, "seconds": seconds}
    return out, None


def collect(params: Mapping, root: str | Path = ".") -> dict:
    """Everything the table shows.

    Returns ``{"judge", "models": {model: {dr_f1, plp_similarity, mlperf_em, avg_score,
    win_rate, gen_tokens_per_s, alias}}, "stages": {...}, "stages_note", "total_s",
    "register": {...} | None}``.

    Raises:
        FileNotFoundError: no ``metrics/eval.json`` (the pipeline has not evaluated yet).
        HargoInputError: it is not valid JSON.
    """
    from hargo.io import HargoInputError

    root = Path(root)
    path = root / EVAL_FILE
    if not path.exists():
        raise FileNotFoundError(f"{path} not found: run the pipeline first (dvc repro)")
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as e:
        raise HargoInputError(path, f"not valid JSON: {e}") from None
    reg = None
    if (root / REGISTER_FILE).exists():
        try:
            reg = json.loads((root / REGISTER_FILE).read_text(encoding="utf-8"))
        except ValueError as e:
            raise HargoInputError(root / REGISTER_FILE, f"not valid JSON: {e}") from None
    aliases: dict[str, list[str]] = {}
    if reg:
        champ, cand = reg.get("champion") or {}, reg.get("candidate") or {}
        for alias, v in (("champion", champ), ("candidate", cand)):
            if v.get("method"):
                aliases.setdefault(v["method"], []).append(f"@{alias} v{v['version']}")
    models = {}
    for m in ["sft", *params["rl"]["methods"]]:
        e = doc.get(m)
        if not isinstance(e, dict):
            models[m] = None
            continue
        models[m] = {k: e.get(k) for k, _ in COLUMNS}
        models[m]["win_rate"] = e.get("win_rate")
        models[m]["gen_tokens_per_s"] = e.get("gen_tokens_per_s")
        models[m]["alias"] = ", ".join(aliases.get(m, []))
    sft = doc.get("sft") if isinstance(doc.get("sft"), dict) else None
    if sft and sft.get("dr_always_yes_f1") is not None:
        base = {k: None for k, _ in COLUMNS}
        base.update(dr_f1=sft["dr_always_yes_f1"], dr_mcc=0.0, dr_yes_share=1.0)
        models = {"sft": models.pop("sft"), ALWAYS_YES: {**base, "win_rate": None,
                                                          "gen_tokens_per_s": None, "alias": ""},
                  **models}
    stages, note = stage_times(params, root)
    total = sum(s["seconds"] or 0.0 for s in stages.values())
    return {"judge": (doc.get("run") or {}).get("judge", "unknown"), "models": models,
            "stages": stages, "stages_note": note, "total_s": total, "register": reg}


def _num(v, pct: bool = False) -> str:
    if v is None:
        return "-"
    return f"{100 * v:.1f}" if pct else f"{v:.3f}"


def render(data: Mapping):
    """The rich renderables: the metrics table, the stage table and the champion line."""
    from rich.table import Table
    from rich.text import Text

    t = Table(title=f"hargo: eval metrics per model (WinRate judge: {data['judge']})",
              title_justify="left")
    t.add_column("model", style="bold", no_wrap=True)
    for _, label in COLUMNS:
        t.add_column(label, justify="right")
    t.add_column("WinRate vs SFT", justify="right")
    t.add_column("gen tok/s", justify="right")
    t.add_column("registry", justify="left")
    for m, row in data["models"].items():
        if row is None:
            t.add_row(m, *["-"] * (len(COLUMNS) + 2), "not evaluated")
            continue
        t.add_row(m, *[_num(row[k]) for k, _ in COLUMNS],
                  "-" if m in ("sft", ALWAYS_YES) else _num(row["win_rate"]),
                  "-" if row["gen_tokens_per_s"] is None else f"{row['gen_tokens_per_s']:.0f}",
                  row["alias"])
    s = Table(title="wall time per stage", title_justify="left")
    s.add_column("stage", style="bold")
    s.add_column("wall time", justify="right")
    for stage, v in data["stages"].items():
        if v["status"] == "cached":
            s.add_row(stage, Text("cached", style="dim"))
        else:
            secs = "-" if v["seconds"] is None else f"{v['seconds']:.1f} s"
            s.add_row(stage, secs if v["status"] == "ran" else f"{secs} ({v['status']})")
    s.add_row("total (ran)", f"{data['total_s']:.1f} s", style="bold")
    out = [t, s]
    if data.get("stages_note"):
        out.append(Text(f"note: {data['stages_note']}", style="yellow"))
    reg = data.get("register")
    if reg:
        line = f"registry {reg['model_name']}: {reg['decision']}"
        for v in reg.get("versions", []):
            line += f"\n  v{v['version']} ({v['method']}): gate {v['gate']} vs {v['reference']}"
        out.append(Text(line))
    else:
        out.append(Text("registry: not registered yet (run hargo register)", style="yellow"))
    return out


def run(params: dict, root: str | Path = ".") -> dict:
    """Print the summary (rich) and return :func:`collect`'s dict.

    Raises:
        FileNotFoundError: no ``metrics/eval.json``.
    """
    from rich.console import Console

    data = collect(params, root)
    console = Console(width=max(Console().width, 140))
    for r in render(data):
        console.print(r)
    return data
