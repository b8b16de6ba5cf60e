"""The ``prepare`` stage: label normalisation, strict raw input, the messy-data handling, both
split strategies (a Hypothesis property for the grouped split, the paper's 5,273/584 on the real
files) and the statistics.

Crafted raw data: tests/data/hpc_tiny (26 race_c records with the real noise kinds, 12 Fortran,
22 mlperf with two conflicting groups, 12 plp; the comments in the expected numbers below say
which record is which)."""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hargo.data import conflicts as C
from hargo.data import labels as L
from hargo.data import prepare as P
from hargo.data import raw as R
from hargo.data import split as S
from hargo.io import HargoInputError
from hargo.vocab import TASKS


def _config(partial: dict):
    """The typed config the prepare stage takes: params.yaml with ``partial``'s sections."""
    from hargo.config import as_config
    from hargo.params import read_params_file

    root = Path(__file__).resolve().parents[1]
    return as_config({**read_params_file(root / "params.yaml"), **partial})

TINY = Path(__file__).parent / "data" / "hpc_tiny"
OUTPUTS = ("train.jsonl", "eval.jsonl", "rejects.jsonl", "stats.json", "answer_lengths.csv")


def params(raw_dir, out_dir, strategy="grouped", conflicts="majority", fraction=0.1, seed=42,
           threshold=0.9) -> dict:
    return {"seed": seed, "data": {"raw_dir": str(raw_dir), "out_dir": str(out_dir),
                                   "split": {"strategy": strategy, "eval_fraction": fraction,
                                             "similarity_threshold": threshold, "minhash_perm": 128},
                                   "conflicts": conflicts}}


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


# ----------------------------------------------------------------------------- labels

@pytest.mark.parametrize("output,expected", [
    ("yes", ("yes", L.CLEAN)),
    ("no", ("no", L.CLEAN)),
    (" No.\n", ("no", L.CLEAN)),
    ("YES", ("yes", L.CLEAN)),
    # the real race_c noise: a label followed by code
    ("no\n\n#pragma omp parallel shared(var)\n{\n    #pragma omp single\n        var++;\n"
     "    #pragma omp barrier\n    #pragma omp single\n        var--;\n}", ("no", L.LEADING_LABEL)),
    ("yes\n\n#pragma omp parallel for\nfor (int k = 0; k < n; k++)\n    x[k] = x[k + 1];",
     ("yes", L.LEADING_LABEL)),
    ("no\n#pragma omp ordered\n{\n    sum += list[i];\n}", ("no", L.LEADING_LABEL)),
    # ... or by prose (record 1499): "do not" is not the word "no"
    ("no\n\nplease note that all the code snippets have the same behavior and do not cause a "
     "data race problem.", ("no", L.LEADING_LABEL)),
    ("yes. yes, it does", ("yes", L.LEADING_LABEL)),
    # no label at all (record 423)
    ("' marker are used for each code snippet.\n\n1.", (None, L.NO_LABEL)),
    ("nothing races here", (None, L.NO_LABEL)),
    # both labels: ambiguous
    ("no, but yes when n > len", (None, L.AMBIGUOUS)),
    ("Yes/No", (None, L.AMBIGUOUS)),
    ("  \n", (None, L.EMPTY)),
])
def test_normalise_label_on_noisy_outputs(output, expected):
    assert L.parse_label(output) == expected


def test_snippet_missing_spots_code_moved_into_the_output():
    tpl = ("Given the code snippet: {}, help me detect if adding pragma will cause a data race "
           "problem? Answer 'yes' if it causes a data race problem and 'no' if it will not.")
    assert L.snippet_missing(tpl.format(""))
    assert L.snippet_missing(tpl.format("1"))
    assert not L.snippet_missing(tpl.format("#pragma omp parallel for\nfor (i=0;i<n;i++) a[i]=1;"))
    assert L.code_snippet(tpl.format(" a[i] = 0; ")) == "a[i] = 0;"
    assert not L.snippet_missing("What is the number of processors?")  # not the race template


# ----------------------------------------------------------------------------- label-bearing names

@pytest.mark.fast
@pytest.mark.parametrize("text,expected,count", [
    # Fortran program, its end and a module used by it: every occurrence, the same replacement
    ("program DRB048_firstprivate_orig_no\n  x = 1\nend program DRB048_firstprivate_orig_no",
     "program DRB048_firstprivate_orig\n  x = 1\nend program DRB048_firstprivate_orig", 2),
    ("module DRB106_taskwaitmissing_orig_yes\nend module\nprogram main\n"
     "  use DRB106_taskwaitmissing_orig_yes\nend program",
     "module DRB106_taskwaitmissing_orig\nend module\nprogram main\n"
     "  use DRB106_taskwaitmissing_orig\nend program", 2),
    # upper and lower case, Fortran is case-insensitive: one name, one replacement each
    ("PROGRAM DRB001_ANTIDEP1_ORIG_YES\nend program drb001_antidep1_orig_yes",
     "PROGRAM DRB001_ANTIDEP1_ORIG\nend program drb001_antidep1_orig", 2),
    # file names in comments, C's hyphens and Fortran's underscores, the extension kept
    ("// DRB001-antidep1-orig-yes.c\n#pragma omp parallel for", "// DRB001-antidep1-orig.c\n#pragma omp parallel for", 1),
    ("! DRB073_doall2_orig_yes.f95: from DataRaceBench", "! DRB073_doall2_orig.f95: from DataRaceBench", 1),
    ("/* DRB020-privatemissing-var-yes.c */", "/* DRB020-privatemissing-var.c */", 1),
    # var variants, gpu suffixes, digits and variants after the label, a label in front
    ("program DRB040_truedepsingleelement_var_yes_2", "program DRB040_truedepsingleelement_var_2", 1),
    ("program DRB145_atomiccritical_orig_gpu_no", "program DRB145_atomiccritical_orig_gpu", 1),
    ("program DRB080_taskdep4_orig_no_omp45", "program DRB080_taskdep4_orig_omp45", 1),
    ("program No_DRB139_taskdeferred_no", "program DRB139_taskdeferred", 1),
    ("program DRB064_outeronly2_new_no1", "program DRB064_outeronly2_new", 1),
    # imitations without DRB: an orig/var suffix, or a program/module name with a label
    ("program LP5_targetparallelfor_orig_no", "program LP5_targetparallelfor_orig", 1),
    ("x = reductionmissing_var_yes5", "x = reductionmissing_var", 1),
    ("program ProgrammingModule_yes\ncall ProgrammingModule_yes()",
     "program ProgrammingModule\ncall ProgrammingModule()", 2),
    ("module   MOD917_threadsmissing_privacy_YES", "module   MOD917_threadsmissing_privacy", 1),
])
def test_mask_label_names_removes_the_label_from_drb_style_names(text, expected, count):
    assert L.mask_label_names(text) == (expected, count)
    assert L.label_names(expected) == [] and not L.LABEL_NAME.search(expected)
    assert L.mask_label_names(expected) == (expected, 0)  # idempotent


