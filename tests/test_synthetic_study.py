"""benchmarks/synthetic_study.py's analysis on crafted runs: the heterogeneity curve (HARGO -
GRPO per h) and the single-task ceilings (alone - mixed), hand-computed."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import synthetic_study as study  # noqa: E402

from hargo.data.synthetic import SYNTHETIC_TASKS  # noqa: E402

TASKS = list(SYNTHETIC_TASKS) * 2          # 6 eval prompts, two a task
BASE = {"syn_yesno": 0.2, "syn_short": 0.1, "syn_long": 0.5}


def _row(point, method, seed, offset, correct=0.0, only=None):
    reward = [BASE[t] + (offset if only in (None, t) else 0.0) for t in TASKS]
    return {"point": point, "method": method, "seed": seed,
            "run": {"eval": {"ids": [str(i) for i in range(6)], "tasks": TASKS,
                             "reward": reward, "correct": [correct] * 6}}}


def test_curve_and_ceilings_on_crafted_runs(tmp_path):
    rows = []
    for h in study.HETEROGENEITY:
        for s in (1, 2):
            rows.append(_row(study.curve_point(h), "grpo", s, 0.1))
            # HARGO is +0.05 above GRPO at h = 1 only
            rows.append(_row(study.curve_point(h), "hargo", s, 0.15 if h == "1" else 0.1,
                             correct=0.5 if h == "0" else 0.0))
    for t in SYNTHETIC_TASKS:
        for s in (1, 2):
            # alone, GRPO gains 0.2 on its task (mixed: 0.1): the mix costs it 0.1
            rows.append(_row(study.ceiling_point(t, SYNTHETIC_TASKS), "grpo", s, 0.2, only=t))
            rows.append(_row(study.ceiling_point(t, SYNTHETIC_TASKS), "hargo", s, 0.15, only=t))
    sft = {"ids": [str(i) for i in range(6)], "tasks": TASKS,
           "reward": [BASE[t] for t in TASKS], "correct": [0.0] * 6}
    md, out = study.analyse(rows, [1, 2], 200, 0.9, SYNTHETIC_TASKS, sft,
                            tmp_path / "curve.png")
    c1, c0 = out["curve"]["1"], out["curve"]["0"]
    assert (c1["all/reward"]["diff"], c1["all/reward"]["low"]) == pytest.approx((0.05, 0.05))
    assert out["curve"]["0.333"]["all/reward"]["diff"] == pytest.approx(0.0)
    assert c0["all/correct"]["diff"] == pytest.approx(0.5)
    short = out["ceilings"]["syn_short"]
    assert short["sft"] == pytest.approx(0.1)
    assert short["grpo"]["alone-mixed"]["diff"] == pytest.approx(0.1)    # 0.3 - 0.2
    assert short["hargo"]["alone-mixed"]["diff"] == pytest.approx(0.0)   # 0.25 - 0.25
    assert short["hargo-grpo mixed"]["diff"] == pytest.approx(0.05)
    assert "| syn_long | 0.500 |" in md and (tmp_path / "curve.png").stat().st_size > 0
    with pytest.raises(SystemExit, match="missing runs"):
        study.analyse(rows[1:], [1, 2], 10, 0.9, SYNTHETIC_TASKS, sft, tmp_path / "c.png")


def test_ceiling_point_keeps_the_mixs_prompts_a_step_for_one_task():
    pt = study.ceiling_point("syn_long", SYNTHETIC_TASKS)
    assert pt == {"synthetic.rl.prompts_per_task":
                  "{syn_yesno: 0, syn_short: 0, syn_long: 300}",
                  "synthetic.rl.prompts_per_step": "2"}
