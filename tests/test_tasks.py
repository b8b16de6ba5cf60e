"""Tasks as plug-ins (hargo/tasks/, issue 28): the registry's API and errors, each task's raw
file, reward and budgets as before the registry, one correctness rule for training and
evaluation, an unknown task refused by name (never scored as PLP), and a toy task added as one
new module -- its records (made by the module: ``prepare`` splits them), reward, metrics and
generation budget seen by the ``rl`` stage on the tiny model, by evaluation's scoring, and its
metric a column of ``hargo summary``, the DVC headline, the comparison report and the gate's
metric list, with no other file edited."""
from __future__ import annotations

import copy
import json
import math
import re
import sys
import textwrap
from pathlib import Path

import pytest

from plugin_helpers import package_copy_with, rediscover
from rl_helpers import rl_params, write_jsonl

from hargo.metrics import compute_metrics, score_samples
from hargo.rewards import RewardConfig, TaskReward
from hargo.tasks import (KINDS, Task, UnknownTaskError, get_task, register_task, task_names,
                         tasks)
from hargo.testing import crafted_record, crafted_records
from hargo.config import as_config

#: The tasks, their order, descriptions and raw files before the registry (hargo/vocab.py's
#: tuples and hargo/data/raw.py's TASK_FILES at ccd7249).
BEFORE = {"race_c": ("data race yes/no, C kernels", "task2_c_c++.json"),
          "race_fortran": ("data race yes/no, Fortran kernels", "task2_fortran.json"),
          "mlperf": ("MLPerf facts, short answers", "task1_ml_perf.json"),
          "plp": ("programming-language processing, sentence-length answers", "task1_plp.json")}


class _Scorer:
    """A PLP embedder stand-in: cosine 1 when completion == reference, else 0."""

    def similarity(self, completions, references):
        return [1.0 if c == r else 0.0 for c, r in zip(completions, references)]


# ------------------------------------------------------------------------------ registry

@pytest.mark.fast
def test_registry_lists_the_tasks_in_the_former_order_with_their_raw_files():
    from hargo.data.raw import TASK_FILES
    from hargo.vocab import RACE_TASKS, TASK_DESCRIPTIONS, TASKS

    assert task_names() == TASKS == tuple(BEFORE)
    assert RACE_TASKS == ("race_c", "race_fortran")
    assert TASK_DESCRIPTIONS == {t: d for t, (d, _) in BEFORE.items()}
    assert TASK_FILES == {t: f for t, (_, f) in BEFORE.items()}
    assert [t.kind for t in tasks()] == ["yes_no", "yes_no", "short_answer", "sentence"]
    assert task_names(synthetic=True) == ("syn_yesno", "syn_short", "syn_long")
    from hargo.data.synthetic import SCHEMA_TASK, SYNTHETIC_TASKS

    assert task_names(synthetic=True) == SYNTHETIC_TASKS
    # each synthetic task has the kind of the real task whose shape it copies
    assert {t.name: t.kind for t in tasks(True)} == {
        s: get_task(real).kind for s, real in SCHEMA_TASK.items()}
    assert task_names(None) == tuple(BEFORE) + SYNTHETIC_TASKS
    assert {t.name: t.metrics[-1] for t in tasks()} == {
        "race_c": "dr_f1_race_c", "race_fortran": "dr_f1_race_fortran", "mlperf": "mlperf_em",
        "plp": "plp_similarity"}
    assert all(t.max_new_tokens is None and t.max_prompt_tokens is None for t in tasks(None))


