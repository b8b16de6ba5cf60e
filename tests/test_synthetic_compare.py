"""The synthetic test bed (hargo/compare/synthetic.py, synthetic_plan.py, synthetic_report.py,
hargo/models/tiny.py): params checks, the RL prompt pool, scoring, the update-mass share, the
intervals, the tiny policy, that it learns the yes/no task by SFT alone, and the whole pipeline
(data -> SFT -> both configurations -> report) at a tiny size, with its per-run resume."""
from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from hargo.compare import synthetic as S
from hargo.compare import synthetic_data as D
from hargo.compare import synthetic_report as R
from hargo.compare.synthetic_plan import configuration, plan
from hargo.data.synthetic import SYNTHETIC_TASKS, SyntheticConfig, generate
from hargo.models.tiny import TinyPolicyConfig, build_tiny_policy, train_small_tokenizer
from hargo.params import ParamsError, validate_params
from hargo.config import as_config

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def params() -> dict:
    return yaml.safe_load((ROOT / "params.yaml").read_text())


def tiny_params(params: dict) -> dict:
    """The committed params with a test-bed small enough for a test (~1 min in all)."""
    p = copy.deepcopy(params)
    p["synthetic"].update({
        "data": {**p["synthetic"]["data"], "n_train": 24, "n_eval": 6},
        "policy": {"tokenizer": "small", "vocab_size": 300, "hidden_size": 64, "num_layers": 2,
                   "num_heads": 2, "intermediate_size": 128, "max_positions": 256},
        "sft": {"epochs": 1, "learning_rate": 1e-3, "batch_size": 16, "max_length": 160,
                "examples_per_task": {"syn_yesno": 24, "syn_short": 24, "syn_long": 24},
                "hedge_share": 0.0},
        "rl": {"prompts_per_task": {"syn_yesno": 2, "syn_short": 2, "syn_long": 2}, "pool": "all",
               "steps": 1,
               "prompts_per_step": 3, "num_generations": 2,
               "max_new_tokens": {"syn_yesno": 4, "syn_short": 6, "syn_long": 12},
               "temperature": 1.0, "learning_rate": 1e-4},
        "methods": ["grpo", "hargo"], "seeds": [1, 2], "parallel_runs": 1,
        "evaluate": {"max_new_tokens": {"syn_yesno": 4, "syn_short": 6, "syn_long": 12},
                     "samples": 2},
        "bootstrap": {"resamples": 200, "confidence": 0.9}})
    return p


# ----------------------------------------------------------------------------- params

def test_committed_params_make_a_plan(params):
    p = plan(as_config(params))
    assert p.methods == ("grpo", "dr_grpo", "hargo", "hargo_b1", "hargo_b2", "uniform_pop")
    assert len(p.seeds) == 10
    assert configuration(p, "homogeneous").homogeneous is True
    assert configuration(p, "heterogeneous").homogeneous is False
    with pytest.raises(ValueError, match="unknown synthetic configuration 'mixed'"):
        configuration(p, "mixed")


