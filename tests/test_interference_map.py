"""benchmarks/interference_map.py (issue 40, items 4 and 6): the runs a cell needs, the resume
rule, the report's numbers on crafted JSON lines (hand-computed), the run fingerprint's code
digest (only the code a run executes), and one tiny real map (1 mechanism x 2 values, 1 task,
1 seed, both configurations) that resumes."""
from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

from hargo.config import as_config
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import interference_map as imap  # noqa: E402
import interference_report as rep  # noqa: E402

TASKS = imap.TASKS
POOLS = {t: 300 for t in TASKS}


def _points():
    return imap.Points({}, 5, POOLS)


# ------------------------------------------------------------------------ the runs a cell needs

@pytest.mark.fast
def test_points_and_the_runs_a_cell_needs():
    pts = _points()
    neutral, noisy = imap.parse_mechanisms(["noise=0,0.3"])
    mixed = pts.mixed(noisy, "grpo")
    assert mixed["synthetic.data.noise_yesno"] == "0.3"
    assert mixed[imap.QUOTA] == "{syn_yesno: 2, syn_short: 2, syn_long: 2}"
    alone = pts.alone(noisy, "syn_short", "grpo")
    # the yes/no noise does not act on syn_short alone: the neutral cell's run is shared
    assert alone == pts.alone(neutral, "syn_short", "grpo")
    assert alone["synthetic.rl.prompts_per_task"] == "{syn_yesno: 0, syn_short: 300, syn_long: 0}"
    assert (alone["synthetic.rl.prompts_per_step"], alone[imap.QUOTA]) == ("2", "null")
    assert pts.alone(noisy, "syn_yesno", "grpo")["synthetic.data.noise_yesno"] == "0.3"
    assert pts.alone(noisy, "syn_long", "grpo", full=True)["synthetic.rl.prompts_per_step"] == "6"
    mix = imap.parse_mechanisms(["mix=4/1/1"])[0]
    assert pts.alone(mix, "syn_yesno", "grpo")["synthetic.rl.prompts_per_step"] == "4"
    agg = imap.parse_mechanisms(["aggregation=token_mean"])[0]
    assert pts.mixed(agg, "hargo")["rl.hargo.aggregation"] == "token_mean"
    # per seed: 2 mixed + 3 x 2 alone (neutral), 2 mixed + 1 x 2 alone (noise: yes/no only)
    runs = imap.plan_runs(pts, [neutral, noisy], [1, 2])
    assert len(runs) == 2 * (8 + 4)
    extra = imap.plan_runs(pts, [noisy], [1], configs=(), full_step=True, methods=["hargo"])
    assert sorted(r[0] for r in extra) == ["alone_full"] * 3 + ["mixed"]
    with pytest.raises(SystemExit, match="unknown values"):
        imap.parse_mechanisms(["noise=0.2"])


@pytest.mark.fast
def test_every_default_mechanism_has_three_values_neutral_first():
    for name in imap.DEFAULT_MECHANISMS:
        cells = imap.MECHANISMS[name]
        assert len(cells) >= 3 and cells[0].overrides == ()
        assert cells[0].quota in (None, (2, 2, 2))   # the base quota
    assert len(imap.DEFAULT_MECHANISMS) >= 4


@pytest.mark.fast
def test_resume_skips_the_runs_in_the_file():
    runs = imap.plan_runs(_points(), imap.parse_mechanisms(["std=group,batch"]), [1])
    keys = {imap.run_key(pt, m, s, c, "pol", "code") for _, pt, m, c, s in runs}
    assert imap.pending(runs, keys, "pol", "code") == []
    left = imap.pending(runs, keys - {imap.run_key(runs[3][1], "grpo", 1, runs[3][3], "pol",
                                                   "code")}, "pol", "code")
    assert left == [runs[3]]
    # another code digest or SFT policy: every run again
    assert len(imap.pending(runs, keys, "pol", "other")) == len(runs)
    assert len(imap.pending(runs, keys, "other", "code")) == len(runs)


