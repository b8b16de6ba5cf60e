"""Every JSONL file hargo writes reads back through its own readers, whatever the text in it
(issue 42, item 1).

``json.dumps(ensure_ascii=False)`` keeps U+2028, U+2029 and U+0085 raw inside strings, and
``str.splitlines`` breaks lines at them: a raw plp instruction or a completion holding one was
written fine and then refused as "not valid JSON" by the file's next reader."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hargo.data import prepare as P
from hargo.data.raw import TASK_FILES, make_record
from hargo.data.records import read_prepared
from hargo.evaluation.identity import GATE_FIELDS, read_eval_rows
from hargo.io import HargoInputError, atomic_write_json, atomic_write_jsonl, read_jsonl, write_jsonl
from hargo.config import as_config


def _config(partial: dict):
    """The typed config the prepare stage takes: params.yaml with ``partial``'s sections."""
    from hargo.config import as_config
    from hargo.params import read_params_file

    root = Path(__file__).resolve().parents[1]
    return as_config({**read_params_file(root / "params.yaml"), **partial})

TINY = Path(__file__).parent / "data" / "hpc_tiny"

#: every character str.splitlines breaks at; JSON escapes the ASCII ones itself
BREAKS = "\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"
#: any Unicode text (every scalar value), with the line breaks drawn often
TEXT = st.text(st.one_of(st.characters(), st.sampled_from(BREAKS)), max_size=40)
JSON = st.recursive(st.none() | st.booleans() | st.integers() | TEXT,
                    lambda kids: st.lists(kids, max_size=3)
                    | st.dictionaries(TEXT, kids, max_size=3), max_leaves=8)
RECORDS = st.lists(st.dictionaries(TEXT, JSON, max_size=4), min_size=1, max_size=4)


@pytest.mark.fast
@settings(max_examples=200, deadline=None)
@given(records=RECORDS)
def test_every_jsonl_writer_round_trips_through_read_jsonl(tmp_path_factory, records):
    d = tmp_path_factory.mktemp("rt")
    assert read_jsonl(write_jsonl(d / "a.jsonl", records)) == records
    assert read_jsonl(atomic_write_jsonl(d / "b.jsonl", records)) == records
    # one line per record, each a valid UTF-8 line no line splitter breaks
    raw = (d / "a.jsonl").read_bytes().decode("utf-8")
    assert raw.splitlines() == raw.split("\n")[:-1] and len(raw.splitlines()) == len(records)
    # the pretty JSON writer too, whole-file
    assert json.loads(atomic_write_json(d / "c.json", records).read_text("utf-8")) == records


@pytest.mark.fast
@settings(max_examples=100, deadline=None)
@given(task=st.sampled_from(sorted(TASK_FILES)), instruction=TEXT.filter(str.strip),
       input_=TEXT, answer=TEXT, alt=st.lists(TEXT, max_size=2), completion=TEXT)
def test_prepared_records_and_eval_rows_round_trip(tmp_path_factory, task, instruction, input_,
                                                   answer, alt, completion):
    """A prepared record made from any raw text, as ``prepare`` writes it, reads back through
    :func:`read_prepared`; an evaluation row with any completion through :func:`read_eval_rows`
    (the first thing ``register`` does)."""
    d = tmp_path_factory.mktemp("prep")
    label = "yes" if task.startswith("race") else None
    rec = make_record(task, 3, {"instruction": instruction, "input": input_, "output": answer},
                      answer, label, alt)
    write_jsonl(d / "train.jsonl", [rec, {**rec, "id": rec["id"] + "b"}])
    assert read_prepared(d / "train.jsonl") == [rec, {**rec, "id": rec["id"] + "b"}]
    row = {"id": rec["id"], "task": task, "completion": completion, "reward": 0.5,
           "label": label, "prediction": completion}
    atomic_write_jsonl(d / "data" / "eval" / "grpo.jsonl", [row, row])
    want = {k: row[k] for k in GATE_FIELDS if k in row}
    assert read_eval_rows(d, ["grpo"]) == {"grpo": [want, want]}