@pytest.mark.parametrize("key, value, message", [
    ("methods", ["grpo", "ppo"], r"synthetic.methods: GRPO-family methods"),
    ("seeds", [], r"synthetic.seeds: a non-empty list"),
    ("seeds", [1, 1], r"synthetic.seeds: a non-empty list of distinct"),
    ("rl.steps", 0, r"synthetic.rl.steps: must be >= 1, got 0"),
    ("rl.prompts_per_task", {"syn_yesno": 4, "syn_short": 4}, r"synthetic.rl.prompts_per_task"),
    ("rl.prompts_per_task", {"syn_yesno": 1601, "syn_short": 1, "syn_long": 1},
     r"\{'syn_yesno': 1601\} exceed synthetic.data.n_train 1600"),
    ("rl.prompts_per_task", {"syn_yesno": 1, "syn_short": 1, "syn_long": 301},
     r"\{'syn_long': 301\} exceed the train records SFT did not see"),
    ("rl.max_new_tokens", {"syn_yesno": 0, "syn_short": 4, "syn_long": 4},
     r"synthetic.rl.max_new_tokens.syn_yesno: expected an integer >= 1"),
    ("data.homogeneous", True, r"synthetic.data.homogeneous: leave it false"),
    ("data.n_eval", 0, r"n_train and n_eval must be >= 1"),
    ("methods", ["grpo", "hargo", "grpo"], r"a method is listed twice"),
    ("data.yesno_question", "odd", r"synthetic.data.yesno_question: must be one of last_even, mixed"),
    ("policy.hidden_size", 250, r"not divisible by num_heads 4"),
    ("policy.depth", 2, r"synthetic.policy.depth: unknown key"),
    ("sft.lr", 1.0, r"synthetic.sft.lr: unknown key"),
    ("sft.examples_per_task", {"syn_yesno": 1601, "syn_short": 1, "syn_long": 1},
     r"synthetic.sft.examples_per_task: \{'syn_yesno': 1601\} exceed synthetic.data.n_train"),
    ("sft.examples_per_task", {"syn_yesno": 0, "syn_short": 0, "syn_long": 0},
     r"synthetic.sft.examples_per_task: SFT needs at least one example"),
    ("sft.examples_per_task", {"syn_yesno": -1, "syn_short": 1, "syn_long": 1},
     r"synthetic.sft.examples_per_task.syn_yesno: expected an integer >= 0"),
    ("evaluate.samples", -1, r"synthetic.evaluate.samples: must be >= 0"),
    ("evaluate.every", 5, r"synthetic.evaluate.every: unknown key"),
    ("parallel_runs", 0, r"synthetic.parallel_runs: must be >= 1"),
])
def test_bad_synthetic_params_fail_in_validate_params_naming_the_key(params, key, value, message):
    p = copy.deepcopy(params)
    *path, last = ["synthetic"] + key.split(".")
    d = p
    for k in path:
        d = d[k]
    if key == "sft.lr":
        d.pop("learning_rate")
    d[last] = value
    with pytest.raises(ParamsError, match=message):
        validate_params(p)


# ----------------------------------------------------------------------------- pure parts

def test_rl_prompts_follow_the_task_mix_and_the_seed(params):
    params = copy.deepcopy(params)
    params["synthetic"]["data"]["n_train"] = 300
    params["synthetic"]["rl"].update(pool="all", prompts_per_task={t: 32 for t in SYNTHETIC_TASKS})
    params["synthetic"]["sft"]["examples_per_task"] = {t: 300 for t in SYNTHETIC_TASKS}
    p = plan(as_config(params))
    train, _ = generate(p.data, 42)
    a, b, a2 = (S.rl_prompts(train, p, s) for s in (1, 2, 1))
    assert [r["task"] for r in a].count("syn_long") == 32 and len(a) == 96
    assert a == a2 and a != b
    assert len({r["id"] for r in a}) == 96           # without replacement
    q = copy.deepcopy(params)
    q["synthetic"]["rl"]["prompts_per_task"] = {"syn_yesno": 10, "syn_short": 0, "syn_long": 2}
    mix = S.rl_prompts(train, plan(as_config(q)), 1)
    assert [r["task"] for r in mix] == ["syn_yesno"] * 10 + ["syn_long"] * 2
    # held_out: only the train records past SFT's first examples_per_task[t]
    q["synthetic"]["rl"]["pool"] = "held_out"
    q["synthetic"]["sft"]["examples_per_task"] = {"syn_yesno": 290, "syn_short": 300,
                                                  "syn_long": 298}
    held = S.rl_prompts(train, plan(as_config(q)), 1)
    ids = sorted(r["id"] for r in held)
    assert ids == [f"syn_long-train-0029{i}" for i in (8, 9)] + \
        [f"syn_yesno-train-{i:05d}" for i in range(290, 300)]
    q["synthetic"]["sft"]["examples_per_task"]["syn_long"] = 299
    with pytest.raises(ParamsError, match=r"\{'syn_long': 2\} exceed the train records SFT did "
                                          r"not see"):
        plan(as_config(q))


