"""Preference trainers (DPO, KTO, SimPO through TRL) on the tiny random Llama: each trains 2
steps, writes a merged model that generates, and its weights moved; plus the pure pieces (pair
order, KTO's unpaired layout) and bad input."""
from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from hargo.io import HargoInputError
from hargo.training import preference_trainers as preference
from hargo.config import as_config

pytestmark = pytest.mark.timeout(600)


def crafted_pairs(n: int = 3) -> list[dict]:
    """n pairs of short prompts with a clearly better (chosen) and worse (rejected) answer."""
    out = []
    for i in range(n):
        out.append({"id": f"race_c-{i}", "task": "race_c",
                    "prompt": [{"role": "user", "content": f"Is there a data race in loop {i}?"}],
                    "chosen": [{"role": "assistant", "content": "yes"}],
                    "rejected": [{"role": "assistant", "content": f"maybe it is loop {i}"}],
                    "chosen_reward": 1.0, "rejected_reward": 0.0})
    return out


def pref_params(committed: dict) -> dict:
    p = copy.deepcopy(committed)
    p["train"].update({"gradient_checkpointing": False, "threads": 1, "bf16": False})
    p["sft"]["max_length"] = 96
    p["compare"].update({"steps": 2, "prompts_per_step": 2})
    for m in ("dpo", "kto", "simpo"):
        p["compare"][m]["learning_rate"] = 5e-3   # large, so 2 LoRA steps visibly move the model
    p["rl"]["lora"] = {**p["rl"]["lora"], "enabled": True, "r": 8, "alpha": 16, "dropout": 0.0}
    return p


def _logits(model_dir: Path, text: str):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    with torch.no_grad():
        return model(**tok(text, return_tensors="pt")).logits[0]


@pytest.mark.parametrize("method", ["dpo", "kto", "simpo"])
def test_preference_method_trains_and_writes_an_evaluable_model(tmp_path, tiny_model_dir,
                                                                committed_params, method):
    from hargo.evaluation.generate import run_generation

    params = pref_params(committed_params)
    out = tmp_path / "model"
    m = preference.train_preference(as_config(params), method, tiny_model_dir, crafted_pairs(3), out, seed=1)

    assert m["method"] == method and m["seed"] == 1
    assert m["steps"] == 2
    assert m["prompts_seen"] == 4 and m["completions_seen"] == 8
    assert m["pairs_available"] == 3 and m["pairs_used"] == 3   # 4 draws cycle over 3 pairs
    assert [s for s, _ in m["loss_curve"]] == [1, 2]
    assert all(v == v for _, v in m["loss_curve"])              # no NaN
    assert m["train_s"] > 0 and m["lora"] is True
    # LoRA r=8 on all 7 linear projections of 2 layers (hidden 128, mlp 256)
    assert m["trainable_parameters"] == 2 * 8 * ((128 + 128) * 4 + (128 + 256) * 3)
    # the trainers' own reward statistics are kept
    assert {"rewards/chosen", "rewards/rejected", "rewards/margins"} <= set(m["final"])
    if method in ("dpo", "simpo"):
        assert 0.0 <= m["final"]["rewards/accuracies"] <= 1.0
    if method == "kto":
        assert "kl" in m["final"]
        # step 1 of KTO: policy == reference, every example's loss is 1 - sigmoid(0) = 0.5
        assert m["loss_curve"][0][1] == pytest.approx(0.5, abs=1e-4)
    if method == "dpo":
        # step 1 of DPO: policy == reference, so the loss is exactly log 2
        assert m["loss_curve"][0][1] == pytest.approx(0.6931, abs=1e-3)

    # a plain merged model folder, complete, no adapter files
    assert (out / ".complete").exists() and not list(out.glob("adapter_*"))
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["num_hidden_layers"] == 2

    # the evaluation path loads and generates from it
    prompts = [p["prompt"] for p in crafted_pairs(2)]
    res = run_generation(out, prompts, {"max_new_tokens": 4, "temperature": 0.0,
                                        "dtype": "float32", "batch_size": 2},
                         "transformers", seed=0)
    assert len(res.completions) == 2 and all(0 < n <= 4 for n in res.completion_tokens)

    # the adapter was trained and merged: the logits moved away from the SFT model's
    before = _logits(tiny_model_dir, "Is there a data race in loop 0?")
    after = _logits(out, "Is there a data race in loop 0?")
    assert before.shape == after.shape
    assert (after - before).abs().max().item() > 1e-3


def test_no_pairs_is_a_clear_error_naming_pairs_jsonl(tmp_path, tiny_model_dir,
                                                      committed_params):
    params = pref_params(committed_params)
    with pytest.raises(HargoInputError, match=r"data/preferences/pairs.jsonl: no preference pairs"):
        preference.train_preference(as_config(params), "dpo", tiny_model_dir, [], tmp_path / "m", seed=1)
    bad = crafted_pairs(2)
    bad[1]["rejected"] = "maybe"
    path = tmp_path / "pairs.jsonl"
    path.write_text("".join(json.dumps(p) + "\n" for p in bad))
    with pytest.raises(HargoInputError, match=r"pairs.jsonl, record 1, field 'rejected'"):
        preference.train_preference(as_config(params), "kto", tiny_model_dir, path, tmp_path / "m", seed=1)
    assert not (tmp_path / "m").exists()


