"""The ``validate`` stage: the GX suites pass on good data and fail, naming the right expectation,
the failing count and the offending ids, on crafted bad prepared files (a leaked instruction, a
label "maybe", an empty answer); under the paper split the leak is measured, not failed."""
from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest

from hargo.data import prepare as P
from hargo.data import validate as V
from hargo.vocab import TASKS

TINY = Path(__file__).parent / "data" / "hpc_tiny"


def params(raw_dir, tmp_path: Path, strategy="grouped", threshold=0.9, **bounds) -> dict:
    v = {"task_counts": {t: [10, 30] for t in TASKS}, "yes_fraction": [0.0, 1.0],
         "prompt_chars": [10, 300000], "answer_chars": [1, 4000],
         "report_dir": str(tmp_path / "reports" / "validation"),
         "metrics_file": str(tmp_path / "metrics" / "validation.json"),
         "data_docs": False}  # GX's HTML rendering costs ~2 s a run: built in one test only
    v.update(bounds)
    return {"seed": 42, "validate": v,
            "data": {"raw_dir": str(raw_dir), "out_dir": str(tmp_path / "prepared"),
                     "split": {"strategy": strategy, "eval_fraction": 0.1,
                               "similarity_threshold": threshold, "minhash_perm": 128},
                     "conflicts": "majority"}}



def _config(partial: dict):
    """The typed config the prepare and validate stages take: params.yaml with ``partial``'s
    sections (the dict the tests change in place, converted where a stage is called)."""
    from hargo.config import as_config
    from hargo.params import read_params_file

    return as_config({**read_params_file(Path(__file__).resolve().parents[1] / "params.yaml"),
                      **partial})

def _rw(path: Path, edit) -> None:
    recs = [json.loads(line) for line in path.read_text().splitlines()]
    recs = edit(recs)
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))


@pytest.fixture()
def prepared(tmp_path) -> dict:
    p = params(TINY, tmp_path)
    P.run(_config(p))
    return p


def _failed(p) -> list[dict]:
    with pytest.raises(V.ValidationFailed) as e:
        V.run(_config(p))
    report = json.loads(Path(p["validate"]["report_dir"], "report.json").read_text())
    assert report["summary"]["success"] is False
    assert json.loads(Path(p["validate"]["metrics_file"]).read_text())["failed"] == len(e.value.failures)
    return e.value