def test_sft_records_take_the_first_n_of_each_task(params):
    q = copy.deepcopy(params)
    q["synthetic"]["sft"]["examples_per_task"] = {"syn_yesno": 3, "syn_short": 0, "syn_long": 2}
    q["synthetic"]["sft"]["hedge_share"] = 0.0
    p = plan(as_config(q))
    train, _ = generate(p.data, 42)
    got = S.sft_records(train, p)
    assert [r["id"] for r in got] == ["syn_yesno-train-00000", "syn_yesno-train-00001",
                                      "syn_yesno-train-00002", "syn_long-train-00000",
                                      "syn_long-train-00001"]
    by_id = {r["id"]: r for r in train}
    assert all(r["answer"] == by_id[r["id"]]["answer"] for r in got)   # hedge_share 0
    # hedge_share 0.5: half of each task's SFT targets (rounded) become hedges; records untouched
    q["synthetic"]["sft"].update(examples_per_task={"syn_yesno": 10, "syn_short": 4,
                                                    "syn_long": 0}, hedge_share=0.5)
    before = copy.deepcopy(train)
    got = S.sft_records(train, plan(as_config(q)))
    hedged = [r for r in got if " or " in r["answer"]]
    assert [r["task"] for r in hedged] == ["syn_yesno"] * 5 + ["syn_short"] * 2
    assert train == before
    assert got == S.sft_records(train, plan(as_config(q)))       # the same draw every time


def test_sampled_reward_is_each_prompts_mean_over_its_k_samples(params, monkeypatch):
    """evaluate_policy maps run_generation's prompt-major N*k completions back to their prompts."""
    import hargo.evaluation.generate as G

    q = copy.deepcopy(params)
    q["synthetic"]["evaluate"]["samples"] = 2
    p = plan(as_config(q))
    recs = [{"id": "a", "task": "syn_short", "prompt": [], "answer": "10", "label": None},
            {"id": "b", "task": "syn_yesno", "prompt": [], "answer": "yes", "label": "yes"}]

    class Res:
        def __init__(self, completions):
            self.completions = completions

    def fake(model_dir, prompts, params_evaluate, backend, seed=0, num_samples=1, **kw):
        if params_evaluate["temperature"] == 0:
            return Res(["10", "no"])
        assert num_samples == 2 and params_evaluate["temperature"] == p.rl.temperature
        return Res(["10", "10 or 11", "yes", "no"])          # a, a, b, b

    monkeypatch.setattr(G, "run_generation", fake)
    ev = S.evaluate_policy("unused", recs, p, {"h": p.data})["h"]
    assert ev["reward"] == [1.0, 0.0]
    assert ev["sampled_reward"] == [0.75, 0.5]              # (1 + 0.5) / 2, (1 + 0) / 2
    summary = S.eval_summary(ev)
    assert summary["syn_short/sampled_reward"] == 0.75 and summary["all/sampled_reward"] == 0.625


def test_score_divides_by_the_scale_and_counts_exact_matches():
    cfg = SyntheticConfig(scale_yesno=2.0, scale_short=0.5, scale_long=3.0)
    long_ref = "apple river stone"
    out = S.score(cfg, ["syn_yesno", "syn_yesno", "syn_short", "syn_short", "syn_long"],
                  ["yes", "no", "24", "23", long_ref],
                  ["yes", "yes", "23", "23", long_ref], ["yes", "yes", None, None, None])
    # yes/no: 1 and 0; short: 24 vs 23 is within 5% -> tier 0.5, not exact; long: the reference
    assert out["reward"] == pytest.approx([1.0, 0.0, 0.5, 1.0, 1.0])
    assert out["correct"] == [1.0, 0.0, 0.0, 1.0, 1.0]
    zero = S.score(SyntheticConfig(scale_long=0.0), ["syn_long"], [long_ref], [long_ref], [None])
    assert zero == {"reward": [1.0], "correct": [1.0]}          # the yardstick ignores scales
    committed = as_config(yaml.safe_load((ROOT / "params.yaml").read_text()))
    homo = S.score(configuration(plan(committed),
                                 "homogeneous"), ["syn_short"], ["24"], ["23"], [None])
    assert homo == {"reward": [0.0], "correct": [0.0]}