@pytest.mark.fast
@pytest.mark.parametrize("text", [
    "program DRB048_firstprivate_orig",          # no label suffix
    "program DRB071_v2",
    "integer :: arr_length_no, flag_yes",        # ends in _no/_yes but no DRB-style name
    "call no_omp2(x)",
    "Answer 'yes' if it causes a data race problem and 'no' if it will not.",
    "we use no locks here; program nobarrier_x",  # 'no' only as a word or a prefix
    "program DRB048_nobarrier_orig_notes",
])
def test_mask_label_names_leaves_other_names_alone(text):
    assert L.mask_label_names(text) == (text, 0)
    assert L.label_names(text) == []


@pytest.mark.fast
def test_the_docstring_gives_the_exact_regex():
    doc = L.mask_label_names.__doc__
    block = doc[doc.index("(?<![A-Za-z0-9_])(?:program"):doc.index("Every such name")]
    parts = {"C": r"[A-Za-z0-9]+", "S": r"[_-]", "L": r"(?:yes+|no)\d*(?![A-Za-z])", "E": r"(?![A-Za-z0-9_-])"}
    block = re.sub(r"\b[CSLE]\b", lambda m: parts[m.group(0)], block.replace("[ \\t]", "\0"))
    assert "(?i)" + "".join(block.split()).replace("\0", "[ \\t]") == L.LABEL_NAME_REGEX


@pytest.mark.fast
def test_strip_label_keeps_a_valid_identifier():
    assert L.strip_label("DRB048_firstprivate_orig_no") == "DRB048_firstprivate_orig"
    assert L.strip_label("DRB001-antidep1-orig-yes") == "DRB001-antidep1-orig"
    assert L.strip_label("No_DRB139_taskdeferred_no") == "DRB139_taskdeferred"
    assert L.strip_label("Yes_1") == "name_1" and L.strip_label("yes_no") == "name"


def _tiny_with_label_names(tmp_path: Path) -> Path:
    """hpc_tiny with DataRaceBench-style names: Fortran 0 (yes) names its program twice; 1 (no)
    upper case; 2 (yes) is 0's code under a lower-case name with a digit after the label, the
    same prompt once masked; 4 (yes) an orig imitation; 5 (no) a variable arr_length_no (left
    alone); race_c 0 (yes) a C file name in a comment; mlperf 0 a DRB name (not a race prompt)."""
    raw = tmp_path / "raw"
    shutil.copytree(TINY, raw)
    f = json.loads((raw / "task2_fortran.json").read_text())
    f[0]["instruction"] = f[0]["instruction"].replace("program p0", "program DRB001_antidep1_orig_yes") \
        .replace("end program", "end program DRB001_antidep1_orig_yes")
    f[1]["instruction"] = f[1]["instruction"].replace("program p1", "PROGRAM DRB048_FIRSTPRIVATE_ORIG_NO")
    f[2]["instruction"] = f[0]["instruction"].replace("DRB001_antidep1_orig_yes", "drb001_antidep1_orig_yes2")
    f[4]["instruction"] = f[4]["instruction"].replace("program p4", "program LP5_targetparallelfor_orig_yes")
    f[5]["instruction"] = f[5]["instruction"].replace("integer :: i", "integer :: i, arr_length_no")
    (raw / "task2_fortran.json").write_text(json.dumps(f))
    c = json.loads((raw / "task2_c_c++.json").read_text())
    c[0]["instruction"] = c[0]["instruction"].replace("#pragma", "// DRB001-antidep1-orig-yes.c\n#pragma", 1)
    (raw / "task2_c_c++.json").write_text(json.dumps(c))
    m = json.loads((raw / "task1_ml_perf.json").read_text())
    m[0]["instruction"] += " (see DRB001_antidep1_orig_yes)"
    (raw / "task1_ml_perf.json").write_text(json.dumps(m))
    return raw


def test_prepare_masks_label_names_before_grouping_and_counts_them(tmp_path):
    raw = _tiny_with_label_names(tmp_path)
    P.run(_config(params(raw, tmp_path / "out")))
    stats = json.loads((tmp_path / "out" / "stats.json").read_text())
    h = stats["handling"]
    got = {t: (h[t]["label_name_records"], h[t]["label_name_occurrences"]) for t in TASKS}
    # Fortran: 0 and 2 two names each (program and end program), 1 and 4 one each
    assert got == {"race_c": (1, 1), "race_fortran": (4, 6), "mlperf": (0, 0), "plp": (0, 0)}
    assert stats["mask_label_names"] is True and "LABEL_NAME_REGEX" in stats["label_name_rule"]
    # Fortran 2 is Fortran 0 once masked (prompt and answer): a duplicate, 12 -> 11 records
    assert h["race_fortran"]["exact_duplicates"] == 1 and h["race_fortran"]["kept"] == 11
    recs = read_jsonl(tmp_path / "out" / "train.jsonl") + read_jsonl(tmp_path / "out" / "eval.jsonl")
    by_id = {r["id"]: r["prompt"][0]["content"] for r in recs}
    assert "race_fortran-00002" not in by_id
    assert "program DRB001_antidep1_orig\n" in by_id["race_fortran-00000"]
    assert "end program DRB001_antidep1_orig\n" in by_id["race_fortran-00000"]
    assert "PROGRAM DRB048_FIRSTPRIVATE_ORIG\n" in by_id["race_fortran-00001"]
    assert "program LP5_targetparallelfor_orig\n" in by_id["race_fortran-00004"]
    assert "arr_length_no" in by_id["race_fortran-00005"]
    assert "// DRB001-antidep1-orig.c\n" in by_id["race_c-00000"]
    assert by_id["mlperf-00000"].endswith("(see DRB001_antidep1_orig_yes)")  # not a race prompt
    assert not any(L.LABEL_NAME.search(r["prompt"][0]["content"]) for r in recs if r["task"].startswith("race"))
    # off: the prompts as written, nothing counted
    p = params(raw, tmp_path / "off")
    p["data"]["mask_label_names"] = False
    P.run(_config(p))
    stats = json.loads((tmp_path / "off" / "stats.json").read_text())
    assert stats["handling"]["race_fortran"]["label_name_records"] == 0
    assert stats["handling"]["race_fortran"]["kept"] == 12 and stats["label_name_rule"] is None
    recs = read_jsonl(tmp_path / "off" / "train.jsonl") + read_jsonl(tmp_path / "off" / "eval.jsonl")
    assert "program DRB001_antidep1_orig_yes\n" in next(
        r["prompt"][0]["content"] for r in recs if r["id"] == "race_fortran-00000")
    p["data"].update(mask_label_names="yes", out_dir=str(tmp_path / "bad"))
    with pytest.raises(ValueError, match="data.mask_label_names: expected true or false, got 'yes'"):
        P.run(_config(p))
    assert not (tmp_path / "bad").exists()


