"""A prompt plus its completion budget must fit the model's context, and when they do not the
error names the parameter that is too large (issue 12, item 7): the rule
(:func:`hargo.models.loading.check_context`) and every stage that generates or trains on
completions (evaluate's generation, the comparison's, RL, SFT)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from hargo.models.loading import check_context, context_length
from hargo.testing import crafted_records, make_tiny_model
from hargo.config import as_config


# -- the rule ------------------------------------------------------------------------------------

def test_fits_returns_the_context_needed():
    assert check_context(64, 36, 28, "p.max_prompt_tokens", "p.max_new_tokens") == 64
    assert check_context(None, 10_000, 10_000, "p", "n") == 20_000   # no limit known


@pytest.mark.parametrize("new_tokens", [64, 65, 1000])
def test_budget_at_or_past_the_context_names_only_the_budget(new_tokens):
    # the reported case: a 36-token prompt, max_new_tokens at/past the context -> not the prompt cap
    with pytest.raises(ValueError) as e:
        check_context(64, 36, new_tokens, "evaluate.max_prompt_tokens", "evaluate.max_new_tokens")
    msg = str(e.value)
    assert f"evaluate.max_new_tokens={new_tokens}" in msg
    assert "lower evaluate.max_new_tokens below 64" in msg
    assert "max_prompt_tokens" not in msg


def test_both_contribute_names_both_with_the_largest_values_that_fit():
    with pytest.raises(ValueError) as e:
        check_context(64, 36, 40, "rl.max_prompt_tokens", "rl.max_new_tokens")
    msg = str(e.value)
    assert "needs 76 tokens" in msg
    assert "lower rl.max_prompt_tokens to at most 24" in msg    # 64 - 40
    assert "or rl.max_new_tokens to at most 28" in msg          # 64 - 36


def test_prompt_alone_fills_the_context_names_only_the_prompt_cap():
    with pytest.raises(ValueError) as e:
        check_context(64, 64, 8, "evaluate.max_prompt_tokens", "evaluate.max_new_tokens")
    msg = str(e.value)
    assert "lower evaluate.max_prompt_tokens to at most 56" in msg
    assert "max_new_tokens to at most" not in msg               # no budget would fit


def test_context_length_reads_the_config(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"max_position_embeddings": 2048}))
    assert context_length(tmp_path) == 2048
    (tmp_path / "config.json").write_text(json.dumps({"text_config": {
        "max_position_embeddings": 512}}))
    assert context_length(tmp_path) == 512
    (tmp_path / "config.json").write_text("{}")
    assert context_length(tmp_path) is None
    assert context_length(tmp_path / "absent") is None


# -- the stages ----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def short_context_model(tmp_path_factory, tiny_tokenizer_dir) -> Path:
    """A tiny model whose context is 96 tokens (the crafted prompts are ~30-40 tokens)."""
    return make_tiny_model(tmp_path_factory.mktemp("ctx96") / "m", tiny_tokenizer_dir,
                           max_positions=96)


def _prompt_len(model_dir: Path, prompt) -> int:
    from hargo.data.records import prompt_tokens
    from hargo.models.loading import load_tokenizer

    return prompt_tokens(load_tokenizer(model_dir), prompt)


@pytest.mark.parametrize("names", [None, ("train.max_prompt_tokens",
                                          "compare.preferences.max_new_tokens")])
def test_generation_names_the_callers_budget(short_context_model, names):
    from hargo.evaluation.generate import run_generation

    prompt = crafted_records(1)[0]["prompt"]
    assert _prompt_len(short_context_model, prompt) < 96
    kw = {} if names is None else {"param_names": names}
    with pytest.raises(ValueError) as e:
        run_generation(short_context_model, [prompt], {"max_new_tokens": 96, "batch_size": 1},
                       "transformers", **kw)
    budget = "evaluate.max_new_tokens" if names is None else names[1]
    assert f"{budget}=96 leaves no room" in str(e.value)
    assert "max_prompt_tokens" not in str(e.value)


def test_compare_eval_names_its_own_block_when_it_has_the_key(committed_params):
    """compare.evaluate (typed: CompareEvaluate, both keys required) has max_new_tokens and no
    prompt cap, so the budget is named by the comparison's block and the cap by evaluate's."""
    from hargo.compare.evaluate import eval_param_names
    from hargo.config import as_config

    names = ("evaluate.max_prompt_tokens", "compare.evaluate.max_new_tokens")
    assert eval_param_names(committed_params) == names
    assert eval_param_names(as_config(committed_params)) == names


def test_rl_refuses_a_budget_past_the_context_before_training(short_context_model, tmp_path,
                                                              committed_params):
    from rl_helpers import rl_params, write_jsonl

    from hargo.training import rl

    data = tmp_path / "data"
    write_jsonl(data / "train.jsonl", crafted_records(1))   # 4 prompts: RL takes them all
    p = rl_params(committed_params, short_context_model, data, max_new_tokens=100)
    with pytest.raises(ValueError) as e:
        rl.run(as_config(p), "grpo", root=tmp_path)
    assert "rl.max_new_tokens=100 leaves no room" in str(e.value)
    assert not (tmp_path / "models").exists() and not (tmp_path / "metrics").exists()

    longest = max(_prompt_len(short_context_model, r["prompt"]) for r in crafted_records(1))
    p = rl_params(committed_params, short_context_model, data, max_new_tokens=96 - longest + 1,
                  max_prompt_tokens=64)
    with pytest.raises(ValueError) as e:
        rl.run(as_config(p), "grpo", root=tmp_path)
    assert f"lower rl.max_prompt_tokens to at most {longest - 1}" in str(e.value)
    assert f"or rl.max_new_tokens to at most {96 - longest}" in str(e.value)
    # a cap per task: the message names the longest prompt's task's cap
    task = max(crafted_records(1), key=lambda r: _prompt_len(short_context_model, r["prompt"]))["task"]
    p["rl"]["max_prompt_tokens"] = {t: 64 for t in ("race_c", "race_fortran", "mlperf", "plp")}
    with pytest.raises(ValueError) as e:
        rl.run(as_config(p), "grpo", root=tmp_path)
    assert f"lower rl.max_prompt_tokens.{task} to at most {longest - 1}" in str(e.value)


def test_sft_refuses_a_max_length_past_the_context(short_context_model, tmp_path,
                                                   committed_params):
    import copy

    from rl_helpers import write_jsonl

    from hargo.training import sft

    data = tmp_path / "data"
    write_jsonl(data / "train.jsonl", crafted_records(2))
    p = copy.deepcopy(committed_params)
    p["model"]["out_dir"] = str(short_context_model)
    p["data"]["out_dir"] = str(data)
    p["sft"].update(out_dir=str(tmp_path / "sft"), max_length=200)
    with pytest.raises(ValueError, match=r"sft.max_length=200 is past the model's context of 96"):
        sft.run(as_config(p))
    assert not (tmp_path / "sft").exists()
