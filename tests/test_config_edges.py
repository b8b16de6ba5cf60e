"""The typed config's sharp edges a new user met (issue 42, item 11): each one now does what a
user expects.

* a section built alone (``as_section``) gets the rules that relate it to other sections;
* a params argument that is not a mapping is a ParamsError, not a TypeError;
* the synthetic test bed's per-task maps name the task at fault;
* ``hargo check-params`` by hand leaves no stamp that lies, and names the file it checked;
* ``--explain`` with a key no field has is an error;
* a key given twice in params.yaml (or in a ``-S`` value) is refused, as DVC refuses it;
* every interval confidence is in (0, 1), ``compare.report.confidence`` too.
"""
from __future__ import annotations

import re

import copy
import dataclasses
from pathlib import Path

import pytest
from typer.testing import CliRunner

from hargo.cli import app
from hargo.config import Config, as_config, as_section, load_config
from hargo.params import (CHECKED_STAMP, CHECKED_TEXT, ParamsError, apply_overrides,
                          read_params_file)

ROOT = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------ a section built alone
def test_a_section_built_alone_gets_the_answer_budget_rule(committed_params):
    """``rewards.answer.max_chars.plp`` too small for ``rl.max_new_tokens.plp`` (40 tokens x 8
    characters): the whole config refused it, ``as_section(params, "rewards")`` took it. Now
    both refuse it with the same message, and so does the budget's own section built alone
    (``rl``, ``evaluate``) while the mapping has a ``rewards`` section."""
    p = apply_overrides(committed_params, {"rewards.answer.max_chars.plp": 100})
    want = (r"^rewards\.answer\.max_chars\.plp: 100 characters is less than rl\.max_new_tokens "
            r"allows \(40 tokens x 8\); raise it to >= 320")
    for build in (lambda: Config.from_params(p), lambda: as_section(p, "rewards"),
                  lambda: as_section(p, "rl")):
        with pytest.raises(ParamsError, match=want):
            build()
    q = apply_overrides(committed_params, {"evaluate.max_new_tokens.plp": 600})
    with pytest.raises(ParamsError, match=r"less than evaluate\.max_new_tokens allows \(600 "):
        as_section(q, "evaluate")
    assert as_section(committed_params, "rewards").answer.max_chars["plp"] == 4096
    # a section whose mapping has no rewards section is built as before (tests call so)
    assert as_section({"rl": committed_params["rl"]}, "rl").steps == committed_params["rl"][
        "steps"]


def test_a_section_built_alone_needs_every_tuned_task_and_a_config_without_compare_too(
        committed_params):
    """``rewards.answer.max_chars`` naming every tuned task was the whole config's rule only;
    the budget rule ran only when the ``compare`` section was there."""
    p = copy.deepcopy(committed_params)
    del p["rewards"]["answer"]["max_chars"]["plp"]
    with pytest.raises(ParamsError, match=r"^rewards\.answer\.max_chars\.plp: missing"):
        as_section(p, "rewards")
    q = apply_overrides(committed_params, {"rewards.answer.max_chars.plp": 100})
    del q["compare"]
    with pytest.raises(ParamsError, match=r"^rewards\.answer\.max_chars\.plp: 100 characters"):
        Config.from_params(q)


# ------------------------------------------------------------ not a mapping
@pytest.mark.parametrize("params", [None, [1, 2], "params.yaml", 3])
def test_params_that_are_not_a_mapping_are_a_params_error(params):
    for build in (lambda: Config.from_params(params), lambda: as_config(params),
                  lambda: as_section(params, "rl"), lambda: as_config(params, synthetic=True)):
        with pytest.raises(ParamsError, match=r"^params: expected a (Config or a )?mapping of "
                                              r"sections, got"):
            build()


def test_a_params_file_whose_top_level_is_not_a_mapping_names_the_file(tmp_path):
    path = tmp_path / "params.yaml"
    path.write_text("- seed\n- rl\n")
    for read in (lambda: read_params_file(path), lambda: load_config(path, ["rl.steps=2"])):
        with pytest.raises(ParamsError, match=rf"^{path}: expected a mapping of sections at the "
                                              r"top level, got list \['seed', 'rl'\]"):
            read()