def test_real_race_c_noise_is_the_21_records_of_source_md(real_raw_dir):
    raws = R.load_file(real_raw_dir / "task2_c_c++.json")
    forms = {}
    for i, r in enumerate(raws):
        forms.setdefault(L.parse_label(r["output"])[1], []).append(i)
    assert {k: len(v) for k, v in forms.items()} == {L.CLEAN: 1837, L.LEADING_LABEL: 20, L.NO_LABEL: 1}
    assert forms[L.NO_LABEL] == [423]
    # 19 of the 20 label+text outputs come from instructions whose code slid into the output
    missing = [i for i in forms[L.LEADING_LABEL] if L.snippet_missing(raws[i]["instruction"])]
    assert missing == [1542, 1543, 1544, 1545, 1546, 1638, 1639, 1640, 1641, 1642,
                       1698, 1699, 1700, 1701, 1702, 1714, 1715, 1716, 1717]
    assert sorted(set(forms[L.LEADING_LABEL]) - set(missing)) == [1499]


# ----------------------------------------------------------------------------- bad input

def _bad_dir(tmp_path: Path, content: bytes) -> Path:
    raw = tmp_path / "raw"
    shutil.copytree(TINY, raw)
    (raw / "task1_plp.json").write_bytes(content)
    return raw


GOOD = b'{"instruction": "q0", "input": "", "output": "a0"}'


def _two(bad: bytes) -> bytes:
    """A good record on line 2 and ``bad`` (record 1) on line 3, as the real files are laid out."""
    return b"[\n" + GOOD + b",\n" + bad + b"\n]"


@pytest.mark.parametrize("content,record,field,line,message", [
    # invalid JSON: the record and the field the parser stopped in, and where
    (b"[" + GOOD + b', {"instruction": "q1" "input": "", "output": "a1"}]', 1, "instruction", 1,
     "not valid JSON: Expecting ',' delimiter"),
    (b"[" + GOOD + b", " + GOOD + b",]", 2, None, 1, "not valid JSON"),
    (_two(b'{"instruction": "q1", "input": "", "output": "bad \\x escape"}'), 1, "output", 3,
     "not valid JSON: Invalid \\escape"),
    (_two(b'{"instruction": "q1", "input": "", "output": "no closing quote}\n]'), 1, "output", 3,
     "not valid JSON: Invalid control character"),
    (_two(b'{"instruction": "q1", "input": ""}'), 1, "output", None, "missing required field"),
    (b"[" + GOOD + b", " + GOOD + b', {"instruction": "q2", "input": "", "output": 7}]', 2, "output", None,
     "expected a string, got a number"),
    (b"[" + GOOD + b', {"instruction": null, "input": "", "output": "a1"}]', 1, "instruction", None,
     "expected a string, got null"),
    # bytes that are not UTF-8, in any field
    (b"[" + GOOD + b', {"instruction": "caf\xe9 \xff", "input": "", "output": "a1"}]', 1, "instruction", 1,
     "not valid UTF-8: byte 0xe9"),
    (_two(b'{"instruction": "q1", "input": "", "output": "a1 \xc3("}'), 1, "output", 3,
     "not valid UTF-8: byte 0xc3"),
    # JSON-escaped lone surrogates: valid JSON, but no character (UnicodeEncodeError on writing)
    (_two(b'{"instruction": "q1", "input": "", "output": "rocket \\ud83d"}'), 1, "output", 3,
     "JSON escape \\ud83d is a lone UTF-16 surrogate"),
    (_two(b'{"instruction": "q1 \\uDE00", "input": "", "output": "a1"}'), 1, "instruction", 3,
     "JSON escape \\uDE00 is a lone UTF-16 surrogate"),
    (_two(b'{"instruction": "q1", "input": "\\ud83d\\u0041", "output": "a1"}'), 1, "input", 3,
     "JSON escape \\ud83d is a lone UTF-16 surrogate"),
    (b"", None, None, None, "empty file"),
    (b"  \n", None, None, None, "empty file"),
    (b"[]", None, None, None, "no records"),
    (b'{"instruction": "q"}', None, None, None, "expected a JSON array of records, got an object"),
    (b"[" + GOOD + b', ["q1", "", "a1"]]', 1, None, None, "expected a JSON object, got an array"),
], ids=["invalid-json", "trailing-comma", "invalid-escape", "unterminated-string", "missing-field",
        "wrong-type", "null-field", "non-utf8", "non-utf8-output", "lone-high-surrogate",
        "lone-low-surrogate", "high-surrogate-without-low", "empty", "blank", "empty-array",
        "not-an-array", "record-not-object"])
def test_bad_input_names_file_record_field_and_writes_nothing(tmp_path, content, record, field, line, message):
    raw = _bad_dir(tmp_path, content)
    out = tmp_path / "prepared"
    with pytest.raises(HargoInputError) as e:
        P.run(_config(params(raw, out)))
    err = e.value
    assert err.path.endswith("task1_plp.json") and "task1_plp.json" in str(err)
    assert (err.record, err.field) == (record, field)
    assert message in str(err)
    if record is not None:
        assert f"record {record}" in str(err)
    if field is not None:
        assert f"field '{field}'" in str(err)
    if line is not None:
        assert f"(line {line}, column " in str(err)
    assert not out.exists()


