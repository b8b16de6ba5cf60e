"""What DVC re-runs when a knob changes: each ``rl@<method>`` stage depends on the shared RL
knobs and on its own ``rl.<method>`` block only, read from the project's real dvc.yaml and
params.yaml (outputs are placeholders committed with ``dvc commit``; nothing trains)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
METHODS = ["grpo", "dr_grpo", "hargo", "hargo_b1", "hargo_b2", "ppo"]


def _dvc(cwd: Path, *args: str) -> str:
    env = {**os.environ, "DVC_NO_ANALYTICS": "1"}
    proc = subprocess.run([sys.executable, "-m", "dvc", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)
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
    _dvc(d, "commit", "-f", "-q", *[f"rl@{m}" for m in METHODS])
    return d


def _changed(project: Path, key_path: list[str], value) -> set[str]:
    """The rl stages ``dvc status`` reports after setting ``params[key_path] = value``."""
    path = project / "params.yaml"
    original = path.read_text()
    params = yaml.safe_load(original)
    cur = params
    for k in key_path[:-1]:
        cur = cur[k]
    cur[key_path[-1]] = value
    path.write_text(yaml.safe_dump(params, sort_keys=False))
    try:
        out = _dvc(project, "status", *[f"rl@{m}" for m in METHODS])
    finally:
        path.write_text(original)
    return {line.strip().rstrip(":") for line in out.splitlines()
            if line.strip().startswith("rl@")}


def test_all_rl_stages_up_to_date_after_commit(project):
    assert "up to date" in _dvc(project, "status", *[f"rl@{m}" for m in METHODS]).lower()


@pytest.mark.parametrize("key_path, value, expected", [
    (["rl", "hargo", "alpha"], 0.5, {"rl@hargo"}),
    (["rl", "hargo_b2", "alpha"], 0.5, {"rl@hargo_b2"}),
    (["rl", "hargo_b1", "eps_w"], 1e-5, {"rl@hargo_b1"}),
    (["rl", "grpo", "beta"], 0.04, {"rl@grpo"}),
    (["rl", "ppo", "kl_coef"], 0.05, {"rl@ppo"}),
    (["rl", "ppo", "vf_coef"], 0.5, {"rl@ppo"}),
    (["rl", "learning_rate"], 1e-4, {f"rl@{m}" for m in METHODS}),   # a shared knob
    (["rl", "save_steps"], 7, set()),                                # not a training knob
])
def test_a_method_knob_reruns_only_its_method(project, key_path, value, expected):
    assert _changed(project, key_path, value) == expected
