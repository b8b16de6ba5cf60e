"""hargo.training.rl_logging without a model: the per-task share of zero-variance groups and the
learning signals (loss, grad_norm, adv_logprob) reach the console step line and the summary
that becomes ``metrics/rl/<method>.json``, with hand-computed values."""
from __future__ import annotations

import math

import pytest
from transformers import TrainerControl, TrainerState, TrainingArguments

from hargo.training.rl_logging import RLLoggingCallback, StepRecorder, summarize_history

pytestmark = pytest.mark.fast

G = 2


def _generation(rec: StepRecorder, rewards: list[float], tasks: list[str]) -> None:
    n = len(rewards)
    rec.add_generation(tasks=tasks, rewards=rewards, advantages=[0.0] * n, weights=[1 / G] * n,
                       completion_lengths=[3.0] * n, group_size=G)


def _step(cb, rec, state, args, step, rewards, tasks, adv_logprob, logs):
    _generation(rec, rewards, tasks)
    rec.add_loss(tasks=tasks, kl=None, clip_fraction=[0.0] * len(tasks), adv_logprob=adv_logprob)
    state.global_step = step
    cb.on_step_begin(args, state, TrainerControl())
    cb.on_step_end(args, state, TrainerControl())
    if logs is not None:
        cb.on_log(args, state, TrainerControl(), logs=logs)


def test_zero_variance_share_per_task_and_learning_signals_in_line_and_summary(tmp_path):
    """Two steps of 3 groups of G = 2: race_c has two groups, mlperf one.

    step 1: race_c (1, 1) all equal, race_c (1, 0) not, mlperf (0.5, 0.5) all equal
            -> race_c 1/2, mlperf 1, all 2/3;
    step 2: race_c (0, 0) and (0, 0) all equal, mlperf (0.2, 0.1) not -> race_c 1, mlperf 0,
            all 2/3. Means over the steps: race_c 0.75, mlperf 0.5, all 2/3.
    adv_logprob per response; its all-scope mean is step 1: (-1 + 1 + 0 + 0 + 0 + 0) / 6 = 0,
    step 2: (0 + 0 + 0 + 0 - 0.6 + 0.3) / 6 = -0.05.
    """
    lines: list[str] = []
    rec = StepRecorder()
    cb = RLLoggingCallback(rec, "grpo", print_fn=lines.append)
    args = TrainingArguments(output_dir=str(tmp_path), report_to="none")
    state = TrainerState(max_steps=3)
    tasks = ["race_c", "race_c", "race_c", "race_c", "mlperf", "mlperf"]
    _step(cb, rec, state, args, 1, [1, 1, 1, 0, 0.5, 0.5], tasks, [-1, 1, 0, 0, 0, 0],
          {"loss": 0.0, "grad_norm": 0.25, "learning_rate": 1e-5})
    assert len(lines) == 1            # printed once the trainer's log of the step arrived
    line = lines[0]
    assert line.startswith("[rl grpo] step 1/3")
    assert "loss 0  grad_norm 0.25  adv_logp 0" in line
    assert "zero-var mlperf 1.00 race_c 0.50" in line
    assert rec.history[0]["race_c/zero_variance_groups"] == 0.5
    assert rec.history[0]["all/zero_variance_groups"] == pytest.approx(2 / 3)

    # step 2's trainer log never comes: the line goes out at the end of training, without it
    _step(cb, rec, state, args, 2, [0, 0, 0, 0, 0.2, 0.1], tasks, [0, 0, 0, 0, -0.6, 0.3], None)
    assert len(lines) == 1
    cb.on_train_end(args, state, TrainerControl())
    assert len(lines) == 2
    assert "loss" not in lines[1] and "adv_logp -0.05" in lines[1]
    assert "zero-var mlperf 0.00 race_c 1.00" in lines[1]

    s = summarize_history(rec.history)
    z = s["zero_variance_groups"]
    assert z["race_c"] == {"final": 1.0, "mean_over_steps": 0.75}
    assert z["mlperf"] == {"final": 0.0, "mean_over_steps": 0.5}
    assert z["all"]["final"] == pytest.approx(2 / 3)
    assert z["all"]["mean_over_steps"] == pytest.approx(2 / 3)
    learn = s["learning"]
    assert learn["loss"] == {"first": 0.0, "final": 0.0, "mean_over_steps": 0.0}
    assert learn["grad_norm"] == {"first": 0.25, "final": 0.25, "mean_over_steps": 0.25}
    assert learn["adv_logprob"]["first"] == pytest.approx(0.0, abs=1e-12)
    assert learn["adv_logprob"]["final"] == pytest.approx(-0.05)
    assert learn["adv_logprob"]["mean_over_steps"] == pytest.approx(-0.025)
    assert "kl" not in learn and "adv_log_ratio" not in learn   # no reference ran

    # the history (checkpoint state) keeps loss and grad_norm; a restore gives them back
    again = StepRecorder()
    again.load_state_dict(rec.state_dict())
    assert again.history[0]["grad_norm"] == 0.25


def test_add_loss_rejects_lengths_that_differ():
    with pytest.raises(ValueError, match="differ in length"):
        StepRecorder().add_loss(tasks=["a", "b"], kl=None, clip_fraction=[0.0, 0.0],
                                adv_logprob=[1.0])