def test_valid_surrogate_pairs_and_escaped_backslashes_are_not_lone_surrogates(tmp_path):
    # "\\ud83d\\ude00" is one character (U+1F600); "\\\\ud83d" is a backslash and the text "ud83d"
    path = tmp_path / "f.json"
    path.write_bytes(_two(b'{"instruction": "smile \\ud83d\\ude00", "input": "", "output": "\\\\ud83d"}'))
    assert R.load_file(path)[1] == {"instruction": "smile \U0001F600", "input": "", "output": "\\ud83d"}


def test_bad_input_leaves_earlier_outputs_untouched(tmp_path):
    out = tmp_path / "prepared"
    P.run(_config(params(TINY, out)))
    before = {n: (out / n).read_bytes() for n in OUTPUTS}
    raw = _bad_dir(tmp_path, b"[" + GOOD + b", {")
    with pytest.raises(HargoInputError):
        P.run(_config(params(raw, out, seed=7)))
    assert {n: (out / n).read_bytes() for n in OUTPUTS} == before
    assert sorted(p.name for p in out.iterdir()) == sorted(OUTPUTS)  # no temporary leftovers


def test_a_failure_while_writing_leaves_the_old_outputs_whole(tmp_path, monkeypatch):
    out = tmp_path / "prepared"
    P.run(_config(params(TINY, out)))
    before = {n: (out / n).read_bytes() for n in OUTPUTS}
    real_write, written = P.write_jsonl, []

    def write_once_then_fail(path, records):
        if written:
            raise OSError("disk full")
        written.append(real_write(path, records))
        return written[-1]

    monkeypatch.setattr(P, "write_jsonl", write_once_then_fail)
    with pytest.raises(OSError, match="disk full"):
        P.prepare(_config(params(TINY, out, seed=7)))  # another seed: other contents
    assert written and written[0].parent == out and written[0].name != "train.jsonl"  # a temporary
    assert {n: (out / n).read_bytes() for n in OUTPUTS} == before
    assert sorted(p.name for p in out.iterdir()) == sorted(OUTPUTS)  # no temporary leftovers
    monkeypatch.undo()
    P.prepare(_config(params(TINY, out, seed=7)))
    assert (out / "train.jsonl").read_bytes() != before["train.jsonl"]  # the seed mattered


def test_missing_file_is_named(tmp_path):
    raw = tmp_path / "raw"
    shutil.copytree(TINY, raw)
    (raw / "task2_fortran.json").unlink()
    with pytest.raises(HargoInputError, match="task2_fortran.json: file not found"):
        R.load_raw(raw)


# ----------------------------------------------------------------------------- messy-data handling

def test_grouped_handling_of_the_crafted_noise():
    raw = R.load_raw(TINY)
    recs, rejects, c = C.clean_task("race_c", raw["race_c"])
    # 26 raw: 21 kept; 21 (missing code) and 22 (no label) quarantined; 23 duplicates 0;
    # 24/25 label the same code no/yes: a tie, both rejected
    assert c["raw"] == 26 and c["kept"] == 21 == len(recs)
    assert c["quarantined"] == {C.MISSING_CODE: 1, L.NO_LABEL: 1}
    assert c["exact_duplicates"] == 1
    assert (c["conflict_groups"], c["conflict_records"], c["conflict_dropped"]) == (1, 2, 2)
    assert [(r["source"]["index"], r["reason"]) for r in rejects] == [
        (21, C.MISSING_CODE), (22, L.NO_LABEL), (24, C.CONFLICT_TIE), (25, C.CONFLICT_TIE)]
    by_id = {r["id"]: r for r in recs}
    assert by_id["race_c-00020"]["label"] == "no" == by_id["race_c-00020"]["answer"]  # label + prose
    assert sum(r["label"] == "yes" for r in recs) == 10
    assert c["label_forms"] == {L.CLEAN: 23, L.LEADING_LABEL: 2, L.NO_LABEL: 1}

    assert (c["conflict_majority"], c["conflict_ties"]) == (0, 1)

    recs, rejects, c = C.clean_task("mlperf", raw["mlperf"], "majority")
    # 15-19: "2", "896", "2", "192", "2" -> "2" (3 votes), alt in first-seen order;
    # 20/21: "3.0-2003, NVIDIA+CoreWeave" x1 / "3.0-2004, ASUSTeK" x1, a tie -> both rejected
    by_id = {r["id"]: r for r in recs}
    assert by_id["mlperf-00015"]["answer"] == "2"
    assert by_id["mlperf-00015"]["alt_answers"] == ["896", "192"]
    assert "mlperf-00020" not in by_id and "mlperf-00021" not in by_id
    assert (c["exact_duplicates"], c["conflict_groups"], c["conflict_majority"], c["conflict_ties"],
            c["conflict_records"], c["conflict_merged"], c["conflict_dropped"], c["kept"]) == (2, 2, 1, 1, 5, 2, 2, 16)
    assert [(r["source"]["index"], r["reason"]) for r in rejects] == [(20, C.CONFLICT_TIE), (21, C.CONFLICT_TIE)]
    assert rejects[0]["detail"] == ("answers given for this prompt: '3.0-2003, NVIDIA+CoreWeave' x1; "
                                    "'3.0-2004, ASUSTeK' x1")

    recs, rejects, c = C.clean_task("mlperf", raw["mlperf"], "drop")
    assert c["kept"] == 15 and c["conflict_dropped"] == 5
    assert [(r["source"]["index"], r["reason"]) for r in rejects] == [
        (15, C.CONFLICT_DROPPED), (16, C.CONFLICT_DROPPED), (18, C.CONFLICT_DROPPED),
        (20, C.CONFLICT_TIE), (21, C.CONFLICT_TIE)]  # a tie is a tie under both policies
    assert "'2' x3" in rejects[0]["detail"]


