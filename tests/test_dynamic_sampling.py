"""Dynamic sampling (issue 15 item 3, DAPO): the pure selection/join functions on crafted values,
and the trainer on a tiny random Llama with a reward whose zero-variance groups are known in
advance: the dropped groups are left out of the update, the step is refilled with the prompts
``draw_refill_indices`` names, and the recorded counts are right."""
from __future__ import annotations

import copy
import math
from collections import Counter

import pytest
import torch

from rl_helpers import CONSTANT_REWARD, known_reward, rl_params, write_jsonl

from hargo.config import as_config
from hargo.param_values import ParamsError
from hargo.testing import crafted_records
from hargo.training.dynamic_sampling import (DynamicSamplingConfig, draw_refill_indices,
                                             informative_groups, join_rows, refill_prompt_count,
                                             select_groups)

# ------------------------------------------------------------------------------- pure parts


def test_informative_groups_on_crafted_rewards():
    nan = math.nan
    rewards = torch.tensor([1.0, 1.0, 1.0, 1.0,      # all equal
                            0.0, 1.0, 0.0, 0.0,      # one differs
                            nan, 1.0, 1.0, 1.0,      # NaN ignored: the rest equal
                            nan, nan, nan, 0.5,      # one finite reward: no contrast
                            0.2, 0.2 + 1e-7, 0.2, 0.2,   # within atol: equal
                            nan, 0.1, 0.3, nan])     # two finite, different
    assert informative_groups(rewards, 4).tolist() == [False, True, False, False, False, True]
    with pytest.raises(ValueError, match="groups of 4"):
        informative_groups(torch.zeros(6), 4)


def test_select_groups_keeps_informative_first_then_fills_with_own_zero_variance():
    sel = select_groups([[False, True, False], [True, False, True]], 3)
    assert sel.keep == [(0, 1), (1, 0), (1, 2)]
    assert sel.dropped == [(0, 0), (0, 2), (1, 1)] and sel.surplus == [] and sel.unfilled == 0

    sel = select_groups([[True, False, True], [True, True]], 3)   # more than needed
    assert sel.keep == [(0, 0), (0, 2), (1, 0)] and sel.surplus == [(1, 1)]
    assert sel.dropped == [(0, 1)] and sel.unfilled == 0

    sel = select_groups([[False, True], [False, False]], 2)       # too few informative
    assert sel.keep == [(0, 1), (0, 0)] and sel.unfilled == 1
    assert sel.dropped == [(1, 0), (1, 1)]
    with pytest.raises(ValueError, match="3 groups needed"):
        select_groups([[True, True]], 3)


def test_refill_prompt_count_and_reproducible_draws():
    assert refill_prompt_count(0, 2.0) == 0 and refill_prompt_count(3, 2.0) == 6
    assert refill_prompt_count(1, 1.5) == 2 and refill_prompt_count(2, 1.0) == 2
    kw = dict(seed=42, step=3, round_=1, process=0)
    a = draw_refill_indices(10, 4, exclude=[0, 1, 2], **kw)
    assert a == draw_refill_indices(10, 4, exclude=[0, 1, 2], **kw)      # same arguments
    assert len(set(a)) == 4 and not set(a) & {0, 1, 2}                    # no repeat, excluded
    assert a != draw_refill_indices(10, 4, exclude=[0, 1, 2], **{**kw, "step": 4})
    assert a != draw_refill_indices(10, 4, exclude=[0, 1, 2], **{**kw, "process": 1})
    b = draw_refill_indices(5, 4, exclude=[0, 1, 2], **kw)               # pool of 2, topped up
    assert len(b) == 4 and sorted(b[:2]) == [3, 4] and all(0 <= i < 5 for i in b)
    with pytest.raises(ValueError):
        draw_refill_indices(0, 1, **kw)


def test_dynamic_sampling_config_is_the_typed_block(committed_params):
    """The trainer's setting is the typed config's ``rl.dynamic_sampling`` (one parser)."""
    from hargo.config import DynamicSampling, as_section

    def block(ds):
        rl = copy.deepcopy(committed_params["rl"])
        if ds is None:
            rl.pop("dynamic_sampling", None)
        else:
            rl["dynamic_sampling"] = ds
        return as_section({**committed_params, "rl": rl}, "rl").dynamic_sampling

    assert DynamicSamplingConfig is DynamicSampling
    assert block(None) == DynamicSamplingConfig(enabled=False)
    cfg = block({"enabled": True, "refill_factor": 3, "max_refills": 2})
    assert (cfg.enabled, cfg.refill_factor, cfg.max_refills) == (True, 3.0, 2)
    for bad, key in (({"enabled": "yes"}, "enabled"), ({"refill_factor": 0.5}, "refill_factor"),
                     ({"max_refills": -1}, "max_refills"), ({"max_refills": 1.5}, "max_refills"),
                     ({"factor": 2}, "unknown")):
        with pytest.raises(ParamsError, match=key):
            block(bad)