# ------------------------------------------------------------------ the report on crafted rows

EVAL_TASKS = list(TASKS) * 2     # 6 prompts, 2 a task


def _crafted(arm, pt, method, config, seed):
    """Every prompt at 0.2 after SFT (step 0), v5 at step 5, v_end at step 10; the yes/no task
    alone does better (het: +0.2 at the end, hom: +0.05)."""
    v5, end = 0.3, 0.4
    alone_yesno = arm == "alone" and \
        pt["synthetic.rl.prompts_per_task"].startswith("{syn_yesno: 300")
    if alone_yesno and config == "heterogeneous":
        v5, end = 0.5, 0.6
    elif alone_yesno:
        v5, end = 0.35, 0.45

    def vals(v):
        return [v if (t == "syn_yesno" or not alone_yesno) else 0.0 for t in EVAL_TASKS]

    curve = [{"step": s, "reward": vals(v), "correct": vals(v)}
             for s, v in ((0, 0.2), (5, v5), (10, end))]
    return {"arm": arm, "point": pt, "method": method, "config": config, "seed": seed,
            "run": {"eval": {"ids": [str(i) for i in range(6)], "tasks": EVAL_TASKS,
                             "reward": vals(end), "correct": vals(end)},
                    "eval_curve_prompts": curve, "wall_s": 10.0}}


@pytest.mark.fast
def test_analyse_hand_computed_on_crafted_rows(tmp_path):
    pts = _points()
    cells = imap.parse_mechanisms(["noise=0,0.3"])
    rows = [_crafted(*r) for r in imap.plan_runs(pts, cells, [1, 2])]
    num = rep.analyse(rows, cells, TASKS, pts, resamples=200, confidence=0.9)
    y = num["noise=0.3"]["syn_yesno"]
    assert y["n_seeds"] == 2
    # end 0.6 - 0.4; AUC: ((0.2+0.5)/2 + (0.5+0.6)/2)/2 - ((0.2+0.3)/2 + (0.3+0.4)/2)/2
    assert y["het"]["end"]["diff"] == pytest.approx(0.2)
    assert y["het"]["auc"]["diff"] == pytest.approx(0.45 - 0.30)
    assert y["het"]["early"]["diff"] == pytest.approx(0.2)
    assert y["hom"]["end"]["diff"] == pytest.approx(0.05)
    assert y["did"]["end"]["diff"] == pytest.approx(0.15)
    assert y["did"]["auc"]["diff"] == pytest.approx(0.15 - (0.3375 - 0.30))
    assert (y["het"]["end"]["low"], y["het"]["end"]["high"]) == pytest.approx((0.2, 0.2))
    assert y["flag"] and y["readings_above_0"] == ["end", "auc", "early"]
    s = num["noise=0"]["syn_short"]
    assert s["het"]["end"]["diff"] == pytest.approx(0.0) and not s["flag"]
    assert rep.flagged(num) == ["noise=0", "noise=0.3"]
    md = rep.markdown(num, cells, 0.9, "step 5")
    assert "| 0.3 | syn_yesno | 2 | +0.200 [+0.200, +0.200] **>0** |" in md
    assert "interference (end, auc, early); beyond dilution (DiD end, auc, early) (screening)" \
        in md
    assert "none shown: ruled out below +0.000 and above +0.000 (screening)" in md
    rep.plot(num, cells, tmp_path / "map.png", 0.9)
    assert (tmp_path / "map.png").stat().st_size > 1000
    # a missing homogeneous run: no DiD, the rest stands
    some = [r for r in rows if not (r["config"] == "homogeneous" and r["seed"] == 2)]
    n2 = rep.analyse(some, cells, TASKS, pts, resamples=50, confidence=0.9)
    assert n2["noise=0.3"]["syn_yesno"]["did"]["end"]["n_seeds"] == 1


