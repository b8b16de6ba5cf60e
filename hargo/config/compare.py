"""params.yaml ``compare`` and ``synthetic``, typed: the two comparisons of methods. ``compare``
is the nine-method comparison on the HPC-GPT tasks (its preference pairs, evaluation and report,
and the ``compare.<method>`` blocks of the preference methods and hpcgpt: :class:`PreferenceParams`,
:class:`SimPOParams`, :class:`HPCGPTParams`, named by their methods' ``params_class``);
``synthetic`` is the
synthetic test bed, whose blocks are :mod:`hargo.config.synthetic`'s (sections of
:mod:`hargo.config`).
"""
from __future__ import annotations

import dataclasses
from types import MappingProxyType
from typing import Any, Mapping

from hargo.config import names
from hargo.config.fields import REQUIRED, knob, node
from hargo.config.knobs import _budget, _int, _str, section
from hargo.config.rl import _MethodBlocks
from hargo.config.synthetic import (SyntheticBootstrap, SyntheticData, SyntheticEvaluate,
                                    SyntheticPolicy, SyntheticRL, SyntheticSFT, check_synthetic,
                                    check_synthetic_keys)
from hargo.param_values import ParamsError

__all__ = ["Preferences", "CompareEvaluate", "CompareReport", "Compare", "Synthetic",
           "PreferenceParams", "SimPOParams", "HPCGPTParams"]


# ------------------------------------------------------------------------------------ compare
@section
class Preferences:
    """``compare.preferences``: the preference pairs DPO, KTO and SimPO train on."""

    out_dir: str = _str("data/preferences", "folder of the pairs")
    samples_per_task: int | None = _int(REQUIRED, "train prompts per task that get samples "
                                                  "(null: all)", 1, nullable=True)
    samples_per_prompt: int = _int(REQUIRED, "samples per prompt (a pair needs two)", 2)
    temperature: float = knob(REQUIRED, "sampling temperature (greedy samples would tie)", 0,
                              lo_open=True)
    max_new_tokens: int = _int(REQUIRED, "one budget for every task", 1)
    backend: str = _str(help="generation backend", choices=("vllm", "transformers"))


@section
class CompareEvaluate:
    """``compare.evaluate``: replaces evaluate.samples_per_task / max_new_tokens for the
    comparison."""

    samples_per_task: int | None = _int(REQUIRED, "eval prompts per task (null: all)", 1,
                                        nullable=True)
    max_new_tokens: int | Mapping[str, int] = _budget(help="completion budget")


@section
class CompareReport:
    """``compare.report``: the comparison's bootstrap."""

    bootstrap_resamples: int = _int(REQUIRED, "bootstrap resamples", 100)
    confidence: float = knob(REQUIRED, "interval confidence", 0, 1, lo_open=True,
                             hi_open=True)    # as every confidence: 1.0 is no interval


# ------------------------------------------------------------- compare.<method> blocks
@section
class PreferenceParams:
    """``compare.dpo`` / ``compare.kto``: an offline preference method's knobs (TRL's DPO and
    KTO trainers; :mod:`hargo.training.preference_trainers`)."""

    beta: float = knob(REQUIRED, "the trainer's beta (DPO/KTO: KL strength; SimPO: reward "
                                 "scale)", 0, lo_open=True)
    learning_rate: float = knob(REQUIRED, "learning rate", 0, lo_open=True)


@section
class SimPOParams(PreferenceParams):
    """``compare.simpo``: SimPO's knobs (TRL CPO, ``loss_type="simpo"``): the preference knobs
    and the target reward margin."""

    gamma: float = knob(REQUIRED, "target reward margin (CPOConfig.simpo_gamma)", 0)


@section
class HPCGPTParams:
    """``compare.hpcgpt``: the HPC-GPT LoRA SFT recipe (the paper's r=8, alpha=16, lr 2e-5)."""

    learning_rate: float = knob(REQUIRED, "SFT learning rate of the recipe", 0, lo_open=True)
    lora_r: int = _int(REQUIRED, "LoRA rank", 1)
    lora_alpha: float = knob(REQUIRED, "LoRA alpha", 0, lo_open=True)