@pytest.mark.parametrize("text, match", [
    ("", r": empty \(no sections"),
    ("# only a comment\n", r": empty \(no sections"),
    ("seed: 1\nrl:\n  temperature: [0.6\n  steps: 2\n", r", line 4, column 8: not valid YAML "
     r"\(while parsing a flow sequence expected ',' or '\]'"),
    ("seed: 1\nrl: {steps: 2\n", r", line 3, column 1: not valid YAML \(while parsing a flow "
     r"mapping expected ',' or '\}'"),
    ("seed: 1\n\tsteps: 2\n", r", line 2, column 1: not valid YAML"),
    (b"seed: 1\nrl: {a: \xff}\n", r": not UTF-8 text \(byte 16"),
])
def test_a_params_file_that_cannot_be_read_is_one_line_naming_file_and_line(
        tmp_path, monkeypatch, text, match):
    """Text that is not YAML (1-based line and column of the first fault), not UTF-8, or empty:
    a ParamsError naming the file (PyYAML's traceback before), and `hargo check-params` says it
    in one line, exits 2 and removes the stamp of an earlier params.yaml."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("DVC_STAGE", raising=False)
    path = tmp_path / "params.yaml"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    for read in (lambda: read_params_file(path), lambda: load_config(path, ["rl.steps=2"])):
        with pytest.raises(ParamsError, match=rf"^{path}{match}"):
            read()
    stamp = tmp_path / CHECKED_STAMP
    stamp.parent.mkdir()
    stamp.write_text(CHECKED_TEXT)
    res = CliRunner().invoke(app, ["check-params"])
    assert res.exit_code == 2 and not stamp.exists(), res.output
    errors = [ln for ln in res.output.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and re.match(rf"error: params\.yaml{match}", errors[0]), res.output
    assert "Traceback" not in res.output


# ------------------------------------------------------------ synthetic per-task maps
@pytest.mark.parametrize("dotted, value, match", [
    ("synthetic.rl.max_new_tokens", {"syn_yesno": 4, "syn_short": 8},
     r"^synthetic\.rl\.max_new_tokens\.syn_long: missing \(no key "
     r"'synthetic\.rl\.max_new_tokens\.syn_long'; one integer per task"),
    ("synthetic.sft.examples_per_task", {"syn_yesno": 4, "syn_short": 8, "syn_lng": 1},
     r"^synthetic\.sft\.examples_per_task\.syn_lng: unknown task 'syn_lng'; valid synthetic "
     r"tasks: syn_yesno, syn_short, syn_long"),
    ("synthetic.rl.prompts_per_task", {"syn_yesno": 4, "syn_short": 8, "syn_long": -1},
     r"^synthetic\.rl\.prompts_per_task\.syn_long: expected an integer >= 0, got -1"),
    ("synthetic.evaluate.max_new_tokens", [4, 8, 64],
     r"^synthetic\.evaluate\.max_new_tokens: expected one integer per task"),
])
def test_a_synthetic_per_task_map_error_names_the_task(committed_params, dotted, value, match):
    with pytest.raises(ParamsError, match=match):
        Config.from_params(apply_overrides(committed_params, {dotted: value}))


# ------------------------------------------------------------ check-params by hand
def test_check_params_by_hand_leaves_no_stamp_that_lies(tmp_path, monkeypatch):
    """A valid params.yaml writes the stamp; an invalid one checked by hand removes it (it said
    an earlier params.yaml passed), while under DVC (``$DVC_STAGE``) it stays: the stage's
    output is ``persist`` and DVC records nothing for a failed stage. ``-p other.yaml``: the
    message names other.yaml and the pipeline's stamp is not written."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("DVC_STAGE", raising=False)
    text = (ROOT / "params.yaml").read_text()
    (tmp_path / "params.yaml").write_text(text)
    stamp = tmp_path / CHECKED_STAMP
    ok = CliRunner().invoke(app, ["check-params"])
    assert ok.exit_code == 0 and stamp.read_text() == CHECKED_TEXT
    assert "params.yaml: valid -> reports/params-valid.txt" in ok.output
    (tmp_path / "params.yaml").write_text(text.replace("\nseed: 42", "\nseed: -1"))
    monkeypatch.setenv("DVC_STAGE", "params")
    bad = CliRunner().invoke(app, ["check-params"])
    assert bad.exit_code == 2 and stamp.read_text() == CHECKED_TEXT     # DVC's own run: kept
    monkeypatch.delenv("DVC_STAGE")
    bad = CliRunner().invoke(app, ["check-params"])
    assert bad.exit_code == 2 and not stamp.exists()
    assert "error: seed: must be >= 0, got -1" in bad.output
    assert "removed reports/params-valid.txt: it said an earlier params.yaml passed" in bad.output
    # another file: checked, named, nothing written; a bad one leaves params.yaml's stamp alone
    (tmp_path / "params.yaml").write_text(text)
    assert CliRunner().invoke(app, ["check-params"]).exit_code == 0
    (tmp_path / "other.yaml").write_text(text)
    other = CliRunner().invoke(app, ["check-params", "-p", "other.yaml"])
    assert other.exit_code == 0
    assert other.output.strip() == ("other.yaml: valid (nothing written: "
                                    "reports/params-valid.txt is params.yaml's, the pipeline's "
                                    "params file)")
    assert "params.yaml passed" not in other.output
    (tmp_path / "other.yaml").write_text(text.replace("\nseed: 42", "\nseed: -1"))
    assert CliRunner().invoke(app, ["check-params", "-p", "other.yaml"]).exit_code == 2
    assert stamp.read_text() == CHECKED_TEXT