@pytest.mark.fast
def test_transfer_shows_what_each_arm_does_to_every_task():
    """The shared-habit table on the crafted rows: every run starts at 0.2 (step 0) except the
    yes/no-alone run's other tasks (0.0 throughout); the mixed run and syn_short alone end at
    0.4 on every task, so syn_short alone lifts syn_yesno, which it never trains, by +0.2."""
    pts = _points()
    cells = imap.parse_mechanisms(["noise=0,0.3"])
    rows = [_crafted(*r) for r in imap.plan_runs(pts, cells, [1, 2])]
    tr = rep.transfer(rows, cells, TASKS, pts, resamples=200, confidence=0.9)
    n = tr["noise=0"]
    assert list(n) == ["mixed", "alone syn_yesno", "alone syn_short", "alone syn_long"]
    lift = n["alone syn_short"]["syn_yesno"]
    assert (lift["n_seeds"], lift["mean"], lift["sft"]) == (2, pytest.approx(0.4),
                                                            pytest.approx(0.2))
    assert (lift["vs_sft"]["diff"], lift["vs_sft"]["low"]) == pytest.approx((0.2, 0.2))
    own = n["alone syn_yesno"]
    assert own["syn_yesno"]["vs_sft"]["diff"] == pytest.approx(0.4)
    assert (own["syn_short"]["mean"], own["syn_short"]["vs_sft"]["diff"]) == \
        pytest.approx((0.0, 0.0))
    assert n["mixed"]["syn_long"]["vs_sft"]["diff"] == pytest.approx(0.2)
    # the noise acts on syn_yesno only: the other tasks' alone runs are the neutral cell's
    assert tr["noise=0.3"]["alone syn_short"] == n["alone syn_short"]
    md = rep.transfer_markdown(tr, TASKS, 0.9)
    assert "| noise=0 | SFT (step 0) | | 0.200 | 0.200 | 0.200 |" in md
    assert ("| noise=0 | alone syn_short | 2 | 0.400 (+0.200 [+0.200, +0.200] **>0**) | "
            in md)
    # no curve (every_steps 0): means only, no interval
    flat = [{**r, "run": {k: v for k, v in r["run"].items() if k != "eval_curve_prompts"}}
            for r in rows]
    t0 = rep.transfer(flat, cells[:1], TASKS, pts, resamples=50, confidence=0.9)
    assert t0["noise=0"]["mixed"]["syn_yesno"] == {"n_seeds": 2, "mean": pytest.approx(0.4),
                                                   "sft": None, "vs_sft": None}
    assert "| noise=0 | SFT (step 0) | | - | - | - |" in rep.transfer_markdown(t0, TASKS, 0.9)


@pytest.mark.fast
def test_the_cells_figure_reads_the_lift_matrix_from_the_transfer(tmp_path):
    """benchmarks/interference_cells_figure.py on the crafted rows' report: row i is task i
    alone, column j task j's end minus SFT (syn_short alone lifts every task by +0.2; the
    yes/no-alone run's other tasks stay at 0.0, so 0)."""
    import interference_cells_figure as fig

    pts = _points()
    cells = imap.parse_mechanisms(["noise=0"])
    rows = [_crafted(*r) for r in imap.plan_runs(pts, cells, [1, 2])]
    num = rep.analyse(rows, cells, TASKS, pts, resamples=50, confidence=0.9)
    tr = rep.transfer(rows, cells, TASKS, pts, resamples=50, confidence=0.9)
    m = fig.lift_matrix(tr["noise=0"], TASKS)
    assert m == pytest.approx(np.array([[0.4, 0.0, 0.0], [0.2, 0.2, 0.2], [0.2, 0.2, 0.2]]))
    assert np.isnan(fig.lift_matrix({"mixed": tr["noise=0"]["mixed"]}, TASKS)).all()
    stem = tmp_path / "rep"
    (tmp_path / "rep.json").write_text(json.dumps(num))
    with pytest.raises(SystemExit, match="rep_transfer.json: not found"):
        fig.load(str(stem), "noise=0")
    (tmp_path / "rep_transfer.json").write_text(json.dumps(tr))
    with pytest.raises(SystemExit, match="no cell 'std=group'"):
        fig.load(str(stem), "std=group")
    assert fig.main([f"a={stem}", f"b={stem}", "--cell", "noise=0", "--out",
                     str(tmp_path / "f.png")]) == 0
    assert (tmp_path / "f.png").stat().st_size > 1000


