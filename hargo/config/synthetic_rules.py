"""The rules of the whole ``synthetic`` block of params.yaml that relate its blocks
(:func:`check_synthetic`) and check its lists (:func:`check_synthetic_keys`); the blocks
themselves are :mod:`hargo.config.synthetic`'s, which re-exports both. Imports only
:mod:`hargo.param_values` and, lazily, :mod:`hargo.config.registries`."""
from __future__ import annotations

from typing import Mapping

from hargo.param_values import ParamsError

__all__ = ["check_synthetic_keys", "check_synthetic"]


def check_synthetic_keys(raw: Mapping) -> None:
    """``synthetic.methods`` and ``synthetic.seeds`` of the raw block (when given).

    Raises:
        ParamsError: a method outside the GRPO family or listed twice; seeds not a non-empty
            list of distinct integers."""
    from hargo.config import registries           # the method registry's look-ups

    if "methods" in raw:
        methods = list(raw["methods"] or ())
        grpo_family = tuple(n for n, m in registries.rl_methods().items()
                            if m.family == "grpo_family")
        if len(set(methods)) != len(methods):
            raise ParamsError(f"synthetic.methods: a method is listed twice: {methods}")
        if not methods or any(m not in grpo_family for m in methods):
            raise ParamsError(f"synthetic.methods: GRPO-family methods {list(grpo_family)} "
                              f"only, got {methods}")
    if "seeds" in raw:
        seeds = raw["seeds"]
        if not isinstance(seeds, (list, tuple)) or not seeds or len(set(seeds)) != len(seeds) \
                or any(isinstance(x, bool) or not isinstance(x, int) or x < 0 for x in seeds):
            raise ParamsError(f"synthetic.seeds: a non-empty list of distinct integers >= 0 "
                              f"(the pipeline's seed's range), got {seeds!r}")


def check_synthetic(s) -> None:
    """The rules of the built ``synthetic`` block ``s`` (:class:`hargo.config.Synthetic`) that
    relate its blocks: train splits of >= 1 record, ``homogeneous`` false, and every RL pool and
    SFT subset within the train records (the held-out pool within those SFT did not see).

    Raises:
        ParamsError: the broken rule, naming its keys."""
    data, sft, rl = s.data, s.sft, s.rl
    if data.n_train < 1 or data.n_eval < 1:
        raise ParamsError(f"synthetic.data: n_train and n_eval must be >= 1, got {data.n_train} "
                          f"and {data.n_eval}")
    if data.homogeneous:
        raise ParamsError("synthetic.data.homogeneous: leave it false; the homogeneous control "
                          "is the second configuration of every run")
    for where, counts in (("synthetic.rl.prompts_per_task", rl.prompts_per_task),
                          ("synthetic.sft.examples_per_task", sft.examples_per_task)):
        short = {t: n for t, n in counts.items() if n > data.n_train}
        if short:
            raise ParamsError(f"{where}: {short} exceed synthetic.data.n_train {data.n_train}")
    if rl.pool == "held_out":
        short = {t: n for t, n in rl.prompts_per_task.items()
                 if n > data.n_train - sft.examples_per_task[t]}
        if short:
            raise ParamsError(
                f"synthetic.rl.prompts_per_task: {short} exceed the train records SFT did not see "
                f"(synthetic.data.n_train {data.n_train} - synthetic.sft.examples_per_task "
                f"{dict(sft.examples_per_task)}; synthetic.rl.pool is held_out)")
