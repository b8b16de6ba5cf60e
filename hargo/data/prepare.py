"""Stage ``prepare``: the four raw HPC-GPT files -> prepared train/eval splits.

Inputs (``data.raw_dir``): four JSON arrays of ``{instruction, input, output}``
records (../shared/datasets/SOURCE.md). Outputs (``data.out_dir``), written as one
set whole or not at all (:func:`hargo.io.atomic_files`: each to a temporary sibling, and only
when all are written do they replace the old ones), after every input has been read and checked:

- ``train.jsonl``, ``eval.jsonl``: one prepared record per line (schema in
  :func:`hargo.data.raw.make_record`; TRL's conversational ``prompt`` format).
- ``rejects.jsonl``: quarantined raw records with a ``reason`` (race prompt fields after step 0).
- ``stats.json``: counts per task, split and label; how each kind of mess was handled (per task
  in ``handling``; step 0 as ``label_name_records``, ``label_name_occurrences``, with
  ``mask_label_names`` and ``label_name_rule`` at the top level); answer and
  prompt length statistics; the longest/shortest task mean answer-length ratio; for every
  strategy, ``eval_nearest_train``: per race task, for each eval record the largest token-set
  Jaccard to any train record of the same task (:mod:`hargo.data.similarity`, exact, brute
  force), summarised as ``n``, ``median``, ``p90``, ``max``, ``share_ge_0_9``,
  ``share_ge_threshold`` (``data.split.similarity_threshold``;
  :func:`hargo.data.similarity.similarity_summary`): how far eval is from a lookup in train.
- ``answer_lengths.csv``: the per-task answer-length distribution for ``dvc plots``.

Step 0, every strategy (``data.mask_label_names``, default true): the label is removed from
DataRaceBench-style names in the race prompts (:func:`hargo.data.conflicts.mask_race_raws`,
:func:`hargo.data.labels.mask_label_names`). DataRaceBench names a program after its answer
(``program DRB048_firstprivate_orig_no``, ``DRB001-antidep1-orig-yes.c``) and 1,356 of the 1,576
raw Fortran prompts carry such a name (or an imitation: ``LP5_targetparallelfor_orig_no``,
``program ProgrammingModule_yes``); a model, or the nearest-train baseline, could read the
answer off the prompt. Every name matching :data:`hargo.data.labels.LABEL_NAME_REGEX` loses its
yes/no components (``DRB048_firstprivate_orig``), the same everywhere in the prompt, before
anything else compares or splits prompts; so two prompts that differed only in that name are the
same prompt from step 2 on. ``stats.json`` counts per task the raw records changed
(``label_name_records``) and the names replaced (``label_name_occurrences``); ``validate``
fails on a race prompt where the regex still matches.

Step 0b, every strategy and task: control-token strings in a raw record's instruction, input and
output (``<|im_end|>``, ``</s>``, ``[INST]``, ...: :mod:`hargo.data.control_tokens`) are broken
by an invisible word joiner, so no data row can close the user's turn and write the assistant's
when the chat template is tokenised; ``stats.json`` counts per task the records changed
(``control_token_records``) and the strings broken (``control_token_occurrences``);
``validate`` fails on a prepared prompt or answer that still holds one.

Three split strategies (``data.split.strategy``):

``grouped`` (no instruction in both splits)
    1. Quarantine (-> rejects): an empty instruction; an empty mlperf/plp answer; a race output
       with no unambiguous yes/no label (:func:`hargo.data.labels.parse_label`); a race
       instruction whose code snippet is missing (the upstream fault that moved the code into the
       output, :func:`hargo.data.labels.snippet_missing`): its label refers to code the model
       never sees.
    Steps 2-4 compare texts by one key, :func:`hargo.data.raw.normalise_text` (whitespace runs
    and line ends, case, surrounding blanks); ``validate``'s leak check uses it too.

    2. Remove duplicate records (instruction, input and output equal after the key, so a copy
       that differs only in whitespace or case is one), counted as ``exact_duplicates``.
    3. Group what is left by prompt (instruction and input after the key: a near-duplicate
       instruction, the same kernel indented differently, is the same prompt). Answers are
       compared after the key (race: the label). Same prompt, same answer: merged
       into one record (counted as ``merged_duplicates``). Same prompt, different answers (a
       conflict), one rule for every task: ``data.conflicts: majority`` keeps the answer of a
       strict majority of the raw records as ``answer`` and lists the other answers in
       ``alt_answers`` (never the reference); ``drop`` sends the whole group to rejects. A tie
       at the top has no reference and is rejected under both policies (reason
       ``conflicting_answers_tie``). ``stats.json`` counts, per task, ``conflict_groups`` =
       ``conflict_majority`` + ``conflict_ties`` and the records merged or rejected, and
       ``near_duplicates`` the prompts written in more than one way (and their raw records,
       after quarantine): each became one record or was rejected.
       (Steps 1-3: :func:`hargo.data.conflicts.clean_task`.)
    4. :func:`hargo.data.split.split_grouped` per task by instruction text after the key, so
       that no instruction is in both splits, not even as a near-duplicate.

``similarity`` (default: ``grouped``, and no near-copy of a race kernel in both splits)
    Steps 1-3 as ``grouped``. 4. :func:`hargo.data.split.split_similarity`: for the race tasks,
    records whose prompt token sets (the nearest-train baseline's,
    :func:`hargo.data.similarity.kernel_tokens`) have Jaccard >= ``data.split.similarity_threshold``
    are linked (MinHash LSH candidates with ``data.split.minhash_perm`` permutations, seeded by
    ``seed``, each verified with the exact Jaccard), as are records with the same instruction
    after the key; the connected components (chains included) are the groups, placed as
    ``grouped`` places its groups. mlperf and plp are split exactly as under ``grouped``.
    ``stats.json`` ``similarity_groups`` gives per race task the linked pairs, the groups and the
    largest group.

``paper`` (the HPC-GPT/HARGO papers' split, 5,273 train / 584 eval on the real files)
    Every raw record kept, in file order: no de-duplication, no quarantine. ``answer`` is the raw
    output; race records still get the normalised ``label`` where one exists (else ``None``).
    :func:`hargo.data.split.split_paper` per file. Instructions repeated upstream then land in
    both splits; the ``validate`` stage measures that overlap instead of failing on it.
    ``stats.json`` ``near_duplicates`` counts, per task, the split's groups that join
    instructions differing as written, and their records.

Token counts in the statistics are :func:`count_tokens` (a regex word/punctuation count), not
the model tokenizer's, which belongs to a later stage.
"""
from __future__ import annotations