def _batch(prompts: list[list[int]], completions: list[list[int]], pad: int = 0) -> dict:
    """A TRL-shaped scored batch: prompts left-padded, completions right-padded."""
    P = max(map(len, prompts))
    C = max(map(len, completions))
    pid = torch.tensor([[pad] * (P - len(p)) + p for p in prompts])
    pm = torch.tensor([[0] * (P - len(p)) + [1] * len(p) for p in prompts])
    cid = torch.tensor([c + [pad] * (C - len(c)) for c in completions])
    cm = torch.tensor([[1] * len(c) + [0] * (C - len(c)) for c in completions])
    logps = -cid.float() / 10 * cm
    return {"prompt_ids": pid, "prompt_mask": pm, "completion_ids": cid, "completion_mask": cm,
            "advantages": torch.arange(len(prompts)).float(), "ref_per_token_logps": logps,
            "num_items_in_batch": cm.sum()}


def test_join_rows_aligns_padding_and_keeps_a_single_batch_exact():
    a = _batch([[5, 6], [5, 6], [7, 8, 9], [7, 8, 9]], [[11], [12, 13], [14], [15]])
    b = _batch([[21, 22, 23, 24], [21, 22, 23, 24]], [[31, 32, 33], [34]])
    # rows of a alone, in order: exactly a (minus num_items_in_batch, which the caller recomputes)
    same = join_rows([a, b], [(0, i) for i in range(4)], pad_token_id=0)
    assert set(same) == set(a) - {"num_items_in_batch"}
    for k, v in same.items():
        assert torch.equal(v, a[k]), k
    # the last group of a, then b: prompts left-padded to 4, completions right-padded to 3
    j = join_rows([a, b], [(0, 2), (0, 3), (1, 0), (1, 1)], pad_token_id=0)
    assert j["prompt_ids"].tolist() == [[0, 7, 8, 9], [0, 7, 8, 9], [21, 22, 23, 24],
                                        [21, 22, 23, 24]]
    assert j["prompt_mask"].tolist() == [[0, 1, 1, 1], [0, 1, 1, 1], [1, 1, 1, 1], [1, 1, 1, 1]]
    assert j["completion_ids"].tolist() == [[14, 0, 0], [15, 0, 0], [31, 32, 33], [34, 0, 0]]
    assert j["completion_mask"].tolist() == [[1, 0, 0], [1, 0, 0], [1, 1, 1], [1, 0, 0]]
    assert j["advantages"].tolist() == [2.0, 3.0, 0.0, 1.0]
    assert torch.allclose(j["ref_per_token_logps"][2], torch.tensor([-3.1, -3.2, -3.3]))
    assert j["ref_per_token_logps"][0].tolist()[1:] == [0.0, 0.0]
    # columns no kept row uses are cut: a's first group has shorter prompts than a's widest
    k = join_rows([a, b], [(0, 0), (0, 1)], pad_token_id=0)
    assert k["prompt_ids"].tolist() == [[5, 6], [5, 6]]
    assert k["completion_ids"].tolist() == [[11, 0], [12, 13]]
    with pytest.raises(ValueError, match="pixel_values"):
        join_rows([{**a, "pixel_values": torch.zeros(3, 2)}], [(0, 0)], pad_token_id=0)


# ------------------------------------------------------------------------- in the trainer

CONSTANT = CONSTANT_REWARD


class KnownReward:
    """:func:`rl_helpers.known_reward` that keeps the prompts of every call (one call per scored
    batch: the step's own, then each refill)."""

    __name__ = "known_reward"

    def __init__(self):
        self.calls: list[list] = []

    def __call__(self, prompts, completions, task, **kw) -> list[float]:
        self.calls.append(list(prompts))
        return known_reward(completions, task)


class _Recorder:
    """Keeps what the trainer hands the recorder."""

    def __init__(self):
        self.gens: list[dict] = []
        self.history: list[dict] = []

    def add_generation(self, **kw):
        self.gens.append(kw)

    def add_loss(self, **_):
        pass


@pytest.fixture(scope="module")
def ds_setup(committed_params, tiny_model_dir, tmp_path_factory):
    d = tmp_path_factory.mktemp("ds-data")
    records = crafted_records(per_task=3)            # 12 prompts, 3 per task
    write_jsonl(d / "train.jsonl", records)
    params = rl_params(committed_params, tiny_model_dir, d, steps=3, prompts_per_step=4,
                       num_generations=2, max_new_tokens=3, save_steps=10,
                       log_completions_steps=0)
    params["rl"]["dynamic_sampling"] = {"enabled": True, "refill_factor": 2.0, "max_refills": 1}
    return params, records


