"""scripts/diff_outputs.py: the before/after check of a refactor must see a changed result and
nothing else."""
import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("diff_outputs", ROOT / "scripts" / "diff_outputs.py")
diff_outputs = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(diff_outputs)


def _project(root: Path, f1: float, wall_s: float, completion: str) -> Path:
    (root / "metrics" / "rl").mkdir(parents=True)
    (root / "data" / "eval").mkdir(parents=True)
    (root / "metrics" / "eval.json").write_text(json.dumps(
        {"hargo": {"dr_f1": f1, "wall_s": wall_s}, "run": {"run_id": str(wall_s)}}))
    (root / "metrics" / "rl" / "hargo.json").write_text(json.dumps({"history": [{"loss": 0.5}]}))
    (root / "data" / "eval" / "hargo.jsonl").write_text(
        json.dumps({"id": "race_c-1", "completion": completion}) + "\n")
    return root


@pytest.mark.fast
def test_timings_and_ids_differ_results_agree(tmp_path):
    a = _project(tmp_path / "a", 0.5, 12.0, "yes")
    b = _project(tmp_path / "b", 0.5, 99.0, "yes")
    assert diff_outputs.diff(a, b) == []
    assert diff_outputs.main([str(a), str(b)]) == 0


@pytest.mark.fast
def test_the_registry_decisions_are_results_not_timings(tmp_path):
    """Keys like "versions" and "candidate" hold the gate's decisions: compared, though they
    contain "version" and "date"."""
    a = _project(tmp_path / "a", 0.5, 12.0, "yes")
    b = _project(tmp_path / "b", 0.5, 12.0, "yes")
    reg = {"versions": [{"version": "1", "gate": "failed"}], "candidate": {"method": "hargo"},
           "run_id": "x", "wall_s": 3.0, "time/step_s": 1.0}
    (a / "metrics" / "register.json").write_text(json.dumps(reg))
    (b / "metrics" / "register.json").write_text(json.dumps(
        {**reg, "run_id": "y", "wall_s": 4.0, "time/step_s": 2.0}))
    assert diff_outputs.diff(a, b) == []
    for changed in ({"versions": [{"version": "1", "gate": "passed"}]},
                    {"versions": [{"version": "2", "gate": "failed"}]},
                    {"candidate": {"method": "grpo"}}):
        (b / "metrics" / "register.json").write_text(json.dumps({**reg, **changed}))
        assert [line.split(":")[0] for line in diff_outputs.diff(a, b)] == ["metrics/register.json"]


@pytest.mark.fast
def test_a_changed_metric_a_changed_completion_and_a_missing_file_are_reported(tmp_path):
    a = _project(tmp_path / "a", 0.5, 12.0, "yes")
    b = _project(tmp_path / "b", 0.5000001, 12.0, "no")
    (b / "metrics" / "rl" / "hargo.json").unlink()
    lines = diff_outputs.diff(a, b)
    assert len(lines) == 3
    assert lines[0].startswith("data/eval/hargo.jsonl: 1 values differ")
    assert lines[1].startswith("metrics/eval.json: 1 values differ, e.g. [('.hargo.dr_f1', 0.5, ")
    assert lines[2] == f"missing in {b}: metrics/rl/hargo.json"
    assert diff_outputs.main([str(a), str(b)]) == 1