@pytest.mark.fast
def test_unknown_task_is_refused_with_the_valid_names():
    with pytest.raises(UnknownTaskError, match=r"unknown task 'plp2' \(record x\); valid tasks: "
                                               r"\['race_c', 'race_fortran', 'mlperf', 'plp', "
                                               r"'syn_yesno', 'syn_short', 'syn_long'\]$"):
        get_task("plp2", "record x")
    with pytest.raises(UnknownTaskError, match=r"unknown task 'syn_long'; valid tasks: "
                                               r"\['race_c', 'race_fortran', 'mlperf', 'plp'\]$"):
        get_task("syn_long", synthetic=False)
    with pytest.raises(UnknownTaskError, match="unknown task None"):
        get_task(None)
    with pytest.raises(ValueError, match="'plp' is already registered"):
        register_task(Task(name="plp", description="x", kind="sentence", reward=list,
                           score=list))
    with pytest.raises(TypeError, match="expected a hargo.tasks.Task"):
        register_task("plp")


@pytest.mark.fast
def test_an_inconsistent_task_is_refused_when_built():
    ok = dict(name="t", description="d", reward=list, score=list)
    assert Task(**ok, kind="yes_no").kind in KINDS
    with pytest.raises(ValueError, match=r"kind 'boolean' \(valid: yes_no, short_answer, "
                                         r"sentence\)"):
        Task(**ok, kind="boolean")
    with pytest.raises(ValueError, match="description must be a non-empty string"):
        Task(**{**ok, "description": " "}, kind="sentence")
    with pytest.raises(ValueError, match="max_new_tokens must be None or an integer >= 1, got 0"):
        Task(**ok, kind="sentence", max_new_tokens=0)


# ------------------------------------------------------------- an unknown task is never PLP

@pytest.mark.fast
@pytest.mark.parametrize("name", ["plp2", "foo", "syn_long"])
def test_a_record_of_an_unknown_task_is_refused_by_the_reward_and_the_metrics(name):
    fn = TaskReward(scorer=_Scorer())
    with pytest.raises(ValueError, match=rf"unknown task '{name}' \(completion 1\); valid tasks: "
                                         r"\['race_c', 'race_fortran', 'mlperf', 'plp'\]"):
        fn(completions=["yes", "an answer"], task=["race_c", name], answer=[None, "an answer"],
           label=["yes", None])
    samples = [crafted_record(0, "plp", "q", "an answer"), crafted_record(1, name, "q", "a")]
    for call in (score_samples, compute_metrics):
        with pytest.raises(ValueError, match=rf"unknown task '{name}' \(sample id "
                                             rf"'{name}-00001'\)"):
            call(samples, ["an answer", "a"], reward_fn=fn)
    from hargo.training.rl_logging import is_correct

    if name == "syn_long":      # a registered (test-bed) task: the test bed's trainer logs it
        assert is_correct(name, 1.0) and not is_correct(name, 0.9)
    else:
        with pytest.raises(ValueError, match=rf"unknown task '{name}'"):
            is_correct(name, 1.0)
    from hargo.data.records import check_prepared
    from hargo.io import HargoInputError

    with pytest.raises(HargoInputError, match=rf"unknown task '{name}'; valid: race_c, "
                                              r"race_fortran, mlperf, plp"):
        check_prepared("x.jsonl", samples)


# ------------------------------------------------------------- rewards, one correctness rule

@pytest.mark.fast
def test_each_tasks_reward_is_the_reward_modules_own():
    from hargo.rewards.mlperf import mlperf_reward
    from hargo.rewards.plp import plp_rewards
    from hargo.rewards.race import race_reward

    cfg = RewardConfig()
    fn = TaskReward(cfg, scorer=_Scorer())
    texts = ["yes", "No.", "8 GPUs", "8 or 16", "It splits the loop.", "other"]
    task = ["race_c", "race_fortran", "mlperf", "mlperf", "plp", "plp"]
    answer = [None, None, "8", "8", "It splits the loop.", "It splits the loop."]
    label = ["yes", "yes", None, None, None, None]
    got = fn(completions=texts, task=task, answer=answer, label=label)
    plp = plp_rewards(texts[4:], answer[4:], cfg.plp, _Scorer())
    assert got == [race_reward("yes", "yes"), race_reward("No.", "yes"),
                   mlperf_reward("8 GPUs", "8", cfg.mlperf), mlperf_reward("8 or 16", "8",
                                                                          cfg.mlperf), *plp]
    assert got[:4] == [1.0, 0.0, 1.0, 0.5]
    assert got[4] == pytest.approx(1.0 + cfg.plp.format_bonus)


