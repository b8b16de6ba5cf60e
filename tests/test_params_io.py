"""params.yaml loading/validation and the whole-or-nothing writers."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from hargo.io import (HargoInputError, atomic_dir, atomic_files, atomic_write_json, read_jsonl,
                      require_complete_dir, write_json, write_jsonl)
from hargo.params import ParamsError, apply_overrides, get, load_params

ROOT = Path(__file__).resolve().parents[1]


def test_committed_params_validate(committed_params):
    assert committed_params["rl"]["num_generations"] == 4
    assert set(committed_params["rl"]["methods"]) <= {"grpo", "dr_grpo", "hargo", "hargo_b1",
                                                      "hargo_b2"}


@pytest.mark.parametrize("override, name", [
    ("rl.num_generations=1", "rl.num_generations"),
    ("rl.hargo.alpha=-0.1", "rl.hargo.alpha"),
    ("rl.methods=[grpo, ppo2]", "rl.methods"),
    ("rl.hargo.rho=1.5", "rl.hargo.rho"),
    ("rl.ppo.kl_coef=-1", "rl.ppo.kl_coef"),
    ("rl.learning_rate=.inf", "rl.learning_rate"),
    ("rl.temperature=.nan", "rl.temperature"),
    ("evaluate.kv_cache_gib=0", "evaluate.kv_cache_gib"),
    ("data.split.strategy=random", "data.split.strategy"),
    ("data.split.similarity_threshold=0", "data.split.similarity_threshold"),
    ("data.split.similarity_threshold=1.01", "data.split.similarity_threshold"),
    ("data.split.minhash_perm=2", "data.split.minhash_perm"),
    ("data.split.minhash_perm=64.5", "data.split.minhash_perm"),
    ("evaluate.backend=onnx", "evaluate.backend"),
    ("sft.learning_rate=0", "sft.learning_rate"),
    ("rl.steps=two", "rl.steps"),
    # the registry gate's own rule (hargo.gate.check_gate_params), checked before any stage runs
    ("register.gate_metrics=[dr_f1, loss]", "register.gate_metrics"),
    ("register.tolerance=.inf", "register.tolerance"),
    ("register.tolerance=-0.1", "register.tolerance"),
])
def test_bad_values_name_the_parameter(override, name):
    with pytest.raises(ParamsError) as e:
        load_params(ROOT / "params.yaml", [override])
    assert str(e.value).startswith(name + ":")


def test_unknown_override_key_is_refused():
    with pytest.raises(ParamsError, match=r"rl\.bta: unknown parameter"):
        apply_overrides({"rl": {"beta": 0.02}}, {"rl.bta": 0.1})


def test_overrides_parse_yaml_values_and_copy():
    base = {"rl": {"steps": 4, "methods": ["grpo"]}}
    out = apply_overrides(base, ["rl.steps=8", "rl.methods=[hargo, grpo]"])
    assert out["rl"] == {"steps": 8, "methods": ["hargo", "grpo"]}
    assert base["rl"]["steps"] == 4  # the input is not mutated
    assert get(out, "rl.methods") == ["hargo", "grpo"]


def test_llm_judge_needs_an_endpoint():
    with pytest.raises(ParamsError, match="evaluate.judge_endpoint"):
        load_params(ROOT / "params.yaml", ["evaluate.judge=llm"])


def test_atomic_dir_leaves_nothing_on_failure(tmp_path):
    target = tmp_path / "model"
    with pytest.raises(RuntimeError):
        with atomic_dir(target) as tmp:
            (tmp / "weights.bin").write_text("half")
            raise RuntimeError("crash mid-write")
    assert not target.exists()
    assert list(tmp_path.iterdir()) == []


def test_atomic_dir_replaces_whole_and_marks_complete(tmp_path):
    target = tmp_path / "model"
    with atomic_dir(target) as tmp:
        (tmp / "a").write_text("1")
    with atomic_dir(target) as tmp:
        (tmp / "b").write_text("2")
    assert sorted(p.name for p in target.iterdir()) == [".complete", "b"]
    assert require_complete_dir(target) == target
    (target / ".complete").unlink()
    with pytest.raises(FileNotFoundError, match="incomplete"):
        require_complete_dir(target)


def test_atomic_files_replace_all_together_or_none(tmp_path):
    a, b = tmp_path / "a.jsonl", tmp_path / "sub" / "b.json"
    with atomic_files() as stage:
        write_jsonl(stage(a), [{"x": 1}])
        write_json(stage(b), {"y": 2})
        assert not a.exists() and not b.exists()  # nothing replaced before the block ends
    assert read_jsonl(a) == [{"x": 1}] and json.loads(b.read_text()) == {"y": 2}
    with pytest.raises(OSError, match="disk full"), atomic_files() as stage:
        write_jsonl(stage(a), [{"x": 3}])
        raise OSError("disk full")  # after the first file is written
    assert read_jsonl(a) == [{"x": 1}] and json.loads(b.read_text()) == {"y": 2}
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["a.jsonl", "b.json", "sub"]  # no temporaries
    with pytest.raises(ValueError, match="already staged"), atomic_files() as stage:
        stage(a)
        stage(a)
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["a.jsonl", "b.json", "sub"]


def test_read_jsonl_names_file_and_record(tmp_path):
    p = tmp_path / "x.jsonl"
    p.write_text('{"a": 1}\n{"a": \n')
    with pytest.raises(HargoInputError, match=r"x\.jsonl, record 1 \(line 2\): not valid JSON"):
        read_jsonl(p)
    p.write_text('{"a": 1}\n\n \n{"a": 2}\n[3]\n')    # blank lines: no record, still a line
    with pytest.raises(HargoInputError, match=r"x\.jsonl, record 2 \(line 5\): expected a JSON "
                                              r"object, got list"):
        read_jsonl(p)
    p.write_bytes(b'{"a": "\xff"}\n')
    with pytest.raises(HargoInputError, match="not valid UTF-8"):
        read_jsonl(p)
    atomic_write_json(tmp_path / "y.json", {"b": 2, "a": 1})
    assert json.loads((tmp_path / "y.json").read_text()) == {"a": 1, "b": 2}


@pytest.mark.parametrize("override, name", [
    ("rewards.mlperf.partial=abc", "rewards.mlperf.partial"),
    ("rewards.mlperf.partial=-7", "rewards.mlperf.partial"),
    ("validate.yes_fraction=0.5", "validate.yes_fraction"),
    ("validate.task_counts.plp=[700, 400]", "validate.task_counts.plp"),
    ("rewards.plp.batch_size=0", "rewards.plp.batch_size"),
])
def test_reward_and_contract_params_are_checked(override, name):
    with pytest.raises(ParamsError) as e:
        load_params(ROOT / "params.yaml", [override])
    assert str(e.value).startswith(name + ":")


def test_outputs_honour_the_umask(tmp_path):
    import os

    old = os.umask(0o022)
    try:
        atomic_write_json(tmp_path / "m.json", {"a": 1})
        with atomic_files() as stage:
            stage(tmp_path / "n.txt").write_text("x")
        with atomic_dir(tmp_path / "d") as tmp:
            (tmp / "f").write_text("x")
    finally:
        os.umask(old)
    assert (tmp_path / "m.json").stat().st_mode & 0o777 == 0o644
    assert (tmp_path / "n.txt").stat().st_mode & 0o777 == 0o644
    assert (tmp_path / "d").stat().st_mode & 0o777 == 0o755


@pytest.mark.parametrize("spelling, value", [
    ("1e-5", 1e-5), ("1E-5", 1e-5), ("1e-05", 1e-5), (".5", 0.5), ("5.0e-5", 5e-5),
    ("2.0e-4", 2e-4), ("3", 3)])
def test_every_number_spelling_loads_as_a_number(tmp_path, spelling, value):
    """PyYAML (YAML 1.1) reads 1e-5 / 1e-05 as strings; DVC's -S writes 1e-05. Every spelling
    is a number after load_params, in the file or as an override."""
    from hargo.params import load_params

    text = (ROOT / "params.yaml").read_text()
    text = text.replace("  learning_rate: 5.0e-5", f"  learning_rate: {spelling}", 1)
    assert f"learning_rate: {spelling}" in text
    (tmp_path / "params.yaml").write_text(text)
    p = load_params(tmp_path / "params.yaml")
    assert p["rl"]["learning_rate"] == pytest.approx(value)
    assert isinstance(p["rl"]["learning_rate"], (int, float))
    q = load_params(ROOT / "params.yaml", [f"sft.learning_rate={spelling}"])
    assert q["sft"]["learning_rate"] == pytest.approx(value)


def _script_overrides(script: Path) -> list[str]:
    """The ``-S`` overrides a script passes to ``dvc exp run``."""
    import re
    import shlex

    text = script.read_text().replace("\\\n", " ")
    words = shlex.split(" ".join(line.split("#")[0] for line in text.splitlines()))
    return [words[i + 1] for i, w in enumerate(words) if w == "-S" and
            not re.match(r"^\$", words[i + 1])]


@pytest.mark.parametrize("script", ["scripts/paper_recipe.sh", "scripts/compare.sh"])
def test_every_script_override_passes_dvcs_writer_and_the_validation(tmp_path, script):
    """Each -S of the script, written into a copy of params.yaml by DVC's own override writer
    (what `dvc exp run -S` does), then validated by hargo."""
    import shutil

    from dvc.utils.hydra import apply_overrides as dvc_apply
    from hargo.params import load_params

    overrides = _script_overrides(ROOT / script)
    assert len(overrides) >= 15 and "sft.learning_rate=2e-5" in overrides
    target = tmp_path / "params.yaml"
    shutil.copy(ROOT / "params.yaml", target)
    dvc_apply(target, overrides)
    assert "learning_rate: 2e-05" in target.read_text()   # DVC's spelling, a YAML 1.1 string
    p = load_params(target)
    assert p["sft"]["learning_rate"] == 2e-5
    assert p["rl"]["hargo"]["alpha"] == 0.3


def test_check_params_with_overrides_checks_them_and_writes_nothing(tmp_path, monkeypatch):
    """`hargo check-params -S key=value`: the value is checked as `dvc exp run -S` would set it,
    and no stamp is written (the stamp says params.yaml itself is valid)."""
    from typer.testing import CliRunner

    from hargo.cli import app

    monkeypatch.chdir(tmp_path)
    (tmp_path / "params.yaml").write_text((ROOT / "params.yaml").read_text())
    bad = CliRunner().invoke(app, ["check-params", "-S", "register.tolerance=.inf"])
    assert bad.exit_code == 2 and "register.tolerance" in bad.output
    ok = CliRunner().invoke(app, ["check-params", "-S", "register.tolerance=0.02"])
    assert ok.exit_code == 0 and "valid (nothing written)" in ok.output
    assert not (tmp_path / "reports").exists()
    stamp = CliRunner().invoke(app, ["check-params"])
    assert stamp.exit_code == 0 and (tmp_path / "reports" / "params-valid.txt").is_file()


def test_check_params_refuses_a_method_whose_module_names_an_unknown_estimator(tmp_path,
                                                                               monkeypatch):
    """Found by the fresh-clone review: a typo in a method module's estimator ("dr_grp0") passed
    the params stage and failed only when the rl stage built its trainer. check-params resolves
    every listed method's estimator, policy loss and KL names (hargo.methods._check)."""
    import dataclasses

    from typer.testing import CliRunner

    import hargo.methods as M
    from hargo.cli import app

    monkeypatch.chdir(tmp_path)
    (tmp_path / "params.yaml").write_text((ROOT / "params.yaml").read_text())
    assert CliRunner().invoke(app, ["check-params", "-S", "rl.methods=[dr_grpo]"]).exit_code == 0
    monkeypatch.setattr(M, "_REGISTRY", dict(M._REGISTRY))
    M._REGISTRY["dr_grpo"] = dataclasses.replace(M.get_method("dr_grpo"), estimator="dr_grp0")
    bad = CliRunner().invoke(app, ["check-params", "-S", "rl.methods=[dr_grpo]"])
    assert bad.exit_code == 2
    assert "method 'dr_grpo': unknown advantage estimator 'dr_grp0'" in bad.output
    assert not (tmp_path / "reports").exists()