def test_update_mass_share_is_hand_computed():
    """The trainers' StepRecorder (every RL run: main pipeline, comparison, test bed)."""
    from hargo.training.rl_logging import StepRecorder

    rec = StepRecorder()
    # group 1 (task syn_yesno): w = 1/2, 1/2, A = +1, -1 -> mass 1
    # group 2 (task syn_long): w = 1/4, 3/4, A = +2, -2 -> mass 0.5 + 1.5 = 2
    rec.add_generation(tasks=["syn_yesno", "syn_yesno", "syn_long", "syn_long"], rewards=[1, 0, 1, 0],
                       advantages=[1.0, -1.0, 2.0, -2.0], weights=[0.5, 0.5, 0.25, 0.75],
                       completion_lengths=[1, 1, 1, 1], group_size=2)
    m = rec.finish_step(1)
    assert (m["syn_yesno/update_mass"], m["syn_long/update_mass"], m["all/update_mass"]) == \
        pytest.approx((1.0, 2.0, 3.0))
    assert "all/update_mass_share" not in m
    assert m["syn_yesno/update_mass_share"] == pytest.approx(1 / 3)
    assert m["syn_long/update_mass_share"] == pytest.approx(2 / 3)
    assert rec.history[-1]["syn_long/update_mass_share"] == pytest.approx(2 / 3)
    rec.add_generation(tasks=["syn_yesno", "syn_yesno"], rewards=[1, 1], advantages=[0.0, 0.0],
                       weights=[0.5, 0.5], completion_lengths=[1, 1], group_size=2)
    assert np.isnan(rec.finish_step(2)["syn_yesno/update_mass_share"])   # no mass at all


def _fake_run(values, tasks):
    return {"eval": {"tasks": tasks, "reward": list(values), "correct": [float(v == 1)
                                                                        for v in values],
                     "ids": [str(i) for i in range(len(values))]},
            "eval_summary": {}}


def test_intervals_and_verdicts_on_crafted_runs():
    tasks = ["syn_yesno", "syn_short", "syn_long"] * 4
    base = [0.0, 0.2, 0.5] * 4
    runs = {"grpo-s1": _fake_run(base, tasks), "grpo-s2": _fake_run(base, tasks),
            "hargo-s1": _fake_run([v + 0.1 for v in base], tasks),
            "hargo-s2": _fake_run([v + 0.1 for v in base], tasks),
            "dr_grpo-s1": _fake_run([v + 0.1 for v in base], tasks),
            "dr_grpo-s2": _fake_run([v + 0.1 for v in base], tasks)}
    ci = R.intervals(runs, ["dr_grpo", "grpo", "hargo"], [1, 2], 200, 0.9, 0)
    assert list(ci) == ["hargo-grpo", "hargo-dr_grpo"]             # GRPO first
    g = ci["hargo-grpo"]["all/reward"]
    assert g["diff"] == pytest.approx(0.1) and g["low"] == pytest.approx(0.1)
    assert R.verdict(g) == "HARGO better"
    assert R.verdict(ci["hargo-dr_grpo"]["syn_long/reward"]) == "no difference shown"
    assert R.verdict({"low": -0.3, "high": -0.1}) == "HARGO worse"
    assert R.prompt_values(runs["grpo-s1"]["eval"], "syn_short/reward").tolist() == [0.2] * 4
    assert R.intervals(runs, ["grpo", "dr_grpo"], [1, 2], 10, 0.9, 0) == {}
    assert R.intervals(runs, ["hargo"], [1, 2], 10, 0.9, 0) == {}


