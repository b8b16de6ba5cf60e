"""Reward noise for the synthetic test bed (``synthetic.data.noise_{yesno,short,long}``): the
mechanism "noisy rewards amplified by the std division" (issue 40), per task.

:class:`NoisyReward` is :class:`hargo.data.synthetic.SyntheticReward` plus, for every reward of
a task ``t`` with ``config.noise(t) = s > 0``, ``scale(t) * e`` with ``e ~ N(0, s^2)``: the noise
is in the task's unscaled reward units (so a scale knob keeps the signal-to-noise ratio), and
it is **not clipped** (a yes/no reward may read 1.07 or -0.05; clipping would bias the mean).
Each task draws from its own ``random.Random(f"hargo.synthetic.noise:{seed}:{t}")`` stream with
``gauss(0.0, s)``, one draw per reward of that task in call order (a task without noise draws
nothing), so a run is reproducible from its seed and a task's noise does not depend on how many
rewards the other tasks had; two methods with the same seed see the same noise sequence. Only
training rewards are noisy: evaluation (:func:`hargo.compare.synthetic.score`) reads the clean
reward. Pure Python.
"""
from __future__ import annotations

import random

from hargo.config.synthetic import SYNTHETIC_TASKS
from hargo.data.synthetic import SyntheticConfig, SyntheticReward

__all__ = ["NoisyReward", "noise_stream", "reward_function"]


def noise_stream(seed: int, task: str) -> random.Random:
    """The noise stream of ``task`` in a run seeded ``seed`` (module docstring)."""
    return random.Random(f"hargo.synthetic.noise:{int(seed)}:{task}")


class NoisyReward(SyntheticReward):
    """A TRL reward function: :class:`SyntheticReward`'s rewards (a list of N floats, one per
    completion) plus each task's seeded Gaussian noise times its scale (module docstring).
    ``__name__`` stays ``"synthetic_reward"``.

    Args:
        config: the tasks' config (its ``noise_*`` and ``scale_*``).
        seed: the RL run's seed.
    """

    def __init__(self, config: SyntheticConfig | None = None, seed: int = 0):
        super().__init__(config)
        self.seed = int(seed)
        self.streams = {t: noise_stream(self.seed, t) for t in SYNTHETIC_TASKS}

    def __call__(self, prompts=None, completions=None, task=None, answer=None, label=None,
                 **kwargs) -> list[float]:
        clean = super().__call__(prompts, completions, task, answer, label, **kwargs)
        out = []
        for t, r in zip(task, clean, strict=True):
            s = self.config.noise(t)
            out.append(r + self.config.scale(t) * self.streams[t].gauss(0.0, s) if s > 0 else r)
        return out


def reward_function(config: SyntheticConfig, seed: int) -> SyntheticReward:
    """The training reward of a run: :class:`SyntheticReward` when no task is noisy (today's
    bed, bit for bit), else :class:`NoisyReward` seeded ``seed``."""
    if any(config.noise(t) > 0 for t in SYNTHETIC_TASKS):
        return NoisyReward(config, seed)
    return SyntheticReward(config)
