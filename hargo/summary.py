"""``hargo summary``: the table that ends the main job.

Per model from ``metrics/eval.json``, the baselines first and marked as such: ``always-yes``
("yes" to every race prompt), ``nearest-train`` (the label of the most similar train kernel,
``hargo.evaluation.baselines``) and ``base`` (the untuned base model), then SFT and each method
of ``rl.methods``: DR-F1 with the race metrics a prior cannot fool beside it -- the Matthews
correlation (MCC, 0 for any constant answer), the ROC AUC of the first-token
``log P(yes) - log P(no)`` (0.5 for a constant score) and the share of "yes" answers -- PLP
similarity, MLPerf EM, AvgScore, WinRate against SFT (the judge is named in the header) and
generation speed; the alias each model's registered version holds, from ``metrics/register.json``.
The metric columns before AvgScore are the tasks' (each registered task's ``Metric`` objects of
the ``summary`` view, :func:`hargo.tasks.headline_metrics`): a new task's own metric gets a
column with no edit here.
A claimed race gain counts only where it beats all three baselines.
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

from hargo.config import Config

__all__ = ["STAGES", "columns", "stage_names", "collect", "render", "run"]

STAGES = ("prepare", "validate", "base_model", "sft", "rl", "evaluate", "register")
EVAL_FILE = "metrics/eval.json"
REGISTER_FILE = "metrics/register.json"


def columns() -> tuple[tuple[str, str], ...]:
    """The metric columns, ``(key of metrics/eval.json, label)``: the registered tasks' metrics
    of the ``summary`` view (:func:`hargo.tasks.headline_metrics`; the built-ins: DR-F1, DR MCC,
    DR AUC, yes share, PLP sim, MLPerf EM), then AvgScore. Read from the registry when called."""
    from hargo.tasks import headline_metrics

    return tuple((m.key, m.label) for m in headline_metrics("summary")) + (
        ("avg_score", "AvgScore"),)


#: The trivial race baseline beside the models: "yes" to every race prompt of the same eval set
#: (its F1 looks respectable, its MCC is 0; a model whose MCC is near 0 learned nothing).
ALWAYS_YES = "always-yes"
#: The lookup baseline: each race prompt gets the label of its most similar train kernel.
NEAREST_TRAIN = "nearest-train"
#: The untuned base model, evaluated like the trained ones.
BASE = "base"
#: The baseline rows, in table order (keys of ``metrics/eval.json``).
BASELINES = (ALWAYS_YES, NEAREST_TRAIN, BASE)


def stage_names(params: Config) -> list[str]:
    """The pipeline's stages in DVC order, ``rl@<method>`` for each of ``rl.methods``
    (``params``: the typed config)."""
    out = []
    for s in STAGES:
        if s == "rl":
            out.extend(f"rl@{m}" for m in params.rl.methods)
        else:
            out.append(s)
    return out


def _find_parent(client, exp_id: str, params: Config, root: Path) -> str | None:
    from hargo.tracking import PARENT_ENV, pipeline_key

    if os.environ.get(PARENT_ENV):
        return os.environ[PARENT_ENV]
    key = pipeline_key(params, root)
    found = client.search_runs([exp_id], filter_string=f"tags.`hargo.pipeline_key` = '{key}'",
                               max_results=1)
    return found[0].info.run_id if found else None


def stage_times(params: Config, root: str | Path = ".") -> tuple[dict[str, dict], str | None]:
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
        exp = client.get_experiment_by_name(params.mlflow.experiment)
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


def collect(params: Config, root: str | Path = ".") -> dict:
    """Everything the table shows (``params``: the typed config; its
    ``rl.methods`` and ``mlflow.experiment`` are read).

    Returns ``{"judge", "models": {model: {<each key of columns()> (the built-ins: dr_f1, dr_mcc,
    dr_auc, dr_yes_share, plp_similarity, mlperf_em, avg_score), win_rate, gen_tokens_per_s,
    alias, baseline}}, "stages":
    {...}, "stages_note", "total_s", "register": {...} | None}``. ``models`` lists the baselines
    present in ``eval.json`` first (:data:`BASELINES` order; ``baseline`` True), then ``sft`` and
    each method (None when not evaluated). An ``eval.json`` written before the always-yes entry
    existed gets that row from SFT's ``dr_always_yes_f1`` (MCC 0, yes share 1, no AUC).

    Raises:
        FileNotFoundError: no ``metrics/eval.json`` (the pipeline has not evaluated yet).
        HargoInputError: it or ``metrics/register.json`` is not valid JSON or not an object,
            or a model's metric is neither a number nor null (file, model and field named).
    """
    from hargo.io import HargoInputError

    root = Path(root)
    path = root / EVAL_FILE
    if not path.exists():
        raise FileNotFoundError(f"{path} not found: run the pipeline first (dvc repro)")
    doc = _json_object(path)
    reg = _json_object(root / REGISTER_FILE) if (root / REGISTER_FILE).exists() else None
    aliases: dict[str, list[str]] = {}
    if reg:
        champ, cand = reg.get("champion") or {}, reg.get("candidate") or {}
        for alias, v in (("champion", champ), ("candidate", cand)):
            if v.get("method"):
                aliases.setdefault(v["method"], []).append(f"@{alias} v{v['version']}")
    cols = columns()

    def row(e: Mapping, m: str, baseline: bool) -> dict:
        keys = [k for k, _ in cols] + ["win_rate", "gen_tokens_per_s"]
        for k in keys:     # a number or null: the table formats it
            v = e.get(k)
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))):
                raise HargoInputError(path, f"model {m!r}: expected a number or null, got "
                                            f"{v!r:.40}", field=k)
        return {**{k: e.get(k) for k in keys}, "alias": ", ".join(aliases.get(m, [])),
                "baseline": baseline}

    sft = doc.get("sft") if isinstance(doc.get("sft"), dict) else None
    models: dict = {}
    for m in BASELINES:
        if isinstance(doc.get(m), dict):
            models[m] = row(doc[m], m, True)
        elif m == ALWAYS_YES and sft and sft.get("dr_always_yes_f1") is not None:
            models[m] = row({"dr_f1": sft["dr_always_yes_f1"], "dr_mcc": 0.0,
                             "dr_yes_share": 1.0}, m, True)
    for m in ["sft", *params.rl.methods]:
        e = doc.get(m)
        models[m] = row(e, m, False) if isinstance(e, dict) else None
    stages, note = stage_times(params, root)
    total = sum(s["seconds"] or 0.0 for s in stages.values())
    return {"judge": (doc.get("run") or {}).get("judge", "unknown"), "models": models,
            "stages": stages, "stages_note": note, "total_s": total, "register": reg}


def _json_object(path: Path) -> dict:
    """The JSON object in ``path`` (a metrics file hargo wrote).

    Raises:
        HargoInputError: not valid JSON, or not an object (the file, and what it holds)."""
    from hargo.io import HargoInputError

    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as e:
        raise HargoInputError(path, f"not valid JSON: {e}") from None
    if not isinstance(doc, dict):
        raise HargoInputError(path, f"expected a JSON object (one entry per model), got "
                                    f"{type(doc).__name__} {json.dumps(doc)[:40]}")
    return doc


def _num(v, pct: bool = False) -> str:
    if v is None:
        return "-"
    return f"{100 * v:.1f}" if pct else f"{v:.3f}"


CAPTION = ("baselines: always-yes answers yes to every race prompt (MCC 0, AUC 0.5); "
           "nearest-train the label of the most similar train race kernel (Jaccard of token "
           "sets); base the untuned base model. A race gain counts only above all three (DR "
           "MCC, DR AUC).")


def _cells(data: Mapping) -> tuple[list[str], list[tuple[str, bool, list[str] | None]]]:
    """The metrics table's text: its column labels (after ``model``) and, per model, ``(name,
    baseline, cells)`` (cells None: not evaluated)."""
    cols = columns()
    labels = [label for _, label in cols] + ["WinRate vs SFT", "gen tok/s", "registry"]
    rows = []
    for m, row in data["models"].items():
        if row is None:
            rows.append((m, False, None))
            continue
        rows.append((f"{m} (baseline)" if row.get("baseline") else m, bool(row.get("baseline")),
                     [*[_num(row.get(k)) for k, _ in cols],
                      "-" if m == "sft" else _num(row["win_rate"]),
                      "-" if row["gen_tokens_per_s"] is None
                      else f"{row['gen_tokens_per_s']:.0f}",
                      row["alias"]]))
    return labels, rows


def _wide(data: Mapping):
    """One row per model, one column per metric (the layout for a wide console)."""
    from rich.table import Table

    labels, rows = _cells(data)
    t = Table(title=f"hargo: eval metrics per model (WinRate judge: {data['judge']})",
              title_justify="left", caption=CAPTION, caption_justify="left")
    t.add_column("model", style="bold", no_wrap=True)
    for label in labels[:-1]:
        t.add_column(label, justify="right")
    t.add_column(labels[-1], justify="left")
    for i, (name, baseline, cells) in enumerate(rows):
        if cells is None:
            t.add_row(name, *["-"] * (len(labels) - 1), "not evaluated")
            continue
        t.add_row(name, *cells, end_section=baseline and (
            i + 1 == len(rows) or not rows[i + 1][1]))
    return t


def _transposed(data: Mapping):
    """One row per metric, one column per model (a narrower console: fewer models than
    metrics)."""
    from rich.table import Table

    labels, rows = _cells(data)
    t = Table(title=f"hargo: eval metrics per model (WinRate judge: {data['judge']})",
              title_justify="left", caption=CAPTION, caption_justify="left",
              expand=True)   # measured at its narrowest; shown as wide as the console
    t.add_column("metric", style="bold")
    for name, _, _ in rows:
        t.add_column(name, justify="right")
    for j, label in enumerate(labels):
        t.add_row(label, *[("not evaluated" if j == len(labels) - 1 else "-")
                           if cells is None else cells[j] for _, _, cells in rows])
    return t


def _stacked(data: Mapping):
    """One block per model, a metric a line (the narrowest layout: about 35 columns)."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    labels, rows = _cells(data)
    out = [Text(f"hargo: eval metrics per model (WinRate judge: {data['judge']})")]
    for name, _, cells in rows:
        g = Table.grid(padding=(0, 2))
        g.add_column(style="dim")
        g.add_column(justify="right", no_wrap=True)
        if cells is None:
            g.add_row("", "not evaluated")
        else:
            for label, cell in zip(labels, cells):
                g.add_row(label, cell)
        out += [Text(name, style="bold"), g]
    out.append(Text(CAPTION, style="dim"))
    return Group(*out)