@section
class Compare(_MethodBlocks):
    """``compare``: the nine-method comparison (docs/comparing.md); the preference methods' and
    hpcgpt's knobs are ``compare.<method>`` blocks (:meth:`method`)."""

    methods: tuple[str, ...] = knob(REQUIRED, "methods compared (hargo.methods registry)",
                                    kind="list")
    seeds: tuple[int, ...] = knob(REQUIRED, "seeds, paired across methods", kind="list")
    out_dir: str = _str("models/compare", "folder of the comparison's models")
    samples_per_task: int | None = _int(REQUIRED, "RL prompt pool per task (null: all)", 1,
                                        nullable=True)
    steps: int = _int(REQUIRED, "steps of every RL and preference method", 1)
    prompts_per_step: int = _int(REQUIRED, "prompts per step", 1)
    preferences: Preferences = node(Preferences, "the preference pairs")
    evaluate: CompareEvaluate = node(CompareEvaluate, "the comparison's evaluation")
    report: CompareReport = node(CompareReport, "the comparison's report")
    blocks: Mapping[str, Any] = dataclasses.field(
        default_factory=lambda: MappingProxyType({}),
        metadata={"kind": "method_blocks", "help": "compare.<method>: the preference methods' "
                  "and hpcgpt's knobs (Method.params_class: PreferenceParams, SimPOParams, "
                  "HPCGPTParams)", "source": "hargo.methods registry"})

    _section_name, _blocks_of = "compare", "methods with one"

    @staticmethod
    def _dynamic(raw: Mapping) -> dict:
        from hargo.config import registries

        return registries.compare_methods()

    @staticmethod
    def _check(raw: Mapping, key: str, root: Mapping) -> None:
        from hargo.config import registries

        for k in ("methods", "seeds"):
            v = raw.get(k)
            key = f"compare.{k}"
            if not isinstance(v, list) or not v:
                raise ParamsError(f"{key}: expected a non-empty list, got {v!r}")
            if len(set(map(str, v))) != len(v):
                raise ParamsError(f"{key}: duplicate entry in {v}")
            for x in v:
                if k == "methods":
                    registries.check_method(key, x)
                elif not isinstance(x, int) or isinstance(x, bool) or x < 0:
                    raise ParamsError(f"{key}: seeds must be integers >= 0, got {x!r} (DVC "
                                      f"names the stages compare_train@<method>-<seed> from "
                                      f"params.yaml as written: no 1.0)")
            if k == "methods":                       # compare/dvc.yaml's matrix
                names.check_stage_keys(key, "compare_train", v)


# ----------------------------------------------------------------------------------- synthetic
@section
class Synthetic:
    """``synthetic``: the synthetic test bed (hargo/compare/synthetic.py), typed: its blocks are
    the dataclasses of :mod:`hargo.config.synthetic` (``data`` is the generator's
    ``SyntheticConfig``, ``policy`` the tiny model's ``TinyPolicyConfig``), and this whole block
    is the test bed's plan (:class:`hargo.compare.synthetic_plan.SyntheticPlan`).

    Attributes:
        data, policy, sft, rl, evaluate, bootstrap: the typed blocks.
        methods: GRPO-family methods compared (``hargo`` among them for the intervals).
        seeds: RL seeds; seed s of one method is paired with seed s of another.
        parallel_runs: runs trained at once by ``synthetic_rl`` (spawned processes, each with
            ``train.threads`` / ``parallel_runs`` torch threads, at least 1). A run's numbers
            depend on its thread count (float reductions), so changing this changes results
            slightly; a script that calls ``train_configuration`` with it > 1 needs the
            ``if __name__ == "__main__"`` guard of Python's spawn start method.
    """

    data: SyntheticData = node(SyntheticData, "the generated tasks (SyntheticConfig)",
                               source="hargo/config/synthetic.py")
    policy: SyntheticPolicy = node(SyntheticPolicy, "the tiny policy (TinyPolicyConfig)",
                                   source="hargo/config/synthetic.py")
    sft: SyntheticSFT = node(SyntheticSFT, "SFT of the tiny policy")
    rl: SyntheticRL = node(SyntheticRL, "RL shared by every method and seed")
    methods: tuple[str, ...] = knob(REQUIRED, "GRPO-family methods compared", kind="list")
    seeds: tuple[int, ...] = knob(REQUIRED, "RL seeds, paired across methods", kind="list")
    parallel_runs: int = _int(REQUIRED, "runs trained at once", 1)
    evaluate: SyntheticEvaluate = node(SyntheticEvaluate, "the greedy evaluation")
    bootstrap: SyntheticBootstrap = node(SyntheticBootstrap, "the paired bootstrap")

    @staticmethod
    def _check(raw: Mapping, key: str, root: Mapping) -> None:
        check_synthetic_keys(raw)

    @staticmethod
    def _after(value: "Synthetic", key: str, root: Mapping) -> None:
        check_synthetic(value)
