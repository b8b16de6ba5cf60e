"""hargo.training.rl_logging without a model: the per-task share of zero-variance groups and the
learning signals (loss, grad_norm, adv_logprob) reach the console step line and the summary
that becomes ``metrics/rl/<method>.json``, with hand-computed values."""
from __future__ import annotations

import pytest
from transformers import TrainerControl, TrainerState, TrainingArguments

from hargo.training.rl_logging import RLLoggingCallback, StepRecorder, summarize_history

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
