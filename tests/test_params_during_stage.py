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


# ------------------------------------------------- a declared dependency edited during a stage
def _dvc_project(root: Path) -> None:
    """``root``: params.yaml and dvc.yaml as committed, and a few of the stages' declared deps
    (a code file, a folder of per-prompt rows, a foreach stage's own file)."""
    shutil.copy(ROOT / "params.yaml", root / "params.yaml")
    shutil.copy(ROOT / "dvc.yaml", root / "dvc.yaml")
    (root / "hargo").mkdir()
    shutil.copy(ROOT / "hargo" / "registry.py", root / "hargo" / "registry.py")
    (root / "data" / "eval").mkdir(parents=True)
    (root / "data" / "eval" / "sft.jsonl").write_text('{"id": "a"}\n')
    (root / "reports" / "method-params").mkdir(parents=True)
    for m in ("grpo", "hargo"):
        (root / "reports" / "method-params" / f"{m}.json").write_text('{"beta": 0.02}\n')


@pytest.mark.parametrize("stage, command, module, edit, named", [
    # the reported case: `dvc repro -f -s register &`, 12 s later `echo '# x' >> registry.py`
    ("register", ["register"], "hargo.registry", "hargo/registry.py", "hargo/registry.py"),
    ("register", ["register"], "hargo.registry", "data/eval/sft.jsonl", "data/eval/sft.jsonl"),
    ("register", ["register"], "hargo.registry", "data/eval/new.jsonl",
     "data/eval/new.jsonl (added)"),
    ("rl@hargo", ["rl", "--method", "hargo"], "hargo.training.rl",
     "reports/method-params/hargo.json", "reports/method-params/hargo.json"),
])
def test_a_dependency_edit_during_a_stage_fails_the_stage_naming_it(
        tmp_path, monkeypatch, stage, command, module, edit, named):
    """Issue 42 item 3's kind, for code and data: a declared dep (dvc.yaml) edited while the
    stage ran. Before: exit 0, dvc.lock recorded the edited file and `dvc status` said up to
    date, though the unedited code ran. DVC tells the stage who it is ($DVC_STAGE)."""
    import importlib

    from typer.testing import CliRunner

    from hargo.cli import app

    _dvc_project(tmp_path)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DVC_STAGE", stage)
    monkeypatch.setenv("DVC_ROOT", str(tmp_path))

    def stage_fn(params, *args, **kwargs):
        with open(tmp_path / edit, "a") as f:
            f.write("# x\n")
        return {}

    monkeypatch.setattr(importlib.import_module(module), "run", stage_fn)
    res = CliRunner().invoke(app, command)
    assert res.exit_code == 1, res.output
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert lines[-1].startswith(f"error: DependencyChanged: {named} (declared in dvc.yaml as a "
                                f"dependency of stage {stage}) changed while the stage ran"), \
        res.output
    assert "DVC records nothing" in lines[-1]


def test_an_untouched_or_only_touched_dependency_lets_the_stage_succeed(tmp_path, monkeypatch):
    """A dep whose mtime changed but not its content (`touch`), bytecode written under a
    declared folder, another foreach item's file, a file no stage declares: no change."""
    import importlib
    import os

    from typer.testing import CliRunner

    from hargo.cli import app

    _dvc_project(tmp_path)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DVC_STAGE", "rl@hargo")

    def stage(params, *args, **kwargs):
        os.utime(tmp_path / "reports" / "method-params" / "hargo.json", ns=(1, 10 ** 18))
        (tmp_path / "hargo" / "__pycache__").mkdir()
        (tmp_path / "hargo" / "__pycache__" / "registry.cpython-311.pyc").write_bytes(b"x")
        (tmp_path / "reports" / "method-params" / "grpo.json").write_text("{}")
        (tmp_path / "notes.txt").write_text("x")
        return {}

    monkeypatch.setattr(importlib.import_module("hargo.training.rl"), "run", stage)
    res = CliRunner().invoke(app, ["rl", "--method", "hargo"])
    assert res.exit_code == 0, res.output


def test_stage_deps_resolve_foreach_items_from_params(tmp_path):
    from hargo import stage_inputs

    _dvc_project(tmp_path)
    deps = stage_inputs.stage_deps("rl@grpo", tmp_path)
    assert tmp_path / "reports" / "method-params" / "grpo.json" in deps
    assert tmp_path / "hargo" / "training" / "rl.py" in deps
    assert not any("${" in str(d) for d in deps)
    assert stage_inputs.stage_deps("register", tmp_path / "hargo")[0] == tmp_path / "hargo" / \
        "config"                             # found from a folder below the dvc.yaml too
    with pytest.raises(ValueError, match="no foreach item"):
        stage_inputs.stage_deps("rl@nope", tmp_path)


@pytest.mark.parametrize("what", ["params", "deps"])
def test_a_change_during_the_stage_ends_its_mlflow_run_failed(tmp_path, monkeypatch, what,
                                                              committed_params):
    """Before: the stage failed (params) but its MLflow run stayed FINISHED. The run ends
    FAILED, its hargo.error naming the change."""
    import importlib

    from mlflow.tracking import MlflowClient
    from typer.testing import CliRunner

    from hargo import tracking
    from hargo.cli import app

    _dvc_project(tmp_path)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DVC_STAGE", "register")
    uri = f"sqlite:///{tmp_path / 'store' / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.delenv("HARGO_PARENT_RUN_ID", raising=False)
    runs = []

    def stage(params, *args, **kwargs):
        with tracking.stage_run("register", params) as run:
            runs.append(run.info.run_id)
            if what == "params":
                _edit(tmp_path / "params.yaml", "register", "tolerance", 0.5)
            else:
                with open(tmp_path / "hargo" / "registry.py", "a") as f:
                    f.write("# x\n")
        return {}

    monkeypatch.setattr(importlib.import_module("hargo.registry"), "run", stage)
    res = CliRunner().invoke(app, ["register"])
    assert res.exit_code == 1, res.output
    got = MlflowClient(uri).get_run(runs[0])
    assert got.info.status == "FAILED"
    err = got.data.tags["hargo.error"]
    assert err.startswith("ParamsError: params.yaml changed while the stage ran "
                          "(register.tolerance: " if what == "params" else
                          "DependencyChanged: hargo/registry.py (declared in dvc.yaml"), err