def test_the_stamp_names_the_file_it_checked(tmp_path):
    from hargo.params import checked_text, write_checked_stamp

    (tmp_path / "other.yaml").write_text((ROOT / "params.yaml").read_text())
    out = write_checked_stamp("other.yaml", root=tmp_path)
    assert out.read_text().startswith("other.yaml passed hargo.params.validate_params;")
    assert checked_text("params.yaml") == CHECKED_TEXT
    assert CHECKED_TEXT.startswith("params.yaml passed ")


# ------------------------------------------------------------ --explain
def test_explain_a_key_no_field_has_is_an_error():
    res = CliRunner().invoke(app, ["check-params", "--explain", "rl.foo"])
    assert res.exit_code == 2
    assert "error: --explain rl.foo: no field's key starts with it" in res.output
    res = CliRunner().invoke(app, ["check-params", "--explain", "rl.stepz"])
    assert res.exit_code == 2 and "did you mean rl.steps" in res.output
    res = CliRunner().invoke(app, ["check-params", "--explain", "rl.ste"])
    assert res.exit_code == 0
    assert res.output.splitlines() == ["rl.steps (int, required, >= 1): optimizer steps"]


# ------------------------------------------------------------ duplicate keys
@pytest.mark.parametrize("text, line, key", [
    ("seed: 1\nseed: 2\n", 2, "seed"),
    ("rl:\n  steps: 2\n  lora: {r: 8}\n  steps: 3\n", 4, "rl.steps"),
    ("rl:\n  lora: {r: 8, alpha: 16, r: 4}\n", 2, "rl.lora.r"),
    ("rl:\n  max_new_tokens:\n    plp: 40\n    plp: 80\n", 4, "rl.max_new_tokens.plp"),
])
def test_a_key_given_twice_is_refused_as_dvc_refuses_it(tmp_path, text, line, key):
    """PyYAML kept the last value silently; DVC's parser refuses the file. Refused here too,
    naming the file, the line and the dotted key."""
    from dvc.utils.serialize import YAMLFileCorruptedError, parse_yaml

    path = tmp_path / "params.yaml"
    path.write_text(text)
    with pytest.raises(YAMLFileCorruptedError):
        parse_yaml(text, str(path))
    with pytest.raises(ParamsError, match=rf"^{path}, line {line}: duplicate key '{key}' "
                                          r"\(first on line \d+\); PyYAML would keep the last"):
        read_params_file(path)