import re
import statistics
from collections import Counter
from pathlib import Path
from typing import Any

from hargo.config import Config
from hargo.data import labels as L
from hargo.data.conflicts import clean_task, mask_race_raws, neutralise_raws
from hargo.data.raw import load_raw, make_record
from hargo.data.similarity import (kernel_tokens, nearest_similarity,
                                   similarity_summary)
from hargo.data.split import (near_duplicates, similarity_groups, split_grouped,
                              split_groups, split_paper)
from hargo.io import atomic_files, write_json, write_jsonl
from hargo import vocab  # its task lists read when used (a task module added later counts)

CONFLICT_RULE = ("answers compared after normalise_text; majority: a strict majority of the raw "
                 "records is the reference, the rest alt_answers; drop: every conflict rejected; "
                 "a tie at the top is rejected for every task under both")

_TOKEN = re.compile(r"\w+|[^\w\s]")


# ----------------------------------------------------------------------------- paper records

def paper_records(task: str, raws: list[dict]) -> list[dict]:
    """Every raw record of one task as a prepared record (the ``paper`` strategy): the raw
    output as ``answer``; for race tasks the normalised label, or ``None`` where there is none."""
    out = []
    for i, r in enumerate(raws):
        label = L.parse_label(r["output"])[0] if task in vocab.RACE_TASKS else None
        out.append(make_record(task, i, r, r["output"], label))
    return out


# ----------------------------------------------------------------------------- statistics

def count_tokens(text: str) -> int:
    """A deterministic, tokenizer-free token count: runs of word characters plus single
    punctuation characters (regex ``\\w+|[^\\w\\s]``). ``"a[i] = 1;"`` -> 7."""
    return len(_TOKEN.findall(text))


