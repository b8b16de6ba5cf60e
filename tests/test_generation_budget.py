"""Per-task completion budgets (issue 15 item 2): the pure budget functions, evaluation
generation (each prompt stops at its task's budget: a greedy completion is the unlimited one cut
there, on transformers and vLLM alike) and RL rollouts (each completion at most its task's
budget, a batch generated only as long as its largest)."""
from __future__ import annotations

import pytest

from rl_helpers import char_reward, rl_params, write_jsonl

from hargo.config import as_config
from hargo.generation_budget import (budget_record, check_budget, describe_budget, max_budget,
                                     row_budgets, task_budget)
from hargo.param_values import ParamsError
from hargo.testing import crafted_records

TASKS = ("race_c", "race_fortran", "mlperf", "plp")
BUDGETS = {"race_c": 1, "race_fortran": 2, "mlperf": 3, "plp": 6}


def test_budget_functions():
    assert check_budget(16, "k") == 16
    assert check_budget(dict(BUDGETS), "k", TASKS) == BUDGETS
    assert max_budget(16) == 16 and max_budget(BUDGETS) == 6
    assert task_budget(16, "plp") == 16 and task_budget(BUDGETS, "mlperf") == 3
    assert row_budgets(BUDGETS, ["plp", "race_c", "plp"]) == [6, 1, 6]
    assert budget_record({"plp": 6, "mlperf": 3}) == {"mlperf": 3, "plp": 6}
    assert list(budget_record({"plp": 6, "mlperf": 3})) == ["mlperf", "plp"]   # sorted keys
    assert describe_budget(BUDGETS) == "race_c 1, race_fortran 2, mlperf 3, plp 6"
    with pytest.raises(ParamsError, match=r"k: needs one budget per task.*missing \['plp'\]"):
        check_budget({t: 1 for t in TASKS[:3]}, "k", TASKS)
    with pytest.raises(ParamsError, match=r"unknown \['sql'\]"):
        check_budget({**BUDGETS, "sql": 2}, "k", TASKS)
    with pytest.raises(ParamsError, match=r"k\.plp: expected an integer >= 1, got 0"):
        check_budget({**BUDGETS, "plp": 0}, "k", TASKS)
    for bad in (0, True, 2.5, "16", {}):
        with pytest.raises(ParamsError, match="k"):
            check_budget(bad, "k")
    with pytest.raises(ParamsError, match=r"k\.sql: no budget for task 'sql'"):
        task_budget(BUDGETS, "sql", "k")


def test_params_accept_a_budget_per_task(committed_params):
    import copy

    from hargo.params import validate_params

    p = copy.deepcopy(committed_params)
    p["rl"]["max_new_tokens"] = dict(BUDGETS)
    p["evaluate"]["max_new_tokens"] = dict(BUDGETS)
    validate_params(p)
    p["evaluate"]["max_new_tokens"] = {"race_c": 4}
    with pytest.raises(ParamsError, match="evaluate.max_new_tokens: needs one budget per task"):
        validate_params(p)
    p["evaluate"]["max_new_tokens"] = dict(BUDGETS)
    # the RL prompt cap takes the same two forms; the prompt cap RL uses follows it
    from hargo.training.rl import prompt_cap

    p["rl"]["max_prompt_tokens"] = 192
    validate_params(p)
    assert prompt_cap(as_config(p)) == 192
    p["rl"]["max_prompt_tokens"] = dict(BUDGETS)
    validate_params(p)
    assert prompt_cap(as_config(p)) == BUDGETS and max_budget(prompt_cap(as_config(p))) == 6
    p["rl"]["max_prompt_tokens"] = None
    assert prompt_cap(as_config(p)) == p["train"]["max_prompt_tokens"]
    p["rl"]["max_prompt_tokens"] = {**BUDGETS, "plp": 0}
    with pytest.raises(ParamsError, match=r"rl.max_prompt_tokens.plp: expected an integer >= 1"):
        validate_params(p)


# ------------------------------------------------------------------------------ evaluation

def _prompts():
    recs = crafted_records(per_task=2)
    return [r["prompt"] for r in recs], [r["task"] for r in recs]