def test_unknown_method_and_bad_params_are_refused(committed_params):
    from hargo.params import ParamsError

    params = pref_params(committed_params)
    with pytest.raises(ParamsError, match="method: must be one of dpo, kto, simpo"):
        preference.check_params(as_config(params), "orpo")
    params["compare"]["simpo"]["beta"] = 0
    with pytest.raises(ParamsError, match=r"compare.simpo.beta: must be > 0"):
        preference.check_params(as_config(params), "simpo")


def test_pair_order_draws_without_replacement_then_cycles():
    import random

    order = preference.pair_order(10, 4, seed=3)
    assert len(order) == 4 and len(set(order)) == 4
    perm = list(range(10))
    random.Random(3).shuffle(perm)
    assert order == perm[:4]
    cyc = preference.pair_order(3, 7, seed=3)
    assert sorted(cyc[:3]) == [0, 1, 2] and sorted(cyc[3:6]) == [0, 1, 2] and len(cyc) == 7
    assert preference.pair_order(3, 7, seed=3) == cyc
    with pytest.raises(ValueError):
        preference.pair_order(0, 2, seed=1)


def test_kto_rows_put_a_batch_s_chosen_then_rejected_completions():
    pairs = crafted_pairs(3)
    rows = preference.kto_rows(pairs, [2, 0, 1, 2], prompts_per_step=2)
    assert [(r["prompt"][0]["content"][-2], r["label"]) for r in rows] == [
        ("2", True), ("0", True), ("2", False), ("0", False),
        ("1", True), ("2", True), ("1", False), ("2", False)]
    assert rows[0]["completion"] == [{"role": "assistant", "content": "yes"}]
    assert rows[2]["completion"] == [{"role": "assistant", "content": "maybe it is loop 2"}]
    d = preference.dpo_rows(pairs, [1])
    assert d == [{"prompt": pairs[1]["prompt"], "chosen": pairs[1]["chosen"],
                  "rejected": pairs[1]["rejected"]}]


class _Interrupted(Exception):
    pass


@pytest.mark.parametrize("method", ["dpo", "kto", "simpo"])
def test_interrupted_preference_run_starts_over_to_the_uninterrupted_result(
        tmp_path, tiny_model_dir, committed_params, monkeypatch, method):
    """Preference runs keep no checkpoint (issue 12: they have no resume path): a run interrupted
    after step 1 leaves neither a model nor a trainer folder behind, and the re-run starts over
    from the SFT model and ends on the uninterrupted run's weights and losses (1e-6: the same
    seeded float32 ops in the same order)."""
    from safetensors.torch import load_file
    from transformers import TrainerCallback

    params = pref_params(committed_params)
    straight = preference.train_preference(as_config(params), method, tiny_model_dir, crafted_pairs(3),
                                           tmp_path / "a", seed=1)

    class StopAfterStep1(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            if state.global_step == 1:
                raise _Interrupted()

    built = []
    original = preference.build_trainer

    def build_with_stop(*a, **kw):
        trainer = original(*a, **kw)
        assert trainer.args.save_strategy == "no"          # no checkpoint is ever written
        trainer.add_callback(StopAfterStep1())
        built.append(trainer.args.output_dir)
        return trainer

    monkeypatch.setattr(preference, "build_trainer", build_with_stop)
    with pytest.raises(_Interrupted):
        preference.train_preference(as_config(params), method, tiny_model_dir, crafted_pairs(3),
                                    tmp_path / "b", seed=1)
    monkeypatch.setattr(preference, "build_trainer", original)
    assert built and not Path(built[0]).exists()              # nothing to resume from
    assert not (tmp_path / "b").exists()

    again = preference.train_preference(as_config(params), method, tiny_model_dir, crafted_pairs(3),
                                        tmp_path / "b", seed=1)
    assert again["steps"] == straight["steps"] == 2
    assert [s for s, _ in again["loss_curve"]] == [s for s, _ in straight["loss_curve"]]
    assert [v for _, v in again["loss_curve"]] == \
        pytest.approx([v for _, v in straight["loss_curve"]], abs=1e-6)
    wa = load_file(tmp_path / "a" / "model.safetensors")
    wb = load_file(tmp_path / "b" / "model.safetensors")
    w0 = load_file(tiny_model_dir / "model.safetensors")
    assert wa.keys() == wb.keys()
    assert max((wa[k].float() - wb[k].float()).abs().max().item() for k in wa) <= 1e-6
    assert max((wa[k].float() - w0[k].float()).abs().max().item() for k in wa if k in w0) > 1e-4
