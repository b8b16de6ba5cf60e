"""The nine-method comparison: per-run params, run names, the plan, and the whole
``compare/dvc.yaml`` pipeline through DVC on the tiny random model (every method trains from the
SFT model and gives a model the eval stage generates from; the report renders)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from flow_project import DOOR_METHODS, PIPELINE_GROUP
from hargo.params import ParamsError, apply_overrides
from hargo.config import as_config

DEFAULT_METHODS = ["hpcgpt", "ppo", "dpo", "kto", "simpo", "grpo", "dr_grpo", "hargo"]


def test_the_default_comparison_is_the_papers_eight_methods(committed_params):
    """params.yaml compares the paper's eight methods; the DVC door runs one per trainer path
    (flow_project.DOOR_METHODS), each of them a default."""
    from hargo.compare.train import family

    assert committed_params["compare"]["methods"] == DEFAULT_METHODS
    assert [family(m) for m in DEFAULT_METHODS] == \
        ["sft", "rl", "preference", "preference", "preference", "rl", "rl", "rl"]
    assert set(DOOR_METHODS) < set(DEFAULT_METHODS)
    assert {family(m) for m in DOOR_METHODS} == {family(m) for m in DEFAULT_METHODS}


def test_run_params_apply_the_comparison_budget_and_seed(committed_params):
    from hargo.compare.train import run_params

    p = run_params(as_config(committed_params), "hargo", 3)
    c = committed_params["compare"]
    assert p["seed"] == 3 and committed_params["seed"] == 42      # a copy; the input unchanged
    assert p["rl"]["steps"] == c["steps"] and p["rl"]["prompts_per_step"] == c["prompts_per_step"]
    assert p["rl"]["samples_per_task"] == c["samples_per_task"]
    assert p["rl"]["hargo"] == committed_params["rl"]["hargo"]    # method knobs untouched
    h = run_params(as_config(committed_params), "hpcgpt", 1)
    assert h["sft"]["learning_rate"] == 2e-5                       # the HPC-GPT recipe
    assert (h["sft"]["lora"]["r"], h["sft"]["lora"]["alpha"]) == (8, 16.0)
    assert committed_params["sft"]["learning_rate"] == 2e-4
    with pytest.raises(ParamsError, match="method: unknown method .ppo2."):
        run_params(as_config(committed_params), "ppo2", 1)


def test_run_names_and_parsing(committed_params):
    from hargo.compare.evaluate import eval_params, parse_run
    from hargo.compare.train import family, metrics_path, model_dir, run_name

    assert run_name("dr_grpo", 2) == "dr_grpo-s2"
    assert [family(m) for m in ("ppo", "dpo", "hpcgpt", "hargo_b1")] == \
        ["rl", "preference", "sft", "rl"]
    assert model_dir(committed_params, "kto", 1) == Path("models/compare/kto-s1")
    assert metrics_path("kto", 1) == Path("metrics/compare/train/kto-s1.json")
    assert parse_run(committed_params, "dr_grpo-s2") == ("dr_grpo", 2)
    assert parse_run(committed_params, "sft") is None
    assert parse_run(committed_params, "base") is None
    for bad in ("hargo-s9", "hargo", "nope-s1", "hargo_b1-s1"):   # b1 not in the quick methods
        with pytest.raises(ParamsError, match="--run"):
            parse_run(committed_params, bad)
    ev = eval_params(as_config(committed_params))
    assert ev["samples_per_task"] == committed_params["compare"]["evaluate"]["samples_per_task"]
    assert ev["backend"] == committed_params["evaluate"]["backend"]


def test_compare_params_are_validated(committed_params):
    from hargo.params import validate_params

    for override, msg in ((["compare.methods", ["grpo", "grpo"]], "compare.methods: duplicate"),
                          (["compare.seeds", [1, -2]], "compare.seeds: seeds must be"),
                          (["compare.steps", 0], "compare.steps: must be >= 1"),
                          (["compare.preferences.samples_per_prompt", 1],
                           "compare.preferences.samples_per_prompt"),
                          (["compare.preferences.backend", "tgi"],
                           "compare.preferences.backend")):
        bad = apply_overrides(committed_params, {override[0]: override[1]})
        with pytest.raises(ParamsError, match=msg):
            validate_params(bad)


def test_comparison_plan_order(committed_params):
    from flows.compare import comparison_plan

    plan = comparison_plan(committed_params)
    c = committed_params["compare"]
    assert plan[0] == ("preferences", None)
    assert plan[-3:] == [("compare_sft", None), ("compare_base", None), ("report", None)]
    trains = [item for stage, item in plan if stage == "compare_train"]
    assert len(trains) == len(c["methods"]) * len(c["seeds"])
    # every run is evaluated right after it is trained
    for i, (stage, item) in enumerate(plan):
        if stage == "compare_train":
            assert plan[i + 1] == ("compare_eval", item)
    rl_only = apply_overrides(committed_params, {"compare.methods": ["grpo", "hargo"]})
    assert [s for s, _ in comparison_plan(rl_only)].count("preferences") == 1   # as DVC does


def _dvc(args, cwd, env, timeout):
    proc = subprocess.run([sys.executable, "-m", "dvc", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"dvc {' '.join(args)} failed:\n{proc.stdout[-4000:]}\n" \
                                 f"{proc.stderr[-4000:]}"
    return proc.stdout


@pytest.mark.xdist_group(PIPELINE_GROUP)
def test_comparison_pipeline_through_dvc(dvc_door, dvc_compare_door):
    """After the main pipeline's `dvc repro` (the shared tiny run), `dvc repro compare/dvc.yaml`
    with flow_project.DOOR_METHODS (one per trainer path) x 1 seed on the tiny model (the shared
    comparison run, on a copy): every run trains from the SFT model (hpcgpt from the base model), writes a complete model
    the eval stage generates from, and the report renders. A second `dvc repro
    compare/dvc.yaml` has nothing to do; nothing upstream re-ran."""
    from hargo.io import read_jsonl, require_complete_dir

    root, env, out = dvc_compare_door.root, dvc_compare_door.env, dvc_compare_door.log
    mlflow_uri = dvc_compare_door.mlflow_uri
    assert not (dvc_door.root / "models" / "compare").exists()   # the main job runs no comparison
    assert "Running stage 'sft'" not in out and (root / "models" / "sft").stat().st_mtime_ns \
        == dvc_compare_door.sft_mtime_ns
    assert "Running stage 'prepare'" not in out and "Running stage 'rl@hargo'" not in out
    assert "Running stage 'compare/dvc.yaml:compare_train@hargo-1'" in out

    params = json.loads(json.dumps(__import__("yaml").safe_load((root / "params.yaml").read_text())))
    assert params["compare"]["methods"] == DOOR_METHODS
    n_prompts = set()
    for m in DOOR_METHODS:
        run = f"{m}-s1"
        require_complete_dir(root / "models" / "compare" / run)
        tm = json.loads((root / "metrics" / "compare" / "train" / f"{run}.json").read_text())
        assert tm["method"] == m and tm["seed"] == 1 and tm["prompts_seen"] > 0
        if m in ("ppo", "grpo", "hargo"):
            assert tm["steps"] == 1 and len(tm["history"]) == 1
            assert "all/reward_mean" in tm["history"][0]
        em = json.loads((root / "data" / "compare" / "eval" / run / "metrics.json").read_text())
        gens = read_jsonl(root / "data" / "compare" / "eval" / run / "generations.jsonl")
        assert em["n_prompts"] == len(gens) > 0
        n_prompts.add(tuple(sorted(g["id"] for g in gens)))
    for run in ("sft", "base"):
        gens = read_jsonl(root / "data" / "compare" / "eval" / run / "generations.jsonl")
        n_prompts.add(tuple(sorted(g["id"] for g in gens)))
        # race rows carry the first-token yes/no score, the AUC is in the run's metrics
        assert all("yes_no_score" in g for g in gens if g["task"].startswith("race"))
    assert len(n_prompts) == 1                            # every model answered the same prompts

    stats = json.loads((root / "data" / "preferences" / "stats.json").read_text())
    pairs = read_jsonl(root / "data" / "preferences" / "pairs.jsonl")
    assert stats["pairs"] == len(pairs) and all(p["chosen_reward"] > p["rejected_reward"]
                                                for p in pairs)
    md = (root / "reports" / "comparison.md").read_text()
    for name in ("HPC-GPT", "PPO", "DPO", "GRPO", "HARGO"):
        assert f"| {name} " in md                          # a row of the results table each
    assert "| KTO " not in md                              # the methods run, not the defaults
    assert "paper (Qwen2.5-0.5B-Instruct)" in md and "HARGO - GRPO" in md
    assert (root / "reports" / "comparison.html").is_file()
    summary = json.loads((root / "metrics" / "compare" / "summary.json").read_text())
    assert sorted(summary["results"]) == sorted(DOOR_METHODS)
    assert sorted(summary["runs"]) == sorted([f"{m}-s1" for m in DOOR_METHODS] + ["sft"])
    # the race baselines beside the methods, the base model among them
    assert sorted(summary["race"]["baselines"]) == ["always-yes", "base", "nearest-train"]
    assert summary["race"]["baselines"]["always-yes"]["dr_mcc"] == 0.0
    for name in ("always-yes (baseline)", "nearest-train (baseline)", "base model (baseline)"):
        assert f"| {name} " in md
    # the main job's evaluate stage: base, the baselines and an AUC per model
    ev = json.loads((root / "metrics" / "eval.json").read_text())
    assert {"base", "sft", "always-yes", "nearest-train"} <= set(ev)
    assert ev["nearest-train"]["baseline"] is True and "dr_auc" in ev["sft"]

    # MLflow: each comparison training run read the train split, each eval run the eval split,
    # named with dvc.lock's md5 of that file
    from mlflow.tracking import MlflowClient

    md5 = {o["path"]: o["md5"] for o in __import__("yaml").safe_load(
        (root / "dvc.lock").read_text())["stages"]["prepare"]["outs"]}
    client = MlflowClient(mlflow_uri)
    exp = client.get_experiment_by_name("hargo")
    for stage, split in (("compare", "train"), ("compare-eval", "eval")):
        runs = client.search_runs([exp.experiment_id], f"tags.`hargo.stage` = '{stage}'")
        # compare-eval also evaluates the SFT model and the untuned base model (compare_base)
        assert len(runs) == len(DOOR_METHODS) + (2 if stage == "compare-eval" else 0), stage
        for r in runs:
            assert [(i.dataset.name, i.dataset.digest) for i in r.inputs.dataset_inputs] == \
                [(f"hpc-gpt-{split}", md5[f"data/prepared/{split}.jsonl"])], r.info.run_name

    again = _dvc(["repro", "compare/dvc.yaml"], root, env, 300)
    assert "Running stage" not in again, again