def _fit(table, width: int) -> bool:
    """Lay ``table`` out ``width`` columns wide with every cell whole (words may wrap, never be
    cut): True, with each column's width fixed where the table is narrower than its natural
    width (rich itself would narrow the widest columns past their longest word and end the
    cells in ``…``); False where even its narrowest whole layout is wider."""
    from rich.console import Console
    from rich.measure import Measurement

    console = Console(width=10_000)   # rich clamps a measurement to the console's width
    ranges = []
    for column in table.columns:
        ms = [Measurement.get(console, console.options, c)
              for c in (column.header, *column.cells)]
        ranges.append((max(m.minimum for m in ms), max(m.maximum for m in ms)))
    overhead = (Measurement.get(console, console.options, table).maximum
                - sum(hi for _, hi in ranges))   # padding and borders
    room = width - overhead
    lo_sum, hi_sum = sum(lo for lo, _ in ranges), sum(hi for _, hi in ranges)
    if room < lo_sum:
        return False
    if room < hi_sum:   # share the room beyond the minimums in proportion to what each wants
        slack, want = room - lo_sum, hi_sum - lo_sum
        widths = [lo + (hi - lo) * slack // want for lo, hi in ranges]
        for i in sorted(range(len(ranges)), key=lambda i: ranges[i][0] - ranges[i][1]):
            if sum(widths) < room and widths[i] < ranges[i][1]:   # the rounding's remainder
                widths[i] += 1
        for column, w in zip(table.columns, widths):
            column.width = w
    return True


def metrics_view(data: Mapping, width: int | None = None):
    """The metrics of :func:`collect`'s ``data`` laid out for a console ``width`` columns wide:
    the wide table where every cell fits whole, else the transposed one (metrics as rows),
    else one block per model, so that no number is ever cut (rich would shorten every cell to
    ``0…`` to squeeze the wide table into 80 columns). ``width`` None: the wide table."""
    if width is None:
        return _wide(data)
    for make in (_wide, _transposed):
        view = make(data)
        if _fit(view, width):
            return view
    return _stacked(data)


def render(data: Mapping, width: int | None = None):
    """The rich renderables: the metrics (:func:`metrics_view` for a console ``width`` columns
    wide), the stage table and the champion line."""
    from rich.table import Table
    from rich.text import Text

    t = metrics_view(data, width)
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


def run(params: Config, root: str | Path = ".") -> dict:
    """Print the summary (rich) of the typed config ``params`` and return :func:`collect`'s
    dict.

    Raises:
        FileNotFoundError: no ``metrics/eval.json``.
    """
    from hargo.console import table_console

    data = collect(params, root)
    console = table_console(140)
    for r in render(data, console.width):
        console.print(r)
    return data
