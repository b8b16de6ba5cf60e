"""params.yaml ``synthetic``, checked: the plan of the synthetic test bed
(:mod:`hargo.compare.synthetic`). Light imports only, so ``hargo check-params`` (the ``params``
stage, :func:`hargo.params.validate_params`) checks the block without loading torch."""
from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Mapping

from hargo.data.synthetic import SYNTHETIC_TASKS, SyntheticConfig
from hargo.models.tiny import TinyPolicyConfig
from hargo.param_values import ParamsError, as_number
from hargo.methods import method_names

__all__ = ["CONFIGURATIONS", "SyntheticPlan", "plan", "configuration", "DATA_DIR", "MODEL_DIR",
           "RUNS_DIR", "METRICS_DIR", "REPORT_MD", "FIGURES_DIR"]

#: The reward configurations every run of the test bed trains in.
CONFIGURATIONS: tuple[str, ...] = ("heterogeneous", "homogeneous")
#: The stages' outputs (synthetic/dvc.yaml), relative to the repository root.
DATA_DIR = Path("data") / "synthetic"
MODEL_DIR = Path("models") / "synthetic" / "sft"
RUNS_DIR = Path("checkpoints") / "synthetic"
METRICS_DIR = Path("metrics") / "synthetic"
REPORT_MD = Path("reports") / "synthetic.md"
FIGURES_DIR = Path("reports") / "synthetic"


@dataclass(frozen=True)
class SyntheticPlan:
    """params.yaml ``synthetic``, checked (:func:`plan`).

    Attributes:
        data: the tasks (:class:`hargo.data.synthetic.SyntheticConfig`; ``homogeneous`` is
            set per configuration, not here).
        policy: the tiny policy (:class:`hargo.models.tiny.TinyPolicyConfig`).
        sft: ``epochs``, ``learning_rate``, ``batch_size``, ``max_length`` (tokens),
            ``examples_per_task`` (task -> the first n train records of the task SFT sees: how
            much SFT leaves for RL to learn per task; 0 leaves a task to RL alone),
            ``hedge_share`` (the share of each task's SFT targets written as a hedge,
            :func:`hargo.data.synthetic.hedge`: the SFT policy learns to hedge that often, a
            habit every reward pays less for, so RL has a behaviour to unlearn, as on MLPerf
            where SFT answers verbosely).
        rl: ``prompts_per_task`` (task -> prompts in the RL pool: the task mix; 0 leaves a task
            out), ``pool`` (``held_out``: drawn from the train records SFT did not see, those
            past ``sft.examples_per_task``; ``all``: from every train record), ``steps``, ``prompts_per_step``, ``num_generations``, ``max_new_tokens`` (task
            -> tokens), ``temperature``, ``learning_rate``.
        methods: GRPO-family methods compared (``hargo`` among them for the intervals).
        seeds: RL seeds; seed s of one method is paired with seed s of another.
        eval_max_new_tokens: task -> tokens for the greedy evaluation.
        eval_samples: k >= 0; with k > 0 every evaluation also draws k completions per prompt
            at the RL sampling temperature (``synthetic.rl.temperature``) and reports their
            mean reward (``sampled_reward``): what RL optimises, beside the greedy answer.
        eval_every: evaluate the policy also every this many RL steps (0: at the end only);
            the curve is ``eval_curve`` of each run.
        resamples, confidence: of the paired bootstrap.
        parallel_runs: runs trained at once by ``synthetic_rl`` (spawned processes, each
            with ``train.threads`` / ``parallel_runs`` torch threads, at least 1). On a 2-core
            AMX Xeon, 2 one-thread runs at once finished 4 runs of 30 steps 1.34x sooner than
            one two-thread run after another (docs/synthetic.md). A run's numbers depend on its thread
            count (float reductions), so changing this changes results slightly; a script that
            calls ``train_configuration`` with it > 1 needs the ``if __name__ == "__main__"``
            guard of Python's spawn start method.
    """

    data: SyntheticConfig
    policy: TinyPolicyConfig
    sft: dict
    rl: dict
    methods: tuple[str, ...]
    seeds: tuple[int, ...]
    eval_max_new_tokens: dict
    eval_samples: int = 0
    eval_every: int = 0
    parallel_runs: int = 1
    resamples: int = 2000
    confidence: float = 0.95