def test_answers_are_compared_after_normalisation():
    q = lambda i, o: {"instruction": f"Which accelerator is in system {i}?", "input": "", "output": o}
    raws = [q(0, "H100"), q(0, "H100 "),                            # one answer, written twice
            q(1, "H100"), q(1, "A100"), q(1, "h100\r\n"), q(1, "A100 "), q(1, "H100"),  # h100 x3, a100 x2
            q(2, "H100"), q(2, "A100 "), q(2, " a100"), q(2, "h100")]  # h100 x2, a100 x2: a tie
    recs, rejects, c = C.clean_task("mlperf", raws, "majority")
    assert [(r["id"], r["answer"], r["alt_answers"]) for r in recs] == [
        ("mlperf-00000", "H100", []),          # a duplicate, not a conflict
        ("mlperf-00002", "H100", ["A100"])]    # the winner's and the alternative's first text
    # copies that differ only in whitespace or case are duplicates (1, 4, 5, 6, 9, 10), still
    # counted in the vote
    assert (c["merged_duplicates"], c["exact_duplicates"], c["conflict_groups"], c["conflict_majority"],
            c["conflict_ties"], c["conflict_merged"], c["conflict_dropped"]) == (0, 6, 2, 1, 1, 1, 2)
    assert [r["source"]["index"] for r in rejects] == [7, 8]
    assert {r["reason"] for r in rejects} == {C.CONFLICT_TIE}
    assert rejects[0]["detail"] == "answers given for this prompt: 'H100' x2; 'A100 ' x2"


def test_ties_are_rejected_for_every_task():
    # free-text plp answers and race labels alike: one answer each, no reference
    plp = [{"instruction": "What does BigCloneBench hold?", "input": "", "output": o}
           for o in ("Java clone pairs.", "Code clones in Java.")]
    race = [{"instruction": "Given the code snippet: x[i] = x[i+1];, help me detect a race", "input": "",
             "output": o} for o in ("yes", "no")]
    for task, raws in (("plp", plp), ("mlperf", plp), ("race_fortran", race)):
        for policy in C.CONFLICT_POLICIES:
            recs, rejects, c = C.clean_task(task, raws, policy)
            assert recs == [] and [r["reason"] for r in rejects] == [C.CONFLICT_TIE] * 2
            assert (c["conflict_groups"], c["conflict_ties"], c["conflict_dropped"]) == (1, 1, 2)


def test_near_duplicate_instructions_are_one_prompt_for_conflicts():
    # the same kernel indented differently / with CRLF line ends / other case: one prompt, so its
    # contradictory labels meet in one vote (upstream race_c 1525/1573/1833 and 1553/1577/1662/1813)
    kernel = "Given the code snippet: #pragma omp parallel for\nfor (i = 0; i < n; i++)\n  a[i] = a[i+1];, help me detect"
    other = kernel.replace("\n  ", "\n    ")
    tie = [{"instruction": kernel, "input": "", "output": "yes"},
           {"instruction": other, "input": "", "output": "no"}]
    for policy in C.CONFLICT_POLICIES:
        recs, rejects, c = C.clean_task("race_c", tie, policy)
        assert recs == [] and [r["reason"] for r in rejects] == [C.CONFLICT_TIE] * 2
        assert (c["conflict_groups"], c["conflict_ties"], c["near_duplicate_groups"],
                c["near_duplicate_records"]) == (1, 1, 1, 2)
    majority = tie + [{"instruction": kernel.replace("\n", "\r\n").upper() + " ", "input": "", "output": "Yes."}]
    recs, rejects, c = C.clean_task("race_c", majority, "majority")
    assert [(r["id"], r["label"], r["alt_answers"], r["prompt"][0]["content"]) for r in recs] == [
        ("race_c-00000", "yes", ["no"], kernel)]  # the first record, as written
    assert (rejects, c["conflict_majority"], c["conflict_merged"], c["near_duplicate_records"]) == ([], 1, 2, 3)


def test_duplicates_are_compared_after_normalisation():
    q = "Which accelerator does system 7 use?"
    raws = [{"instruction": q, "input": "", "output": "H100"},
            {"instruction": q.upper().replace(" ", "\r\n") + " ", "input": " ", "output": "h100\n"},
            {"instruction": "other", "input": "", "output": "H100"}]
    recs, rejects, c = C.clean_task("plp", raws)
    assert [r["id"] for r in recs] == ["plp-00000", "plp-00002"] and rejects == []
    assert (c["exact_duplicates"], c["merged_duplicates"], c["conflict_groups"]) == (1, 0, 0)
    assert (c["near_duplicate_groups"], c["near_duplicate_records"]) == (1, 2)


def test_race_majority_and_merged_duplicates():
    tpl = "Given the code snippet: {}, help me detect if adding pragma will cause a data race problem?"
    a, b = tpl.format("x[i] = x[i-1];"), tpl.format("y[i] = 0;")
    raws = [{"instruction": a, "input": "", "output": o} for o in ("yes", "no", "no", "no\n\nno race.")]
    raws += [{"instruction": b, "input": "", "output": "no"}, {"instruction": b, "input": "", "output": "No."}]
    recs, rejects, c = C.clean_task("race_c", raws, "majority")
    # a: yes x1, no x3 (two exact duplicates + one normalised) -> no, alt [yes]; b: merged
    assert [(r["id"], r["label"], r["alt_answers"]) for r in recs] == [
        ("race_c-00001", "no", ["yes"]), ("race_c-00004", "no", [])]
    assert (c["exact_duplicates"], c["merged_duplicates"], c["conflict_merged"], rejects) == (1, 1, 2, [])


@pytest.mark.parametrize("strategy,conflicts", [("grouped", "majority"), ("grouped", "drop"), ("paper", "majority")])
def test_every_raw_record_is_accounted_for(tmp_path, strategy, conflicts):
    P.run(_config(params(TINY, tmp_path, strategy, conflicts)))
    stats = json.loads((tmp_path / "stats.json").read_text())
    for task, h in stats["handling"].items():
        removed = (sum(h.get("quarantined", {}).values()) + h.get("exact_duplicates", 0)
                   + h.get("merged_duplicates", 0) + h.get("conflict_merged", 0) + h.get("conflict_dropped", 0))
        assert h["raw"] == removed + h["kept"] == stats["counts"][task]["raw"]
        assert h["kept"] == stats["counts"][task]["total"]
        assert h.get("conflict_groups", 0) == h.get("conflict_majority", 0) + h.get("conflict_ties", 0)
    assert "a tie at the top is rejected for every task" in stats["conflict_rule"]
    rejects = read_jsonl(tmp_path / "rejects.jsonl")
    assert len(rejects) == sum(sum(h.get("quarantined", {}).values()) + h.get("conflict_dropped", 0)
                               for h in stats["handling"].values())