def test_crafted_data_passes_and_writes_the_report(prepared, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # relative output paths, as under `dvc repro`
    prepared["validate"].update(data_docs=True, report_dir="reports/validation",
                                metrics_file="metrics/validation.json")
    summary = V.run(_config(prepared))
    assert summary["success"] and summary["failed"] == 0
    assert summary["rows"] == {"raw": 72, "train": 56, "eval": 5}
    report = json.loads((tmp_path / "reports/validation/report.json").read_text())
    names = [e["name"] for e in report["expectations"]]
    assert len(names) == len(V.expectation_specs(_config(prepared))) == 29   # 27 + no_control_tokens_in_{prompt,answer}
    assert {"prepared.no_train_eval_leak", "prepared.race_label_in_set", "prepared.answer_non_empty",
            "summary.count_mlperf", "summary.yes_fraction_within_bounds", "raw.output_non_empty"} <= set(names)
    assert all(e["success"] for e in report["expectations"] if e["name"] != "prepared.no_near_copy_in_train")
    # the grouped split keeps near-copies of three eval kernels in train: measured, not enforced
    near = next(e for e in report["expectations"] if e["name"] == "prepared.no_near_copy_in_train")
    assert (near["success"], near["enforced"], near["failing"]) == (False, False, 3)
    assert near["ids"] == ["race_c-00009", "race_c-00015", "race_fortran-00011"]
    assert summary["near_copy_eval_rows"] == 3
    label_names = next(e for e in report["expectations"] if e["name"] == "prepared.no_label_name_in_race_prompt")
    assert (label_names["success"], label_names["enforced"], label_names["failing"]) == (True, True, 0)
    assert label_names["element_count"] == 33 and summary["label_name_rows"] == 0  # race rows
    assert (tmp_path / "reports/validation/index.html").exists()  # GX data docs
    assert list((tmp_path / "reports/validation/validations").rglob("*.html"))
    assert json.loads((tmp_path / "metrics/validation.json").read_text()) == summary


def test_leaked_instruction_fails_no_train_eval_leak(prepared, tmp_path):
    out = tmp_path / "prepared"
    leaked = json.loads((out / "eval.jsonl").read_text().splitlines()[0])
    copy = dict(leaked, id=leaked["id"] + "-copy")
    _rw(out / "train.jsonl", lambda recs: recs + [copy])
    err = _failed(prepared)
    assert [f["name"] for f in err.failures] == ["prepared.no_train_eval_leak"]
    f = err.failures[0]
    assert f["failing"] == 2 and sorted(f["ids"]) == sorted([leaked["id"], copy["id"]])
    assert "prepared.no_train_eval_leak: 2 failing of 62 rows" in str(err)
    assert leaked["id"] in str(err)


def test_near_duplicate_leak_fails_no_train_eval_leak(tmp_path):
    # plp-00012: plp-00003's instruction with CRLF line ends, other case and a trailing space
    raw = tmp_path / "raw"
    shutil.copytree(TINY, raw)
    plp = json.loads((raw / "task1_plp.json").read_text())
    text = plp[3]["instruction"]
    plp.append(dict(plp[3], instruction=text.replace(" the ", " THE\r\n", 1).upper() + " "))
    (raw / "task1_plp.json").write_text(json.dumps(plp))
    p = params(raw, tmp_path)
    P.run(_config(p))
    summary = V.run(_config(p))  # prepare drops the copy as a duplicate of plp-00003
    assert summary["success"] and summary["leaked_rows"] == 0
    out = tmp_path / "prepared"
    side = {n: [json.loads(x) for x in (out / n).read_text().splitlines()] for n in ("train.jsonl", "eval.jsonl")}
    assert not any(r["id"] == "plp-00012" for recs in side.values() for r in recs)
    home = next(n for n, recs in side.items() if any(r["id"] == "plp-00003" for r in recs))
    other = "eval.jsonl" if home == "train.jsonl" else "train.jsonl"
    orig = next(r for r in side[home] if r["id"] == "plp-00003")
    copy = dict(orig, id="plp-00012", prompt=[{"role": "user", "content": plp[12]["instruction"]}],
                source=dict(orig["source"], index=12))
    _rw(out / other, lambda recs: recs + [copy])  # force the leak
    err = _failed(p)
    assert [f["name"] for f in err.failures] == ["prepared.no_train_eval_leak"]
    assert err.failures[0]["failing"] == 2
    assert sorted(err.failures[0]["ids"]) == ["plp-00003", "plp-00012"]
    assert "plp-00003" in str(err) and "plp-00012" in str(err)
    metrics = json.loads(Path(p["validate"]["metrics_file"]).read_text())
    assert (metrics["leaked_rows"], metrics["leaked_instructions"]) == (2, 1)


def _add_label_names(path: Path) -> list[str]:
    """Append a DataRaceBench file name with its label to the first race_fortran and race_c
    prompts of a prepared file, and one to the first mlperf prompt (not a race prompt: allowed).
    Returns the ids of the two race records."""
    ids = []

    def edit(recs):
        for task, name in (("race_fortran", "\n! DRB048_firstprivate_orig_no.f95"),
                           ("race_c", "\n// DRB001-antidep1-orig-yes.c"), ("mlperf", " DRB001_x_orig_yes")):
            r = next(r for r in recs if r["task"] == task)
            r["prompt"] = [dict(r["prompt"][0], content=r["prompt"][0]["content"] + name)]
            if task != "mlperf":
                ids.append(r["id"])
        return recs

    _rw(path, edit)
    return ids


def test_label_name_in_a_race_prompt_fails_no_label_name_in_race_prompt(prepared, tmp_path):
    ids = _add_label_names(tmp_path / "prepared" / "train.jsonl")
    err = _failed(prepared)
    assert [(f["name"], f["failing"], sorted(f["ids"])) for f in err.failures] == [
        ("prepared.no_label_name_in_race_prompt", 2, sorted(ids))]
    assert json.loads(Path(prepared["validate"]["metrics_file"]).read_text())["label_name_rows"] == 2


def test_label_names_are_measured_not_enforced_without_masking(tmp_path):
    p = params(TINY, tmp_path)
    p["data"]["mask_label_names"] = False
    P.run(_config(p))
    _add_label_names(tmp_path / "prepared" / "train.jsonl")
    summary = V.run(_config(p))
    assert summary["success"] and summary["label_name_rows"] == 2
    report = json.loads((tmp_path / "reports/validation/report.json").read_text())
    e = next(e for e in report["expectations"] if e["name"] == "prepared.no_label_name_in_race_prompt")
    assert (e["success"], e["enforced"], e["failing"]) == (False, False, 2)


def test_the_leak_check_compares_masked_instructions(tmp_path):
    """Two raw Fortran prompts that differ only in the label of a DRB name are one prompt once
    masked: a record in eval whose masked instruction is a train record's leaks."""
    raw = tmp_path / "raw"
    shutil.copytree(TINY, raw)
    f = json.loads((raw / "task2_fortran.json").read_text())
    f.append(dict(f[0], instruction=f[0]["instruction"].replace("program p0", "program DRB001_x_orig_no")))
    f[0]["instruction"] = f[0]["instruction"].replace("program p0", "program DRB001_x_orig_yes")
    (raw / "task2_fortran.json").write_text(json.dumps(f))
    p = params(raw, tmp_path)
    P.run(_config(p))
    assert V.run(_config(p))["leaked_rows"] == 0  # prepare made them one record
    out = tmp_path / "prepared"
    side = {n: [json.loads(x) for x in (out / n).read_text().splitlines()] for n in ("train.jsonl", "eval.jsonl")}
    home = next(n for n, recs in side.items() if any(r["id"] == "race_fortran-00000" for r in recs))
    other = "eval.jsonl" if home == "train.jsonl" else "train.jsonl"
    orig = next(r for r in side[home] if r["id"] == "race_fortran-00000")
    copy = dict(orig, id="race_fortran-00012", source=dict(orig["source"], index=12))
    _rw(out / other, lambda recs: recs + [copy])  # the raw instructions differ, the masked do not
    err = _failed(p)
    assert [(f["name"], sorted(f["ids"])) for f in err.failures] == [
        ("prepared.no_train_eval_leak", ["race_fortran-00000", "race_fortran-00012"])]


def test_label_maybe_fails_race_label_in_set(prepared, tmp_path):
    out = tmp_path / "prepared"

    def edit(recs):
        r = next(r for r in recs if r["task"] == "race_fortran")
        r["label"] = "maybe"
        edit.id = r["id"]
        return recs

    _rw(out / "train.jsonl", edit)
    err = _failed(prepared)
    assert [(f["name"], f["failing"], f["ids"]) for f in err.failures] == [
        ("prepared.race_label_in_set", 1, [edit.id])]
    assert "prepared.race_label_in_set: 1 failing" in str(err)


def test_empty_answer_fails_answer_non_empty(prepared, tmp_path):
    out = tmp_path / "prepared"
    (blank,) = [r["id"] for r in map(json.loads, (out / "eval.jsonl").read_text().splitlines())
                if r["task"] == "mlperf"]
    _rw(out / "eval.jsonl", lambda recs: [dict(r, answer="") if r["id"] == blank else r for r in recs])
    err = _failed(prepared)
    # the blank answer breaks the non-empty contract and, being 0 characters, the length bounds
    assert [(f["name"], f["failing"], f["ids"]) for f in err.failures] == [
        ("prepared.answer_non_empty", 1, [blank]),
        ("prepared.answer_chars_within_bounds", 1, [blank])]
    assert str(err).startswith("2 expectation(s) failed:\n  prepared.answer_non_empty: 1 failing of 61 rows")


def test_count_and_yes_fraction_bounds_come_from_params(prepared):
    p = dict(prepared)
    # the typed config's task_counts names every task: the race bounds wide open
    p["validate"] = dict(prepared["validate"], task_counts={"plp": [13, 30], "mlperf": [1, 30],
                                                            "race_c": [0, 10**6],
                                                            "race_fortran": [0, 10**6]},
                         yes_fraction=[0.3, 0.7])
    err = _failed(p)
    by = {f["name"]: f for f in err.failures}
    assert by["summary.count_plp"]["ids"] == ["plp"]  # 12 plp records < 13
    assert "summary.count_mlperf" not in by
    # Fortran eval holds one record: its yes-fraction is 0 or 1, out of [0.3, 0.7]
    assert "race_fortran/eval" in by["summary.yes_fraction_within_bounds"]["ids"]


def test_paper_split_measures_the_leak_without_failing(tmp_path):
    p = params(TINY, tmp_path, strategy="paper")
    P.run(_config(p))
    out = tmp_path / "prepared"
    leaked = json.loads((out / "eval.jsonl").read_text().splitlines()[0])
    _rw(out / "train.jsonl", lambda recs: recs + [dict(leaked, id=leaked["id"] + "-copy")])
    summary = V.run(_config(p))
    assert summary["success"] and summary["failed"] == 0
    assert summary["failed_not_enforced"] >= 1 and summary["leaked_rows"] >= 2
    report = json.loads((tmp_path / "reports/validation/report.json").read_text())
    leak = next(e for e in report["expectations"] if e["name"] == "prepared.no_train_eval_leak")
    assert (leak["success"], leak["enforced"]) == (False, False)
    assert leak["failing"] == summary["leaked_rows"]
    # the paper split keeps race_c record 22, which has no label: measured too
    label = next(e for e in report["expectations"] if e["name"] == "prepared.race_label_present")
    assert (label["failing"], label["ids"], label["enforced"]) == (1, ["race_c-00022"], False)


def test_real_data_grouped_passes_the_committed_bounds(real_raw_dir, tmp_path, committed_params):
    """The real files pass params.yaml's own validate bounds (read from it, not copied here), and
    every count is derived from the inputs rather than a snapshot of the output: raw = the
    records of the four raw files; train and eval = the lines of the prepared files; per task,
    what was kept = raw minus what stats.json says was removed (exact duplicates, merged
    conflict records, dropped conflict records, quarantined records); eval holds
    data.split.eval_fraction of each task up to the split's granularity (whole instruction
    groups; 1% of the task)."""
    from hargo.data.raw import TASK_FILES

    committed = committed_params["validate"]
    p = params(real_raw_dir, tmp_path, task_counts=committed["task_counts"],
               yes_fraction=committed["yes_fraction"], prompt_chars=committed["prompt_chars"],
               answer_chars=committed["answer_chars"])
    p["data"]["split"] = dict(committed_params["data"]["split"])
    assert p["data"]["split"]["strategy"] == "similarity"
    P.run(_config(p))
    summary = V.run(_config(p))
    assert summary["success"] and summary["leaked_rows"] == 0

    raw = {t: len(json.loads((real_raw_dir / name).read_text(encoding="utf-8")))
           for t, name in TASK_FILES.items()}
    out = tmp_path / "prepared"
    split = {n: [json.loads(x) for x in (out / f"{n}.jsonl").read_text().splitlines()]
             for n in ("train", "eval")}
    assert summary["rows"] == {"raw": sum(raw.values()), "train": len(split["train"]),
                               "eval": len(split["eval"])}
    handling = json.loads((out / "stats.json").read_text())["handling"]
    f = p["data"]["split"]["eval_fraction"]
    for t in TASKS:
        h = handling[t]
        assert h["raw"] == raw[t], t
        kept = (raw[t] - h["exact_duplicates"] - h["merged_duplicates"] - h["conflict_merged"]
                - h["conflict_dropped"] - sum(h["quarantined"].values()))
        n = {s: sum(r["task"] == t for r in recs) for s, recs in split.items()}
        assert n["train"] + n["eval"] == kept == h["kept"], t
        lo, hi = committed["task_counts"][t]
        assert lo <= kept <= hi, t
        assert abs(n["eval"] - f * kept) <= 0.01 * kept, (t, n)
        assert n["eval"] <= math.floor(round(f * kept, 9)), (t, n)   # never above the target


def test_real_data_similarity_passes_the_committed_bounds(real_raw_dir, tmp_path, committed_params):
    """The similarity split of the real files at the committed threshold passes every committed
    bound, the near-copy check (enforced) and the yes-fraction included; mlperf and plp are
    split as under grouped."""
    committed = committed_params["validate"]
    p = params(real_raw_dir, tmp_path, task_counts=committed["task_counts"],
               yes_fraction=committed["yes_fraction"], prompt_chars=committed["prompt_chars"],
               answer_chars=committed["answer_chars"])
    p["data"]["split"] = dict(committed_params["data"]["split"], strategy="similarity")
    P.run(_config(p))
    summary = V.run(_config(p))
    assert summary["success"] and summary["near_copy_eval_rows"] == 0 and summary["leaked_rows"] == 0
    report = json.loads(Path(p["validate"]["report_dir"], "report.json").read_text())
    near = next(e for e in report["expectations"] if e["name"] == "prepared.no_near_copy_in_train")
    assert near["enforced"] and near["success"] and near["element_count"] > 0
    stats = json.loads((tmp_path / "prepared" / "stats.json").read_text())
    t = committed_params["data"]["split"]["similarity_threshold"]
    for task in ("race_c", "race_fortran"):
        n = stats["eval_nearest_train"][task]
        assert n["n"] == stats["counts"][task]["eval"] > 0
        assert n["share_ge_threshold"] == 0.0 and n["max"] < t
    g = tmp_path / "grouped"
    P.run(_config(dict(p, data=dict(p["data"], out_dir=str(g),
                                    split=dict(p["data"]["split"], strategy="grouped")))))
    for name in ("train.jsonl", "eval.jsonl"):
        ids = lambda path: [r["id"] for r in map(json.loads, path.read_text().splitlines())
                            if r["task"] in ("mlperf", "plp")]
        assert ids(tmp_path / "prepared" / name) == ids(g / name)


def test_unreadable_prepared_file_is_an_input_error(prepared, tmp_path):
    from hargo.io import HargoInputError

    (tmp_path / "prepared" / "eval.jsonl").write_text('{"id": "x"}\n{oops\n')
    with pytest.raises(HargoInputError, match=r"eval.jsonl, record 1 \(line \d+\): not valid JSON"):
        V.run(_config(prepared))
    assert not (tmp_path / "reports").exists()


@pytest.mark.parametrize("strategy", ["similarity", "grouped"])
def test_near_copy_in_train_fails_under_similarity_and_is_measured_otherwise(tmp_path, strategy):
    """A clean split passes; then a near-copy of a race eval kernel (one word appended, Jaccard
    n / (n + 1) >= 0.95) is planted in train: the similarity split fails on it, naming the eval
    record; other strategies measure it without failing."""
    import re

    p = params(TINY, tmp_path, strategy=strategy, threshold=0.95)
    P.run(_config(p))
    summary = V.run(_config(p))
    assert summary["success"] and summary["near_copy_eval_rows"] == 0
    out = tmp_path / "prepared"
    eval_ = [json.loads(x) for x in (out / "eval.jsonl").read_text().splitlines()]
    train = [json.loads(x) for x in (out / "train.jsonl").read_text().splitlines()]
    target = next(r for r in eval_ if r["task"] == "race_c")
    host = next(r for r in train if r["task"] == "race_c")   # its raw instruction stays in train
    text = target["prompt"][0]["content"] + " zzplanted"
    n = len(set(re.findall(r"\w+|[^\w\s]", target["prompt"][0]["content"])))
    assert n / (n + 1) >= 0.95
    near = dict(host, id="race_c-planted", prompt=[{"role": "user", "content": text}])
    _rw(out / "train.jsonl", lambda recs: recs + [near])
    if strategy == "similarity":
        err = _failed(p)
        assert [(f["name"], f["failing"], f["ids"], f["enforced"]) for f in err.failures] == [
            ("prepared.no_near_copy_in_train", 1, [target["id"]], True)]
    else:
        summary = V.run(_config(p))
        assert summary["success"] and summary["failed_not_enforced"] == 1
        report = json.loads(Path(p["validate"]["report_dir"], "report.json").read_text())
        e = next(e for e in report["expectations"] if e["name"] == "prepared.no_near_copy_in_train")
        assert (e["success"], e["enforced"], e["failing"], e["ids"]) == (False, False, 1, [target["id"]])
    metrics = json.loads(Path(p["validate"]["metrics_file"]).read_text())
    assert metrics["near_copy_eval_rows"] == 1 and metrics["leaked_rows"] == 0


def test_near_train_similarity_by_hand():
    rec = lambda rid, task, text: {"id": rid, "task": task, "prompt": [{"role": "user", "content": text}]}
    train = [rec("t1", "race_c", "a b c d"), rec("t2", "race_fortran", "a b c x"),
             rec("t3", "plp", "a b c x")]
    eval_ = [rec("e1", "race_c", "a b c x"), rec("e2", "plp", "a b c x"),
             rec("e3", "race_fortran", "q"), {"id": "e4", "task": "race_c", "prompt": "oops"}]
    assert V.near_train_similarity(train, eval_) == [None, None, None, 3 / 5, None, 0.0, None]