def _summary(values: list[int]) -> dict:
    if not values:
        return {"n": 0, "mean": 0.0, "median": 0.0, "min": 0, "max": 0}
    return {"n": len(values), "mean": round(statistics.fmean(values), 4),
            "median": float(statistics.median(values)), "min": min(values), "max": max(values)}


def length_ratio(means: dict[str, float]) -> dict:
    """Longest over shortest task mean answer length (the papers report 58x for the raw data).

    Args:
        means: ``{task: mean answer length}`` (characters).
    """
    pos = {t: m for t, m in means.items() if m > 0}
    if len(pos) < 2:
        return {"longest_task": None, "shortest_task": None, "ratio": None}
    hi, lo = max(pos, key=pos.get), min(pos, key=pos.get)
    return {"longest_task": hi, "shortest_task": lo, "ratio": round(pos[hi] / pos[lo], 2)}


def answer_length_table(records: list[dict]) -> str:
    """CSV for ``dvc plots``: the share (percent) of each task's answers per character-length
    bin. Bins are powers of two: the row ``answer_chars = b`` counts lengths in ``[b, 2b)``
    (``0`` counts empty answers). Columns: ``answer_chars`` then one per task."""
    per: dict[str, Counter] = {t: Counter() for t in vocab.TASKS}
    for r in records:
        n = len(r["answer"])
        per[r["task"]][0 if n == 0 else 1 << (n.bit_length() - 1)] += 1
    top = max((b for c in per.values() for b in c), default=1)
    bins = [0] + [1 << k for k in range(max(top, 1).bit_length())]
    lines = ["answer_chars," + ",".join(vocab.TASKS)]
    for b in bins:
        cells = []
        for t in vocab.TASKS:
            tot = sum(per[t].values())
            cells.append(f"{100.0 * per[t][b] / tot:.2f}" if tot else "0.00")
        lines.append(f"{b}," + ",".join(cells))
    return "\n".join(lines) + "\n"


def eval_nearest_train(train: list[dict], eval_: list[dict], threshold: float) -> dict:
    """Per race task, the summary (:func:`hargo.data.similarity.similarity_summary`) of each
    eval record's largest token-set Jaccard to any train record of the same task
    (:func:`hargo.data.similarity.nearest_similarity`; ~2 s on the real splits).

    Returns:
        ``{task: {"n", "median", "p90", "max", "share_ge_0_9", "share_ge_threshold"}}`` for
        every race task (``n`` 0 and None values without eval records).
    """
    out = {}
    for t in vocab.RACE_TASKS:
        pool = [kernel_tokens(r["prompt"]) for r in train if r["task"] == t]
        queries = [kernel_tokens(r["prompt"]) for r in eval_ if r["task"] == t]
        out[t] = similarity_summary(nearest_similarity(pool, queries), threshold)
    return out