# ----------------------------------------------------------------------------- splits

# Prompts "<task> line\nq<k>" as written in one of four ways: the same instruction to the split
_VARIANTS = (lambda c: c, lambda c: c.replace("\n", "\r\n") + " ", lambda c: "  " + c.upper(),
             lambda c: c.replace("\n", " \t\n"))
_records = st.lists(
    st.tuples(st.sampled_from(TASKS), st.integers(0, 12), st.sampled_from(_VARIANTS)), min_size=0, max_size=120,
).map(lambda xs: [{"id": f"r{k}", "task": t, "prompt": [{"role": "user", "content": v(f"{t} line\nq{q}")}]}
                  for k, (t, q, v) in enumerate(xs)])


@pytest.mark.fast
@settings(max_examples=150, deadline=None)
@given(records=_records, fraction=st.sampled_from([0.1, 0.2, 0.25, 0.5]), seed=st.integers(0, 2**31))
def test_grouped_split_leaks_nothing(records, fraction, seed):
    train, eval_ = S.split_grouped(records, fraction, seed)
    key = lambda r: " ".join(r["prompt"][0]["content"].split()).lower()  # an independent normaliser
    assert not {key(r) for r in train} & {key(r) for r in eval_}
    assert sorted(r["id"] for r in train + eval_) == sorted(r["id"] for r in records)  # a partition
    for t in TASKS:
        n = sum(r["task"] == t for r in records)
        n_eval = sum(r["task"] == t for r in eval_)
        assert n_eval <= S.eval_size(n, fraction)
        if len({key(r) for r in records if r["task"] == t}) == n:  # singleton groups: exact size
            assert n_eval == S.eval_size(n, fraction)
    assert S.split_grouped(records, fraction, seed) == (train, eval_)  # seeded


@pytest.mark.fast
def test_normalise_text_folds_line_ends_whitespace_case_and_blanks():
    assert R.normalise_text("Is  X\r\nracy? ") == R.normalise_text("is x\nRACY?") == "is x racy?"
    assert R.normalise_text("a\rb\u00a0c\t") == "a b c"  # a lone CR and a no-break space
    assert R.normalise_text("H100 ") == R.normalise_text("h100") == "h100"
    assert R.normalise_text("a b") != R.normalise_text("ab")  # whitespace is folded, not removed


@pytest.mark.fast
def test_crlf_and_trailing_space_copies_stay_in_one_split():
    # 20 instructions, each also as a CRLF + trailing-space copy: 40 records, eval target 20
    recs = []
    for k in range(20):
        text = f"Given the code snippet: #pragma omp parallel\n{{ a[{k}] = 0; }}, help me detect"
        recs += [{"id": f"r{k}", "task": "race_c", "prompt": [{"role": "user", "content": text}]},
                 {"id": f"r{k}-crlf", "task": "race_c",
                  "prompt": [{"role": "user", "content": text.replace("\n", "\r\n") + " "}]}]
    for seed in range(5):
        train, eval_ = S.split_grouped(recs, 0.5, seed)
        assert len(train) == len(eval_) == 20
        ids = {r["id"] for r in eval_}
        assert all((f"r{k}" in ids) == (f"r{k}-crlf" in ids) for k in range(20))
    assert S.near_duplicates(recs) == {"race_c": {"groups": 20, "records": 40}}


def test_prepare_merges_near_duplicate_instructions(tmp_path):
    # every plp instruction also as a copy with CRLF line ends, other case and a trailing space:
    # the same answer makes it a duplicate, a different one a conflict (a tie: rejected)
    raw = tmp_path / "raw"
    shutil.copytree(TINY, raw)
    plp = json.loads((raw / "task1_plp.json").read_text())
    copies = [dict(r, instruction=r["instruction"].replace(" the ", " THE\r\n", 1) + " ") for r in plp]
    assert all(c["instruction"] != r["instruction"] for c, r in zip(copies, plp))
    copies[0]["output"] = "A different answer."
    (raw / "task1_plp.json").write_text(json.dumps(plp + copies))
    for seed in (1, 2, 3):
        P.run(_config(params(raw, tmp_path / "out", fraction=0.25, seed=seed)))
        train, eval_ = (read_jsonl(tmp_path / "out" / n) for n in ("train.jsonl", "eval.jsonl"))
        key = lambda r: " ".join(r["prompt"][0]["content"].split()).casefold()  # independent of R
        assert not {key(r) for r in train} & {key(r) for r in eval_}
        plp_out = [r for r in train + eval_ if r["task"] == "plp"]
        assert sorted(r["source"]["index"] for r in plp_out) == list(range(1, 12))  # the originals
        assert len({key(r) for r in plp_out}) == 11
        stats = json.loads((tmp_path / "out" / "stats.json").read_text())
        h = stats["handling"]["plp"]
        assert (h["exact_duplicates"], h["conflict_ties"], h["conflict_dropped"], h["kept"]) == (11, 1, 2, 11)
        assert stats["near_duplicates"]["plp"] == {"groups": 12, "records": 24}
        assert stats["near_duplicates"]["race_fortran"] == {"groups": 0, "records": 0}


@pytest.mark.fast
def test_grouped_split_by_custom_key_keeps_groups_whole():
    # 5 instructions x 10 records: the eval target floor(50 * 0.2) = 10 holds exactly one group
    recs = [{"id": f"r{k}", "task": "plp", "prompt": [{"role": "user", "content": f"p{k}"}],
             "instruction": f"i{k % 5}"} for k in range(50)]
    by_instruction = lambda r: r["instruction"]
    chosen = set()
    for seed in range(10):
        train, eval_ = S.split_grouped(recs, 0.2, seed, text=by_instruction)
        assert len(eval_) == 10 and len({r["instruction"] for r in eval_}) == 1
        assert not {r["instruction"] for r in train} & {r["instruction"] for r in eval_}
        chosen.add(eval_[0]["instruction"])
    assert len(chosen) > 1  # the seed matters


@pytest.mark.fast
def test_eval_size_is_floor_robust_to_float_error():
    assert [S.eval_size(n, 0.1) for n in (1858, 1576, 1820, 603, 9)] == [185, 157, 182, 60, 0]
    assert S.eval_size(100, 0.29) == 29  # 100 * 0.29 = 28.999999999999996
    with pytest.raises(ValueError, match="eval_fraction"):
        S.split_paper([], 1.0, 0)