@pytest.mark.fast
def test_training_and_evaluation_count_correct_by_the_same_rule():
    """rl_logging's accuracy (from the reward) and score_samples' ``correct`` are the task's one
    rule: plp a reward >= 0.5 (cosine 0.45 + the 0.1 format bonus is correct), race and mlperf
    the full reward 1.0; a degenerate completion is never correct."""
    from hargo.training.rl_logging import PLP_ACCURACY_THRESHOLD, is_correct

    assert PLP_ACCURACY_THRESHOLD == get_task("plp").correct_threshold == 0.5
    samples = [crafted_record(0, "race_c", "q", "yes", "yes"),
               crafted_record(1, "mlperf", "q", "8"), crafted_record(2, "mlperf", "q", "8"),
               crafted_record(3, "plp", "q", "ref"), crafted_record(4, "plp", "q", "ref"),
               crafted_record(5, "plp", "q", "ref")]
    rewards = [1.0, 1.0, 0.5, 0.55, 0.45, float("nan")]
    fn = TaskReward(scorer=_Scorer())
    scored = score_samples(samples, ["yes", "8", "8 or 9", "x", "y", "z"], fn, rewards=rewards)
    assert [r["correct"] for r in scored] == [True, True, False, True, False, False]
    assert [r["correct"] for r in scored] == [is_correct(s["task"], r)
                                              for s, r in zip(samples, rewards)]
    # a degenerate completion (one repeated unit) is not correct whatever its reward
    (deg,) = score_samples(samples[:1], ["yes " * 400], fn, rewards=[1.0])
    assert deg["degenerate"] == "repetitive" and deg["correct"] is False
    assert get_task("plp").correct(0.5) and not get_task("plp").correct(0.7, "repetitive")


# ------------------------------------------------------------------------------- budgets

@pytest.mark.fast
def test_a_per_task_budget_map_must_name_each_task_without_a_default(committed_params):
    from hargo.generation_budget import check_budget, task_budget
    from hargo.params import ParamsError, validate_params

    budget = dict(committed_params["rl"]["max_new_tokens"])
    assert check_budget(budget, "rl.max_new_tokens", task_names()) == budget
    del budget["plp"]
    with pytest.raises(ParamsError, match=r"rl.max_new_tokens: needs one budget per task .*; "
                                          r"missing \['plp'\]"):
        check_budget(budget, "rl.max_new_tokens", task_names())
    with pytest.raises(ParamsError, match=r"rl.max_new_tokens.plp: no budget for task 'plp'"):
        task_budget(budget, "plp", "rl.max_new_tokens")
    p = copy.deepcopy(committed_params)
    p["rl"]["max_new_tokens"]["foo"] = 8
    with pytest.raises(ParamsError, match=r"rl.max_new_tokens: .*; unknown \['foo'\]"):
        validate_params(p)
    # the other per-task maps refuse an unknown task by its key too
    p = copy.deepcopy(committed_params)
    p["validate"]["task_counts"]["plp2"] = [1, 2]
    with pytest.raises(ParamsError, match=r"^validate.task_counts.plp2: unknown task 'plp2'; "
                                          r"valid tasks: race_c, race_fortran, mlperf, plp$"):
        validate_params(p)
    p = copy.deepcopy(committed_params)
    p["rewards"]["answer"]["max_chars"]["foo"] = 64
    with pytest.raises(ParamsError, match=r"^rewards.answer.max_chars.foo: unknown task 'foo'"):
        validate_params(p)


# ------------------------------------------------------------------ a toy task, one module