def test_each_method_minus_sft_on_crafted_runs():
    """RL vs the SFT policy it starts from: SFT's one deterministic eval is paired with every
    seed. +0.1 on every prompt and seed is the point interval [+0.1, +0.1]; +0.3 on one seed and
    -0.1 on the other has mean +0.1 and an interval that contains 0 (the seeds disagree)."""
    tasks = ["syn_yesno", "syn_short", "syn_long"] * 4
    base = [0.0, 0.2, 0.5] * 4
    sft = {"ids": [str(i) for i in range(12)], "tasks": tasks, "reward": base,
           "correct": [0.0] * 12}
    runs = {"grpo-s1": _fake_run([v + 0.1 for v in base], tasks),
            "grpo-s2": _fake_run([v + 0.1 for v in base], tasks),
            "hargo-s1": _fake_run([v + 0.3 for v in base], tasks),
            "hargo-s2": _fake_run([v - 0.1 for v in base], tasks)}
    vs = R.sft_intervals(runs, ["grpo", "hargo"], [1, 2], sft, 500, 0.9, 0)
    g, h = vs["grpo"]["all/reward"], vs["hargo"]["all/reward"]
    assert (g["diff"], g["low"], g["high"]) == pytest.approx((0.1, 0.1, 0.1))
    assert h["diff"] == pytest.approx(0.1) and h["low"] < 0 < h["high"]
    assert h["low"] == pytest.approx(-0.1) and h["high"] == pytest.approx(0.3)
    assert vs["grpo"]["syn_long/reward"]["diff"] == pytest.approx(0.1)
    summary = {"configurations": {"heterogeneous": {"table": {}, "intervals": {},
                                                    "vs_sft": vs}}}
    flat = R.flat_metrics(summary)
    assert flat["heterogeneous.grpo-sft.all.reward.low"] == pytest.approx(0.1)
    runs["grpo-s2"]["eval"]["ids"] = list(reversed(sft["ids"]))
    with pytest.raises(ValueError, match="grpo-s2: eval prompts differ from the SFT eval's"):
        R.sft_intervals(runs, ["grpo"], [1, 2], sft, 10, 0.9, 0)


def test_two_level_interval_carries_the_spread_over_seeds():
    """Same prompts, HARGO - GRPO = +0.3 on seed 1 and -0.1 on seed 2 on every prompt: with the
    seeds fixed the interval is the point (+0.1); resampling seed pairs spreads it over
    [-0.1, +0.3], so 0 is inside and no difference is shown."""
    from hargo.stats import paired_bootstrap_ci_seeds, paired_bootstrap_ci_two_level

    b = [np.zeros(20), np.zeros(20)]
    a = [np.full(20, 0.3), np.full(20, -0.1)]
    fixed = paired_bootstrap_ci_seeds(a, b, resamples=500, confidence=0.9, seed=0)
    two = paired_bootstrap_ci_two_level(a, b, resamples=500, confidence=0.9, seed=0)
    assert fixed["low"] == pytest.approx(0.1) and fixed["high"] == pytest.approx(0.1)
    assert two["diff"] == pytest.approx(0.1)
    assert two["low"] == pytest.approx(-0.1) and two["high"] == pytest.approx(0.3)
    assert R.verdict(two) == "no difference shown" and R.verdict(fixed) == "HARGO better"
    with pytest.raises(ValueError, match="1-D"):
        paired_bootstrap_ci_two_level([np.zeros((3, 2))], [np.zeros((3, 2))])


def test_share_curve_counts_an_absent_task_as_zero():
    h1 = [{"step": 1, "a/update_mass_share": 1.0}, {"step": 2, "a/update_mass_share": 0.5,
                                                    "b/update_mass_share": 0.5}]
    h2 = [{"step": 1, "a/update_mass_share": 0.25, "b/update_mass_share": 0.75},
          {"step": 2, "a/update_mass_share": float("nan")}]
    assert R.share_curve([h1, h2], "b") == ([1, 2], [0.375, 0.5])
    assert R.share_curve([h1, h2], "a") == ([1, 2], [0.625, 0.5])


# ----------------------------------------------------------------------------- tiny policy

def test_small_tokenizer_round_trips_and_speaks_chatml():
    tok = train_small_tokenizer(["Is the last number of 1 2 3 even?", "apple river"] * 5, 300)
    assert len(tok) <= 300
    text = "Write 23 words: zebra Ünïcode ✓"
    assert tok.decode(tok(text)["input_ids"]) == text               # byte fallback
    rendered = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                       add_generation_prompt=True)
    assert rendered == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"


def test_tiny_policy_is_deterministic_per_seed(tmp_path):
    from safetensors.torch import load_file

    cfg = TinyPolicyConfig(vocab_size=300, hidden_size=64, num_layers=2, num_heads=2,
                           intermediate_size=128)
    texts = ["yes no 1 2 3 apple"] * 4
    paths = [build_tiny_policy(tmp_path / n, cfg, texts, seed=s)
             for n, s in (("a", 0), ("b", 0), ("c", 1))]
    w = [load_file(str(p / "model.safetensors")) for p in paths]
    assert all((p / ".complete").exists() for p in paths)
    assert w[0].keys() == w[1].keys()
    assert all(np.array_equal(w[0][k].numpy(), w[1][k].numpy()) for k in w[0])
    assert not all(np.array_equal(w[0][k].numpy(), w[2][k].numpy()) for k in w[0])
    with pytest.raises(ValueError, match="needs texts"):
        build_tiny_policy(tmp_path / "d", cfg, [], seed=0)


