"""Tasks as plug-ins (hargo/tasks/, issue 28): the registry's API and errors, each task's raw
file, reward and budgets as before the registry, one correctness rule for training and
evaluation, an unknown task refused by name (never scored as PLP), and a toy task added as one
new module -- its records, reward, metrics and generation budget seen by the ``rl`` stage on the
tiny model, by evaluation's scoring and by the comparison's summary, with no other file
edited."""
from __future__ import annotations

import copy
import json
import math
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
    """``toy``: answer with the word "toy". Reward 1 when the completion says it, else 0."""
    from hargo.tasks import Task, mean, register_task


    def says_toy(text: str) -> bool:
        return "toy" in text.casefold()


    register_task(Task(
        name="toy", description="a toy: say toy", kind="short_answer",
        reward=lambda batch: [float(says_toy(t)) for t in batch.texts],
        score=lambda batch: [{"said": says_toy(t)} for t in batch.texts],
        summarize=lambda rows: {"toy_said": mean([float(r["said"]) for r in rows])},
        metrics=("toy_said",), max_new_tokens=3, max_prompt_tokens=64, rank=50))
''')


@pytest.fixture(scope="module")
def toy_package(tmp_path_factory) -> Path:
    """A copy of the ``hargo`` package with one new module, ``hargo/tasks/toy.py``."""
    return package_copy_with(tmp_path_factory.mktemp("pkg"), "tasks", "toy", TOY_MODULE)


#: Modules that read the task list once, when imported (``from hargo.vocab import TASKS``:
#: tables' columns, plot panels, the gate's metric names); imported before the toy is
#: registered, so that no later test of this process sees the toy in them.
IMPORT_TIME_READERS = ("hargo.compare.aggregate", "hargo.compare.baselines",
                       "hargo.compare.evaluate", "hargo.compare.render", "hargo.compare.report",
                       "hargo.data.conflicts", "hargo.data.prepare", "hargo.data.split",
                       "hargo.data.validate", "hargo.data.raw", "hargo.evaluation.baselines",
                       "hargo.evaluation.evaluate", "hargo.evaluation.plots", "hargo.gate")


@pytest.fixture()
def toy_task(toy_package, monkeypatch):
    """This process's task registry, re-discovered with the copy's ``hargo/tasks`` on the
    package's path (so ``toy.py`` is found as a module of the package); restored afterwards."""
    import importlib

    import hargo.tasks as registry

    for name in IMPORT_TIME_READERS:
        importlib.import_module(name)
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
