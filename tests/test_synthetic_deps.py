"""The synthetic test bed's stages (synthetic/dvc.yaml) and the ``params`` stage (dvc.yaml) list
exactly the hargo code they run: every module a stage's ``hargo <command>`` imports is covered by
one of its ``deps`` (tests/test_stage_deps.py checks that for every stage), and, checked here,
no hargo dep covers a module the command never imports (the synthetic stages used to list the
HPC data modules, and the ``params`` stage the synthetic generator, the tiny model and the
gate: a change there re-ran stages it cannot affect). The helpers are test_stage_deps'.

Also: ``hargo check-params`` on the repository's params.yaml passes, writes its stamp, and loads
none of the code above the config (hargo.compare, gate, data, models, training, evaluation)."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.test_stage_deps import RESULT_NEUTRAL, _command_modules, code_closure

ROOT = Path(__file__).resolve().parents[1]

#: What ``hargo check-params`` may load besides its stage's deps: the package root, the CLI
#: and its console plumbing (no stage lists hargo/cli.py).
CLI_PLUMBING = {"hargo/__init__.py", "hargo/cli.py", "hargo/console.py", "hargo/diskspace.py",
                "hargo/offline.py",
                # every command re-roots a copied project's MLflow store first (hargo/cli.py)
                "hargo/tracking_store.py", "hargo/tracking_db.py",
                # and notes what the stage reads, to fail it if that changes while it runs
                "hargo/stage_inputs.py",
                # and, before that, checks it runs the project's own code (hargo/cli.py)
                "hargo/code_home.py"}
ABOVE_CONFIG = ("hargo.compare", "hargo.gate", "hargo.data", "hargo.models", "hargo.training",
                "hargo.evaluation")


def _covers(dep: str, path: str) -> bool:
    return path == dep or path.startswith(dep.rstrip("/") + "/")


def full_closure(modules: set[str]) -> set[str]:
    """:func:`code_closure` without leaving out the result-neutral modules: every hargo file the
    modules import, transitively."""
    saved = dict(RESULT_NEUTRAL)
    RESULT_NEUTRAL.clear()
    try:
        return code_closure(modules)
    finally:
        RESULT_NEUTRAL.update(saved)


def _stage(dvc_yaml: str, name: str):
    spec = yaml.safe_load((ROOT / dvc_yaml).read_text())["stages"][name]
    spec = spec.get("do", spec)
    command = re.match(r"hargo ([\w-]+)", spec["cmd"]).group(1)
    deps = [d if isinstance(d, str) else next(iter(d)) for d in spec.get("deps", [])]
    return command, [d for d in deps if d.startswith("hargo")]


SYNTHETIC_STAGES = list(yaml.safe_load((ROOT / "synthetic" / "dvc.yaml").read_text())["stages"])


@pytest.mark.parametrize("name", SYNTHETIC_STAGES)
def test_synthetic_stage_lists_exactly_the_code_it_runs(name):
    command, deps = _stage("synthetic/dvc.yaml", name)
    modules = _command_modules(command)
    runs = full_closure(modules)
    extra = [d for d in deps if not any(_covers(d, f) for f in runs)]
    assert extra == [], f"synthetic/dvc.yaml:{name} depends on code it never runs: {extra}"
    missing = sorted(f for f in code_closure(modules) if not any(_covers(d, f) for d in deps))
    assert missing == [], f"synthetic/dvc.yaml:{name} runs code it does not depend on: {missing}"


def test_synthetic_training_stages_need_no_hpc_data_modules():
    for name in ("synthetic_sft", "synthetic_rl", "synthetic_report"):
        command, deps = _stage("synthetic/dvc.yaml", name)
        hpc = ("hargo/data/raw.py", "hargo/data/validate.py", "hargo/data/labels.py",
               "hargo/data/conflicts.py", "hargo/data/similarity.py", "hargo/data/prepare.py")
        assert not set(hpc) & set(deps), name
        assert not set(hpc) & full_closure(_command_modules(command)), name


def test_params_stage_lists_exactly_what_check_params_imports():
    """Result-neutral modules included: checking params.yaml is this stage's whole result."""
    command, deps = _stage("dvc.yaml", "params")
    assert command == "check-params"
    imports = full_closure(_command_modules(command))
    extra = [d for d in deps if not any(_covers(d, f) for f in imports)]
    assert extra == [], f"dvc.yaml:params depends on code check-params never imports: {extra}"
    missing = sorted(f for f in imports if not any(_covers(d, f) for d in deps))
    assert missing == [], f"dvc.yaml:params does not depend on code it imports: {missing}"
    for above in ("hargo/gate.py", "hargo/compare", "hargo/data", "hargo/models", "hargo/training"):
        assert not any(_covers(above, f) for f in imports), above


def test_check_params_passes_on_the_repository_params_and_loads_nothing_above_the_config(
        tmp_path):
    """``hargo check-params`` in a fresh interpreter, on a copy of params.yaml: exit 0, the stamp
    written, and every hargo module it loaded is one of the ``params`` stage's deps (or the CLI's
    plumbing); none of the code above the config."""
    (tmp_path / "params.yaml").write_text((ROOT / "params.yaml").read_text())
    code = ("import json, sys\nfrom hargo.cli import app\nsys.argv = ['hargo', 'check-params']\n"
            "try:\n    app()\nexcept SystemExit as e:\n    assert not e.code, e.code\n"
            "print(json.dumps(sorted(m.__file__ for n, m in sys.modules.items()\n"
            "                        if n.startswith('hargo') and getattr(m, '__file__', None))))")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                         text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "reports" / "params-valid.txt").is_file()
    loaded = {Path(f).resolve().relative_to(ROOT).as_posix()
              for f in json.loads(out.stdout.strip().splitlines()[-1])}
    _, deps = _stage("dvc.yaml", "params")
    outside = sorted(f for f in loaded - CLI_PLUMBING if not any(_covers(d, f) for d in deps))
    assert outside == [], f"check-params loaded code its stage does not list: {outside}"
    above = sorted(f for f in loaded for a in ABOVE_CONFIG
                   if f == a.replace(".", "/") + ".py" or f.startswith(a.replace(".", "/") + "/"))
    assert above == [], f"check-params loaded {above}"
