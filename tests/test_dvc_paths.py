"""Every path knob of params.yaml is where its DVC pipeline file declares it, or the ``params``
stage refuses it (issue 42, item 7): ``check-params -S data.out_dir=data/prepared_v2`` said
valid, and ``dvc exp run`` then broke the workspace. The DVC-level case (the workspace left as
it was) is ``tests/test_dvc_stages.py::test_a_path_knob_dvc_yaml_does_not_declare_stops_dvc_exp
_run_at_the_params_stage``."""
from __future__ import annotations

import copy
import shutil
from pathlib import Path

import pytest
import yaml

from hargo.config import Config, as_config, explain
from hargo.config.dvc_paths import PATH_KNOBS, _declared, check_pipeline_paths
from hargo.params import ParamsError

ROOT = Path(__file__).resolve().parents[1]
KNOBS = {k.key: k for k in PATH_KNOBS}


def _get(params: dict, key: str):
    """The value at ``key``: params.yaml's, else the typed config's default."""
    node = as_config(params)
    for part in key.split("."):
        node = getattr(node, part)
    return node


def _set(params: dict, key: str, value) -> Config:
    """The typed config of ``params`` with ``key`` set to ``value`` (the key added where
    params.yaml leaves it out), as check_pipeline_paths takes it."""
    p = copy.deepcopy(params)
    *head, last = key.split(".")
    node = p
    for part in head:
        node = node.setdefault(part, {})
    node[last] = value
    return as_config(p)


@pytest.fixture()
def project(tmp_path, committed_params) -> tuple[Path, dict]:
    for name in ("dvc.yaml", "compare/dvc.yaml"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, tmp_path / name)
    return tmp_path, copy.deepcopy(committed_params)


@pytest.mark.fast
def test_every_path_knob_of_the_config_is_checked():
    keys = {line.split(" ")[0].rstrip(":") for line in explain()}
    paths = {k for k in keys if k.rsplit(".", 1)[-1].endswith(("_dir", "_file", "_path"))}
    assert paths == set(KNOBS), "a path knob without its pipeline file: add it to PATH_KNOBS"


@pytest.mark.fast
@pytest.mark.parametrize("key", sorted(KNOBS))
def test_the_committed_value_is_what_the_pipeline_declares(project, key):
    root, params = project
    knob = KNOBS[key]
    stages = yaml.safe_load((root / knob.dvc_file).read_text())["stages"]
    value = _get(params, key)
    assert knob.form.replace("{}", value) in _declared(stages[knob.stage], knob.field)
    for spelling in (value + "/", f"./{value}", str(root / value)):
        check_pipeline_paths(_set(params, key, spelling), root)


@pytest.mark.fast
@pytest.mark.parametrize("key", sorted(KNOBS))
def test_a_path_knob_the_pipeline_does_not_declare_is_refused_by_name(project, key):
    root, params = project
    knob = KNOBS[key]
    value = _get(params, key)
    # a knob params.yaml leaves out is checked at its default: refused when dvc.yaml moves
    moved = value.rsplit(".", 1)[0] + "_v2" + ("." + value.rsplit(".", 1)[1] if "." in value
                                               else "")
    verb = "writes" if knob.field == "outs" else "reads"
    with pytest.raises(ParamsError, match=rf"^{key}: '{moved}' is not where {knob.dvc_file} "
                                          rf"stage '{knob.stage}' {verb} it \({value}[ )|].*"
                                          rf"Keep '{value}', or change the path in "
                                          rf"{knob.dvc_file}"):
        check_pipeline_paths(_set(params, key, moved), root)
    # no pipeline file here: nothing is declared, nothing refused (a stage run by hand)
    (root / knob.dvc_file).unlink()
    check_pipeline_paths(_set(params, key, moved), root)


def test_check_params_refuses_a_moved_output_and_writes_nothing(monkeypatch, tmp_path):
    """The reported command: ``hargo check-params -S data.out_dir=data/prepared_v2`` said the
    file was valid."""
    from typer.testing import CliRunner

    from hargo.cli import app

    shutil.copy(ROOT / "dvc.yaml", tmp_path / "dvc.yaml")
    shutil.copy(ROOT / "params.yaml", tmp_path / "params.yaml")
    monkeypatch.chdir(tmp_path)
    res = CliRunner().invoke(app, ["check-params", "-S", "data.out_dir=data/prepared_v2"])
    assert res.exit_code == 2, res.output
    assert "error: data.out_dir: 'data/prepared_v2' is not where dvc.yaml stage 'prepare' " \
           "writes it (data/prepared)" in res.output
    res = CliRunner().invoke(app, ["check-params", "-S", "data.out_dir=data/prepared/"])
    assert res.exit_code == 0, res.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dvc.yaml", "params.yaml"]


@pytest.mark.fast
def test_a_knob_left_out_of_params_is_checked_at_its_default(project):
    root, params = project
    assert "report_dir" not in params["validate"]       # params.yaml relies on the default
    text = (root / "dvc.yaml").read_text()
    moved = text.replace("    outs:\n      - reports/validation\n", "    outs:\n      - reports/gx\n")
    assert moved != text                                 # the stage's output was found and moved
    (root / "dvc.yaml").write_text(moved)
    with pytest.raises(ParamsError, match=r"^validate\.report_dir: 'reports/validation' is not "
                                          r"where dvc\.yaml stage 'validate' writes it "
                                          r"\(reports/gx\)"):
        check_pipeline_paths(as_config(params), root)


@pytest.mark.fast
def test_a_path_the_pipeline_templates_from_the_knob_flows(project):
    """The other way to agree: a pipeline file that takes the path from params.yaml
    (``${data.out_dir}``) follows any value."""
    root, params = project
    text = (root / "dvc.yaml").read_text()
    (root / "dvc.yaml").write_text(text.replace("- data/prepared/train.jsonl\n      - data/prepared"
                                                "/eval.jsonl", "- ${data.out_dir}/train.jsonl\n"
                                                "      - ${data.out_dir}/eval.jsonl", 1))
    assert "${data.out_dir}/train.jsonl" in (root / "dvc.yaml").read_text()
    check_pipeline_paths(_set(params, "data.out_dir", "data/prepared_v2"), root)
    with pytest.raises(ParamsError, match=r"^sft\.out_dir: "):    # the others still checked
        check_pipeline_paths(_set(params, "sft.out_dir", "models/sft_v2"), root)