TOY_MODULE = textwrap.dedent('''\
    """``toy``: answer with the word "toy". Reward 1 when the completion says it, else 0. Its
    records are made here (no data file); its metric ``toy_said`` is in the headline tables."""
    from hargo.tasks import Metric, Task, mean, register_task


    def says_toy(text: str) -> bool:
        return "toy" in text.casefold()


    def toy_records() -> list[dict]:
        return [{"instruction": f"Say the word toy, number {i}.", "input": "", "output": "toy"}
                for i in range(20)]


    register_task(Task(
        name="toy", description="a toy: say toy", kind="short_answer",
        reward=lambda batch: [float(says_toy(t)) for t in batch.texts],
        score=lambda batch: [{"said": says_toy(t)} for t in batch.texts],
        summarize=lambda rows: {"toy_said": mean([float(r["said"]) for r in rows])},
        metrics=("toy_said",), headline=(Metric("toy_said", "toy said", "said", percent=True),),
        records=toy_records, max_new_tokens=3, max_prompt_tokens=64, rank=50))
''')


@pytest.fixture(scope="module")
def toy_package(tmp_path_factory) -> Path:
    """A copy of the ``hargo`` package with one new module, ``hargo/tasks/toy.py``."""
    return package_copy_with(tmp_path_factory.mktemp("pkg"), "tasks", "toy", TOY_MODULE)


@pytest.fixture()
def toy_task(toy_package, monkeypatch):
    """This process's task registry, re-discovered with the copy's ``hargo/tasks`` on the
    package's path (so ``toy.py`` is found as a module of the package); restored afterwards."""
    import hargo.tasks as registry

    registry.tasks()    # the built-ins discovered first: restoring the registry keeps them
    rediscover(monkeypatch, registry, toy_package)
    try:
        yield get_task("toy")
    finally:
        sys.modules.pop("hargo.tasks.toy", None)


def _toy_records(n: int) -> list[dict]:
    return [crafted_record(i, "toy", f"Say the word toy ({i}).", "toy") for i in range(n)]


def test_toy_task_is_checked_rewarded_scored_and_summarised(toy_task, committed_params):
    from hargo.compare.aggregate import run_metrics
    from hargo.data.records import check_prepared
    from hargo.generation_budget import max_budget, task_budget
    from hargo.params import validate_params

    assert task_names() == (*BEFORE, "toy") and toy_task.kind == "short_answer"
    # the params checks: the committed per-task maps do not name it, its defaults apply
    validate_params(committed_params)
    assert task_budget(committed_params["rl"]["max_new_tokens"], "toy", "rl.max_new_tokens") == 3
    assert task_budget({"race_c": 5}, "toy", "rl.max_prompt_tokens") == 64
    assert max_budget({"race_c": 2}) == 3
    samples = [crafted_record(0, "race_c", "q", "yes", "yes"), *_toy_records(3)]
    check_prepared("toy.jsonl", samples)
    fn = TaskReward(scorer=_Scorer())
    texts = ["yes", "a TOY.", "no", "toy"]
    assert fn(completions=texts, task=[s["task"] for s in samples],
              answer=[s["answer"] for s in samples],
              label=[s["label"] for s in samples]) == [1.0, 1.0, 0.0, 1.0]
    scored = score_samples(samples, texts, fn)
    assert [r.get("said") for r in scored] == [None, True, False, True]
    assert [r["correct"] for r in scored] == [True, True, False, True]
    m = compute_metrics(samples, texts, reward_fn=fn)
    assert m["toy_said"] == pytest.approx(2 / 3) and m["accuracy_toy"] == pytest.approx(2 / 3)
    assert m["n_toy"] == 3 and m["mean_completion_chars_toy"] == pytest.approx(11 / 3)
    assert m["dr_f1"] == 1.0 and m["mlperf_em"] is None    # a short answer, not a race task
    # the comparison's summary of a run's rows
    rows = [{**r, "id": s["id"]} for r, s in zip(scored, samples)]
    summary = run_metrics(rows, {samples[0]["id"]: "yes"})
    assert (summary["accuracy_toy"], summary["reward_toy"], summary["n_toy"]) == \
        (pytest.approx(2 / 3), pytest.approx(2 / 3), 3)


