"""LoRA target sets (issue 42, item 4): every set the params stage allows gives a merged model
that is exactly the base plus the stored adapter (the model ``evaluate`` scores is the one
``register`` stores), on the tiny model, whose embedding is tied to its head like SmolLM2's;
the sets that touch the tied weights are refused at the params stage, by name."""
from __future__ import annotations

import warnings
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from hargo.config import as_config
from hargo.config.lora_targets import PROJECTIONS, TIED
from hargo.params import ParamsError, apply_overrides

#: any target set a user could write: all-linear, or a list of projections and tied names
TARGETS = st.one_of(st.just("all-linear"),
                    st.lists(st.sampled_from(PROJECTIONS + TIED), min_size=1, max_size=9,
                             unique=True))


def _accepted(params: dict, targets) -> bool:
    try:
        as_config(apply_overrides(params, {"rl.lora.target_modules": targets}))
    except ParamsError as e:
        assert any(t in TIED for t in targets) and "tied weights" in str(e)
        assert str(e).startswith("rl.lora.target_modules: ")
        return False
    return True


@pytest.mark.fast
@given(targets=TARGETS)
def test_the_params_stage_refuses_exactly_the_sets_with_a_tied_weight(committed_params, targets):
    assert _accepted(committed_params, targets) == (not any(t in TIED for t in targets)
                                                    or targets == "all-linear")


@pytest.mark.fast
@pytest.mark.parametrize("section", ["sft", "rl"])
@pytest.mark.parametrize("value, message", [
    (["embed_tokens"], "'embed_tokens' is one of the tied weights"),
    (["q_proj", "lm_head"], "'lm_head' is one of the tied weights"),
    ("q_proj", "a string other than all-linear is a regular expression"),
    (".*", "a string other than all-linear is a regular expression"),
    (["c_attn"], "'c_attn' is not an attention or MLP projection"),
    ([], "expected all-linear or a non-empty list"),
    (["v_proj", "v_proj"], "'v_proj' is listed twice"),
])
def test_a_bad_target_set_is_refused_by_name(committed_params, section, value, message):
    with pytest.raises(ParamsError, match=rf"^{section}\.lora\.target_modules: {message}"):
        as_config(apply_overrides(committed_params, {f"{section}.lora.target_modules": value}))


def _merged_vs_adapter(base: Path, out: Path, targets, seed: int) -> float:
    """The rl stage's save path (``save_merged`` with ``adapter_base``) for a random non-zero
    LoRA on ``targets``; returns the largest logit difference of the two forms
    (:func:`hargo.registered_models.check_adapter_agrees` with no tolerance)."""
    import torch
    from peft import LoraConfig, get_peft_model

    from hargo.models.loading import load_model, load_tokenizer, save_merged
    from hargo.registered_models import check_adapter_agrees

    torch.manual_seed(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")       # PEFT warns on a tied target: the refused case
        model = get_peft_model(load_model(base), LoraConfig(
            r=4, lora_alpha=8, target_modules=targets if isinstance(targets, str)
            else list(targets), init_lora_weights=False))
        save_merged(model, load_tokenizer(base), out, adapter_base=base, adapter_dtype="bfloat16")
        return check_adapter_agrees(out, out / "adapter", base, atol=float("inf"))


@settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@example(targets="all-linear")
@example(targets=list(PROJECTIONS))
@example(targets=["q_proj"])
@example(targets=["down_proj"])
@example(targets=["embed_tokens"])
@example(targets=["lm_head"])
@given(targets=TARGETS)
def test_every_allowed_target_set_merges_to_base_plus_adapter(
        committed_params, tiny_model_dir, tmp_path_factory, targets):
    diff = _merged_vs_adapter(tiny_model_dir, tmp_path_factory.mktemp("lora") / "rl", targets,
                              seed=len(targets))
    if _accepted(committed_params, targets):
        assert diff <= 1e-3
    else:                             # why they are refused: the two forms are two models
        assert diff > 0.05
