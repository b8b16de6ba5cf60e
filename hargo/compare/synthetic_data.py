"""Stage ``synthetic_data`` of the synthetic test bed (:mod:`hargo.compare.synthetic`): the
generated train and eval splits in the prepared schema, and reading them back checked."""
from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Mapping

from hargo.compare.synthetic_plan import DATA_DIR, plan
from hargo.data.synthetic import SYNTHETIC_TASKS, check_synthetic
from hargo.io import atomic_files, read_jsonl, write_json, write_jsonl

__all__ = ["prepare_data", "read_split"]


def prepare_data(params: Mapping, root: str | Path = ".") -> dict:
    """Stage ``synthetic_data``: the train and eval splits (seed ``params["seed"]``) and
    ``stats.json`` (records and mean reference length in characters per task and split).

    Raises:
        ParamsError: a bad ``synthetic`` block.
        ValueError: the prompt space is too small for the counts asked.
    """
    from hargo.data.synthetic import generate

    p = plan(params)
    train, ev = generate(p.data, int(params["seed"]))
    check_synthetic(train, "synthetic train split")
    check_synthetic(ev, "synthetic eval split")
    out = Path(root) / DATA_DIR
    stats = {"seed": int(params["seed"]), "config": asdict(p.data), "splits": {}}
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


def read_split(root: Path, split: str) -> list[dict]:
    """``data/synthetic/<split>.jsonl`` under ``root``, checked.

    Raises:
        FileNotFoundError: missing (names the stage to run).
        HargoInputError: a bad record (names file, record, field).
    """
    path = root / DATA_DIR / f"{split}.jsonl"
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: run stage synthetic_data "
                                "(dvc repro synthetic/dvc.yaml)")
    recs = read_jsonl(path)
    check_synthetic(recs, str(path))
    return recs
