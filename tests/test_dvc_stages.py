"""What DVC re-runs when a knob changes: each ``rl@<method>`` stage depends on the shared RL
knobs and on its own method's resolved knobs only (``reports/method-params/<method>.json``, which
the ``params`` stage writes with the defaults applied), read from the project's real dvc.yaml and
params.yaml (outputs are placeholders committed with ``dvc commit``; nothing trains). And a bad
value stops ``dvc exp run -S`` at the ``params`` stage, before DVC deletes any output."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

# one xdist worker runs this module (scripts/test.sh: --dist loadgroup), so its DVC project
# (``project``) is built and committed once
pytestmark = pytest.mark.xdist_group("dvc-stages")

ROOT = Path(__file__).resolve().parents[1]
METHODS = ["grpo", "dr_grpo", "hargo", "hargo_b1", "hargo_b2", "ppo"]


def _dvc_run(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    # this interpreter's bin first on PATH: the stages' `hargo` command is this environment's
    env = {**os.environ, "DVC_NO_ANALYTICS": "1",
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    return subprocess.run([sys.executable, "-m", "dvc", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def _dvc(cwd: Path, *args: str) -> str:
    proc = _dvc_run(cwd, *args)
    assert proc.returncode == 0, f"dvc {' '.join(args)}: {proc.stdout}{proc.stderr}"
    return proc.stdout


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    """A DVC project with the real dvc.yaml, params.yaml (every RL method on) and code; the
    rl stages' data inputs and outputs are placeholder files, committed to dvc.lock."""
    d = tmp_path_factory.mktemp("dvcproj")
    shutil.copy(ROOT / "dvc.yaml", d / "dvc.yaml")
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    params["rl"]["methods"] = METHODS
    (d / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    shutil.copytree(ROOT / "hargo", d / "hargo",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    (d / "models" / "sft").mkdir(parents=True)
    (d / "models" / "sft" / "model.safetensors").write_text("sft")
    (d / "data" / "prepared").mkdir(parents=True)
    (d / "data" / "prepared" / "train.jsonl").write_text("{}\n")
    for m in METHODS:
        (d / "models" / "rl" / m).mkdir(parents=True)
        (d / "models" / "rl" / m / "model.safetensors").write_text(m)
        (d / "checkpoints" / "rl" / m).mkdir(parents=True)
        (d / "metrics" / "rl").mkdir(parents=True, exist_ok=True)
        (d / "metrics" / "rl" / f"{m}.json").write_text("{}")
    _dvc(d, "init", "--no-scm", "-q")
    _dvc(d, "repro", "-q", "params")      # validates params.yaml, writes the stamp every stage reads
    _dvc(d, "commit", "-f", "-q", *[f"rl@{m}" for m in METHODS])
    return d


def _resolve(project: Path) -> None:
    """What the ``params`` stage writes besides its stamp: the resolved method blocks."""
    from hargo.params import load_params
    from hargo.resolved_params import write_method_blocks

    write_method_blocks(load_params(project / "params.yaml"), project)


def _changed(project: Path, key_path: list[str], value) -> set[str]:
    """The rl stages ``dvc status`` reports after setting ``params[key_path] = value`` and
    writing the resolved method blocks as the ``params`` stage does (``dvc repro`` runs it
    first; called in-process here, which saves two DVC runs a case)."""
    path = project / "params.yaml"
    original = path.read_text()
    params = yaml.safe_load(original)
    cur = params
    for k in key_path[:-1]:
        cur = cur.setdefault(k, {})
    cur[key_path[-1]] = value
    path.write_text(yaml.safe_dump(params, sort_keys=False))
    try:
        _resolve(project)
        out = _dvc(project, "status", *[f"rl@{m}" for m in METHODS])
    finally:
        path.write_text(original)
        _resolve(project)
    return {line.strip().rstrip(":") for line in out.splitlines()
            if line.strip().startswith("rl@")}


def test_all_rl_stages_up_to_date_after_commit(project):
    assert "up to date" in _dvc(project, "status", *[f"rl@{m}" for m in METHODS]).lower()


@pytest.mark.parametrize("key_path, value, expected", [
    (["rl", "hargo", "alpha"], 0.5, {"rl@hargo"}),
    (["rl", "hargo_b2", "alpha"], 0.5, {"rl@hargo_b2"}),
    (["rl", "hargo_b1", "eps_w"], 1e-5, {"rl@hargo_b1"}),
    (["rl", "grpo", "beta"], 0.04, {"rl@grpo"}),
    (["rl", "dr_grpo", "aggregation"], "token_mean", {"rl@dr_grpo"}),
    (["rl", "hargo", "std"], "sample", {"rl@hargo"}),
    (["rl", "hargo", "alpha"], 0.3, set()),           # the committed value: nothing changes
    (["rl", "ppo", "kl_coef"], 0.05, {"rl@ppo"}),
    (["rl", "ppo", "vf_coef"], 0.5, {"rl@ppo"}),
    (["rl", "learning_rate"], 1e-4, {f"rl@{m}" for m in METHODS}),   # a shared knob
    (["rl", "save_steps"], 7, set()),                                # not a training knob
])
def test_a_method_knob_reruns_only_its_method(project, key_path, value, expected):
    assert _changed(project, key_path, value) == expected


def test_a_params_file_without_method_blocks_runs(project):
    """An older params.yaml, written before a method existed, has no block for it: the params
    stage still passes (the method's knobs take their defaults), DVC raises no
    MissingParamsError, and a method whose block is absent can be staged: its resolved knobs
    are the defaults."""
    import json

    path = project / "params.yaml"
    original = path.read_text()
    params = yaml.safe_load(original)
    for m in ("hargo_b2", "dr_grpo", "ppo"):
        del params["rl"][m]
    params["rl"]["methods"] = METHODS + ["uniform_pop"]
    path.write_text(yaml.safe_dump(params, sort_keys=False))
    try:
        _dvc(project, "repro", "-q", "params")
        out = _dvc(project, "status", "rl@hargo_b2", "rl@uniform_pop")
        assert "rl@hargo_b2" not in out and "rl@uniform_pop" in out   # not trained yet
        resolved = json.loads((project / "reports" / "method-params" / "uniform_pop.json")
                              .read_text())
        assert resolved == {"aggregation": "response_mean", "beta": 0.02, "std": "population",
                            "std_eps": 1e-6, "std_scope": "group"}
        b2 = json.loads((project / "reports" / "method-params" / "hargo_b2.json").read_text())
        assert (b2["alpha"], b2["rho"], b2["std"]) == (0.3, 0.9, "population")
    finally:
        path.write_text(original)
        _dvc(project, "repro", "-q", "params")


def test_a_valid_change_reruns_the_params_check_and_nothing_through_it(project):
    path = project / "params.yaml"
    original = path.read_text()
    params = yaml.safe_load(original)
    params["rl"]["hargo"]["alpha"] = 0.25
    path.write_text(yaml.safe_dump(params, sort_keys=False))
    try:
        assert "params:" in _dvc(project, "status", "params")
        _dvc(project, "repro", "-q", "params")
        assert "up to date" in _dvc(project, "status", "params").lower()
        # the stamp's content did not change: rl@grpo does not re-run because of it
        assert "up to date" in _dvc(project, "status", "rl@grpo").lower()
    finally:
        path.write_text(original)
        _dvc(project, "repro", "-q", "params")


def _git(cwd: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, timeout=60,
                   env={**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t",
                        "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"})


def _placeholder(path: Path) -> None:
    """A file (a name with a suffix) or a folder holding one file, for a stage's path."""
    if path.suffix:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"placeholder {path.name}\n")
    else:
        path.mkdir(parents=True, exist_ok=True)
        (path / "placeholder").write_text(f"placeholder {path.name}\n")


def _locked_project(d: Path, stages: list[str]) -> dict[str, str]:
    """The real dvc.yaml, params.yaml and code in a git + DVC project at ``d``, with every
    non-code dependency and output of ``stages`` (and of ``rl@hargo``) as a placeholder, all
    committed to dvc.lock and git: DVC finds them up to date. Returns ``{path: text}`` of every
    placeholder file."""
    d.mkdir()
    shutil.copy(ROOT / "dvc.yaml", d / "dvc.yaml")
    shutil.copy(ROOT / "params.yaml", d / "params.yaml")
    shutil.copytree(ROOT / "hargo", d / "hargo",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    spec = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    entries = [*(spec[s] for s in stages), {
        k: [str(x).replace("${item}", "hargo") if isinstance(x, str)
            else {str(kk).replace("${item}", "hargo"): vv for kk, vv in x.items()}
            for x in v] for k, v in spec["rl"]["do"].items() if k in ("deps", "outs", "metrics")}]
    for entry in entries:
        for key in ("deps", "outs", "metrics"):
            for x in entry.get(key, []):
                rel = x if isinstance(x, str) else next(iter(x))
                if not rel.startswith("hargo") and rel != "reports/params-valid.txt":
                    _placeholder(d / rel)
    _git(d, "init", "-q")
    _dvc(d, "init", "-q")
    _dvc(d, "repro", "-q", "params")
    _dvc(d, "commit", "-f", "-q", *stages, "rl@hargo")
    _git(d, "add", "-A")
    _git(d, "commit", "-q", "-m", "placeholders")
    return {str(p.relative_to(d)): p.read_text() for p in d.rglob("*")
            if p.is_file() and ".dvc" not in p.parts and ".git" not in p.parts
            and p.read_text(errors="replace").startswith("placeholder")}


@pytest.mark.parametrize("override, key", [
    ("rl.hargo.alpha=-1", "rl.hargo.alpha"),
    ("rl.learning_rate=inf", "rl.learning_rate"),
    ("evaluate.kv_cache_gib=0", "evaluate.kv_cache_gib"),
    ("model.source=/nonexistent", "model.source"),   # a new user's case: models/base was deleted
])
def test_a_bad_value_in_dvc_exp_run_touches_no_output(tmp_path, override, key):
    """The reported case: ``dvc exp run -S rl.hargo.alpha=-1`` let DVC delete models/rl/hargo
    (and its cache: false metrics) before ``hargo rl`` rejected the value. Every upstream stage
    is up to date here, so without the ``params`` stage DVC would run ``rl@hargo`` at once."""
    d = tmp_path / "proj"
    files = _locked_project(d, ["prepare", "validate", "base_model", "sft"])
    assert "models/rl/hargo/placeholder" in files and "metrics/rl/hargo.json" in files
    assert "up to date" in _dvc(d, "status", "sft").lower()
    committed = (d / "params.yaml").read_bytes()

    proc = _dvc_run(d, "exp", "run", "-S", override, "rl@hargo")
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    assert f"error: {key}" in out, out
    assert "hargo check-params" in out and "hargo rl" not in out, out   # stopped at `params`
    for rel, text in files.items():
        assert (d / rel).read_text() == text, f"{rel} was touched: {out}"
    # issue 42 item 7: the refused value is not left in params.yaml (DVC wrote it there)
    assert (d / "params.yaml").read_bytes() == committed, out
    assert "params.yaml: restored as committed in" in out, out
    # the stamp outlives the failed check (persist): the other stages do not turn stale
    from hargo.params import CHECKED_STAMP, CHECKED_TEXT

    assert (d / CHECKED_STAMP).read_text() == CHECKED_TEXT


def test_a_path_knob_dvc_yaml_does_not_declare_stops_dvc_exp_run_at_the_params_stage(tmp_path):
    """Issue 42 item 7: ``dvc exp run -S data.out_dir=data/prepared_v2`` passed ``check-params``,
    ran ``prepare`` into the new folder and then failed on dvc.yaml's ``data/prepared/...``,
    leaving an emptied data/prepared, lost uncached outputs, a stray folder and a changed
    dvc.lock. Now the ``params`` stage refuses it, and nothing of the workspace changes: not even
    params.yaml, where DVC had written the refused value (it then failed the next ``dvc exp run
    -S <another key>`` on this one)."""
    d = tmp_path / "proj"
    files = _locked_project(d, ["prepare"])
    assert "data/prepared/stats.json" in files and "data/prepared/train.jsonl" in files
    lock = (d / "dvc.lock").read_text()
    committed = (d / "params.yaml").read_bytes()
    proc = _dvc_run(d, "exp", "run", "-S", "data.out_dir=data/prepared_v2", "prepare")
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    assert "error: data.out_dir: 'data/prepared_v2' is not where dvc.yaml stage 'prepare' " \
           "writes it (data/prepared)" in out, out
    assert "hargo prepare" not in out, out                    # stopped at `params`
    for rel, text in files.items():
        assert (d / rel).read_text() == text, f"{rel} was touched: {out}"
    assert not (d / "data" / "prepared_v2").exists()
    assert (d / "dvc.lock").read_text() == lock
    status = subprocess.run(["git", "status", "--porcelain"], cwd=d, capture_output=True,
                            text=True, timeout=60).stdout.split("\n")
    assert [s for s in status if s] == [], status
    assert (d / "params.yaml").read_bytes() == committed, out
    # the next experiment on another knob runs: the refused value did not stay behind
    proc = _dvc_run(d, "exp", "run", "-S", "register.tolerance=0.02", "params")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _exp_workspace(tmp_path: Path, monkeypatch, overrides: list[str] | None) -> Path:
    """A git project whose params.yaml is committed, seen from the ``params`` stage of a DVC
    experiment run in the workspace (DVC's environment; the ``-S`` values of its ``dvc exp
    run`` command line are ``overrides``, None: no such process)."""
    from hargo import cli_check_params

    d = tmp_path / "ws"
    d.mkdir(parents=True)
    shutil.copy(ROOT / "params.yaml", d / "params.yaml")
    for args in (["init", "-q"], ["add", "params.yaml"], ["commit", "-q", "-m", "p"]):
        _git(d, *args)
    rev = subprocess.run(["git", "rev-parse", "HEAD"], cwd=d, capture_output=True, text=True,
                         timeout=60).stdout.strip()
    monkeypatch.chdir(d)
    monkeypatch.setenv("DVC_STAGE", "params")
    monkeypatch.setenv("DVC_ROOT", str(d))
    monkeypatch.setenv("DVC_EXP_BASELINE_REV", rev)
    monkeypatch.setattr(cli_check_params, "_exp_run_overrides", lambda path: overrides)
    return d


def _dvc_writes(d: Path, overrides: list[str]) -> None:
    """What ``dvc exp run -S`` does to params.yaml before any stage runs."""
    from dvc.utils.hydra import apply_overrides

    apply_overrides(str(d / "params.yaml"), overrides)


@pytest.mark.parametrize("overrides", [["rl.learning_rate=-1"],
                                       ["rl.learning_rate=-1", "register.tolerance=0.02"]])
def test_a_refused_experiment_restores_the_committed_params_file(tmp_path, monkeypatch, capsys,
                                                                 overrides):
    from hargo.cli_check_params import undo_experiment_values

    d = _exp_workspace(tmp_path, monkeypatch, overrides)
    committed = (d / "params.yaml").read_bytes()
    _dvc_writes(d, overrides)
    assert (d / "params.yaml").read_bytes() != committed
    undo_experiment_values("params.yaml")
    assert (d / "params.yaml").read_bytes() == committed
    assert "params.yaml: restored as committed in" in capsys.readouterr().err


def test_a_refused_experiment_keeps_the_users_own_edits(tmp_path, monkeypatch, capsys):
    """The file held an uncommitted edit of the user besides the experiment's ``-S`` value (or
    the values cannot be read): nothing is written, and the line names the commands."""
    from hargo.cli_check_params import undo_experiment_values

    for overrides in (["rl.learning_rate=-1"], None):
        d = _exp_workspace(tmp_path / str(overrides is None), monkeypatch, overrides)
        (d / "params.yaml").write_text((d / "params.yaml").read_text().replace(
            "seed: 42", "seed: 7"))                                  # the user's own edit
        _dvc_writes(d, ["rl.learning_rate=-1"])
        before = (d / "params.yaml").read_bytes()
        assert b"seed: 7" in before
        undo_experiment_values("params.yaml")
        assert (d / "params.yaml").read_bytes() == before
        assert "`git checkout params.yaml` restores the committed file" in capsys.readouterr().err


def test_a_temporary_workspace_or_dvc_repro_is_left_alone(tmp_path, monkeypatch, capsys):
    from hargo.cli_check_params import undo_experiment_values

    d = _exp_workspace(tmp_path, monkeypatch, ["rl.learning_rate=-1"])
    _dvc_writes(d, ["rl.learning_rate=-1"])
    before = (d / "params.yaml").read_bytes()
    monkeypatch.setenv("DVC_ROOT", str(tmp_path))          # the stage runs in a copy under it
    undo_experiment_values("params.yaml")
    monkeypatch.setenv("DVC_ROOT", str(d))
    monkeypatch.delenv("DVC_EXP_BASELINE_REV")             # dvc repro: no experiment
    undo_experiment_values("params.yaml")
    assert (d / "params.yaml").read_bytes() == before and capsys.readouterr().err == ""
