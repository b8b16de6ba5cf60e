"""A params file edited while a stage runs (issue 42, item 3): the stage fails, naming what
changed, so DVC records nothing (it would record the file's new values as the params of outputs
made from the old ones, and call them up to date)."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]


def _edit(path: Path, section: str, key: str, value) -> None:
    params = yaml.safe_load(path.read_text())
    params[section][key] = value
    path.write_text(yaml.safe_dump(params, sort_keys=False))


@pytest.mark.parametrize("command, module, attr", [
    (["register"], "hargo.registry", "run"),
    (["evaluate"], "hargo.evaluation.evaluate", "run"),
    (["rl", "--method", "hargo"], "hargo.training.rl", "run"),
])
def test_a_params_edit_during_a_stage_fails_the_stage_naming_it(tmp_path, monkeypatch, command,
                                                                module, attr):
    """The reported case: ``register.tolerance`` 0.01 -> 0.02 six seconds into ``hargo
    register``: metrics/register.json said 0.01, dvc.lock 0.02, `dvc status` up to date."""
    import importlib

    from typer.testing import CliRunner

    from hargo.cli import app

    shutil.copy(ROOT / "params.yaml", tmp_path / "params.yaml")
    _edit(tmp_path / "params.yaml", "register", "tolerance", 0.01)
    monkeypatch.chdir(tmp_path)
    used = {}

    def stage(params, *args, **kwargs):      # the stage reads its params, then someone edits
        used["tolerance"] = params.register.tolerance     # the typed Config (issue 41 item 4)
        _edit(tmp_path / "params.yaml", "register", "tolerance", 0.02)
        return {}

    monkeypatch.setattr(importlib.import_module(module), attr, stage)
    res = CliRunner().invoke(app, command)
    assert res.exit_code == 1, res.output
    assert used == {"tolerance": 0.01}
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert lines[-1].startswith("error: ParamsError: params.yaml changed while the stage ran "
                                "(register.tolerance: 0.01 -> 0.02)"), res.output
    assert "DVC records nothing" in lines[-1]


def test_an_unchanged_or_reformatted_params_file_lets_the_stage_succeed(tmp_path, monkeypatch):
    import importlib

    from typer.testing import CliRunner

    from hargo.cli import app

    shutil.copy(ROOT / "params.yaml", tmp_path / "params.yaml")
    monkeypatch.chdir(tmp_path)

    def stage(params):          # a comment added and the keys re-ordered: the same values
        path = tmp_path / "params.yaml"
        path.write_text("# touched\n" + yaml.safe_dump(yaml.safe_load(path.read_text())))
        return {}

    monkeypatch.setattr(importlib.import_module("hargo.registry"), "run", stage)
    res = CliRunner().invoke(app, ["register"])
    assert res.exit_code == 0, res.output


def test_a_command_after_another_checks_only_its_own_params(tmp_path, monkeypatch):
    """The params an earlier command of the same process read are forgotten: a command that
    reads none (tracking-reroot) in another folder is not failed by them."""
    from typer.testing import CliRunner

    from hargo.cli import app

    shutil.copy(ROOT / "params.yaml", tmp_path / "params.yaml")
    monkeypatch.chdir(tmp_path)
    assert CliRunner().invoke(app, ["check-params"]).exit_code == 0
    other = tmp_path / "other"
    other.mkdir()
    monkeypatch.chdir(other)                   # no params.yaml here
    res = CliRunner().invoke(app, ["tracking-reroot"])
    assert res.exit_code == 0 and "nothing to re-root" in res.output, res.output