_SFT_KEYS = {"epochs": int, "learning_rate": float, "batch_size": int, "max_length": int,
             "examples_per_task": dict, "hedge_share": "share"}
_RL_KEYS = {"prompts_per_task": dict, "pool": str, "steps": int, "prompts_per_step": int,
            "num_generations": int, "max_new_tokens": dict, "temperature": float,
            "learning_rate": float}


#: the allowed values of the string keys
_CHOICES = {"pool": ("held_out", "all")}


def _block(d: Any, keys: Mapping[str, type], where: str) -> dict:
    if not isinstance(d, Mapping):
        raise ParamsError(f"{where}: expected a mapping, got {d!r}")
    missing, unknown = sorted(set(keys) - set(d)), sorted(set(d) - set(keys))
    if missing or unknown:
        raise ParamsError(f"{where}: " + "; ".join(
            ([f"missing {missing}"] if missing else []) + ([f"unknown {unknown}"] if unknown else [])))
    out = {}
    for k, t in keys.items():
        v = d[k]
        if t is dict:
            out[k] = _per_task(v, f"{where}.{k}",
                               allow_zero=k in ("prompts_per_task", "examples_per_task"))
        elif t == "share":
            x = as_number(f"{where}.{k}", v)
            if not 0 <= x <= 1:
                raise ParamsError(f"{where}.{k}: expected a number in [0, 1], got {v!r}")
            out[k] = float(x)
        elif t is str:
            if v not in _CHOICES[k]:
                raise ParamsError(f"{where}.{k}: expected one of {list(_CHOICES[k])}, got {v!r}")
            out[k] = v
        elif t is int:
            n = as_number(f"{where}.{k}", v, integer=True)
            if n < 1:
                raise ParamsError(f"{where}.{k}: expected an integer >= 1, got {v!r}")
            out[k] = n
        else:
            x = as_number(f"{where}.{k}", v)
            if not x > 0:
                raise ParamsError(f"{where}.{k}: expected a number > 0, got {v!r}")
            out[k] = float(x)
    return out


def _per_task(v: Any, where: str, allow_zero: bool = False) -> dict:
    if not isinstance(v, Mapping) or sorted(v) != sorted(SYNTHETIC_TASKS):
        raise ParamsError(f"{where}: expected one integer per task {list(SYNTHETIC_TASKS)}, "
                          f"got {v!r}")
    lo = 0 if allow_zero else 1
    out = {}
    for t in SYNTHETIC_TASKS:
        n = as_number(f"{where}.{t}", v[t], integer=True)
        if n < lo:
            raise ParamsError(f"{where}.{t}: expected an integer >= {lo}, got {v[t]!r}")
        out[t] = n
    return out


