"""A diverging run stops with a named error before anything is saved (issue 30, item 1): the
bounds check by hand, then SFT and RL on a tiny policy at a learning rate of 1e3, the stage's
MLflow run FAILED with the step and value, and check-params warning on the learning rate."""
from __future__ import annotations

import math
from pathlib import Path

import pytest

from hargo.config import Config, as_config, params_dict
from hargo.io import HargoInputError
from hargo.training.divergence import (TRAINING_RECORD, DivergenceBounds, DivergenceGuard,
                                       TrainingDiverged, check_training_record, training_record,
                                       check_logs)

PARAMS = str(Path(__file__).resolve().parents[1] / "params.yaml")


@pytest.mark.fast
@pytest.mark.parametrize("logs, found", [
    ({"loss": 3.1e23, "kl": 9.7e24, "grad_norm": 5164.0}, "loss = 3.1e+23 (bound |loss| <= 100"),
    ({"loss": 0.4, "kl": 9.7e24}, "kl = 9.7e+24 (bound |kl| <= 10"),
    ({"loss": 0.4, "grad_norm": 5164.0}, "grad_norm = 5164 (bound |grad_norm| <= 1000"),
    ({"loss": float("nan")}, "loss = nan (non-finite)"),
    ({"loss": 1.0, "grad_norm": float("inf")}, "grad_norm = inf (non-finite)"),
    ({"loss": -150.0}, "loss = -150"),                      # a GRPO loss may be negative
])
def test_check_logs_names_the_value(logs, found):
    assert found in check_logs(logs, DivergenceBounds())


@pytest.mark.fast
@pytest.mark.parametrize("logs", [
    {"loss": 11.2, "grad_norm": 19.0, "kl": 0.8},            # healthy: SmolLM2's first SFT step
    {"loss": -0.3, "kl": 0.0, "grad_norm": 0.0},
    {"learning_rate": 5.0, "epoch": 3.0, "train_loss": float("nan")},   # not checked keys
    {"loss": True, "kl": "n/a"},                             # not numbers: not checked
    {},
])
def test_check_logs_passes_healthy_steps(logs):
    assert check_logs(logs, DivergenceBounds()) is None


@pytest.mark.fast
def test_bounds_from_params(committed_params):
    assert DivergenceBounds.from_params(as_config(committed_params)) == \
        DivergenceBounds(100.0, 10.0, 1000.0) == DivergenceBounds()
    typo = {**committed_params, "train": {**committed_params["train"],
                                          "divergence": {"max_gradnorm": 1}}}
    with pytest.raises(ValueError, match="train.divergence.max_gradnorm: unknown key"):
        DivergenceBounds.from_params(as_config(typo))    # refused where the config is built
    raised = {**committed_params, "train": {**committed_params["train"],
                                            "divergence": {"max_loss": "1e3"}}}
    assert DivergenceBounds.from_params(as_config(raised)) == DivergenceBounds(max_loss=1000.0)
    with pytest.raises(ValueError, match="max_kl: must be a finite number > 0"):
        DivergenceBounds(max_kl=math.inf)


@pytest.mark.fast
def test_guard_raises_with_step_and_learning_rate():
    from types import SimpleNamespace

    guard = DivergenceGuard(DivergenceBounds(), "rl (hargo)")
    args, state = SimpleNamespace(learning_rate=1e3), SimpleNamespace(global_step=2)
    guard.on_log(args, state, None, logs={"loss": 0.1, "grad_norm": 3.0})   # healthy: nothing
    with pytest.raises(TrainingDiverged, match=r"rl \(hargo\) diverged at step 2: loss = 3.1e\+23"
                                               r".*learning rate 1000. Nothing of this run"):
        guard.on_log(args, state, None, logs={"loss": 3.1e23})


@pytest.fixture(scope="module")
def tiny_policy(tmp_path_factory):
    from hargo.data.synthetic import SyntheticConfig, generate
    from hargo.models.tiny import TinyPolicyConfig, build_tiny_policy

    train, _ = generate(SyntheticConfig(n_train=40, n_eval=4), seed=0)
    texts = [m["content"] for r in train for m in r["prompt"]] + [r["answer"] for r in train]
    cfg = TinyPolicyConfig(vocab_size=300, hidden_size=64, num_layers=2, num_heads=2,
                           intermediate_size=128, max_positions=256)
    model_dir = build_tiny_policy(tmp_path_factory.mktemp("tiny") / "policy", cfg, texts, seed=0)
    return model_dir, [r for r in train if r["task"] == "syn_short"][:8]


