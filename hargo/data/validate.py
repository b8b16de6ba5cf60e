"""Stage ``validate``: Great Expectations contracts over the raw and the prepared data.

Three tables are validated, each by its own ExpectationSuite through a ValidationDefinition and a
Checkpoint in an ephemeral GX context (pandas data source; GX 1.x):

``raw``
    one row per raw record (:func:`hargo.data.raw.load_raw`, which already rejects malformed
    files): instruction and output non-empty, task in the four values.
``prepared``
    one row per record of ``train.jsonl`` + ``eval.jsonl``, with computed columns: the record
    schema holds (field types), required fields present and non-empty, ``task`` in the four
    values, race labels present and in {yes, no} (no label on mlperf/plp), ids unique, ``source``
    points at a raw record, and ``leaks``: the record's instruction (taken from the raw record its
    ``source`` names, else the prompt text) also appears in the other split, compared after
    :func:`hargo.data.raw.normalise_text` (the grouped split's key: a copy with CRLF line ends,
    other whitespace or case is the same instruction); expected all False. ``near_train``: for a
    race eval record, the largest token-set Jaccard of its prompt to any train record of its task
    (:mod:`hargo.data.similarity`, exact; None for other rows); expected below
    ``data.split.similarity_threshold`` (no near-copy of an eval kernel in train).
    Prompt and answer lengths (characters) within ``validate.prompt_chars``/``answer_chars``.
    ``no_label_name_in_race_prompt``: no race prompt contains a DataRaceBench-style name carrying
    its label (:data:`hargo.data.labels.LABEL_NAME_REGEX`, the regex ``prepare``'s step 0 masks
    with); enforced when ``data.mask_label_names`` is true (the default), measured otherwise.
    With ``data.mask_label_names`` the raw race instructions are masked as ``prepare`` masks them
    (:func:`hargo.data.conflicts.mask_race_raws`) before they become the ``instruction`` column,
    so the leak check compares what was split.
``summary``
    one row per task (``n`` records, ``n_eval``) and one per race task and split
    (``yes_fraction``): counts within ``validate.task_counts``, eval non-empty, the yes-fraction
    within ``validate.yes_fraction``.

Under ``data.split.strategy: paper`` the papers' split keeps repeated instructions on both sides
and one race record without a label; the two expectations that measure those
(``prepared.no_train_eval_leak`` and ``prepared.race_label_present``) are then run and
reported, but not enforced. ``prepared.no_near_copy_in_train`` is enforced under
``data.split.strategy: similarity`` only, the split built to pass it; under ``grouped`` and
``paper`` it measures how many race eval records have a near-copy in train.

Outputs: ``reports/validation/report.json`` (per expectation: success, enforced, failing count,
a few offending ids), GX data docs (``reports/validation/index.html``) and
``metrics/validation.json`` (a summary). The report folder is written whole or not at all.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from hargo.data.conflicts import mask_race_raws
from hargo.data.control_tokens import CONTROL_TOKEN_REGEX
from hargo.data.gx_adapter import MAX_IDS, run_suites  # noqa: F401  (public here too)
from hargo.data.labels import LABEL_NAME, LABEL_NAME_REGEX
from hargo.data.raw import load_raw, normalise_text, source_file
from hargo.data.similarity import kernel_tokens, nearest_similarity
from hargo.config import Config
from hargo.io import atomic_dir, atomic_write_json, read_jsonl
from hargo.tasks import tasks as _registered

REPORT_DIR = "reports/validation"
METRICS_FILE = "metrics/validation.json"


def _tasks() -> tuple[str, ...]:
    """The tasks with raw records (registered tasks with a ``raw_file`` or a ``records``
    function: :func:`hargo.data.raw.load_raw`), in listing order; asked of the registry when
    called."""
    return tuple(t.name for t in _registered() if t.raw_file or t.records is not None)


def _race_tasks() -> tuple[str, ...]:
    """The yes/no tasks among :func:`_tasks` (their label checks)."""
    return tuple(t.name for t in _registered()
                 if (t.raw_file or t.records is not None) and t.kind == "yes_no")


class ValidationFailed(Exception):
    """One or more enforced expectations failed.

    Attributes:
        failures: the failed expectations' report entries (``name``, ``failing``, ``ids``, ...).
    """

    def __init__(self, failures: list[dict]):
        self.failures = failures
        lines = [f"{f['name']}: {f['failing']} failing of {f['element_count']} rows"
                 + (f" (e.g. {', '.join(map(str, f['ids']))})" if f["ids"] else "")
                 for f in failures]
        super().__init__(f"{len(failures)} expectation(s) failed:\n  " + "\n  ".join(lines))


# ----------------------------------------------------------------------------- tables (pure)

def _str_or_none(x: Any) -> str | None:
    return x if isinstance(x, str) else None


def _schema_ok(r: dict) -> bool:
    p = r.get("prompt")
    src = r.get("source")
    return (isinstance(r.get("id"), str) and isinstance(r.get("task"), str)
            and isinstance(p, list) and len(p) > 0
            and all(isinstance(m, dict) and isinstance(m.get("role"), str)
                    and isinstance(m.get("content"), str) for m in p)
            and isinstance(r.get("answer"), str)
            and (r.get("label") is None or isinstance(r.get("label"), str))
            and isinstance(r.get("alt_answers", []), list)
            and all(isinstance(a, str) for a in r.get("alt_answers", []))
            and isinstance(src, dict) and isinstance(src.get("file"), str)
            and isinstance(src.get("index"), int) and not isinstance(src.get("index"), bool))


def _prompt_content(r: dict) -> str | None:
    """Content of the last user turn, or None if the prompt is malformed."""
    p = r.get("prompt")
    if not isinstance(p, list):
        return None
    users = [m.get("content") for m in p if isinstance(m, dict) and m.get("role") == "user"]
    return users[-1] if users and isinstance(users[-1], str) else None


def raw_rows(raw: dict[str, list[dict]]) -> list[dict]:
    """Rows of the ``raw`` table: ``id`` (``task-index``), ``task``, the three fields."""
    return [{"id": f"{t}-{i:05d}", "task": t, **r} for t, rs in raw.items() for i, r in enumerate(rs)]


def prepared_rows(train: list[dict], eval_: list[dict], raw: dict[str, list[dict]]) -> list[dict]:
    """Rows of the ``prepared`` table, one per record, ``split`` = train | eval, with the
    computed columns ``schema_ok``, ``prompt_content``, ``prompt_chars``, ``answer_chars``,
    ``source_ok``, ``instruction``, ``leak_key`` (the normalised instruction), ``leaks`` and
    ``near_train`` (see the module docstring; :func:`near_train_similarity`)."""
    by_file = {source_file(t): rs for t, rs in raw.items()}
    rows = []
    for split, recs in (("train", train), ("eval", eval_)):
        for r in recs:
            content = _prompt_content(r)
            answer = _str_or_none(r.get("answer"))
            src = r.get("source") if isinstance(r.get("source"), dict) else {}
            rs, idx = by_file.get(src.get("file")), src.get("index")
            ok = rs is not None and isinstance(idx, int) and not isinstance(idx, bool) and 0 <= idx < len(rs)
            rows.append({
                "id": _str_or_none(r.get("id")), "task": _str_or_none(r.get("task")), "split": split,
                "schema_ok": _schema_ok(r), "prompt_content": content,
                "prompt_chars": len(content) if content is not None else None,
                "answer": answer, "answer_chars": len(answer) if answer is not None else None,
                "label": r.get("label") if isinstance(r.get("label"), str) else None,
                "source_ok": ok,
                "instruction": rs[idx]["instruction"] if ok else content,
            })
    for row in rows:
        row["leak_key"] = normalise_text(row["instruction"]) if row["instruction"] is not None else None
    sides = {s: {row["leak_key"] for row in rows if row["split"] == s} for s in ("train", "eval")}
    for row in rows:
        other = sides["eval" if row["split"] == "train" else "train"]
        row["leaks"] = row["leak_key"] is not None and row["leak_key"] in other
    for row, near in zip(rows, near_train_similarity(train, eval_)):
        row["near_train"] = near
    return rows


def _tokens(r: dict) -> frozenset | None:
    try:
        return kernel_tokens(r["prompt"])
    except (KeyError, TypeError, ValueError):  # a malformed prompt: record_schema reports it
        return None


def near_train_similarity(train: list[dict], eval_: list[dict]) -> list[float | None]:
    """One value per record of ``train + eval_``, in that order: for a race eval record, the
    largest token-set Jaccard (:func:`hargo.data.similarity.jaccard`) of its prompt to any
    well-formed train record of the same task (0.0 without one); None for train records, other
    tasks and malformed prompts."""
    out: list[float | None] = [None] * len(train)
    pools = {t: [x for x in (_tokens(r) for r in train if r.get("task") == t) if x is not None]
             for t in _race_tasks()}
    for r in eval_:
        toks = _tokens(r) if r.get("task") in pools else None
        out.append(None if toks is None else nearest_similarity(pools[r["task"]], [toks])[0])
    return out


def summary_rows(prepared: list[dict]) -> list[dict]:
    """Rows of the ``summary`` table: per task ``{id: task, kind: "task", n, n_eval}``; per race
    task and split ``{id: "task/split", kind: "labels", yes_fraction}`` (None when empty)."""
    rows = []
    for t in _tasks():
        mine = [r for r in prepared if r["task"] == t]
        rows.append({"id": t, "kind": "task", "n": len(mine),
                     "n_eval": sum(r["split"] == "eval" for r in mine), "yes_fraction": None})
    for t in _race_tasks():
        for s in ("train", "eval"):
            labs = [r["label"] for r in prepared if r["task"] == t and r["split"] == s]
            yes = sum(lab == "yes" for lab in labs) / len(labs) if labs else None
            rows.append({"id": f"{t}/{s}", "kind": "labels", "n": len(labs), "n_eval": None,
                         "yes_fraction": yes})
    return rows


def expectation_specs(params: Config) -> list[dict]:
    """The contract, as plain data: one dict per expectation with ``dataset`` (raw | prepared |
    summary), ``name``, GX class name ``type``, its ``kwargs``, an optional ``where``
    (``(column, [values])``: only rows whose column is in values), ``enforced`` and
    ``description``. Bounds come from the ``validate`` section (character lengths in
    characters, counts in records, the yes-fraction in [0, 1]), the split and masking rules
    from ``data``; ``params`` is the typed config (:class:`hargo.config.Config`). Raises
    nothing: the config was checked when it was built."""
    v, data = params.validate, params.data
    S: list[dict] = []

    def add(dataset, name, type_, description, where=None, enforced=True, **kwargs):
        S.append({"dataset": dataset, "name": f"{dataset}.{name}", "type": type_, "kwargs": kwargs,
                  "where": where, "enforced": enforced, "description": description})

    add("raw", "instruction_non_empty", "ExpectColumnValuesToMatchRegex", "raw instruction is not blank",
        column="instruction", regex=r"\S")
    add("raw", "output_non_empty", "ExpectColumnValuesToMatchRegex", "raw output is not blank",
        column="output", regex=r"\S")
    add("raw", "task_in_set", "ExpectColumnValuesToBeInSet", "task is one of the four",
        column="task", value_set=list(_tasks()))
    _prepared_specs(add, v, data)
    _summary_specs(add, v)
    return S


def _prepared_specs(add, v, data) -> None:
    """The ``prepared`` table's expectations, through :func:`expectation_specs`' ``add``; ``v``
    and ``data`` are the ``validate`` and ``data`` sections."""
    paper = data.split.strategy == "paper"
    masked = data.mask_label_names
    similarity = data.split.strategy == "similarity"
    threshold = data.split.similarity_threshold
    race, other = list(_race_tasks()), [t for t in _tasks() if t not in _race_tasks()]
    add("prepared", "record_schema", "ExpectColumnValuesToBeInSet",
        "every field has the schema's type (id, task, prompt turns, answer, label, alt_answers, source)",
        column="schema_ok", value_set=[True])
    for col in ("id", "task", "prompt_content", "answer"):
        add("prepared", f"{col.split('_')[0]}_present", "ExpectColumnValuesToNotBeNull",
            f"{col} is present", column=col)
    add("prepared", "prompt_non_empty", "ExpectColumnValuesToMatchRegex", "the user turn is not blank",
        column="prompt_content", regex=r"\S")
    add("prepared", "answer_non_empty", "ExpectColumnValuesToMatchRegex", "the reference answer is not blank",
        column="answer", regex=r"\S")
    add("prepared", "task_in_set", "ExpectColumnValuesToBeInSet", "task is one of the four",
        column="task", value_set=list(_tasks()))
    add("prepared", "id_unique", "ExpectColumnValuesToBeUnique", "ids are unique over train + eval",
        column="id")
    add("prepared", "race_label_present", "ExpectColumnValuesToNotBeNull",
        "every race record has a label" + (" (paper split: measured, not enforced)" if paper else ""),
        where=("task", race), enforced=not paper, column="label")
    add("prepared", "race_label_in_set", "ExpectColumnValuesToBeInSet", "race labels are yes or no",
        where=("task", race), column="label", value_set=["yes", "no"])
    add("prepared", "other_label_null", "ExpectColumnValuesToBeNull", "mlperf/plp records carry no label",
        where=("task", other), column="label")
    add("prepared", "source_resolves", "ExpectColumnValuesToBeInSet",
        "source names an existing raw file and record index", column="source_ok", value_set=[True])
    add("prepared", "no_train_eval_leak", "ExpectColumnValuesToBeInSet",
        "no instruction is in both train and eval" + (" (paper split: measured, not enforced)" if paper else ""),
        enforced=not paper, column="leaks", value_set=[False])
    add("prepared", "no_near_copy_in_train", "ExpectColumnValuesToBeBetween",
        f"no race eval record has a train record of its task at token-set Jaccard >= {threshold}"
        + ("" if similarity else " (measured; enforced under the similarity split)"),
        where=("task", race), enforced=similarity, column="near_train", max_value=threshold,
        strict_max=True)
    add("prepared", "no_label_name_in_race_prompt", "ExpectColumnValuesToNotMatchRegex",
        "no race prompt names a DataRaceBench-style program with its label (DRB048_..._orig_no; "
        "hargo.data.labels.LABEL_NAME_REGEX)"
        + ("" if masked else " (measured; enforced with data.mask_label_names)"),
        where=("task", race), enforced=masked, column="prompt_content", regex=LABEL_NAME_REGEX)
    for col in ("prompt_content", "answer"):
        add("prepared", f"no_control_tokens_in_{col.split('_')[0]}",
            "ExpectColumnValuesToNotMatchRegex",
            f"no {col.split('_')[0]} holds a chat-template control token (<|im_end|>, </s>, "
            "[INST], ...; hargo.data.control_tokens): a data row cannot forge a chat turn",
            column=col, regex=CONTROL_TOKEN_REGEX)
    lo, hi = v.prompt_chars
    add("prepared", "prompt_chars_within_bounds", "ExpectColumnValuesToBeBetween",
        f"prompt length in [{lo}, {hi}] characters", column="prompt_chars", min_value=lo, max_value=hi)
    lo, hi = v.answer_chars
    add("prepared", "answer_chars_within_bounds", "ExpectColumnValuesToBeBetween",
        f"answer length in [{lo}, {hi}] characters", column="answer_chars", min_value=lo, max_value=hi)


def _summary_specs(add, v) -> None:
    """The ``summary`` table's expectations, through :func:`expectation_specs`' ``add``; ``v`` is
    the ``validate`` section."""
    for t, (lo, hi) in v.task_counts.items():
        add("summary", f"count_{t}", "ExpectColumnValuesToBeBetween",
            f"{t}: train + eval records in [{lo}, {hi}]", where=("id", [t]),
            column="n", min_value=lo, max_value=hi)
    add("summary", "eval_non_empty", "ExpectColumnValuesToBeBetween", "every task has eval records",
        where=("kind", ["task"]), column="n_eval", min_value=1)
    lo, hi = v.yes_fraction
    add("summary", "yes_fraction_within_bounds", "ExpectColumnValuesToBeBetween",
        f"race yes-fraction per task and split in [{lo}, {hi}]", where=("kind", ["labels"]),
        column="yes_fraction", min_value=lo, max_value=hi)


# ----------------------------------------------------------------------------- the stage

def run(params: Config) -> dict:
    """Run the ``validate`` stage (``params``: the typed config) inside its MLflow child run (a
    failed validation marks the run FAILED); see :func:`validate`."""
    import mlflow

    from hargo import tracking

    with tracking.stage_run("validate", params):
        out = validate(params)
        mlflow.log_metrics({k: v for k, v in out.items()
                            if isinstance(v, (int, float)) and not isinstance(v, bool)})
        return out


def validate(params: Config) -> dict:
    """Run the ``validate`` stage.

    Args:
        params: the typed config (:class:`hargo.config.Config`); reads ``data.raw_dir``,
            ``data.out_dir`` (the prepared ``train.jsonl``/``eval.jsonl``),
            ``data.split.strategy``, ``data.split.similarity_threshold``,
            ``data.mask_label_names`` (default true) and ``validate`` (``task_counts``,
            ``yes_fraction``, ``prompt_chars``, ``answer_chars``; optional ``report_dir`` and
            ``metrics_file``, default ``reports/validation`` and ``metrics/validation.json``,
            and ``data_docs``, default true: build GX's HTML data docs, ~2 s).

    Returns:
        The summary written to ``metrics/validation.json`` (deterministic for the same inputs,
        since the ``sft`` stage depends on it).

    Raises:
        HargoInputError: a raw or prepared file cannot be read.
        ValidationFailed: an enforced expectation failed (the report is written first).
    """
    v, data = params.validate, params.data
    report_dir = Path(v.report_dir)
    metrics_file = Path(v.metrics_file)
    raw = load_raw(data.raw_dir)
    out = Path(data.out_dir)
    train, eval_ = read_jsonl(out / "train.jsonl"), read_jsonl(out / "eval.jsonl")
    as_split = {t: mask_race_raws(t, rs)[0] for t, rs in raw.items()} \
        if data.mask_label_names else raw
    prepared = prepared_rows(train, eval_, as_split)
    tables = {"raw": raw_rows(raw), "prepared": prepared, "summary": summary_rows(prepared)}
    specs = expectation_specs(params)

    with atomic_dir(report_dir) as tmp:
        results = run_suites(tables, specs, docs_dir=tmp if v.data_docs else None)
        failed = [r for r in results if not r["success"] and r["enforced"]]
        leaked = [r for r in prepared if r["leaks"]]
        summary = {
            "success": not failed,
            "strategy": data.split.strategy,
            "expectations": len(results),
            "failed": len(failed),
            "failed_not_enforced": sum(1 for r in results if not r["success"] and not r["enforced"]),
            "rows": {"raw": len(tables["raw"]), "train": len(train), "eval": len(eval_)},
            "leaked_rows": len(leaked),
            "leaked_instructions": len({r["leak_key"] for r in leaked}),
            "unlabelled_race_rows": sum(1 for r in prepared if r["task"] in _race_tasks() and r["label"] is None),
            "label_name_rows": sum(1 for r in prepared if r["task"] in _race_tasks()
                                   and r["prompt_content"] is not None
                                   and LABEL_NAME.search(r["prompt_content"])),
            "near_copy_eval_rows": sum(1 for r in prepared if r["near_train"] is not None
                                       and r["near_train"] >= data.split.similarity_threshold),
        }
        atomic_write_json(tmp / "report.json", {"summary": summary, "expectations": results})
    atomic_write_json(metrics_file, summary)
    _print(results, summary)
    if failed:
        raise ValidationFailed(failed)
    return summary


def _print(results: list[dict], summary: dict) -> None:
    from hargo.console import table_console
    from rich.table import Table

    passed = sum(r["success"] for r in results)
    tab = Table(title=f"validation ({summary['strategy']} split): {passed} passed, "
                      f"{summary['failed']} failed, {summary['failed_not_enforced']} measured only")
    for col in ("expectation", "result", "failing", "e.g."):
        tab.add_column(col, no_wrap=col != "e.g.")
    for r in results:
        verdict = "ok" if r["success"] else ("FAILED" if r["enforced"] else "measured")
        tab.add_row(r["name"], verdict, str(r["failing"]), ", ".join(r["ids"][:3]))
    table_console(110).print(tab)