#: any text with the UTF-16 surrogates drawn often, lone and in high-low order (which a Python
#: str may hold: a decoder's surrogateescape, a slice of a UTF-16 string). st.text never draws
#: a surrogate, whatever its alphabet: the characters are joined by hand.
SURROGATE_TEXT = st.lists(st.one_of(
    st.characters(), st.sampled_from(BREAKS),
    st.integers(0xD800, 0xDFFF).map(chr),
    st.sampled_from(["\ud83d", "\ude00", "\udbff", "\udc00"])), max_size=12).map("".join)
SURROGATE_RECORDS = st.lists(st.dictionaries(SURROGATE_TEXT, st.one_of(
    SURROGATE_TEXT, st.lists(SURROGATE_TEXT, max_size=2),
    st.dictionaries(SURROGATE_TEXT, SURROGATE_TEXT, max_size=2)), max_size=3),
    min_size=1, max_size=3)


def _has_pair(obj) -> bool:
    """A string in ``obj`` (key or value) holds a high surrogate right before a low one."""
    import re

    pair = re.compile("[\ud800-\udbff][\udc00-\udfff]")
    if isinstance(obj, str):
        return bool(pair.search(obj))
    if isinstance(obj, dict):
        return any(_has_pair(k) or _has_pair(v) for k, v in obj.items())
    if isinstance(obj, list):
        return any(_has_pair(v) for v in obj)
    return False


@pytest.mark.fast
@settings(max_examples=100, deadline=None)   # ~2.5 s; about half the draws hold a pair
@given(records=SURROGATE_RECORDS)
def test_strings_with_surrogates_round_trip_or_are_refused(tmp_path_factory, records):
    """Issue 42 (new user): ``atomic_write_jsonl(p, [{"c": "\\ud83d\\ude00"}])`` then
    ``read_jsonl(p)`` gave ``"😀"``: two lone surrogates, escaped one by one, read back as the
    pair they spell. JSON has no way to write them apart, so every writer refuses exactly such
    a string (naming the file, the record and the field, writing nothing); every other string,
    lone surrogates included, round-trips."""
    d = tmp_path_factory.mktemp("sur")
    bad = next((i for i, r in enumerate(records) if _has_pair(r)), None)
    if bad is None:
        assert read_jsonl(write_jsonl(d / "a.jsonl", records)) == records
        assert read_jsonl(atomic_write_jsonl(d / "b.jsonl", records)) == records
        assert json.loads(atomic_write_json(d / "c.json", records).read_text("utf-8")) \
            == records
        return
    for write, name, rec in ((atomic_write_jsonl, "b.jsonl", bad), (write_jsonl, "a.jsonl", bad),
                             (atomic_write_json, "c.json", None)):
        with pytest.raises(HargoInputError) as e:
            write(d / name, records)
        msg = str(e.value)
        assert msg.startswith(str(d / name) + ("" if rec is None else f", record {rec}"))
        assert e.value.record == rec and e.value.field
        assert "two lone UTF-16 surrogates" in msg and "U+D" in msg
        msg.encode("utf-8")   # printable: the field's surrogates are escaped
    assert not (d / "b.jsonl").exists() and not (d / "c.json").exists()
    assert [p.name for p in d.iterdir()] == ["a.jsonl"]   # in place (a staged path): partial


@pytest.mark.fast
def test_the_reported_surrogate_pair_is_refused_by_file_record_and_field(tmp_path):
    with pytest.raises(HargoInputError) as e:
        atomic_write_jsonl(tmp_path / "p.jsonl", [{"c": "ok"}, {"a": 1, "c": "x\ud83d\ude00"}])
    assert str(e.value).startswith(f"{tmp_path / 'p.jsonl'}, record 1, field 'c': cannot write "
                                   "U+D83D followed by U+DE00")
    assert "reads back as the single character U+1F600" in str(e.value)
    assert (e.value.record, e.value.field) == (1, "c") and not (tmp_path / "p.jsonl").exists()
    with pytest.raises(HargoInputError, match=r"field 'prompt\[1\]\.content'"):
        atomic_write_jsonl(tmp_path / "q.jsonl", [{"prompt": [{"content": "a"},
                                                             {"content": "\udbff\udc00"}]}])
    # apart, or in low-high order, they stay lone and read back as written
    for s in ("\ud83d \ude00", "\ude00\ud83d", "\ud83d", "\ude00"):
        assert read_jsonl(atomic_write_jsonl(tmp_path / "r.jsonl", [{"c": s}])) == [{"c": s}]


