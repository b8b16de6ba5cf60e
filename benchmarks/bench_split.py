"""Split strategies on the real data: does the race eval still reward lookup? (issue 15)

    PYTHONPATH=. .venv/bin/python benchmarks/bench_split.py [--raw data/raw/hpc-gpt]
        [--strategies grouped,similarity] [--thresholds 0.9] [--seeds 42] [--mask on,off]
        [--json out.json]

For every strategy (``similarity`` once per threshold) and seed, runs the ``prepare`` stage
(:func:`hargo.data.prepare.prepare`, the committed params.yaml otherwise) into a temporary
folder and prints: its wall time; per task the train/eval counts and, for the race tasks, the
yes-fraction of each split (validate's ``yes_fraction`` bounds apply); the eval records'
nearest-train similarity summary from ``stats.json``; and the nearest-train baseline
(:func:`hargo.evaluation.baselines.nearest_train`, the train split's race records as its pool)
on every race eval record: accuracy, F1 of "yes" and MCC (scikit-learn), all race eval records
and per task; the label-name leak (``data.mask_label_names``, once per value given by ``--mask``):
per race task the raw records masked and names replaced (``stats.json`` ``handling``), and the
*name reader*, which answers with the label a DataRaceBench-style name in the eval prompt spells
(:func:`hargo.data.labels.labels_in_names`, the first one): the eval records it can answer and
its accuracy on them. Nothing is written outside the temporary folders.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from contextlib import redirect_stdout
from io import StringIO
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def nn_metrics(train: list[dict], eval_: list[dict]) -> dict:
    """Accuracy, F1 ("yes" positive) and MCC of nearest-train on the race eval records, for
    all of them (``all``) and per race task."""
    from sklearn.metrics import accuracy_score, f1_score, matthews_corrcoef

    from hargo.evaluation.baselines import nearest_train
    from hargo.vocab import RACE_TASKS

    race = [r for r in eval_ if r["task"] in RACE_TASKS and r["label"] in ("yes", "no")]
    pred = [p["prediction"] for p in nearest_train(train, race)]
    out = {}
    for name in ("all",) + RACE_TASKS:
        idx = [k for k, r in enumerate(race) if name in ("all", r["task"])]
        y, p = [race[k]["label"] for k in idx], [pred[k] for k in idx]
        out[name] = {"n": len(y), "accuracy": round(accuracy_score(y, p), 3) if y else None,
                     "f1": round(f1_score(y, p, pos_label="yes"), 3) if y else None,
                     "mcc": round(matthews_corrcoef(y, p), 3) if y else None}
    return out


def name_reader(eval_: list[dict]) -> dict:
    """Per race task, the eval records whose prompt holds a label-bearing name (``covered``) and
    the accuracy of answering with the first label the names spell on those."""
    from hargo.data.labels import labels_in_names
    from hargo.vocab import RACE_TASKS

    out = {}
    for t in RACE_TASKS:
        read = [(labels_in_names(r["prompt"][0]["content"]), r["label"]) for r in eval_ if r["task"] == t]
        hits = [labs[0] == label for labs, label in read if labs]
        out[t] = {"n": len(read), "covered": len(hits),
                  "accuracy_covered": round(sum(hits) / len(hits), 3) if hits else None}
    return out


def run_one(params: dict) -> dict:
    from hargo.data.prepare import prepare
    from hargo.config import as_config
    from hargo.io import read_jsonl
    from hargo.params import apply_overrides
    from hargo.vocab import RACE_TASKS, TASKS

    with tempfile.TemporaryDirectory() as tmp:
        params = apply_overrides(params, {"data.out_dir": tmp})
        t0 = time.perf_counter()
        with redirect_stdout(StringIO()):
            prepare(as_config(params))
        wall = time.perf_counter() - t0
        stats = json.loads((Path(tmp) / "stats.json").read_text())
        train, eval_ = read_jsonl(Path(tmp) / "train.jsonl"), read_jsonl(Path(tmp) / "eval.jsonl")
    counts = {}
    for t in TASKS:
        c = stats["counts"][t]
        counts[t] = {"train": c["train"], "eval": c["eval"]}
        if t in RACE_TASKS:
            for s in ("train", "eval"):
                lab = c["labels"][s]
                n = sum(lab.values())
                counts[t][f"yes_{s}"] = round(lab.get("yes", 0) / n, 3) if n else None
    cfg = as_config(params)
    return {"strategy": cfg.data.split.strategy, "seed": cfg.seed,
            "threshold": cfg.data.split.similarity_threshold,
            "mask_label_names": cfg.data.mask_label_names, "wall_s": round(wall, 1),
            "label_names_masked": {t: {k: stats["handling"][t][f"label_name_{k}"]
                                       for k in ("records", "occurrences")} for t in RACE_TASKS},
            "name_reader": name_reader(eval_),
            "counts": counts, "eval_nearest_train": {t: stats["eval_nearest_train"][t] for t in RACE_TASKS},
            "similarity_groups": stats.get("similarity_groups"), "nearest_train": nn_metrics(train, eval_)}


def main(argv: list[str] | None = None) -> list[dict]:
    sys.path.insert(0, str(ROOT))
    from hargo.config import as_config
    from hargo.params import apply_overrides, load_params

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--raw", default=str(ROOT / "data" / "raw" / "hpc-gpt"))
    ap.add_argument("--strategies", default="grouped,similarity")
    ap.add_argument("--thresholds", default=None, help="similarity thresholds (default: params.yaml's)")
    ap.add_argument("--seeds", default=None, help="split seeds (default: params.yaml's)")
    ap.add_argument("--mask", default=None,
                    help="data.mask_label_names values, on and/or off (default: params.yaml's)")
    ap.add_argument("--json", default=None, help="also write the results here")
    a = ap.parse_args(argv)
    base = load_params(ROOT / "params.yaml", {"data.raw_dir": a.raw})
    cfg = as_config(base)
    thresholds = [float(x) for x in a.thresholds.split(",")] if a.thresholds else \
        [cfg.data.split.similarity_threshold]
    seeds = [int(x) for x in a.seeds.split(",")] if a.seeds else [cfg.seed]
    masks = [{"on": True, "off": False}[x] for x in a.mask.split(",")] if a.mask else \
        [cfg.data.mask_label_names]
    results = []
    for mask in masks:
        for seed in seeds:
            for strategy in a.strategies.split(","):
                for t in (thresholds if strategy == "similarity" else thresholds[:1]):
                    p = apply_overrides(base, {"seed": seed, "data.mask_label_names": mask,
                                               "data.split.strategy": strategy,
                                               "data.split.similarity_threshold": t})
                    r = run_one(p)
                    results.append(r)
                    print(json.dumps(r), flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=1) + "\n")
    return results


if __name__ == "__main__":
    main()
