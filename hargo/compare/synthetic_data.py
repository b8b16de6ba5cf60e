"""Stage ``synthetic_data`` of the synthetic test bed (:mod:`hargo.compare.synthetic`): the
generated train and eval splits in the prepared schema, validated by the record contract
(:func:`hargo.data.synthetic.check_synthetic`) and by a Great Expectations suite run through the
``validate`` stage's GX adapter (:func:`hargo.data.validate.run_suites`, :func:`contract_specs`),
and reading them back checked (:func:`read_split`, defined with the paths in
:mod:`hargo.compare.synthetic_plan` so that the training stages, which only read the splits, do
not import the GX adapter and the HPC data modules it uses)."""
from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

from hargo.compare.synthetic_plan import DATA_DIR, plan, read_split  # noqa: F401 (re-exported)
from hargo.config import Config
from hargo.data.synthetic import SYNTHETIC_TASKS, check_synthetic
from hargo.io import atomic_files, write_json, write_jsonl

__all__ = ["prepare_data", "read_split", "contract_specs", "contract_tables", "validate_splits"]


def contract_specs(data) -> list[dict]:
    """The synthetic splits' data contract, in :func:`hargo.data.validate.expectation_specs`'
    format (GX expectation class names and kwargs): on every record the prepared schema, a
    present and non-blank prompt and answer, a task of ``SYNTHETIC_TASKS``, unique ids, yes/no
    labels on syn_yesno only, no prompt in both splits; per task and split the record count
    ``data.n_train`` / ``data.n_eval``; per split the syn_yesno "yes" share within 0.5 +- one
    record (balanced by construction)."""
    S: list[dict] = []

    def add(dataset, name, type_, description, where=None, **kwargs):
        S.append({"dataset": dataset, "name": f"synthetic.{dataset}.{name}", "type": type_,
                  "kwargs": kwargs, "where": where, "enforced": True,
                  "description": description})

    add("prepared", "record_schema", "ExpectColumnValuesToBeInSet", "the prepared schema",
        column="schema_ok", value_set=[True])
    for col in ("prompt_content", "answer"):
        add("prepared", f"{col}_non_blank", "ExpectColumnValuesToMatchRegex", f"{col} not blank",
            column=col, regex=r"\S")
    add("prepared", "task_in_set", "ExpectColumnValuesToBeInSet", "a synthetic task",
        column="task", value_set=list(SYNTHETIC_TASKS))
    add("prepared", "id_unique", "ExpectColumnValuesToBeUnique", "ids unique over both splits",
        column="id")
    add("prepared", "yesno_label_in_set", "ExpectColumnValuesToBeInSet", "yes/no labels",
        where=("task", ["syn_yesno"]), column="label", value_set=["yes", "no"])
    add("prepared", "other_label_null", "ExpectColumnValuesToBeNull", "no label off syn_yesno",
        where=("task", ["syn_short", "syn_long"]), column="label")
    add("prepared", "no_train_eval_leak", "ExpectColumnValuesToBeInSet",
        "no prompt in both splits", column="leak", value_set=[False])
    for split, n in (("train", data.n_train), ("eval", data.n_eval)):
        add("summary", f"count_{split}", "ExpectColumnValuesToBeBetween",
            f"{n} records per task in {split}", where=("split", [split]), column="n",
            min_value=n, max_value=n)
        half = 1.0 / n if n else 0.0
        add("summary", f"yes_share_{split}", "ExpectColumnValuesToBeBetween",
            f"syn_yesno yes share in {split} within 0.5 +- one record",
            where=("split", [split]), column="yes_share", min_value=0.5 - half,
            max_value=0.5 + half, mostly=1.0)
    return S


def contract_tables(train: list[dict], ev: list[dict]) -> dict[str, list[dict]]:
    """The rows :func:`contract_specs` checks: ``prepared`` (one per record: id, task,
    prompt_content, answer, label, schema_ok, leak) and ``summary`` (one per task and split:
    ``n``; ``yes_share`` on syn_yesno, None elsewhere)."""
    from hargo.data.validate import _prompt_content, _schema_ok

    prompts = {split: {_prompt_content(r) for r in recs}
               for split, recs in (("train", train), ("eval", ev))}
    prepared = [{"id": r.get("id"), "task": r.get("task"), "prompt_content": _prompt_content(r),
                 "answer": r.get("answer"), "label": r.get("label"), "schema_ok": _schema_ok(r),
                 "leak": _prompt_content(r) in prompts["eval" if split == "train" else "train"]}
                for split, recs in (("train", train), ("eval", ev)) for r in recs]
    summary = []
    for split, recs in (("train", train), ("eval", ev)):
        for t in SYNTHETIC_TASKS:
            mine = [r for r in recs if r.get("task") == t]
            yes = [r.get("label") == "yes" for r in mine]
            summary.append({"id": f"{split}:{t}", "split": split, "task": t, "n": len(mine),
                            "yes_share": (sum(yes) / len(yes) if yes else None)
                            if t == "syn_yesno" else None})
    return {"prepared": prepared, "summary": summary}


def validate_splits(train: list[dict], ev: list[dict], data) -> list[dict]:
    """Run the GX suite of :func:`contract_specs` on the splits; returns the report entries.

    Raises:
        hargo.data.validate.ValidationFailed: an expectation failed (names it, the failing
            count and up to a few record ids).
    """
    from hargo.data.validate import ValidationFailed, run_suites

    results = run_suites(contract_tables(train, ev), contract_specs(data), None)
    failed = [r for r in results if r["enforced"] and not r["success"]]
    if failed:
        raise ValidationFailed(failed)
    return results


def prepare_data(params: Config, root: str | Path = ".") -> dict:
    """Stage ``synthetic_data`` (``params``: the typed config): the train and eval splits (seed
    ``params.seed``), validated
    (module docstring), and ``stats.json`` (records and mean reference length in characters per
    task and split, and every expectation's outcome).

    Raises:
        ParamsError: a bad ``synthetic`` block.
        ValueError: the prompt space is too small for the counts asked.
        hargo.data.validate.ValidationFailed: the GX contract failed (nothing is written).
    """
    from hargo.data.synthetic import generate

    p = plan(params)
    seed = params.seed
    train, ev = generate(p.data, seed)
    check_synthetic(train, "synthetic train split")
    check_synthetic(ev, "synthetic eval split")
    results = validate_splits(train, ev, p.data)
    out = Path(root) / DATA_DIR
    stats = {"seed": seed, "config": asdict(p.data), "splits": {},
             "expectations": {r["name"]: r["success"] for r in results}}
    for split, recs in (("train", train), ("eval", ev)):
        stats["splits"][split] = {t: {"records": sum(r["task"] == t for r in recs),
                                      "answer_chars_mean": round(
                                          sum(len(r["answer"]) for r in recs if r["task"] == t)
                                          / max(1, sum(r["task"] == t for r in recs)), 2)}
                                  for t in SYNTHETIC_TASKS}
    with atomic_files() as place:   # the three files as one set
        write_jsonl(place(out / "train.jsonl"), train)
        write_jsonl(place(out / "eval.jsonl"), ev)
        write_json(place(out / "stats.json"), stats)
    return stats