@pytest.mark.fast
def test_lone_surrogates_and_crlf_files_read_back(tmp_path):
    recs = [{"s": "\ud83d alone", "t": "low \udc00"}]
    assert read_jsonl(write_jsonl(tmp_path / "s.jsonl", recs)) == recs
    (tmp_path / "crlf.jsonl").write_bytes(b'{"a": "x\xe2\x80\xa8y"}\r\n\r\n{"a": 2}\r\n')
    assert read_jsonl(tmp_path / "crlf.jsonl") == [{"a": "x\u2028y"}, {"a": 2}]


@pytest.mark.fast
def test_a_bad_line_is_still_named_by_file_and_record(tmp_path):
    """Splitting at ``\\n`` only does not hide a broken record: a form feed alone on a line is
    not blank JSON, and the record index counts the lines before it."""
    p = tmp_path / "x.jsonl"
    p.write_text('{"a": 1}\n{"a": 2}\n\x0c\n', encoding="utf-8")
    with pytest.raises(HargoInputError, match=r"x\.jsonl, record 2 \(line \d+\): not valid JSON"):
        read_jsonl(p)


def test_prepare_output_with_unicode_line_separators_reads_back(tmp_path, committed_params):
    """The reported case: U+2028, U+2029 and U+0085 inside raw plp instructions and answers.
    ``prepare`` succeeds, and every later reader of its splits (read_prepared for SFT, RL and
    evaluate; read_jsonl for validate; the MLflow dataset profile) reads every record back."""
    raw = tmp_path / "raw"
    shutil.copytree(TINY, raw)
    f = json.loads((raw / "task1_plp.json").read_text(encoding="utf-8"))
    for i, ch in enumerate("\u2028\u2029\x85" * 4):
        f[i]["instruction"] = f[i]["instruction"].replace(" ", ch, 1) + ch
        f[i]["output"] = ch + f[i]["output"]
    (raw / "task1_plp.json").write_text(json.dumps(f, ensure_ascii=False), encoding="utf-8")
    out = tmp_path / "out"
    summary = P.run(_config({"seed": 42, "data": {"raw_dir": str(raw), "out_dir": str(out),
                                          "split": {"strategy": "grouped", "eval_fraction": 0.1,
                                                    "similarity_threshold": 0.9,
                                                    "minhash_perm": 128},
                                          "conflicts": "majority"}}))
    train, eval_ = read_prepared(out / "train.jsonl"), read_prepared(out / "eval.jsonl")
    assert summary["per_task"]["plp"] == {"train": 11, "eval": 1}
    assert len(train) == 56 and len(eval_) == 5
    plp = {r["source"]["index"]: r for r in train + eval_ if r["task"] == "plp"}
    assert plp[0]["prompt"][0]["content"].endswith("\u2028")
    assert plp[1]["answer"].startswith("\u2029") and plp[2]["answer"].startswith("\x85")
    assert read_jsonl(out / "rejects.jsonl") == [json.loads(line) for line in (
        out / "rejects.jsonl").read_text(encoding="utf-8").split("\n") if line]

    from hargo.tracking import split_dataset

    params = {**committed_params, "data": {**committed_params["data"], "out_dir": str(out)}}
    profile = split_dataset("train", as_config(params), tmp_path).profile
    assert profile == {"num_rows": 56, "tasks": {"mlperf": 15, "plp": 11, "race_c": 19,
                                                 "race_fortran": 11}}