def _tiny_params(lr: float) -> Config:
    from hargo.compare.synthetic import stage_params
    from hargo.compare.synthetic_plan import plan
    from hargo.params import load_params

    params = as_config(load_params(PARAMS))
    q = params_dict(stage_params(params, plan(params), 1))   # the synthetic tasks' config
    q["train"].update(threads=1, bf16=False)
    q["rl"].update(steps=4, prompts_per_step=4, num_generations=4, max_new_tokens=4,
                   learning_rate=lr, save_steps=1)
    q["sft"].update(learning_rate=lr, epochs=1, max_steps=4, batch_size=4)
    return Config.from_params(q, synthetic=True)


def _length_reward(completions, **_) -> list[float]:
    """A reward that differs within every group of a random policy (so every step updates)."""
    return [float(len(c[0]["content"] if isinstance(c, list) else c) % 3) for c in completions]


@pytest.mark.parametrize("method", ["grpo", "hargo"])
def test_rl_at_lr_1e3_stops_and_saves_nothing(tiny_policy, tmp_path, method):
    """save_steps=1 would checkpoint every step: the diverged step must not be checkpointed."""
    from hargo.hardware import setup_torch
    from hargo.training.rl import build_trainer

    model_dir, records = tiny_policy
    q = _tiny_params(1e3)
    setup_torch(q)
    out = tmp_path / "trainer"
    rewards = [_length_reward]
    trainer = build_trainer(q, method, model_dir, records, out, reward_funcs=rewards)
    with pytest.raises(TrainingDiverged, match=rf"rl \({method}\) diverged at step (\d+): "):
        trainer.train()
    step = trainer.state.global_step
    saved = sorted(p.name for p in out.glob("checkpoint-*"))
    assert f"checkpoint-{step}" not in saved, (step, saved)
    # the same run at a healthy learning rate passes the guard
    q = _tiny_params(1e-4)
    diverged = training_record(trainer.state.log_history, q_bounds := DivergenceBounds())
    assert diverged["diverged"] and diverged["problem"].startswith(f"step {step}: ")
    trainer = build_trainer(q, method, model_dir, records, tmp_path / "healthy",
                            reward_funcs=rewards)
    trainer.train()
    # the record the rl stage saves beside the model: 4 logged steps, every peak within bounds
    rec = training_record(trainer.state.log_history, q_bounds)
    assert rec["diverged"] is False and rec["problem"] is None and rec["logged_steps"] == 4
    assert {"loss", "grad_norm"} <= set(rec["peaks"])
    assert all(math.isfinite(p["value"]) and 1 <= p["step"] <= 4 for p in rec["peaks"].values())


def test_sft_at_lr_1e3_stops_and_writes_no_model(tiny_policy, tmp_path):
    from hargo.training import sft

    model_dir, records = tiny_policy
    out = tmp_path / "sft-out"
    with pytest.raises(TrainingDiverged, match=r"sft diverged at step \d+"):
        sft.train(_tiny_params(1e3), model_dir, records, out, report_to=())
    assert not out.exists()


def test_a_failed_stage_run_says_why(mlflow_uri, committed_params):
    import mlflow

    from hargo import tracking

    with pytest.raises(TrainingDiverged):
        with tracking.stage_run("rl", as_config(committed_params), extra_tags={"hargo.method": "hargo"}) as r:
            run_id = r.info.run_id
            raise TrainingDiverged("rl (hargo) diverged at step 2: loss = 3.1e+23")
    run = mlflow.get_run(run_id)
    assert run.info.status == "FAILED"
    assert run.data.tags["hargo.error"] == ("TrainingDiverged: rl (hargo) diverged at step 2: "
                                            "loss = 3.1e+23")