def test_tiny_policy_learns_the_yes_no_task_by_sft_alone(params, tmp_path):
    """The test bed's premise: SFT on a few hundred examples makes the tiny policy (the
    committed config) answer the yes/no task well above chance (0.5: balanced labels). 5
    epochs, not the committed 20 (a quarter of the time): on a 2-core AMD EPYC with
    AVX512-BF16 (2026-12-07), policy seeds 0-2 reached 1.000 at 4-6 epochs, 0.94-1.00 at 3
    and 0.53-0.59 at 2, so the bound holds with two epochs to spare."""
    from hargo.training import sft

    params = copy.deepcopy(params)
    params["synthetic"]["sft"]["epochs"] = 5
    p = plan(as_config(params))
    train, ev = generate(replace_counts(p.data, 300, 64), 1)
    train = [r for r in train if r["task"] == "syn_yesno"]
    ev = [r for r in ev if r["task"] == "syn_yesno"]
    texts = [r["prompt"][0]["content"] for r in train] + [r["answer"] for r in train]
    init = build_tiny_policy(tmp_path / "init", p.policy, texts, seed=0)
    q = S.stage_params(as_config(params), p, 1)
    before = S.evaluate_policy(init, ev, p, {"h": p.data})["h"]
    sft.train(q, init, train, tmp_path / "sft", report_to=())
    after = S.evaluate_policy(tmp_path / "sft", ev, p, {"h": p.data})["h"]
    acc = float(np.mean(after["correct"]))
    assert acc >= 0.85, acc
    assert acc > float(np.mean(before["correct"])) + 0.3


def replace_counts(cfg: SyntheticConfig, n_train: int, n_eval: int) -> SyntheticConfig:
    from dataclasses import replace

    return replace(cfg, n_train=n_train, n_eval=n_eval)


# ----------------------------------------------------------------------------- the pipeline

#: the two pipeline tests share one prepared test bed and SFT policy (built once, on one worker)
BED_GROUP = "synthetic-bed"


@pytest.fixture(scope="module")
def tiny_bed(params, tmp_path_factory) -> tuple[Path, dict, dict]:
    """The tiny test bed's data and SFT policy (``tiny_params``), built once for the module:
    ``(root, prepare's stats, train_sft's output)``. Read-only: tests copy ``root``."""
    root = tmp_path_factory.mktemp("synthetic-bed")
    p = tiny_params(params)
    stats = D.prepare_data(as_config(p), root)
    sft_out = S.train_sft(as_config(p), root)
    return root, stats, sft_out


def _copy_bed(bed: tuple[Path, dict, dict], dest: Path) -> Path:
    import shutil

    shutil.copytree(bed[0], dest, dirs_exist_ok=True)
    return dest


@pytest.mark.xdist_group(BED_GROUP)
def test_a_run_does_not_depend_on_what_its_worker_ran_before(params, tiny_bed, tmp_path):
    """train_configuration's workers train run after run (no fresh process per run): run B
    after run A in one process equals run B alone in a fresh one, history and eval alike."""
    import multiprocessing as mp

    p = tiny_params(params)
    p["train"] = {**p["train"], "threads": 1}
    _copy_bed(tiny_bed, tmp_path)
    model = str(tmp_path / "models" / "synthetic" / "sft")
    a = (p, "heterogeneous", "hargo", 1, str(tmp_path), model)
    b = (p, "heterogeneous", "grpo", 2, str(tmp_path), model)
    ctx = mp.get_context("spawn")
    with ctx.Pool(1) as pool:                       # one process: A, then B
        after_a = list(pool.imap(S._train_run_job, [a, b]))[1]
    with ctx.Pool(1, maxtasksperchild=1) as pool:   # B alone in a fresh process
        alone = pool.apply(S._train_run_job, (b,))
    for r in (after_a, alone):
        for key in ("wall_s", "train_s"):
            r.pop(key)
        for row in r["history"]:
            for k in [k for k in row if "time" in k or k.endswith("_s")]:
                row.pop(k)
    same = lambda x: json.dumps(x, sort_keys=True)  # noqa: E731
    assert same(after_a) == same(alone)