@pytest.mark.fast
def test_a_diverged_run_drops_its_pair_and_is_listed_and_methods_meet_the_uniform_control():
    """A run the divergence guard stopped (``run`` None: the sweep worker records it instead of
    ending the whole map) leaves its seed pair out of every interval and is listed by
    :func:`interference_report.diverged`; each method's mixed run is compared with GRPO's and
    with the uniform control's (``uniform_pop``) on the same seeds."""
    pts = _points()
    cells = imap.parse_mechanisms(["noise=0"])
    methods = ["hargo", "uniform_pop"]
    rows = [_crafted(*r) for r in imap.plan_runs(pts, cells, [1, 2, 3], methods=methods)]
    for r in rows:                      # hargo's mixed runs 0.1 above GRPO's, uniform's 0.05
        if r["method"] != "grpo":
            bump = 0.1 if r["method"] == "hargo" else 0.05
            r["run"]["eval"]["reward"] = [v + bump for v in r["run"]["eval"]["reward"]]
            for c in r["run"]["eval_curve_prompts"]:
                c["reward"] = [v + bump for v in c["reward"]]
    gone = next(r for r in rows if r["arm"] == "mixed" and r["method"] == "grpo"
                and r["config"] == "heterogeneous" and r["seed"] == 3)
    gone.update(run=None, diverged="rl (grpo) diverged at step 25: kl = 18.2")
    num = rep.analyse(rows, cells, TASKS, pts, methods=methods, resamples=100, confidence=0.9)
    y = num["noise=0"]["syn_yesno"]
    assert y["n_seeds"] == 2 and y["het"]["end"]["n_seeds"] == 2
    assert y["het"]["end"]["diff"] == pytest.approx(0.2)
    assert y["methods"]["hargo"]["end"]["diff"] == pytest.approx(0.1)
    assert y["methods"]["hargo"]["end"]["n_seeds"] == 2          # GRPO's seed 3 is gone
    assert y["methods_vs_uniform"]["hargo"]["end"]["diff"] == pytest.approx(0.05)
    assert y["methods_vs_uniform"]["hargo"]["end"]["n_seeds"] == 3
    assert "uniform_pop" not in y["methods_vs_uniform"]
    assert rep.diverged(rows) == [
        'mixed heterogeneous grpo seed 3 at ' + rep.point_key(gone["point"])
        + ': rl (grpo) diverged at step 25: kl = 18.2']
    md = rep.markdown(num, cells, 0.9, "step 5")
    assert "| noise=0 | syn_yesno | hargo | +0.100 [+0.100, +0.100] **>0** |" in md
    assert ("| +0.050 [+0.050, +0.050] **>0** | +0.050 [+0.050, +0.050] **>0** |\n"
            "| noise=0 | syn_yesno | uniform_pop |") in md
    assert rep.timing(rows)["mixed"] == pytest.approx(10.0)