def compute_stats(train: list[dict], eval_: list[dict], raw: dict[str, list[dict]],
                  handling: dict[str, dict], params: Config) -> dict:
    """The content of ``stats.json`` (see the module docstring); ``params``: the typed
    :class:`Config` (its ``seed`` and ``data`` sections are read). Raises nothing: the config
    was checked when it was built."""
    data, seed = params.data, params.seed
    out: dict[str, Any] = {
        "strategy": data.split.strategy, "eval_fraction": data.split.eval_fraction,
        "seed": seed, "conflicts": data.conflicts,
        "conflict_rule": CONFLICT_RULE,
        "mask_label_names": data.mask_label_names,
        "label_name_rule": L.MASK_RULE if data.mask_label_names else None,
        "token_count": "regex \\w+|[^\\w\\s] (words and punctuation), not the model tokenizer",
        "counts": {}, "handling": handling, "answer_length": {}, "prompt_length": {},
    }
    means, raw_means = {}, {}
    for t in vocab.TASKS:
        tr = [r for r in train if r["task"] == t]
        ev = [r for r in eval_ if r["task"] == t]
        entry: dict[str, Any] = {"raw": len(raw.get(t, [])), "train": len(tr), "eval": len(ev),
                                 "total": len(tr) + len(ev)}
        if t in vocab.RACE_TASKS:
            entry["labels"] = {name: dict(sorted(Counter(str(r["label"]) for r in rs).items()))
                               for name, rs in (("train", tr), ("eval", ev))}
        out["counts"][t] = entry
        both = tr + ev
        chars = [len(r["answer"]) for r in both]
        out["answer_length"][t] = {"chars": _summary(chars),
                                   "tokens": _summary([count_tokens(r["answer"]) for r in both])}
        out["prompt_length"][t] = {"chars": _summary([len(r["prompt"][0]["content"]) for r in both])}
        means[t] = out["answer_length"][t]["chars"]["mean"]
        raw_means[t] = statistics.fmean(len(r["output"]) for r in raw[t]) if raw.get(t) else 0.0
    out["counts"]["total"] = {"train": len(train), "eval": len(eval_),
                              "total": len(train) + len(eval_),
                              "raw": sum(len(v) for v in raw.values())}
    out["answer_length_ratio"] = length_ratio(means)
    out["answer_length_ratio_raw"] = length_ratio(raw_means)
    threshold = data.split.similarity_threshold
    out["eval_nearest_train"] = {
        "rule": "per eval record the largest token-set Jaccard (hargo.data.similarity) to a train "
                "record of its task; p90 nearest rank", "threshold": threshold,
        **eval_nearest_train(train, eval_, threshold)}
    return out


# ----------------------------------------------------------------------------- the stage

def _print_table(stats: dict) -> None:
    from hargo.console import table_console
    from rich.table import Table

    tab = Table(title=f"prepared data ({stats['strategy']} split)")
    for col in ("task", "raw", "masked", "rejected", "duplicates", "conflicts", "train", "eval",
                "yes/no train", "yes/no eval"):
        tab.add_column(col, justify="left" if col == "task" else "right", no_wrap=True,
                       min_width=12 if col == "task" else None)
    for t in vocab.TASKS:
        c, h = stats["counts"][t], stats["handling"].get(t, {})
        lab = c.get("labels", {})
        yn = lambda d: f"{d.get('yes', 0)}/{d.get('no', 0)}" if d is not None else "-"
        tab.add_row(t, str(c["raw"]), str(h.get("label_name_records", 0)),
                    str(sum(h.get("quarantined", {}).values()) + h.get("conflict_dropped", 0)),
                    str(h.get("exact_duplicates", 0) + h.get("merged_duplicates", 0)),
                    str(h.get("conflict_groups", 0)), str(c["train"]), str(c["eval"]),
                    yn(lab.get("train")), yn(lab.get("eval")))
    tot = stats["counts"]["total"]
    tab.add_row("total", str(tot["raw"]), "", "", "", "", str(tot["train"]), str(tot["eval"]), "", "")
    console = table_console(120)  # $COLUMNS, the terminal's width, else >= 120 (a pipe)
    console.print(tab)
    r = stats["answer_length_ratio"]
    console.print(f"mean answer length: {r['longest_task']} / {r['shortest_task']} = {r['ratio']}x")


def run(params: Config) -> dict:
    """Run the ``prepare`` stage (``params``: the typed config) inside its MLflow child run
    (counts logged as metrics); see :func:`prepare`."""
    import mlflow

    from hargo import tracking

    with tracking.stage_run("prepare", params):
        out = prepare(params)
        mlflow.log_metrics({"train": out["train"], "eval": out["eval"], "rejects": out["rejects"],
                            **{f"{s}_{t}": n for t, c in out["per_task"].items()
                               for s, n in c.items() if isinstance(n, (int, float))}})
        return out