def test_toy_task_trains_in_the_rl_stage_at_its_own_budget(
        toy_task, committed_params, tiny_model_dir, mlflow_uri, tmp_path):
    """One optimizer step of GRPO on race_c and toy prompts through ``rl.run``: the toy's
    records are read and checked, a toy prompt over its default cap (64 tokens) is skipped, its
    reward and accuracy are logged per task, and its completions stop at its default budget
    (3 tokens) while race_c's run to the committed 8."""
    from hargo.training import rl

    data = tmp_path / "prepared"
    records = [r for r in crafted_records(per_task=1) if r["task"] == "race_c"]
    too_long = crafted_record(1, "toy", "Say the word toy. " * 40, "toy")
    write_jsonl(data / "train.jsonl", records + _toy_records(1) + [too_long])
    params = rl_params(committed_params, tiny_model_dir, data, steps=1, num_generations=2,
                       prompts_per_step=2, save_steps=1)
    for key in ("max_new_tokens", "max_prompt_tokens"):     # the committed maps: no toy
        params["rl"][key] = dict(committed_params["rl"][key])
        assert "toy" not in params["rl"][key]
    res = rl.run(as_config(params), "grpo", root=tmp_path, keep_history=True)
    assert res["skipped_prompts"] == {"race_c": 0, "toy": 1}
    (step,) = res["history"]
    assert step["toy/completion_length"] <= 3 < step["race_c/completion_length"] <= 8
    assert step["toy/reward_mean"] in (0.0, 0.5, 1.0) and not math.isnan(step["toy/accuracy"])
    assert step["toy/accuracy"] == step["toy/reward_mean"]    # its rule: the full reward 1.0
    on_disk = json.loads((tmp_path / "metrics" / "rl" / "grpo.json").read_text())
    assert set(on_disk["rewards"]) == {"race_c", "toy", "all"}


# --------------------------------------------- the toy's records and its headline columns

def test_toy_task_is_one_new_file(toy_package):
    """The package the toy tests run is this one plus ``hargo/tasks/toy.py``, no other file
    added or changed (what ``git diff --stat`` of a commit adding the toy would show)."""
    def files(pkg: Path) -> dict:
        return {p.relative_to(pkg): p.read_bytes() for p in pkg.rglob("*")
                if p.is_file() and "__pycache__" not in p.parts}

    ours, theirs = files(Path(__file__).resolve().parents[1] / "hargo"), files(
        toy_package / "hargo")
    assert set(theirs) - set(ours) == {Path("tasks/toy.py")}
    assert [p for p, b in ours.items() if theirs.get(p) != b] == []


@pytest.mark.fast
def test_a_raw_file_is_under_the_raw_folder_or_where_its_path_says(tmp_path):
    from hargo.data.raw import raw_path

    ok = dict(description="d", kind="sentence", reward=list, score=list)
    assert raw_path(Task(name="a", raw_file="a.json", **ok), tmp_path) == tmp_path / "a.json"
    elsewhere = tmp_path / "elsewhere" / "a.json"
    assert raw_path(Task(name="a", raw_file=str(elsewhere), **ok), "data/raw") == elsewhere
    assert raw_path(Task(name="a", raw_file="d/a.json", **ok), "data/raw") == Path("d/a.json")
    with pytest.raises(ValueError, match="'a': give raw_file or records, not both"):
        Task(name="a", raw_file="a.json", records=list, **ok)