def test_merge_keys_are_not_duplicates_and_a_duplicate_override_value_is_refused(
        tmp_path, committed_params):
    text = "base: &b {r: 8, alpha: 16}\nlora:\n  <<: *b\n  r: 4\n"
    from dvc.utils.serialize import parse_yaml

    assert dict(parse_yaml(text, "p.yaml")["lora"]) == {"r": 4, "alpha": 16}
    (tmp_path / "p.yaml").write_text(text)
    assert read_params_file(tmp_path / "p.yaml")["lora"] == {"r": 4, "alpha": 16}
    with pytest.raises(ParamsError, match=r"^override 'rl\.max_new_tokens=\{plp: 40, plp: 80\}'"
                                          r": duplicate key 'plp'"):
        apply_overrides(committed_params, ["rl.max_new_tokens={plp: 40, plp: 80}"])
    res = CliRunner().invoke(app, ["check-params", "-p", str(ROOT / "params.yaml"), "-S",
                                   "rl.max_new_tokens={plp: 40, plp: 80}"])
    assert res.exit_code == 2 and "duplicate key 'plp'" in res.output


# ------------------------------------------------------------ confidences
def _confidence_keys(cls=Config, prefix=""):
    """The dotted keys of every field named ``confidence``, at any depth of the config."""
    out = []
    for f in dataclasses.fields(cls):
        node = f.metadata.get("node")
        if node is not None:
            out += _confidence_keys(node, f"{prefix}{f.name}.")
        elif f.name == "confidence":
            out.append(f"{prefix}{f.name}")
    return out


def test_every_confidence_is_in_the_open_interval(committed_params):
    """compare.report.confidence took 1.0 (an interval of every resample); register's and
    synthetic.bootstrap's did not. Every confidence of the config refuses 0 and 1 and takes
    0.9."""
    keys = _confidence_keys()
    assert sorted(keys) == ["compare.report.confidence", "register.confidence",
                            "synthetic.bootstrap.confidence"]
    for key in keys:
        for bad in (1.0, 0.0):
            with pytest.raises(ParamsError, match=rf"^{key.replace('.', '[.]')}: "):
                Config.from_params(apply_overrides(committed_params, {key: bad}))
        assert Config.from_params(apply_overrides(committed_params, {key: 0.9})).get(key) == 0.9


# ------------------------------------------------------------ integers, in every section alike
#: integer knobs of several sections and what the typed config gives for each
_INT_KNOBS = [
    ("seed", lambda c: c.seed),
    ("rl.steps", lambda c: c.rl.steps),
    ("register.resamples", lambda c: c.register.resamples),
    ("data.split.minhash_perm", lambda c: c.data.split.minhash_perm),
    ("rl.max_new_tokens.race_c", lambda c: c.rl.max_new_tokens["race_c"]),
    ("rewards.answer.max_chars.race_c", lambda c: c.rewards.answer.max_chars["race_c"]),
]


@pytest.mark.parametrize("dotted, read", _INT_KNOBS, ids=[k for k, _ in _INT_KNOBS])
def test_a_whole_float_is_an_integer_for_every_int_knob(committed_params, tmp_path, dotted,
                                                        read):
    """Issue 42 (new user): ``seed: 42.0`` and ``-S rl.steps=1e1`` were integers, but the
    file's ``register.resamples: 2000.0`` was refused ("expected an integer >= 100, got
    2000.0"), and so was a per-task budget ``rl.max_new_tokens: {race_c: 64.0}``. One rule now:
    a whole number in any spelling (256, 256.0, 2.56e2, 2.56e+2) is the integer, in the file and
    with ``-S`` alike; a fraction is refused for every one of them."""
    import yaml

    from hargo.params import load_params, validate_params

    n = 256
    for spelling in (str(n), f"{n}.0", "2.56e2", "2.56e+2"):
        as_file = copy.deepcopy(committed_params)
        node, *path, last = [as_file, *dotted.split(".")]
        for key in path:
            node = node[key]
        node[last] = "PLACEHOLDER"
        f = tmp_path / "params.yaml"
        f.write_text(yaml.safe_dump(as_file).replace("PLACEHOLDER", spelling))
        for params in (load_params(f), load_params(ROOT / "params.yaml",
                                                   [f"{dotted}={spelling}"])):
            got = read(validate_params(params))
            assert got == n and type(got) is int, (spelling, got)
    for fraction in ("256.5", "2.565e2"):
        with pytest.raises(ParamsError, match=rf"^{dotted}: "):
            load_params(ROOT / "params.yaml", [f"{dotted}={fraction}"])