@pytest.mark.fast
def test_check_params_warns_on_an_implausible_learning_rate():
    from typer.testing import CliRunner

    from hargo.cli import app
    from hargo.params import implausible_learning_rates, load_params

    assert implausible_learning_rates(load_params(PARAMS)) == []
    res = CliRunner().invoke(app, ["check-params", "--params", PARAMS, "-S",
                                   "rl.learning_rate=1e3"])
    assert res.exit_code == 0
    assert ("rl.learning_rate = 1000 is outside the plausible range [1e-07, 0.01]"
            in res.output)


HISTORY = [{"loss": 2.0, "grad_norm": 5.0, "learning_rate": 1e-4, "step": 1},
           {"loss": -3.5, "kl": 0.2, "grad_norm": 1.0, "step": 2},
           {"train_runtime": 9.0, "step": 2}]      # the end-of-training entry: nothing checked


def test_training_record_takes_each_peak_and_its_step_by_hand():
    rec = training_record(HISTORY, DivergenceBounds())
    assert rec == {"diverged": False, "problem": None,
                   "bounds": {"max_loss": 100.0, "max_kl": 10.0, "max_grad_norm": 1000.0},
                   "logged_steps": 2,
                   "peaks": {"loss": {"value": 3.5, "step": 2},
                             "grad_norm": {"value": 5.0, "step": 1},
                             "kl": {"value": 0.2, "step": 2}}}


def test_training_record_keeps_the_first_non_finite_value_and_the_first_problem():
    hist = HISTORY + [{"loss": float("nan"), "step": 3}, {"loss": 1e9, "step": 4}]
    rec = training_record(hist, DivergenceBounds())
    assert rec["diverged"] is True and rec["problem"] == "step 3: loss = nan (non-finite)"
    assert math.isnan(rec["peaks"]["loss"]["value"]) and rec["peaks"]["loss"]["step"] == 3
    # tighter bounds: the first step past them is the problem
    rec = training_record(HISTORY, DivergenceBounds(max_grad_norm=4.0))
    assert rec["problem"] == "step 1: grad_norm = 5 (bound |grad_norm| <= 4, " \
        "train.divergence.max_grad_norm)"


def _write(folder: Path, record) -> Path:
    import json

    folder.mkdir(parents=True, exist_ok=True)
    (folder / TRAINING_RECORD).write_text(json.dumps(record))
    return folder


def test_check_training_record_refuses_what_diverged_and_names_the_field(tmp_path):
    healthy = training_record(HISTORY, DivergenceBounds())
    assert check_training_record(_write(tmp_path / "ok", healthy), DivergenceBounds()) == healthy
    with pytest.raises(HargoInputError, match=r"no training record"):
        check_training_record(tmp_path / "empty", DivergenceBounds(), "model folder of 'grpo'")
    bad = training_record(HISTORY + [{"grad_norm": float("inf"), "step": 3}], DivergenceBounds())
    with pytest.raises(HargoInputError, match=r"field 'diverged'.*diverged in training "
                                              r"\(step 3: grad_norm = inf \(non-finite\)\)"):
        check_training_record(_write(tmp_path / "inf", bad), DivergenceBounds())
    # trained under raised bounds (the record says healthy), registered under the defaults
    raised = training_record(HISTORY + [{"loss": 500.0, "step": 3}],
                             DivergenceBounds(max_loss=1e6))
    with pytest.raises(HargoInputError, match=r"field 'peaks.loss'.*reached 500 at step 3, past "
                                              r"train.divergence.max_loss = 100"):
        check_training_record(_write(tmp_path / "raised", raised), DivergenceBounds())
    crafted = {**healthy, "peaks": {"grad_norm": {"value": -5e6, "step": 1}}}   # |value| counts
    with pytest.raises(HargoInputError, match=r"field 'peaks.grad_norm'"):
        check_training_record(_write(tmp_path / "negative", crafted), DivergenceBounds())
    # the same record passes where the bound in force is above its peak
    check_training_record(tmp_path / "raised", DivergenceBounds(max_loss=1000.0))
    with pytest.raises(HargoInputError, match=r"not a training record"):
        check_training_record(_write(tmp_path / "other", {"loss": 1}), DivergenceBounds())
