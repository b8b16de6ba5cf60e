"""The typed config (hargo/config/) is the bottom floor of params handling: building it from
params.yaml, synthetic test bed included, imports nothing above it: no comparison or synthetic
plan, no promotion gate, no data generator, model, training or evaluation code (and no torch).
The look-ups of the plug-in registries (hargo.methods, hargo.tasks) through
hargo/config/registries.py stay allowed. Checked twice: at run time in a fresh interpreter, and
statically over every module of the package (lazy imports and ``if TYPE_CHECKING:`` blocks
included)."""
from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: The hargo packages and modules above the config.
ABOVE = ("hargo.compare", "hargo.gate", "hargo.data", "hargo.models", "hargo.training",
         "hargo.evaluation")


def _above(name: str) -> bool:
    return any(name == a or name.startswith(a + ".") for a in ABOVE)


def _loaded_after(code: str) -> list[str]:
    """The modules a fresh interpreter has loaded after running ``code`` in the repository
    root."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, "-c", code + "\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_loading_the_config_imports_nothing_above_it():
    loaded = _loaded_after("import hargo.config\n"
                           "cfg = hargo.config.load_config('params.yaml')\n"
                           "assert cfg.synthetic is not None and cfg.synthetic.sft.epochs >= 1\n"
                           "assert cfg.register.gate_metrics\n"
                           "hargo.config.as_section(cfg.to_dict(), 'synthetic')")
    above = [m for m in loaded if _above(m)]
    assert above == [], f"building the config imported {above}"
    assert "torch" not in loaded


def test_the_planted_import_would_be_seen():
    """The run-time check sees a module of ``ABOVE`` when one is imported."""
    loaded = _loaded_after("import hargo.config, hargo.compare.synthetic_plan")
    assert "hargo.compare.synthetic_plan" in loaded and _above("hargo.compare.synthetic_plan")


def _imported(path: Path, root: Path = ROOT) -> set[str]:
    """Every module ``path`` names in an import statement, anywhere in it (function bodies and
    ``if TYPE_CHECKING:`` blocks included); relative imports resolved."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = ".".join(path.relative_to(root).with_suffix("").parts[:-1])
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1] + ([base] if base else []))
            out.add(base)
            out |= {f"{base}.{a.name}" for a in node.names}
    return out


CONFIG_MODULES = sorted((ROOT / "hargo" / "config").glob("*.py"))


@pytest.mark.parametrize("path", CONFIG_MODULES, ids=lambda p: p.name)
def test_no_config_module_imports_anything_above_it(path):
    above = sorted(m for m in _imported(path) if _above(m))
    assert above == [], f"{path.relative_to(ROOT)} imports {above}"


def test_the_static_check_sees_lazy_and_type_checking_imports(tmp_path):
    planted = tmp_path / "hargo" / "config" / "x.py"
    planted.parent.mkdir(parents=True)
    planted.write_text("from typing import TYPE_CHECKING\n"
                       "if TYPE_CHECKING:\n    from hargo.models.tiny import TinyPolicyConfig\n"
                       "def f():\n    import hargo.gate\n    from ..compare import synthetic_plan\n")
    found = sorted(m for m in _imported(planted, tmp_path) if _above(m))
    assert found == ["hargo.compare", "hargo.compare.synthetic_plan", "hargo.gate",
                     "hargo.models.tiny", "hargo.models.tiny.TinyPolicyConfig"]