def test_finish_step_metrics_by_hand_with_hargo_weights():
    """Every per-task diagnostic of one step against hand arithmetic: two batches of G = 2 (one
    race_c and one plp group, then one mlperf group), HARGO-style non-uniform weights, two loss
    micro-batches with per-response KL. Values chosen so a wrong scope, mean, std, max or
    accuracy rule changes a number.

    race_c  rewards (1, 0)    w (0.75, 0.25)  A (1, -1)    lengths (4, 6)  c (0.6, 0.2)  l (-1, -3)
    plp     rewards (0.5, 0.4) w (0.6, 0.4)   A (0.5, -0.5) lengths (10, 20) c (0.5, 0.5) l (-2, -2)
    mlperf  rewards (0.5, 0.5) w (0.5, 0.5)   A (0, 0)      lengths (2, 2)  c (0.9, 0.1) l (0, -4)
    """
    rec = StepRecorder()
    rec.add_generation(tasks=["race_c", "race_c", "plp", "plp"], rewards=[1.0, 0.0, 0.5, 0.4],
                       advantages=[1.0, -1.0, 0.5, -0.5], weights=[0.75, 0.25, 0.6, 0.4],
                       completion_lengths=[4, 6, 10, 20], group_size=2,
                       confidence=[0.6, 0.2, 0.5, 0.5], ref_logprob=[-1.0, -3.0, -2.0, -2.0],
                       baseline=-1.5, generation_s=3.0, scoring_s=1.0)
    rec.add_generation(tasks=["mlperf", "mlperf"], rewards=[0.5, 0.5], advantages=[0.0, 0.0],
                       weights=[0.5, 0.5], completion_lengths=[2, 2], group_size=2,
                       confidence=[0.9, 0.1], ref_logprob=[0.0, -4.0], baseline=-1.75,
                       generation_s=2.0, scoring_s=0.5)
    rec.add_loss(tasks=["race_c", "race_c", "plp"], kl=[0.1, 0.3, 0.05],
                 clip_fraction=[0.0, 0.5, 0.25], adv_logprob=[-2.0, 1.0, 0.5])
    rec.add_loss(tasks=["plp", "mlperf", "mlperf"], kl=[0.15, 0.0, 0.2],
                 clip_fraction=[0.0, 0.0, 1.0], adv_logprob=[0.5, 0.0, 0.0])
    m = rec.finish_step(7, step_s=10.0)
    want = {
        "step": 7,
        # race_c: mean 0.5, population std 0.5; accuracy 1/2 (reward 1 is correct)
        "race_c/n_completions": 2.0, "race_c/reward_mean": 0.5, "race_c/reward_std": 0.5,
        "race_c/accuracy": 0.5, "race_c/completion_length": 5.0, "race_c/advantage_mean": 0.0,
        "race_c/weight_mean": 0.5, "race_c/weight_max": 0.75, "race_c/confidence_mean": 0.4,
        "race_c/ref_logprob_mean": -2.0, "race_c/zero_variance_groups": 0.0,
        "race_c/kl": 0.2, "race_c/clip_fraction": 0.25, "race_c/adv_logprob": -0.5,
        # plp: mean 0.45, std 0.05; accuracy 1/2 (0.5 reaches the 0.5 threshold, 0.4 does not)
        "plp/n_completions": 2.0, "plp/reward_mean": 0.45, "plp/reward_std": 0.05,
        "plp/accuracy": 0.5, "plp/completion_length": 15.0, "plp/advantage_mean": 0.0,
        "plp/weight_mean": 0.5, "plp/weight_max": 0.6, "plp/confidence_mean": 0.5,
        "plp/ref_logprob_mean": -2.0, "plp/zero_variance_groups": 0.0,
        "plp/kl": 0.1, "plp/clip_fraction": 0.125, "plp/adv_logprob": 0.5,
        # mlperf: 0.5 is partial credit, not correct; one all-equal group
        "mlperf/n_completions": 2.0, "mlperf/reward_mean": 0.5, "mlperf/reward_std": 0.0,
        "mlperf/accuracy": 0.0, "mlperf/completion_length": 2.0, "mlperf/advantage_mean": 0.0,
        "mlperf/weight_mean": 0.5, "mlperf/weight_max": 0.5, "mlperf/confidence_mean": 0.5,
        "mlperf/ref_logprob_mean": -2.0, "mlperf/zero_variance_groups": 1.0,
        "mlperf/kl": 0.1, "mlperf/clip_fraction": 0.5, "mlperf/adv_logprob": 0.0,
        # all six: rewards (1, 0, .5, .4, .5, .5) mean 2.9/6, squares sum 1.91
        "all/n_completions": 6.0, "all/reward_mean": 2.9 / 6,
        "all/reward_std": math.sqrt(1.91 / 6 - (2.9 / 6) ** 2),
        "all/accuracy": 2 / 6, "all/completion_length": 44 / 6, "all/advantage_mean": 0.0,
        "all/weight_mean": 0.5, "all/weight_max": 0.75, "all/confidence_mean": 2.8 / 6,
        "all/ref_logprob_mean": -2.0, "all/zero_variance_groups": 1 / 3,
        "all/kl": 0.8 / 6, "all/clip_fraction": 1.75 / 6, "all/adv_logprob": 0.0,
        # the last batch's baseline; times summed over the batches, update = step - the rest
        "ema_baseline": -1.75, "time/generation_s": 5.0, "time/scoring_s": 1.5,
        "time/step_s": 10.0, "time/update_s": 3.5,
        # update mass sum w|A|: race_c .75 + .25 = 1, plp .6 * .5 + .4 * .5 = .5, mlperf 0
        "race_c/update_mass": 1.0, "plp/update_mass": 0.5, "mlperf/update_mass": 0.0,
        "all/update_mass": 1.5, "race_c/update_mass_share": 2 / 3,
        "plp/update_mass_share": 1 / 3, "mlperf/update_mass_share": 0.0,
    }
    assert set(m) == set(want)
    for k, v in want.items():
        assert m[k] == pytest.approx(v, abs=1e-12), k
    assert rec.history == [m]
    # buffers were cleared: the next step without any record holds only its number
    assert rec.finish_step(8) == {"step": 8}