@pytest.mark.fast
def test_the_archive_keeps_what_the_report_reads(tmp_path):
    """:func:`interference_map.compact` / :func:`expand` keep every reading the report uses
    exactly (a run without a curve, a diverged run too); the archive's bytes depend on its runs
    only; the start lines say which archived runs resume here and why the others do not."""
    pts = _points()
    cells = imap.parse_mechanisms(["noise=0,0.3"])
    here = {"cpu": "AMD EPYC, 2 cores, avx512_bf16", "bf16_flags": "avx512_bf16",
            "precision": "bf16"}
    rows = []
    for r in imap.plan_runs(pts, cells, [1, 2], methods=["hargo"]):
        row = _crafted(*r)
        row.update(key=imap.run_key(row["point"], row["method"], row["seed"], row["config"],
                                    "pol", "code"), policy="pol", code="code", machine=here,
                   unlisted_modules=[])
        row["run"]["eval"]["reward"][0] = row["run"]["eval_curve_prompts"][-1]["reward"][0] = \
            1 / 3 + row["seed"]                                       # not short in decimal
        row["run"].update(history=[{"loss": 1.0}] * 5, eval_summary={"all/reward": 0.4})
        rows.append(row)
    rows[0]["run"].pop("eval_curve_prompts")                          # no curve: "end" kept
    rows[1].update(run=None, diverged="rl (grpo) diverged at step 2: kl = 18.2")
    a = imap.Archive(tmp_path / "a.jsonl.gz")
    assert a.add(rows) == len(rows)
    a.save()
    b = imap.Archive(tmp_path / "a.jsonl.gz")
    kept = b.rows()
    assert len(kept) == len(rows) and b.add(kept) == 0
    # an archived row (e.g. one --out holds since a resume) archives again as it was
    fresh = imap.Archive(None)
    assert fresh.add(kept) == len(kept) and fresh.lines == b.lines
    by = {r["key"]: r for r in kept}
    for r in rows:
        k = by[r["key"]]
        assert k["run"] is None if r["run"] is None else (
            k["run"]["eval"]["reward"] == r["run"]["eval"]["reward"]
            and k["run"].get("eval_curve_prompts") == r["run"].get("eval_curve_prompts"))
    args = dict(methods=["hargo"], resamples=100, confidence=0.9)
    assert rep.analyse(kept, cells, TASKS, pts, **args) == rep.analyse(rows, cells, TASKS, pts,
                                                                       **args)
    assert rep.diverged(kept) == rep.diverged(rows) and rep.timing(kept) == rep.timing(rows)
    c = imap.Archive(tmp_path / "c.jsonl.gz")
    c.add(list(reversed(rows)))
    c.save()
    assert (tmp_path / "c.jsonl.gz").read_bytes() == (tmp_path / "a.jsonl.gz").read_bytes()
    # another code digest, another policy from another CPU kind, one without a machine
    other = dict(here, bf16_flags="none", precision="fp32", cpu="Intel, AVX2")
    mixed = kept[:3] + [dict(kept[3], code="new")] + [dict(kept[4], policy="pol2",
                                                           machine=other)]
    mixed.append(dict(kept[5], policy="pol3"))
    mixed[-1].pop("machine")
    lines = imap.resume_lines(mixed, "pol", "code", here)
    assert lines[0] == f"  3 of this policy and code: resumed (trained on bf16 flags " \
        f"avx512_bf16, bf16; {here['cpu']})"
    assert any("1 of this policy but another code digest (new)" in x for x in lines)
    assert any("1 of another SFT policy pol2 (trained on bf16 flags none, fp32; Intel, AVX2): "
               "another CPU kind or precision than here" in x for x in lines)
    assert any("1 of another SFT policy pol3 (trained on machine not recorded)" in x
               for x in lines)


@pytest.mark.fast
def test_the_archive_is_tracked_and_out_is_not():
    """What survives a session is what git keeps: the archive must not be ignored."""
    import subprocess

    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    ignored = subprocess.run(["git", "check-ignore", imap.ARCHIVE, imap.OUT], cwd=ROOT,
                             capture_output=True, text=True).stdout.split()
    assert ignored == [imap.OUT]


