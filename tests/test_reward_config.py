"""The reward constants read from params.yaml (the typed config's reward blocks, hargo.config.rewards)."""
import pytest

from hargo.rewards import RewardConfig
from hargo.rewards.mlperf import MLPerfConfig
from hargo.rewards.plp import PLPConfig


@pytest.mark.fast
def test_each_value_takes_its_fields_type_and_missing_keys_keep_the_defaults():
    plp = PLPConfig.from_params({"length_budget": 250.0, "length_penalty": "0.001", "other": 1})
    assert plp.length_budget == 250 and type(plp.length_budget) is int
    assert plp.length_penalty == 0.001 and type(plp.length_penalty) is float
    assert plp.format_bonus == PLPConfig().format_bonus            # not given: the default
    ml = MLPerfConfig.from_params({"partial": 1, "overlap_low": "0.3"})
    assert (ml.partial, ml.overlap_low) == (1.0, 0.3) and type(ml.partial) is float
    assert ml.overlap_high == MLPerfConfig().overlap_high
    assert PLPConfig.from_params(None) == PLPConfig() and MLPerfConfig.from_params({}) == MLPerfConfig()
    both = RewardConfig.from_params({"plp": {"batch_size": 8}, "mlperf": {"partial": 0.25}})
    assert both.plp.batch_size == 8 and both.mlperf.partial == 0.25


@pytest.mark.fast
def test_a_value_that_is_not_a_number_is_refused():
    with pytest.raises(ValueError):
        PLPConfig.from_params({"batch_size": "many"})
    with pytest.raises(ValueError):
        MLPerfConfig.from_params({"partial": "half"})


def test_the_typed_rewards_section_gives_the_same_config_as_its_mapping(committed_params):
    """``RewardConfig.from_params`` takes the typed section (``cfg.rewards``) as well as the
    params mapping; both give the same constants (ints stay ints, the per-task budgets a dict)."""
    from hargo.config import Config
    from hargo.params import apply_overrides

    params = apply_overrides(committed_params, {"rewards.plp.batch_size": 8,
                                                "rewards.mlperf.partial": 0.25})
    typed = RewardConfig.from_params(Config.from_params(params).rewards)
    assert typed == RewardConfig.from_params(params["rewards"])
    assert typed.plp.batch_size == 8 and type(typed.plp.length_budget) is int
    assert typed.mlperf.partial == 0.25
    assert dict(typed.answer.max_chars) == params["rewards"]["answer"]["max_chars"]
    assert RewardConfig.from_params(None) == RewardConfig()