def _records(raw: dict[str, list[dict]], strategy: str, conflicts: str, mask: bool
             ) -> tuple[list[dict], list[dict], dict[str, dict], dict[str, str]]:
    """Steps 0-3 for every task: label names masked (``mask``), control tokens neutralised,
    then the ``paper`` strategy's records or the cleaned ones (:func:`clean_task`, under the
    ``conflicts`` policy). Returns ``(records, rejects, handling per task, {id: the instruction
    it was built from})``."""
    records: list[dict] = []
    rejects: list[dict] = []
    handling: dict[str, dict] = {}
    instruction: dict[str, str] = {}
    for task, raws in raw.items():
        masked = {"label_name_records": 0, "label_name_occurrences": 0}
        if mask:
            raws, masked = mask_race_raws(task, raws)
        raws, controls = neutralise_raws(raws)
        masked = {**masked, **controls}
        if strategy == "paper":
            recs = paper_records(task, raws)
            forms = Counter(L.parse_label(r["output"])[1] for r in raws) if task in vocab.RACE_TASKS else {}
            handling[task] = {"raw": len(raws), "kept": len(recs), "label_forms": dict(sorted(forms.items())),
                              "unlabelled": sum(r["label"] is None for r in recs) if task in vocab.RACE_TASKS else 0}
        else:
            recs, rej, handling[task] = clean_task(task, raws, conflicts)
            rejects += rej
        handling[task].update(masked)
        for r in recs:
            instruction[r["id"]] = raws[r["source"]["index"]]["instruction"]
        records += recs
    return records, rejects, handling, instruction


def prepare(params: Config) -> dict:
    """Run the ``prepare`` stage.

    Args:
        params: the typed :class:`~hargo.config.Config`; reads ``seed`` and ``data``
            (``raw_dir``, ``out_dir``, ``split.strategy`` (grouped | similarity | paper),
            ``split.eval_fraction``, ``split.similarity_threshold`` (every strategy: the
            statistics use it), ``split.minhash_perm`` (``similarity`` only), ``conflicts``
            (majority | drop), ``mask_label_names`` (default true: step 0,
            :func:`hargo.data.conflicts.mask_race_raws`)). Paths are relative to the working
            directory.

    The five outputs are written as one set: any error, reading or writing, leaves the old
    outputs as they were and no temporary file behind.

    Returns:
        ``{"strategy", "train", "eval", "rejects", "per_task": {task: {"train", "eval"}}}``.

    Raises:
        HargoInputError: a bad raw file (nothing is written).

    (A bad ``seed`` or ``data`` param is refused where the config is built, by its dotted
    key: :class:`hargo.config.Data`.)
    """
    data, seed = params.data, params.seed
    strategy, fraction = data.split.strategy, data.split.eval_fraction
    conflicts, mask = data.conflicts, data.mask_label_names

    raw = load_raw(data.raw_dir)
    records, rejects, handling, instruction = _records(raw, strategy, conflicts, mask)

    def text(r: dict) -> str:
        return instruction[r["id"]]

    groups_info = None
    if strategy == "paper":
        train, eval_ = split_paper(records, fraction, seed)
    elif strategy == "similarity":
        groups, groups_info = similarity_groups(records, data.split.similarity_threshold,
                                                data.split.minhash_perm, seed, text=text)
        train, eval_ = split_groups(records, groups, fraction, seed)
    else:
        train, eval_ = split_grouped(records, fraction, seed, text=text)
    stats = compute_stats(train, eval_, raw, handling, params)
    if groups_info is not None:
        stats["similarity_groups"] = groups_info
    if strategy == "paper":
        stats["near_duplicates"] = near_duplicates(records, text)
    else:  # merged into one record per prompt by clean_task: counted there
        stats["near_duplicates"] = {t: {"groups": h["near_duplicate_groups"],
                                        "records": h["near_duplicate_records"]}
                                    for t, h in handling.items()}
    table = answer_length_table(train + eval_)

    out = Path(data.out_dir)
    with atomic_files() as stage:  # all five replace the old ones together, or none does
        write_jsonl(stage(out / "train.jsonl"), train)
        write_jsonl(stage(out / "eval.jsonl"), eval_)
        write_jsonl(stage(out / "rejects.jsonl"), rejects)
        stage(out / "answer_lengths.csv").write_text(table, encoding="utf-8")
        write_json(stage(out / "stats.json"), stats)
    _print_table(stats)
    return {"strategy": strategy, "train": len(train), "eval": len(eval_), "rejects": len(rejects),
            "per_task": {t: {"train": stats["counts"][t]["train"], "eval": stats["counts"][t]["eval"]}
                         for t in vocab.TASKS}}