@pytest.mark.fast
def test_auc_and_early_readings_by_hand():
    row = _crafted("mixed", {}, "grpo", "heterogeneous", 1)
    assert rep.values(row, "syn_long", "auc") == pytest.approx([0.30, 0.30])
    assert rep.values(row, "syn_long", "early", early_step=10) == pytest.approx([0.4, 0.4])
    assert rep.values(row, "syn_long", "early", early_step=7) is None
    row["run"].pop("eval_curve_prompts")
    assert rep.values(row, "syn_long", "auc") is None


# -------------------------------------------------------------------------- the code digest

@pytest.mark.fast
def test_code_digest_follows_the_code_a_run_imports_only(tmp_path):
    from hargo.compare import synthetic_code as C

    shutil.copytree(ROOT / "hargo", tmp_path / "hargo",
                    ignore=shutil.ignore_patterns("__pycache__"))
    pkg = tmp_path / "hargo"
    files = {p.relative_to(pkg).as_posix() for p in C.run_modules(pkg=pkg)}
    assert {"compare/synthetic.py", "training/rl.py", "advantages.py", "stats.py",
            "methods/hargo.py", "data/synthetic_noise.py"} <= files
    assert not {"gpu_check/run.py", "cli.py", "compare/report.py", "champion.py"} & files
    before = C.code_digest(tmp_path)
    (pkg / "gpu_check" / "run.py").write_text((pkg / "gpu_check" / "run.py").read_text() + "\n#")
    (pkg / "cli.py").write_text((pkg / "cli.py").read_text() + "\n# a comment\n")
    assert C.code_digest(tmp_path) == before          # not imported by a run: runs kept
    f = pkg / "training" / "rl.py"
    f.write_text(f.read_text() + "\n# a comment\n")
    assert C.code_digest(tmp_path) != before          # imported: re-trained


@pytest.mark.fast
def test_unlisted_names_loaded_modules_outside_the_closure():
    from hargo.compare import synthetic_code as C

    pkg = Path(C.__file__).resolve().parents[1]
    assert C.unlisted([str(pkg / "compare" / "synthetic.py")]) == []
    assert C.unlisted([str(pkg / "gpu_check" / "run.py"), "/elsewhere/x.py", ""]) == \
        ["gpu_check/run.py"]


# ----------------------------------------------------------------------- a tiny real map