def plan(params: Mapping) -> SyntheticPlan:
    """params.yaml ``synthetic`` as a :class:`SyntheticPlan`.

    Raises:
        ParamsError: a missing, unknown or bad key, named as ``synthetic.<block>.<key>``; a
            method outside the GRPO family; no seeds; an RL pool smaller than a step.
    """
    s = params.get("synthetic")
    if not isinstance(s, Mapping):
        raise ParamsError("params.yaml has no `synthetic` block (the synthetic test bed)")
    expected = {"data", "policy", "sft", "rl", "methods", "seeds", "evaluate", "bootstrap",
                "parallel_runs"}
    if set(s) != expected:
        raise ParamsError(f"synthetic: expected keys {sorted(expected)}, got {sorted(s)}")
    try:
        data = SyntheticConfig.from_params(s["data"])
    except ValueError as e:
        raise ParamsError(f"synthetic.data: {e}") from None
    try:
        policy = TinyPolicyConfig.from_params(s["policy"])
    except ValueError as e:
        raise ParamsError(str(e)) from None
    if data.n_train < 1 or data.n_eval < 1:
        raise ParamsError(f"synthetic.data: n_train and n_eval must be >= 1, got {data.n_train} "
                          f"and {data.n_eval}")
    if data.homogeneous:
        raise ParamsError("synthetic.data.homogeneous: leave it false; the homogeneous control "
                          "is the second configuration of every run")
    methods = tuple(s["methods"] or ())
    grpo_family = method_names("grpo_family")
    bad = [m for m in methods if m not in grpo_family]
    if len(set(methods)) != len(methods):
        raise ParamsError(f"synthetic.methods: a method is listed twice: {list(methods)}")
    if not methods or bad:
        raise ParamsError(f"synthetic.methods: GRPO-family methods {list(grpo_family)} only, "
                          f"got {list(methods)}")
    seeds = s["seeds"]
    if not isinstance(seeds, (list, tuple)) or not seeds or len(set(seeds)) != len(seeds) or any(
            isinstance(x, bool) or not isinstance(x, int) for x in seeds):
        raise ParamsError(f"synthetic.seeds: a non-empty list of distinct integers, got {seeds!r}")
    sft = _block(s["sft"], _SFT_KEYS, "synthetic.sft")
    rl = _block(s["rl"], _RL_KEYS, "synthetic.rl")
    if sum(rl["prompts_per_task"].values()) < rl["prompts_per_step"]:
        raise ParamsError(f"synthetic.rl.prompts_per_task: {sum(rl['prompts_per_task'].values())}"
                          f" prompts in the pool, fewer than prompts_per_step "
                          f"{rl['prompts_per_step']}")
    for where, counts in (("synthetic.rl.prompts_per_task", rl["prompts_per_task"]),
                          ("synthetic.sft.examples_per_task", sft["examples_per_task"])):
        short = {t: n for t, n in counts.items() if n > data.n_train}
        if short:
            raise ParamsError(f"{where}: {short} exceed synthetic.data.n_train {data.n_train}")
    if rl["pool"] == "held_out":
        short = {t: n for t, n in rl["prompts_per_task"].items()
                 if n > data.n_train - sft["examples_per_task"][t]}
        if short:
            raise ParamsError(
                f"synthetic.rl.prompts_per_task: {short} exceed the train records SFT did not see "
                f"(synthetic.data.n_train {data.n_train} - synthetic.sft.examples_per_task "
                f"{sft['examples_per_task']}; synthetic.rl.pool is held_out)")
    if not any(sft["examples_per_task"].values()):
        raise ParamsError("synthetic.sft.examples_per_task: SFT needs at least one example")
    ev = s["evaluate"]
    if not isinstance(ev, Mapping) or "max_new_tokens" not in ev or \
            set(ev) - {"max_new_tokens", "samples", "every_steps"}:
        raise ParamsError(f"synthetic.evaluate: expected max_new_tokens and optionally samples "
                          f"and every_steps, got {ev!r}")
    eval_extra = {}
    for key in ("samples", "every_steps"):
        n = as_number(f"synthetic.evaluate.{key}", ev.get(key, 0), integer=True)
        if n < 0:
            raise ParamsError(f"synthetic.evaluate.{key}: expected an integer >= 0, got "
                              f"{ev.get(key)!r}")
        eval_extra[key] = n
    b = s["bootstrap"]
    if not isinstance(b, Mapping) or set(b) != {"resamples", "confidence"}:
        raise ParamsError(f"synthetic.bootstrap: expected resamples and confidence, got {b!r}")
    resamples = as_number("synthetic.bootstrap.resamples", b["resamples"], integer=True)
    confidence = as_number("synthetic.bootstrap.confidence", b["confidence"])
    if resamples < 1 or not 0 < confidence < 1:
        raise ParamsError(f"synthetic.bootstrap: resamples >= 1 and 0 < confidence < 1, got {b!r}")
    parallel = as_number("synthetic.parallel_runs", s["parallel_runs"], integer=True)
    if parallel < 1:
        raise ParamsError(f"synthetic.parallel_runs: expected an integer >= 1, got "
                          f"{s['parallel_runs']!r}")
    return SyntheticPlan(data=data, policy=policy, sft=sft, rl=rl, methods=methods,
                         seeds=tuple(int(x) for x in seeds),
                         eval_max_new_tokens=_per_task(ev["max_new_tokens"],
                                                       "synthetic.evaluate.max_new_tokens"),
                         eval_samples=eval_extra["samples"], eval_every=eval_extra["every_steps"],
                         parallel_runs=parallel, resamples=resamples,
                         confidence=float(confidence))


def configuration(p: SyntheticPlan, name: str) -> SyntheticConfig:
    """The reward configuration ``name`` (:data:`CONFIGURATIONS`).

    Raises:
        ValueError: an unknown name.
    """
    if name not in CONFIGURATIONS:
        raise ValueError(f"unknown synthetic configuration {name!r}; valid: {list(CONFIGURATIONS)}")
    return replace(p.data, homogeneous=name == "homogeneous")