def test_toy_task_records_are_made_by_its_module_and_prepared(toy_task, tmp_path):
    """The toy's records come from its ``records`` function, not from the HPC-GPT folder: the
    raw reader lists them after the four files' and ``prepare`` splits them like the others."""
    from config_helpers import config_with
    from hargo.data.prepare import prepare
    from hargo.data.raw import load_raw, source_file

    tiny = Path(__file__).parent / "data" / "hpc_tiny"
    assert not list(tiny.glob("*toy*"))
    raw = load_raw(tiny)
    assert list(raw) == [*BEFORE, "toy"] and len(raw["toy"]) == 20
    assert raw["toy"][3] == {"instruction": "Say the word toy, number 3.", "input": "",
                             "output": "toy"}
    assert source_file("toy") == "hargo.tasks.toy.toy_records"
    out = prepare(config_with({"seed": 42, "data": {
        "raw_dir": str(tiny), "out_dir": str(tmp_path),
        "split": {"strategy": "grouped", "eval_fraction": 0.1, "similarity_threshold": 0.9,
                  "minhash_perm": 128},
        "conflicts": "majority"}}))
    assert out["per_task"]["toy"] == {"train": 18, "eval": 2}     # 10% of 20 instructions
    toy = [json.loads(line) for split in ("train", "eval")
           for line in (tmp_path / f"{split}.jsonl").read_text().splitlines()
           if json.loads(line)["task"] == "toy"]
    assert len(toy) == 20 and {r["answer"] for r in toy} == {"toy"}
    assert {r["source"]["file"] for r in toy} == {"hargo.tasks.toy.toy_records"}


class _TieJudge:
    name = "tie"

    def compare_batch(self, samples, a, b):
        return [0] * len(a)


def _scored_toy_rows(samples: list[dict], said: list[int]) -> list[dict]:
    """Evaluation rows of toy prompts (``score_samples``' fields) saying toy where ``said``."""
    return [{"id": s["id"], "task": "toy", "completion": "toy" if x else "no",
             "chars": 3 if x else 2, "reward": float(x), "correct": bool(x), "said": bool(x)}
            for s, x in zip(samples, said)]


def test_toy_metric_gets_the_gpu_checks_bootstrap_interval(toy_task):
    """The GPU check's compare part builds its interval list and per-prompt values from the
    registry (hargo/gpu_check/compare.py names no task metric): the toy's metric gets a
    HARGO - GRPO interval beside AvgScore."""
    from hargo.gpu_check.compare import _comparison_tables, headline

    assert headline() == ("dr_f1", "plp_similarity", "mlperf_em", "toy_said", "avg_score",
                          "win_rate")
    samples = _toy_records(4)
    evals = {m: {"metrics": {}, "scored": _scored_toy_rows(samples, said)}
             for m, said in (("grpo", [1, 1, 0, 0]), ("hargo", [1, 1, 1, 0]))}
    _, ci = _comparison_tables(samples, evals, None, resamples=200, seed=0)
    assert set(ci["hargo-grpo"]) == {"toy_said", "avg_score"}     # no race/plp/mlperf prompts
    assert ci["hargo-grpo"]["toy_said"]["diff"] == pytest.approx(0.25)
    assert ci["hargo-grpo"]["toy_said"]["n_prompts"] == 4


