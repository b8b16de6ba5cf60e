"""The task universe of the typed config: per-task maps are checked against the HPC-GPT tasks
(params.yaml) or against the synthetic test bed's (``Config.from_params(..., synthetic=True)``,
:func:`hargo.compare.synthetic.stage_params`), passed explicitly and recorded on the Config."""
from __future__ import annotations

import copy

import pytest

from hargo.config import Config, ParamsError, as_config, as_section, params_dict

pytestmark = pytest.mark.fast


def _synthetic_params(committed_params) -> dict:
    from hargo.compare.synthetic import stage_params
    from hargo.compare.synthetic_plan import plan

    cfg = as_config(committed_params)
    return params_dict(stage_params(cfg, plan(cfg), 1))


def test_params_yaml_is_of_the_hpc_tasks(committed_params):
    cfg = Config.from_params(committed_params)
    assert cfg.synthetic_tasks is False
    assert set(cfg.rl.max_new_tokens) == {"race_c", "race_fortran", "mlperf", "plp"}
    with pytest.raises(ParamsError, match=r"validate\.task_counts\.race_c: unknown task 'race_c'; "
                                          r"valid synthetic tasks: syn_yesno"):
        Config.from_params(committed_params, synthetic=True)


def test_stage_params_is_a_config_of_the_synthetic_tasks(committed_params):
    from hargo.compare.synthetic import stage_params
    from hargo.compare.synthetic_plan import plan

    p = plan(as_config(committed_params))
    q = stage_params(as_config(committed_params), p, 3)
    assert isinstance(q, Config) and q.synthetic_tasks is True
    assert q.seed == 3 and dict(q.rl.max_new_tokens) == dict(p.rl.max_new_tokens)
    assert dict(q.evaluate.max_new_tokens) == dict(p.evaluate.max_new_tokens)
    assert q.rl.lora.enabled is False and q.rl.generation_backend == "transformers"
    assert q.rl.dynamic_sampling.enabled is False and q.compare is None
    # the main pipeline's method knobs are kept
    assert q.rl.method("hargo") == as_config(committed_params).rl.method("hargo")
    # its mapping builds the same config again, in the same universe only
    assert Config.from_params(params_dict(q), synthetic=True) == q
    with pytest.raises(ParamsError, match=r"rl\.max_new_tokens"):
        Config.from_params(params_dict(q))


def test_a_hpc_task_in_a_synthetic_map_is_refused_by_name(committed_params):
    d = _synthetic_params(committed_params)
    d["rl"]["max_new_tokens"] = {**d["rl"]["max_new_tokens"], "race_c": 8}
    with pytest.raises(ParamsError, match=r"rl\.max_new_tokens.*race_c"):
        Config.from_params(d, synthetic=True)
    d = _synthetic_params(committed_params)
    d["rewards"]["answer"]["max_chars"]["plp"] = 4096
    with pytest.raises(ParamsError, match=r"rewards\.answer\.max_chars\.plp: unknown task"):
        Config.from_params(d, synthetic=True)


def test_a_synthetic_map_must_name_every_synthetic_task_without_a_default(committed_params):
    d = _synthetic_params(committed_params)
    del d["rl"]["max_new_tokens"]["syn_long"]
    with pytest.raises(ParamsError, match=r"rl\.max_new_tokens.*syn_long"):
        Config.from_params(d, synthetic=True)
    d = _synthetic_params(committed_params)
    del d["rewards"]["answer"]["max_chars"]["syn_short"]
    with pytest.raises(ParamsError, match=r"rewards\.answer\.max_chars\.syn_short: missing"):
        Config.from_params(d, synthetic=True)


def test_as_config_and_as_section_keep_or_check_the_universe(committed_params):
    hpc = as_config(committed_params)
    syn = as_config(_synthetic_params(committed_params), synthetic=True)
    assert as_config(hpc) is hpc and as_config(syn) is syn     # None: a Config as it is
    assert as_config(syn, synthetic=True) is syn and as_config(hpc, synthetic=False) is hpc
    with pytest.raises(ParamsError, match="synthetic tasks where one of the HPC-GPT tasks"):
        as_config(syn, synthetic=False)
    with pytest.raises(ParamsError, match="HPC-GPT tasks where one of the synthetic tasks"):
        as_section(hpc, "rl", synthetic=True)
    assert as_section(syn, "rl") is syn.rl
    # a mapping's section alone, in either universe
    d = _synthetic_params(committed_params)
    rl = as_section(d, "rl", synthetic=True)
    assert dict(rl.max_new_tokens) == dict(syn.rl.max_new_tokens)
    with pytest.raises(ParamsError, match=r"rl\.max_new_tokens"):
        as_section(d, "rl")
    assert as_section(committed_params, "rl").max_new_tokens == hpc.rl.max_new_tokens


def test_the_universe_is_no_global_state(committed_params):
    """Building a synthetic config changes nothing for the next HPC one (and back)."""
    syn = Config.from_params(_synthetic_params(committed_params), synthetic=True)
    hpc = Config.from_params(copy.deepcopy(committed_params))
    assert (syn.synthetic_tasks, hpc.synthetic_tasks) == (True, False)
    assert hpc == as_config(committed_params) and syn != hpc


def test_the_rl_stage_helpers_read_a_synthetic_config(committed_params):
    """What the test bed's RL run reads goes through the typed config, in its universe."""
    from hargo.hardware import trainer_precision_kwargs
    from hargo.training.divergence import DivergenceBounds
    from hargo.training.rl import dynamic_sampling_config, prompt_cap, prompt_cap_name, vllm_max_len

    syn = Config.from_params(_synthetic_params(committed_params), synthetic=True)
    assert prompt_cap(syn) == syn.train.max_prompt_tokens
    assert prompt_cap_name(syn) == "train.max_prompt_tokens"
    assert vllm_max_len(syn) == syn.train.max_prompt_tokens + 48 + 8
    assert dynamic_sampling_config(syn).enabled is False
    assert DivergenceBounds.from_params(syn) == DivergenceBounds.of(syn.train.divergence)
    assert set(trainer_precision_kwargs(syn)) == {"use_cpu", "bf16", "fp16",
                                                   "dataloader_pin_memory"}