def test_paper_strategy_gives_5273_584_on_the_real_files(real_raw_dir, tmp_path):
    summary = P.run(_config(params(real_raw_dir, tmp_path, "paper")))
    assert (summary["train"], summary["eval"], summary["rejects"]) == (5273, 584, 0)
    assert summary["per_task"] == {"race_c": {"train": 1673, "eval": 185},
                                   "race_fortran": {"train": 1419, "eval": 157},
                                   "mlperf": {"train": 1638, "eval": 182},
                                   "plp": {"train": 543, "eval": 60}}
    train, eval_ = read_jsonl(tmp_path / "train.jsonl"), read_jsonl(tmp_path / "eval.jsonl")
    ids = [r["id"] for r in train + eval_]
    assert len(set(ids)) == 5857
    by_id = {r["id"]: r for r in train + eval_}
    # every raw record kept, its raw output the answer; labels normalised where there is one
    assert by_id["race_c-01542"]["answer"].startswith("no\n\n#pragma") and by_id["race_c-01542"]["label"] == "no"
    assert by_id["race_c-00423"]["label"] is None
    stats = json.loads((tmp_path / "stats.json").read_text())
    assert stats["answer_length_ratio_raw"] == {"longest_task": "plp", "shortest_task": "race_fortran",
                                                "ratio": 59.05}  # 147.2438 / 2.4937; the paper: 58x
    # the same seed gives the same split
    P.run(_config(params(real_raw_dir, tmp_path / "again", "paper")))
    assert (tmp_path / "again" / "eval.jsonl").read_bytes() == (tmp_path / "eval.jsonl").read_bytes()


def _fold(text: str) -> str:
    """Whitespace runs and case folded by str.split/casefold: independent of R.normalise_text."""
    return " ".join(text.split()).casefold()


def _usable(task: str, raws: list[dict]) -> list[dict]:
    """The raw records the quarantine lets through (race: an unambiguous label and the code in
    the instruction; mlperf/plp upstream have no empty fields), each with its answer: the label
    or the folded output; race instructions with their label names masked, as prepare's step 0."""
    out = []
    for r in raws:
        if task.startswith("race"):
            r = dict(r, instruction=L.mask_label_names(r["instruction"])[0])  # step 0
            label = L.parse_label(r["output"])[0]
            if label is None or L.snippet_missing(r["instruction"]):
                continue
            out.append(dict(r, answer=label))
        else:
            out.append(dict(r, answer=_fold(r["output"])))
    return out


def _answer_votes_from_raw(task: str, raws: list[dict]) -> list[list[int]]:
    """Per prompt (the folded instruction; upstream inputs are all empty), the vote counts of its
    distinct answers, derived from the raw records alone."""
    votes: dict[str, dict[str, int]] = {}
    for r in _usable(task, raws):
        answers = votes.setdefault(_fold(r["instruction"]), {})
        answers[r["answer"]] = answers.get(r["answer"], 0) + 1
    return [sorted(v.values(), reverse=True) for v in votes.values()]


def test_grouped_strategy_on_the_real_files(real_raw_dir, tmp_path):
    summary = P.run(_config(params(real_raw_dir, tmp_path)))
    assert summary["per_task"] == {"race_c": {"train": 1609, "eval": 178},
                                   "race_fortran": {"train": 1418, "eval": 157},
                                   "mlperf": {"train": 998, "eval": 110},
                                   "plp": {"train": 468, "eval": 52}}
    train, eval_ = read_jsonl(tmp_path / "train.jsonl"), read_jsonl(tmp_path / "eval.jsonl")
    stats = json.loads((tmp_path / "stats.json").read_text())
    h = stats["handling"]
    assert h["race_c"]["quarantined"] == {C.MISSING_CODE: 19, L.NO_LABEL: 1}
    raw = R.load_raw(real_raw_dir)
    assert not any(r["input"].strip() for rs in raw.values() for r in rs)
    # every count derived from the raw files: duplicates (every field folded), conflict groups
    # (folded instructions with more than one answer), majority, ties, kept records. race_c: the
    # near-duplicate kernels 1525/1573/1833 (yes/no/yes) and 1552/1660/1686 (yes/no/yes) are
    # majorities, 1553/1577/1662/1813 (yes/no/no/yes) a tie
    for task, expected in (("race_c", (40, 7, 3, 4, 1787)), ("race_fortran", (1, 0, 0, 0, 1575)),
                           ("mlperf", (510, 94, 26, 68, 1108)), ("plp", (57, 13, 0, 13, 520))):
        usable = _usable(task, raw[task])
        groups = _answer_votes_from_raw(task, raw[task])
        conflicts = [v for v in groups if len(v) > 1]
        ties = sum(v[0] == v[1] for v in conflicts)
        unique = {tuple(_fold(r[f]) for f in ("instruction", "input", "output")) for r in usable}
        derived = (len(usable) - len(unique), len(conflicts), len(conflicts) - ties, ties, len(groups) - ties)
        assert derived == expected
        assert (h[task]["exact_duplicates"], h[task]["conflict_groups"], h[task]["conflict_majority"],
                h[task]["conflict_ties"], h[task]["kept"]) == derived
        written: dict[str, list[str]] = {}
        for r in usable:
            written.setdefault(_fold(r["instruction"]), []).append(r["instruction"])
        near = [v for v in written.values() if len(set(v)) > 1]
        assert stats["near_duplicates"][task] == {"groups": len(near), "records": sum(map(len, near))}
    # race_c 1787: ids 1553 and 1577 rejected (a tie), 1525 and 1552 kept with the majority
    by_id = {r["id"]: r for r in train + eval_}
    assert "race_c-01553" not in by_id and "race_c-01577" not in by_id
    assert [(by_id[i]["label"], by_id[i]["alt_answers"]) for i in ("race_c-01525", "race_c-01552")] == [
        ("yes", ["no"]), ("yes", ["no"])]
    assert (h["race_c"]["conflict_dropped"], h["mlperf"]["conflict_dropped"]) == (8, 157)
    # 65 of mlperf's 68 ties are one record each way; the others 2-2, 4-4 and 6-6
    assert sorted(v[0] for v in _answer_votes_from_raw("mlperf", raw["mlperf"])
                  if len(v) > 1 and v[0] == v[1]) == [1] * 65 + [2, 4, 6]
    # the eval split is the target size floor(0.1 n) of every task's kept records
    for task, c in stats["counts"].items():
        if task != "total":
            assert c["eval"] == S.eval_size(h[task]["kept"], 0.1) and c["train"] + c["eval"] == h[task]["kept"]
    assert stats["counts"]["race_c"]["labels"] == {"train": {"no": 868, "yes": 741},
                                                   "eval": {"no": 89, "yes": 89}}
    # near-duplicates (instructions equal after folding whitespace and case) are one prompt:
    # race_c, the same kernel indented differently: 624/907, 625/906, 1432/1487 (the same label:
    # duplicates) and the three conflicts above; mlperf "MXNet"/"mxnet" and "PyTorch"/"pytorch"
    # in otherwise equal questions. No folded instruction is in both splits
    assert stats["near_duplicates"] == {"race_c": {"groups": 6, "records": 16},
                                        "race_fortran": {"groups": 0, "records": 0},
                                        "mlperf": {"groups": 2, "records": 17},
                                        "plp": {"groups": 0, "records": 0}}
    key = lambda r: _fold(r["prompt"][0]["content"])
    assert not {key(r) for r in train} & {key(r) for r in eval_}
    for t in TASKS:  # one record per folded prompt
        assert len({key(r) for r in train + eval_ if r["task"] == t}) == stats["counts"][t]["total"]
    assert stats["answer_length_ratio"]["ratio"] == 64.72
    # step 0: 1,356 of the 1,576 raw Fortran prompts name a program or file after the label
    # (1,416 names); race_c has none. Where a prompt's names spell one label, it is the record's
    # in 1,288 of 1,354: the answer could be read off the prompt. After prepare no race prompt
    # holds such a name, and masking made no two real prompts one (the counts above are unchanged)
    assert {t: (h[t]["label_name_records"], h[t]["label_name_occurrences"]) for t in TASKS} == {
        "race_c": (0, 0), "race_fortran": (1356, 1416), "mlperf": (0, 0), "plp": (0, 0)}
    spelled = [(set(L.labels_in_names(r["instruction"])), L.parse_label(r["output"])[0])
               for r in raw["race_fortran"]]
    single = [(labs, label) for labs, label in spelled if len(labs) == 1 and label is not None]
    assert (sum(label in labs for labs, label in single), len(single)) == (1288, 1354)
    assert sum(bool(labs) for labs, _ in spelled) == 1356
    assert not any(L.LABEL_NAME.search(r["prompt"][0]["content"])
                   for r in train + eval_ if r["task"].startswith("race"))