@pytest.mark.parametrize("spelling", ["1e3", "2e-3", "1E3", "1.5e3", ".5", "+1", "0x10",
                                      "1_000", "yes", "~", "2000.0", "'2e3'"])
def test_a_set_value_reads_as_the_file_reads_it(tmp_path, spelling):
    """``-S`` values were read as YAML 1.1 (``2e3`` a string) while the file is read with YAML
    1.2's numbers (``2e3`` the float 2000.0): a value now reads the same in both places."""
    f = tmp_path / "params.yaml"
    f.write_text(f"register:\n  resamples: {spelling}\n")
    in_file = read_params_file(f)["register"]["resamples"]
    by_set = apply_overrides({"register": {"resamples": 1}},
                             [f"register.resamples={spelling}"])["register"]["resamples"]
    assert by_set == in_file and type(by_set) is type(in_file), (by_set, in_file)


def _explain(key: str):
    res = CliRunner().invoke(app, ["check-params", "--explain", key])
    return res.exit_code, [line.split(" ", 1)[0].rstrip(":") for line in res.output.splitlines()]


def test_explain_matches_dotted_segments_not_string_prefixes():
    """Issue 42 (new user): ``--explain rl.hargo`` also printed rl.hargo_b1, rl.hargo_b2,
    rl.hargo_batch and rl.hargo_contrast (a string prefix). A field name is the field and the
    fields under it; only a key that is no field's falls back to the keys it starts."""
    code, keys = _explain("rl.hargo")
    assert code == 0 and keys[0] == "rl.hargo" and len(keys) > 5
    assert all(k == "rl.hargo" or k.startswith("rl.hargo.") for k in keys), keys
    assert "rl.hargo.alpha" in keys and "rl.hargo_b1" not in keys
    code, keys = _explain("rl.hargo_b1")
    assert code == 0 and keys[0] == "rl.hargo_b1" and "rl.hargo_b2" not in keys
    code, keys = _explain("rl.steps")
    assert (code, keys) == (0, ["rl.steps"])
    code, keys = _explain("rl.hargo_b")              # no such field: the keys it starts
    assert code == 0 and {"rl.hargo_b1", "rl.hargo_b2", "rl.hargo_batch"} <= set(keys)


def test_explain_an_entry_of_a_per_task_map():
    """Issue 42 (new user): ``--explain rl.max_new_tokens.race_c`` exited 2 although ``-S
    rl.max_new_tokens.race_c=9`` is taken. It prints the map's line, naming the task's entry;
    a task no universe has is still an error."""
    for key, field in (("rl.max_new_tokens.race_c", "rl.max_new_tokens"),
                       ("rewards.answer.max_chars.plp", "rewards.answer.max_chars")):
        res = CliRunner().invoke(app, ["check-params", "--explain", key])
        assert res.exit_code == 0, res.output
        [line] = res.output.splitlines()
        assert line.startswith(f"{field} (") and line.endswith(
            f"[{key}: the entry for task {key.rsplit('.', 1)[1]!r} of this per-task map]")
    res = CliRunner().invoke(app, ["check-params", "--explain", "rl.max_new_tokens.nope"])
    assert res.exit_code == 2 and "did you mean rl.max_new_tokens" in res.output