def test_tiny_map_trains_reports_and_resumes(tmp_path, capsys, monkeypatch):
    """1 mechanism x 2 values (syn_yesno's noise 0 and 0.3), syn_short alone, 1 seed, the
    heterogeneous configuration: 3 runs of an untrained tiny policy (syn_short alone is one
    run: the yes/no noise does not act on it), 2 steps, eval at 0, 1 and 2; the report's
    alone - mixed equals the JSON lines' per-prompt means; a second call trains nothing; every
    hargo module the worker loaded is in the code digest."""
    from hargo.compare.synthetic_plan import DATA_DIR, MODEL_DIR, plan
    from hargo.data.synthetic import generate
    from hargo.io import write_jsonl
    from hargo.models.tiny import TinyPolicyConfig, build_tiny_policy

    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    s = params["synthetic"]
    s["data"].update(n_train=8, n_eval=2)
    s["sft"]["examples_per_task"] = {"syn_yesno": 0, "syn_short": 0, "syn_long": 1}
    s["rl"].update(prompts_per_task={t: 4 for t in TASKS}, pool="all", steps=2,
                   prompts_per_step=3, num_generations=2,
                   max_new_tokens={"syn_yesno": 2, "syn_short": 2, "syn_long": 4})
    s["evaluate"]["max_new_tokens"] = {"syn_yesno": 2, "syn_short": 2, "syn_long": 4}
    s["bootstrap"]["resamples"] = 50
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    train, ev = generate(plan(as_config(params)).data, 0)
    (tmp_path / DATA_DIR).mkdir(parents=True)
    write_jsonl(tmp_path / DATA_DIR / "train.jsonl", train)
    write_jsonl(tmp_path / DATA_DIR / "eval.jsonl", ev)
    texts = [r["prompt"][0]["content"] for r in train] + [r["answer"] for r in train]
    build_tiny_policy(tmp_path / MODEL_DIR, TinyPolicyConfig(
        vocab_size=300, hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64,
        max_positions=256), texts, seed=0)
    out, archive = tmp_path / "map.jsonl", tmp_path / "map_runs.jsonl.gz"
    args = ["--screen", "--params", str(tmp_path / "params.yaml"), "--root", str(tmp_path),
            "--out", str(out), "--archive", str(archive), "--report", str(tmp_path / "map.md"),
            "--mechanisms",
            "noise=0,0.3", "--tasks", "syn_short", "--seeds", "1", "--workers", "1",
            "--every", "1", "--configs", "heterogeneous", "-S",
            "synthetic.rl.prompts_per_step_per_task={syn_yesno: 1, syn_short: 1, syn_long: 1}"]
    imap.main(args)
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert sorted(r["arm"] for r in rows) == ["alone", "mixed", "mixed"]
    assert all(r["unlisted_modules"] == [] for r in rows)
    assert all([c["step"] for c in r["run"]["eval_curve_prompts"]] == [0, 1, 2] for r in rows)
    num = json.loads((tmp_path / "map.json").read_text())
    mixed = [r for r in rows if r["point"].get("synthetic.data.noise_yesno") == "0.3"][0]
    alone = [r for r in rows if r["arm"] == "alone"][0]
    y = lambda r: np.mean([v for t, v in zip(r["run"]["eval"]["tasks"],  # noqa: E731
                                             r["run"]["eval"]["reward"]) if t == "syn_short"])
    assert num["noise=0.3"]["syn_short"]["het"]["end"]["diff"] == \
        pytest.approx(y(alone) - y(mixed))
    md = (tmp_path / "map.md").read_text()
    assert "### noise" in md and "bf16 flags" in md and "train.bf16 = True" in md
    capsys.readouterr()
    imap.main(args)                                     # resumes: nothing left to train
    assert "runs to train" not in capsys.readouterr().out
    assert len(out.read_text().splitlines()) == 3
    # the committed archive: every run, compact; a fresh checkout (no --out) resumes from it
    # alone, and the report from the archived runs is the one from the full runs
    kept = imap.Archive(archive).rows()
    assert sorted(r["key"] for r in kept) == sorted(r["key"] for r in rows)
    assert all(r["machine"]["precision"] in ("bf16", "fp32") for r in kept)
    assert archive.stat().st_size < out.stat().st_size / 5
    cells = imap.parse_mechanisms(["noise=0,0.3"])
    pts = imap.Points({imap.QUOTA: "{syn_yesno: 1, syn_short: 1, syn_long: 1}"}, 1,
                      {t: 4 for t in TASKS}, (1, 1, 1))
    nums = [rep.analyse(rs, cells, ["syn_short"], pts, resamples=50) for rs in (rows, kept)]
    assert json.loads(json.dumps(nums[0])) == num       # the points are the map's
    assert nums[1] == nums[0]
    assert rep.markdown(nums[1], cells, 0.95, "step 1") == rep.markdown(nums[0], cells, 0.95,
                                                                        "step 1")
    first = ((tmp_path / "map.json").read_text(), (tmp_path / "map.md").read_text())
    out.unlink()
    capsys.readouterr()
    imap.main(args)
    said = capsys.readouterr().out
    assert "runs to train" not in said                  # 0 trained
    assert "3 runs, 3 not in" in said and "3 of this policy and code: resumed" in said
    assert len(out.read_text().splitlines()) == 3       # --out holds the archived runs again
    took = lambda md: re.sub(r"this call took \d+ s", "", md)  # noqa: E731
    assert (tmp_path / "map.json").read_text() == first[0]
    assert took((tmp_path / "map.md").read_text()) == took(first[1])
    # a commit that changes code the runs import but none of their results: --adopt-code
    # trains one of them again (the alone run), finds the same readings, takes the rest over
    from hargo.compare import synthetic_code

    monkeypatch.setattr(synthetic_code, "code_digest", lambda root=None: "c0de-new")
    capsys.readouterr()
    imap.main(args + ["--adopt-code"])
    said = capsys.readouterr().out
    assert said.count("runs to train") == 1 and "[map] 1 runs to train" in said
    assert "trained again here gives the same readings: 2 adopted as code c0de-new's" in said
    kept = imap.Archive(archive).rows()
    assert len(kept) == 3 and {r["code"] for r in kept} == {"c0de-new"}
    assert sorted(r.get("adopted_from") or "" for r in kept) == ["", *[rows[0]["code"]] * 2]
    assert (tmp_path / "map.json").read_text() == first[0]     # the same numbers
    # other readings: nothing is adopted. The probe's run at the new code is the one trained
    # just above (re-keyed as code c0de-3's, so adopt() trains nothing: the training path ran
    # above), and the archived run it is compared with has one reading planted
    kept = imap.Archive(archive).rows()
    probe = next(x for x in kept if x["arm"] == "alone")
    trained = json.loads(json.dumps(probe))
    trained.update(code="c0de-3", key=imap.run_key(probe["point"], probe["method"],
                                                   probe["seed"], probe["config"],
                                                   probe["policy"], "c0de-3"))
    planted = json.loads(json.dumps(kept))
    next(x for x in planted if x["arm"] == "alone")["run"]["eval_curve_prompts"][0][
        "reward"][0] += 0.5
    ns = imap.argparse.Namespace(workers=1, params=str(tmp_path / "params.yaml"))
    monkeypatch.setattr(imap, "train", lambda *a, **k: pytest.fail("the probe was trained"))
    capsys.readouterr()
    got = imap.adopt([*planted, trained], kept[0]["policy"], "c0de-3", ns, tmp_path,
                     tmp_path / "probe.jsonl", None, None)
    said = capsys.readouterr().out
    assert "trained again here gives other readings: not adopted" in said, said
    assert got == [] and not (tmp_path / "probe.jsonl").exists()
    # the same comparison with nothing planted adopts the other two runs
    got = imap.adopt([*kept, trained], kept[0]["policy"], "c0de-3", ns, tmp_path,
                     tmp_path / "probe.jsonl", None, None)
    assert sorted(r["adopted_from"] for r in got) == ["c0de-new"] * 2
    # a run the divergence guard stops comes back as a row without scores, not an exception
    # that ends the whole map (the worker, in this process)
    import hargo.compare.synthetic as bed
    from hargo.training.divergence import TrainingDiverged

    def diverge(*a, **k):
        raise TrainingDiverged("rl (grpo) diverged at step 2: kl = 18.2")

    monkeypatch.setattr(bed, "train_run", diverge)
    row = imap._worker(("mixed", "c0de", str(tmp_path / "params.yaml"), [], {}, "grpo", 7,
                        "heterogeneous", str(tmp_path), 1, "p0"))
    assert row["run"] is None and row["diverged"].endswith("kl = 18.2")
    assert row["key"] == imap.run_key({}, "grpo", 7, "heterogeneous", "p0", "c0de")


@pytest.mark.fast
def test_the_run_closure_covers_the_stage_deps_closure():
    """The same closure tests/test_stage_deps.py computes for a stage's deps (less the files it
    deems result-neutral) is inside the run fingerprint's."""
    from hargo.compare import synthetic_code as C
    from tests.test_stage_deps import code_closure

    mine = {p.relative_to(ROOT).as_posix() for p in C.run_modules()}
    assert code_closure(set(C.ENTRIES)) <= mine