# ----------------------------------------------------------------------------- outputs and stats

def test_prepared_record_schema_and_outputs(tmp_path):
    summary = P.run(_config(params(TINY, tmp_path)))
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(OUTPUTS)
    # race_c 21 -> 2 eval; fortran 12 -> 1; mlperf 16 -> 1; plp 12 -> 1
    assert summary["per_task"] == {"race_c": {"train": 19, "eval": 2}, "race_fortran": {"train": 11, "eval": 1},
                                   "mlperf": {"train": 15, "eval": 1}, "plp": {"train": 11, "eval": 1}}
    recs = read_jsonl(tmp_path / "train.jsonl") + read_jsonl(tmp_path / "eval.jsonl")
    r = next(x for x in recs if x["id"] == "plp-00003")
    assert r == {"id": "plp-00003", "task": "plp",
                 "prompt": [{"role": "user", "content":
                             "What is the size of the testing set in the BigCloneBench dataset?"}],
                 "answer": "The testing set of the BigCloneBench dataset contains 4k code samples used "
                           "to evaluate the models.",
                 "label": None, "alt_answers": [], "source": {"file": "task1_plp.json", "index": 3}}
    assert {x["label"] for x in recs if x["task"].startswith("race")} == {"yes", "no"}
    stats = json.loads((tmp_path / "stats.json").read_text())
    assert stats["answer_length"]["race_fortran"]["chars"] == {"n": 12, "mean": 2.5, "median": 2.5,
                                                               "min": 2, "max": 3}
    assert stats["answer_length"]["race_fortran"]["tokens"]["max"] == 1


def test_prompt_keeps_a_non_empty_input_and_never_truncates():
    long = "x" * 250_000
    r = R.make_record("plp", 3, {"instruction": "Explain:", "input": long, "output": "a"}, "a", None)
    assert r["prompt"][0]["content"] == "Explain:\n\n" + long
    assert R.instruction_prompt("Q", "  ") == "Q"


def test_count_tokens_and_length_table():
    assert P.count_tokens("a[i] = 1;") == 7
    assert P.count_tokens("The CT-all dataset") == 5
    recs = [{"task": "plp", "answer": "x" * n} for n in (0, 1, 5, 7, 300)] + [{"task": "race_c", "answer": "no"}]
    rows = [line.split(",") for line in P.answer_length_table(recs).splitlines()]
    assert rows[0] == ["answer_chars", "race_c", "race_fortran", "mlperf", "plp"]
    table = {int(r[0]): dict(zip(rows[0][1:], map(float, r[1:]))) for r in rows[1:]}
    assert sorted(table) == [0, 1, 2, 4, 8, 16, 32, 64, 128, 256]
    assert [table[b]["plp"] for b in (0, 1, 4, 256)] == [20.0, 20.0, 40.0, 20.0]
    assert table[2]["race_c"] == 100.0 and table[2]["mlperf"] == 0.0


def test_length_ratio():
    assert P.length_ratio({"plp": 147.0, "race_c": 3.0, "mlperf": 49.0}) == {
        "longest_task": "plp", "shortest_task": "race_c", "ratio": 49.0}


def test_bad_params_are_refused(tmp_path):
    with pytest.raises(ValueError, match="strategy"):
        P.run(_config(params(TINY, tmp_path, strategy="random")))
    with pytest.raises(ValueError, match="conflicts"):
        P.run(_config(params(TINY, tmp_path, conflicts="vote")))
    assert not tmp_path.joinpath("train.jsonl").exists()


def test_mask_label_names_param_is_validated(committed_params):
    from hargo.params import ParamsError, apply_overrides, validate_params

    assert committed_params["data"]["mask_label_names"] is True
    for value in ("yes", 1, None):
        with pytest.raises(ParamsError, match=r"^data.mask_label_names: expected true or false"):
            validate_params(apply_overrides(committed_params, {"data.mask_label_names": value}))