@pytest.mark.parametrize("backend", ["transformers", pytest.param("vllm", marks=pytest.mark.vllm)])
def test_generation_stops_each_prompt_at_its_task_budget(tiny_model_dir, backend):
    from transformers import AutoTokenizer

    from hargo.evaluation.generate import run_generation

    prompts, tasks = _prompts()
    pe = {"max_new_tokens": 8, "temperature": 0.0, "dtype": "float32", "batch_size": 3,
          "kv_cache_gib": 0.25, "enforce_eager": True}
    full = run_generation(tiny_model_dir, prompts, pe, backend, seed=0)
    cut = run_generation(tiny_model_dir, prompts, {**pe, "max_new_tokens": dict(BUDGETS)},
                         backend, seed=0, tasks=tasks)
    tok = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    for t, f_text, f_n, c_text, c_n in zip(tasks, full.completions, full.completion_tokens,
                                           cut.completions, cut.completion_tokens):
        b = BUDGETS[t]
        assert c_n == min(f_n, b), (t, f_n, c_n)
        # greedy: the budgeted completion is the unlimited one cut at the budget
        ids = tok(f_text, add_special_tokens=False)["input_ids"]
        if f_n > b:
            assert c_text == tok.decode(ids[:b], skip_special_tokens=True) or \
                f_text.startswith(c_text)
        else:
            assert c_text == f_text
    assert max(cut.completion_tokens) == 6 and min(cut.completion_tokens) <= 1  # budgets bit
    with pytest.raises(ValueError, match="needs the task of each"):
        run_generation(tiny_model_dir, prompts, {**pe, "max_new_tokens": dict(BUDGETS)},
                       backend, seed=0)


# ------------------------------------------------------------------------------------- RL

class _Lengths:
    def __init__(self):
        self.rows: list[tuple[str, float]] = []

    def add_generation(self, *, tasks, completion_lengths, **_):
        self.rows += list(zip(tasks, completion_lengths))

    def add_loss(self, **_):
        pass


def test_rl_rollouts_stop_at_their_task_budget(committed_params, tiny_model_dir, tmp_path,
                                               monkeypatch):
    """A random tiny model rarely samples EOS: every completion runs to its task's budget, and
    the transformers generation of a batch runs to the batch's largest budget only, through a
    capped copy of TRL's generation config (TRL's own object is never changed)."""
    from transformers.generation.utils import GenerationMixin

    from hargo.training.rl import build_trainer

    write_jsonl(tmp_path / "data" / "train.jsonl", crafted_records(per_task=2))
    params = rl_params(committed_params, tiny_model_dir, tmp_path / "data", steps=3,
                       prompts_per_step=2, num_generations=2, log_completions_steps=0)
    params["rl"]["max_new_tokens"] = dict(BUDGETS)
    seen: list[int] = []
    real = GenerationMixin.generate

    def spy(model, *args, generation_config=None, **kwargs):
        seen.append(generation_config.max_new_tokens)
        return real(model, *args, generation_config=generation_config, **kwargs)

    monkeypatch.setattr(GenerationMixin, "generate", spy)
    rec = _Lengths()
    records = crafted_records(per_task=2)
    trainer = build_trainer(as_config(params), "hargo", params["sft"]["out_dir"], records,
                            tmp_path / "ck",
                            recorder=rec, reward_funcs=[char_reward], save_strategy="no")
    assert trainer.args.max_completion_length == 6          # the largest budget
    trl_config = trainer.generation_config
    trainer.train()
    assert trainer.generation_config is trl_config and trl_config.max_new_tokens == 6
    assert len(rec.rows) == 3 * 2 * 2 and len(seen) == 3
    for t, n in rec.rows:
        assert 1 <= n <= BUDGETS[t], (t, n)
    # each step's generation ran to the largest budget of its own tasks
    steps = [rec.rows[i:i + 4] for i in range(0, 12, 4)]
    assert seen == [max(BUDGETS[t] for t, _ in s) for s in steps]
    # the random model does not stop early: most completions use their whole budget
    assert sum(n == BUDGETS[t] for t, n in rec.rows) >= 8