def test_toy_metric_is_a_column_of_the_summary_the_report_and_the_gate(
        toy_task, committed_params, tmp_path, mlflow_uri, capsys, monkeypatch):
    """``toy_said`` (its one Metric) shows in ``hargo summary``'s table, the DVC headline, the
    comparison report's results table and intervals, and the gate's metric list, which the gate
    computes from the rows; no module but toy.py names it."""
    from hargo import summary
    from hargo.compare import aggregate, render
    from hargo.config.gate_rule import check_gate_params
    from hargo.gate import gate, gate_metrics
    from hargo.metrics import headline, headline_metrics
    from hargo.params import apply_overrides

    # hargo summary: a column after MLPerf EM, before AvgScore
    monkeypatch.setenv("COLUMNS", "240")
    assert summary.columns()[-3:] == (("mlperf_em", "MLPerf EM"), ("toy_said", "toy said"),
                                      ("avg_score", "AvgScore"))
    (tmp_path / "metrics").mkdir()
    (tmp_path / "metrics" / "eval.json").write_text(json.dumps({
        "sft": {"dr_f1": 0.5, "toy_said": 0.25, "avg_score": 0.5},
        "grpo": {"dr_f1": 0.5, "toy_said": 0.75, "avg_score": 0.625, "win_rate": 0.5},
        "run": {"judge": "tie"}}))
    data = summary.run(as_config(apply_overrides(committed_params, {"rl.methods": ["grpo"]})),
                       tmp_path)
    assert (data["models"]["sft"]["toy_said"], data["models"]["grpo"]["toy_said"]) == (0.25,
                                                                                      0.75)
    table = capsys.readouterr().out
    assert "toy said" in table and "0.750" in table
    # the DVC headline
    assert headline_metrics() == ("dr_f1", "dr_mcc", "plp_similarity", "mlperf_em", "toy_said",
                                "avg_score", "win_rate")
    assert headline({"grpo": {"toy_said": 0.75, "n_toy": 4}}) == {"grpo": {"toy_said": 0.75}}
    # the comparison report: 4 toy prompts; SFT says toy once, GRPO twice, HARGO three times
    samples = _toy_records(4)
    rows = {"sft": _scored_toy_rows(samples, [1, 0, 0, 0]),
            "grpo-s1": _scored_toy_rows(samples, [1, 1, 0, 0]),
            "hargo-s1": _scored_toy_rows(samples, [1, 1, 1, 0])}
    train = {m: {1: {"prompts_seen": 2, "wall_s": 1.0}} for m in ("grpo", "hargo")}
    agg = aggregate.aggregate(samples, rows, {}, train, ["grpo", "hargo"], [1],
                              aggregate.RecordingJudge(_TieJudge()))
    assert agg.per_run["sft"]["toy_said"] == 0.25
    assert agg.results["hargo"]["toy_said"] == {"mean": 0.75, "std": 0.0, "values": [0.75]}
    ci, notes = aggregate.bootstrap_cis(agg.per_prompt, ["grpo", "hargo"], [1], 200, 0.95, 0)
    assert ci["hargo-grpo"]["toy_said"]["diff"] == pytest.approx(0.25)
    setup = render.Setup(model="tiny", methods=["grpo", "hargo"], seeds=[1], judge="tie",
                         steps=1, prompts_per_step=2, num_generations=2,
                         sft_samples_per_task=1, sft_epochs=1, resamples=200, confidence=0.95,
                         bootstrap_seed=0, data_version="x", git_commit="y")
    md = render.render_md(render.document(setup, samples, agg, ci, notes, train, None), "f")
    header = next(line for line in md.splitlines() if "WinRate vs SFT (%)" in line)
    assert re.search(r"MLPerf EM \(%\) *\| *toy said \(%\) *\| *AvgScore", header)
    assert "acc toy (%)" in header and "reward toy" in header
    hargo_row = next(line for line in md.splitlines() if line.startswith("| HARGO "))
    assert "75.00 ± 0.00" in hargo_row
    assert "HARGO - GRPO, toy said: +25.00" in md
    assert render.summary(setup, samples, agg, ci, notes, train, None)["sft"]["toy_said"] == 0.25
    # the gate: its metric list, its params check and the metric from the per-prompt rows
    assert gate_metrics()[gate_metrics().index("mlperf_em"):] == (
        "mlperf_em", "toy_said", "avg_score", "win_rate", "accuracy_race_c",
        "accuracy_race_fortran", "accuracy_mlperf", "accuracy_plp", "accuracy_toy")
    assert check_gate_params({"model_name": "hargo-hpc",
                              "gate_metrics": ["toy_said"]}).gate_metrics == ["toy_said"]
    _, _, intervals = gate(rows["hargo-s1"], rows["sft"], ["toy_said", "accuracy_toy"], 0.0,
                           resamples=200)
    assert {k: (v["candidate"], v["reference"], v["diff"], v["n_prompts"])
            for k, v in intervals.items()} == {"toy_said": (0.75, 0.25, 0.5, 4),
                                               "accuracy_toy": (0.75, 0.25, 0.5, 4)}
