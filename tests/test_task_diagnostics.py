"""hargo/training/task_diagnostics.py: the per-response loss diagnostics, checked against values
computed by hand (float64), and the task indices the trainer carries through TRL's batch."""
from __future__ import annotations

import math

import pytest
import torch

from hargo.training.task_diagnostics import (dataset_tasks, loss_diagnostics, task_index)

# Two responses of one group (G = 2), two token slots; response 1's second token is padding.
LOGPS = torch.tensor([[-1.0, -2.0], [-0.5, 0.0]], dtype=torch.float64)
MASK = torch.tensor([[1.0, 1.0], [1.0, 0.0]], dtype=torch.float64)
ADV = torch.tensor([1.0, -1.0], dtype=torch.float64)
REF = torch.tensor([[-1.0, -1.0], [-0.5, -3.0]], dtype=torch.float64)
# ratios exp(logps - old): response 0 [1, e^0.5 = 1.6487], response 1 [e^-0.5 = 0.6065, 1]
OLD = torch.tensor([[-1.0, -2.5], [0.0, 0.0]], dtype=torch.float64)


def _close(t, expected):
    torch.testing.assert_close(t, torch.tensor(expected, dtype=torch.float64), atol=1e-12, rtol=0,
                               check_dtype=False)   # clip fractions are float32 (as before)


def test_kl_and_log_ratio_by_hand():
    d = loss_diagnostics(LOGPS, MASK, ADV, group_size=2, eps_low=0.2, eps_high=0.2,
                         ref_logps=REF, weights=torch.tensor([0.5, 0.5], dtype=torch.float64))
    # k3 = exp(x) - x - 1, x = ref - logp: response 0 x = [0, 1] -> [0, e - 2], mean (e - 2)/2;
    # response 1 x = [0, (padding)] -> 0.
    _close(d.kl, [(math.e - 2) / 2, 0.0])
    # G w_i = 1: A_i times the mean log-prob over the response's own tokens.
    _close(d.adv_logprob, [1 * (-1 - 2) / 2, -1 * -0.5])
    # log-ratio logp - ref: response 0 [0, -1] -> -0.5; response 1 [0] -> 0.
    _close(d.adv_log_ratio, [-0.5, 0.0])
    # no old log-probs: ratio 1, nothing clipped
    _close(d.clip_fraction, [0.0, 0.0])


def test_weights_scale_by_group_size():
    d = loss_diagnostics(LOGPS, MASK, ADV, group_size=2, eps_low=0.2, eps_high=0.2,
                         weights=torch.tensor([0.8, 0.2], dtype=torch.float64))
    _close(d.adv_logprob, [2 * 0.8 * -1.5, 2 * 0.2 * 0.5])      # G w_i x the unweighted value
    assert d.kl is None and d.adv_log_ratio is None              # no reference model


def test_clip_fraction_by_hand():
    d = loss_diagnostics(LOGPS, MASK, ADV, group_size=2, eps_low=0.2, eps_high=0.2,
                         old_logps=OLD)
    # response 0 (A > 0): 1.6487 > 1.2 clipped on 1 of 2 tokens; response 1 (A < 0):
    # 0.6065 < 0.8 clipped on its only real token.
    _close(d.clip_fraction, [0.5, 1.0])
    # delta caps the ratio first: 1.6487 -> 1.1 <= 1.2, no longer clipped
    d = loss_diagnostics(LOGPS, MASK, ADV, group_size=2, eps_low=0.2, eps_high=0.2, delta=1.1,
                         old_logps=OLD)
    _close(d.clip_fraction, [0.0, 1.0])


def test_task_index_appends_new_tasks_and_counts_none_as_all():
    names = ["plp", "race_c"]
    assert task_index(names, "race_c") == 1
    assert task_index(names, "mlperf") == 2 and names == ["plp", "race_c", "mlperf"]
    assert task_index(names, None) == 3 and names[-1] == "all"


def test_dataset_tasks():
    class Rows:
        column_names = ["prompt", "task"]

        def __getitem__(self, col):
            return {"task": ["race_c", "plp", "race_c"]}[col]

    assert dataset_tasks(Rows(), "task") == ["plp", "race_c"]
    assert dataset_tasks(Rows(), "missing") == ["all"]
    assert dataset_tasks(None, "task") == ["all"]


def test_no_trainer_needed():
    import inspect

    import hargo.training.task_diagnostics as m

    assert "trainer" not in inspect.signature(m.loss_diagnostics).parameters
    with pytest.raises(ValueError, match="group_size"):
        loss_diagnostics(LOGPS, MASK, ADV, group_size=0, eps_low=0.2, eps_high=0.2)