@pytest.mark.xdist_group(BED_GROUP)
def test_pipeline_end_to_end_resumes_per_run(params, tiny_bed, tmp_path):
    p = tiny_params(params)
    _, stats, sft_out = tiny_bed
    _copy_bed(tiny_bed, tmp_path)
    assert stats["splits"]["train"]["syn_long"]["records"] == 24
    assert (tmp_path / "data/synthetic/eval.jsonl").read_text().count("\n") == 18
    assert sft_out["sft"]["steps"] == 5                     # 72 examples / 16, one epoch
    assert set(sft_out["eval"]) == {"heterogeneous", "homogeneous"}
    lines: list[str] = []
    two = copy.deepcopy(p)
    two["synthetic"]["parallel_runs"] = 2   # two worker processes; the runs they return are kept
    het = S.train_configuration(as_config(two), "heterogeneous", tmp_path, print_fn=lines.append)
    assert sorted(het["runs"]) == ["grpo-s1", "grpo-s2", "hargo-s1", "hargo-s2"]
    run = het["runs"]["hargo-s1"]
    assert len(run["history"]) == 1 and len(run["eval"]["reward"]) == 18
    # k = 2 samples per prompt at the training temperature: a mean of two rewards per prompt
    sampled = run["eval"]["sampled_reward"]
    assert len(sampled) == 18 and all(0 <= x <= 1 for x in sampled)
    assert run["eval_summary"]["all/sampled_reward"] == pytest.approx(sum(sampled) / 18)
    assert [c["step"] for c in run["eval_curve"]] == [1]
    shares = [v for k, v in run["history"][0].items() if k.endswith("/update_mass_share")]
    assert shares and (sum(shares) == pytest.approx(1.0) or all(np.isnan(shares)))
    # a second call keeps every finished run; a change of HARGO's own knob re-trains HARGO only
    again = S.train_configuration(as_config(p), "heterogeneous", tmp_path, print_fn=lines.append)
    same = lambda x: json.dumps(x, sort_keys=True)  # noqa: E731  (NaN != NaN, its text is equal)
    assert same(again["runs"]) == same(json.loads(json.dumps(het["runs"])))
    assert sum("done earlier, kept" in ln for ln in lines) == 4
    q = copy.deepcopy(p)
    q["rl"]["hargo"]["alpha"] = 0.5
    lines.clear()
    S.train_configuration(as_config(q), "heterogeneous", tmp_path, print_fn=lines.append)
    kept = [ln for ln in lines if "done earlier, kept" in ln]
    assert len(kept) == 2 and all("grpo-s" in ln for ln in kept)
    S.train_configuration(as_config(p), "homogeneous", tmp_path, print_fn=lines.append)
    with pytest.raises(FileNotFoundError, match=r"heterogeneous.json lacks runs \[.grpo-s3., .hargo-s3.\]"):
        r = copy.deepcopy(p)
        r["synthetic"]["seeds"] = [1, 2, 3]
        R.report(as_config(r), tmp_path)
    summary = R.report(as_config(p), tmp_path)
    assert set(summary["configurations"]) == {"heterogeneous", "homogeneous"}
    assert "all/reward" in summary["configurations"]["homogeneous"]["intervals"]["hargo-grpo"]
    md = (tmp_path / "reports/synthetic.md").read_text()
    assert "## heterogeneous rewards" in md and "HARGO vs GRPO on the mean eval reward" in md
    for name in ("heterogeneous_reward_mean.png", "homogeneous_update_mass_share.png"):
        assert (tmp_path / "reports/synthetic" / name).stat().st_size > 1000
    head = json.loads((tmp_path / "metrics/synthetic/headline.json").read_text())   # DVC metrics
    t = summary["configurations"]["homogeneous"]["table"]
    assert head["homogeneous"]["hargo"] == {"reward": t["hargo"]["all/reward"]["mean"],
                                            "correct": t["hargo"]["all/correct"]["mean"]}
    assert set(head) == {"heterogeneous", "homogeneous"} and set(head["homogeneous"]) == set(t)
    written = json.loads((tmp_path / "metrics/synthetic/summary.json").read_text())
    assert json.dumps(written, sort_keys=True) == json.dumps(json.loads(json.dumps(summary)),
                                                             sort_keys=True)
    # an eval curve: the SFT policy (step 0), every step, and the end
    c = copy.deepcopy(p)
    c["synthetic"]["rl"]["steps"] = 2
    c["synthetic"]["evaluate"]["every_steps"] = 1
    pc = plan(as_config(c))
    train, ev = D.read_split(tmp_path, "train"), D.read_split(tmp_path, "eval")
    run = S.train_run(as_config(c), pc, "heterogeneous", "grpo", 1, train, ev,
                      tmp_path / "models/synthetic/sft",
                      print_fn=lambda *a: None)
    assert [x["step"] for x in run["eval_curve"]] == [0, 1, 2]
    assert run["eval_curve"][0]["all/reward"] == pytest.approx(
        sft_out["eval"]["heterogeneous"]["summary"]["all/reward"])   # step 0 is the SFT policy
    # evaluating does not touch the run's own sampling: the same run without the curve
    c["synthetic"]["evaluate"]["every_steps"] = 0
    plain = S.train_run(as_config(c), plan(as_config(c)), "heterogeneous", "grpo", 1, train, ev,
                        tmp_path / "models/synthetic/sft", print_fn=lambda *a: None)
    drop = ("time/", "step_s")
    rows = lambda r: [{k: v for k, v in h.items() if not k.startswith(drop)}  # noqa: E731
                      for h in r["history"]]
    assert same(rows(plain)) == same(rows(run))
    assert plain["eval_summary"] == run["eval_summary"]