def _train(params, records, out, method, reward):
    from hargo.training.rl import build_trainer

    rec = _Recorder()
    trainer = build_trainer(as_config(params), method, params["sft"]["out_dir"], records, out,
                            recorder=rec, reward_funcs=[reward])
    trainer.train()
    return trainer, rec


def _content(prompt) -> str:
    return prompt[-1]["content"] if isinstance(prompt, list) else prompt


@pytest.mark.parametrize("method", ["grpo", "hargo"])
def test_zero_variance_groups_are_dropped_and_the_step_refilled(ds_setup, tmp_path, method):
    params, records = ds_setup
    reward = KnownReward()
    trainer, rec = _train(params, records, tmp_path / "ckpt", method, reward)
    G, needed = 2, 4
    assert trainer.state.global_step == 3 and len(rec.gens) == 3
    text_row = {_content(r["prompt"]): i for i, r in enumerate(records)}   # crafted: unique
    calls = iter(reward.calls)
    refilled = 0
    for step, gen in enumerate(rec.gens):
        s = gen["sampled_groups"]
        n = len(s["tasks"])
        # the known truth: a group has zero variance iff its task's reward is constant
        assert s["zero_variance"] == [t in CONSTANT for t in s["tasks"]]
        own = [not r for r in s["refill"]]
        assert sum(own) == needed and own == sorted(own, reverse=True)   # own groups first
        informative = [not z for z in s["zero_variance"]]
        # trained: exactly prompts_per_step groups; every informative group up to that, and
        # zero-variance ones only for want of informative ones
        assert sum(s["kept"]) == needed
        want_unfilled = max(0, needed - sum(informative))
        assert sum(1 for z, k in zip(s["zero_variance"], s["kept"]) if z and k) == want_unfilled
        assert sum(1 for z, k in zip(s["zero_variance"], s["kept"]) if z and not k) == \
            sum(s["zero_variance"]) - want_unfilled
        # the batch the recorder (and the loss) gets: the kept groups, group-major
        trained = gen["tasks"][::G]
        assert len(gen["tasks"]) == needed * G == len(gen["rewards"]) == len(gen["weights"])
        assert Counter(trained) == Counter(t for t, k in zip(s["tasks"], s["kept"]) if k)
        assert gen["rewards"] == [CONSTANT[t] for t in gen["tasks"] if t in CONSTANT] or \
            any(t == "plp" for t in gen["tasks"])
        for g, t in enumerate(trained):   # rewards travel with their group
            r = gen["rewards"][g * G:(g + 1) * G]
            assert (max(r) == min(r) == CONSTANT[t]) if t in CONSTANT else max(r) > min(r)
            if t == "plp":                # a kept informative group carries an advantage
                assert max(abs(a) for a in gen["advantages"][g * G:(g + 1) * G]) > 0.1
        # the step's own prompts, then (if any of them had equal rewards) the refill round:
        # 2 x the missing groups, exactly the rows draw_refill_indices names for this step
        own_prompts = next(calls)[::G]
        assert [records[text_row[_content(p)]]["task"] for p in own_prompts] == s["tasks"][:needed]
        missing = needed - sum(informative[:needed])
        if missing:
            refilled += 1
            assert n - needed == refill_prompt_count(missing, 2.0)
            want = draw_refill_indices(
                len(records), n - needed, seed=params["seed"], step=step, round_=1, process=0,
                exclude=sorted(text_row[_content(p)] for p in own_prompts))
            got = [text_row[_content(p)] for p in next(calls)[::G]]
            assert got == want
            assert s["tasks"][needed:] == [records[i]["task"] for i in want]
        else:
            assert n == needed
    assert next(calls, None) is None
    assert refilled      # the crafted data makes the case happen


def test_nothing_dropped_leaves_training_unchanged(ds_setup, tmp_path):
    """Every group informative: dynamic sampling on trains exactly what it trains off (same
    weights bit for bit: no refill, no join, no extra RNG draw)."""
    params, records = ds_setup

    def varied(completions, **_):
        return [i / 10.0 for i in range(len(completions))]
    varied.__name__ = "varied"

    on, rec_on = _train(params, records, tmp_path / "on", "hargo", reward=varied)
    off_params = copy.deepcopy(params)
    off_params["rl"]["dynamic_sampling"]["enabled"] = False
    off, rec_off = _train(off_params, records, tmp_path / "off", "hargo", reward=varied)
    assert all(not any(g["sampled_groups"]["refill"]) for g in rec_on.gens)
    assert all(g["sampled_groups"] is None for g in rec_off.gens)
    w_on = {n: p for n, p in on.model.named_parameters() if p.requires_grad}
    w_off = {n: p for n, p in off.model.named_parameters() if p.requires_grad}
    assert w_on.keys() == w_off.keys()
    assert max((w_on[k] - w_off[k]).abs().max().item() for k in w_on) == 0.0
    assert max(v.abs().max().item() for k, v in w_on.items() if "lora_B" in k) > 0   # it trained
