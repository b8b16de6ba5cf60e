"""hargo/training/reference.py: the reference model's log-probs at several temperatures from one
pass's hidden states, checked against values computed by hand, and its other pure helpers."""
from __future__ import annotations

import contextlib
import math
from types import SimpleNamespace

import pytest
import torch

from hargo.training.reference import (check_temperatures, lm_head_scaling,
                                      logps_at_temperatures, reference_lm)


def _head():
    """An LM head over a 3-token vocabulary, H = 2: logits z = (h_0, h_1, 0)."""
    head = torch.nn.Linear(2, 3, bias=False)
    with torch.no_grad():
        head.weight.copy_(torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.0, 0.0]]))
    return head


HIDDEN = torch.tensor([[[2.0, 0.0], [0.0, 0.0], [5.0, 5.0]]])     # (B=1, T=3, H=2)
LABELS = torch.tensor([[0, 2, 1]])
MASK = torch.tensor([[1, 1, 0]])


def test_logps_at_temperatures_by_hand():
    at_1, at_2 = logps_at_temperatures(HIDDEN, _head(), LABELS, MASK, (1.0, 2.0))
    # token 0: z = (2, 0, 0), label 0: T=1 log(e^2 / (e^2 + 2)); T=2 z/T = (1, 0, 0): log(e/(e+2))
    # token 1: z = (0, 0, 0): log(1/3) at every T; token 2: padding -> 0
    exp1 = [2 - math.log(math.e ** 2 + 2), -math.log(3), 0.0]
    exp2 = [1 - math.log(math.e + 2), -math.log(3), 0.0]
    torch.testing.assert_close(at_1, torch.tensor([exp1]), atol=1e-6, rtol=0)
    torch.testing.assert_close(at_2, torch.tensor([exp2]), atol=1e-6, rtol=0)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="no CUDA device"))])
def test_logps_at_temperatures_equals_log_softmax(device):
    torch.manual_seed(0)
    head = torch.nn.Linear(4, 7).to(device)
    h, y = torch.randn(2, 3, 4), torch.randint(0, 7, (2, 3))     # hidden states on the CPU:
    mask = torch.ones(2, 3)                                      # moved to the head's device
    for fp32 in (False, True):
        (lp,) = logps_at_temperatures(h, head, y, mask, (0.7,), fp32_head=fp32,
                                      autocast=contextlib.nullcontext)
        with torch.no_grad():
            ref = torch.log_softmax(head(h.to(device)) / 0.7, dim=-1).gather(
                -1, y.to(device).unsqueeze(-1)).squeeze(-1)
        assert lp.device.type == device
        torch.testing.assert_close(lp, ref, atol=1e-5, rtol=0)


@pytest.mark.parametrize("bad", [0.0, -1.0])
def test_temperatures_must_be_positive(bad):
    with pytest.raises(ValueError, match="temperatures must be > 0"):
        check_temperatures((1.0, bad))
    with pytest.raises(ValueError, match="temperatures must be > 0"):
        logps_at_temperatures(HIDDEN, _head(), LABELS, MASK, (bad,))
    assert check_temperatures((1, 0.6)) == [1.0, 0.6]


def test_lm_head_scaling():
    def cfg(**kw):
        text = SimpleNamespace(model_type="llama", **kw)
        return SimpleNamespace(get_text_config=lambda: text)

    assert lm_head_scaling(cfg()) == (None, 1.0)
    assert lm_head_scaling(cfg(final_logit_softcapping=30.0, logit_scale=0.5)) == (30.0, 0.5)
    assert lm_head_scaling(cfg(logits_scaling=4.0)) == (None, 0.25)


def test_reference_lm_prefers_the_separate_reference_model():
    ref, policy = object(), object()
    call, lm, ctx = reference_lm(ref, policy, unwrap=lambda m: ("unwrapped", m))
    assert call is ref and lm == ("unwrapped", ref)
    assert isinstance(ctx, contextlib.nullcontext)