def test_numbers_spelled_as_strings_are_parsed(params):
    """`dvc exp run -S synthetic.sft.learning_rate=2e-3` reaches params as the string '2e-3'
    (YAML 1.1): it must parse, as the main pipeline's numbers do (hargo.param_values)."""
    q = copy.deepcopy(params)
    q["synthetic"]["sft"]["learning_rate"] = "2e-3"
    q["synthetic"]["data"]["scale_long"] = "2e-1"
    q["synthetic"]["policy"]["num_layers"] = "2"
    q["synthetic"]["bootstrap"]["confidence"] = "9e-1"
    p = plan(as_config(q))
    assert p.sft.learning_rate == 0.002 and p.data.scale_long == 0.2
    assert p.policy.num_layers == 2 and p.bootstrap.confidence == 0.9
    q["synthetic"]["data"]["scale_long"] = "lots"
    with pytest.raises(ParamsError, match="synthetic.data"):
        plan(as_config(q))


def test_gx_contract_passes_on_generated_splits_and_names_broken_records(params):
    """The synthetic splits go through Great Expectations (the validate stage's adapter): the
    generated splits pass every expectation; a leaked prompt, a bad label and a missing record
    each fail their expectation, naming the records."""
    from hargo.data.validate import ValidationFailed

    p = plan(as_config(params))
    data = SyntheticConfig(n_train=20, n_eval=6)
    train, ev = generate(data, 3)
    results = D.validate_splits(train, ev, data)
    assert len(results) == len(D.contract_specs(data)) and all(r["success"] for r in results)
    no = next(i for i, r in enumerate(ev) if i > 0 and r["label"] == "no")  # yes share kept
    ev[0] = {**ev[0], "prompt": train[2]["prompt"]}
    ev[no] = {**ev[no], "label": "maybe"}
    ev.pop()
    with pytest.raises(ValidationFailed) as e:
        D.validate_splits(train, ev, data)
    failed = {f["name"]: f["ids"] for f in e.value.failures}
    assert set(failed) == {"synthetic.prepared.yesno_label_in_set",
                           "synthetic.prepared.no_train_eval_leak",
                           "synthetic.summary.count_eval"}
    assert failed["synthetic.prepared.yesno_label_in_set"] == [ev[no]["id"]]
    assert set(failed["synthetic.prepared.no_train_eval_leak"]) == {ev[0]["id"], train[2]["id"]}
    assert failed["synthetic.summary.count_eval"] == ["eval:syn_long"]
    assert p.data.n_eval == 64     # the committed size is what the stage validates
