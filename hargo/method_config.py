"""Each RL method's own knobs: one documented dataclass per method family, read once from the
method's block of ``params.yaml`` (``rl.<method>``) and validated there.

The knobs every RL method shares (G, steps, temperature, clip range, learning rate, LoRA, ...)
are the ``rl`` block's own keys; a method's own knobs live in its block, so the DVC stage
``rl@<method>`` depends on ``rl.<method>`` and on the shared keys only: changing HARGO's ``alpha``
re-trains ``rl@hargo``, not ``rl@grpo``.

=============== ====================== ============================================================
block           dataclass              knobs
=============== ====================== ============================================================
``rl.grpo``     :class:`GRPOParams`    ``beta``, ``std``, ``std_eps``, ``std_scope``,
                                       ``aggregation`` (every GRPO-family block has these four)
``rl.dr_grpo``  :class:`DrGRPOParams`  as GRPO; defaults std none, aggregation constant_length
``rl.hargo``    :class:`HargoParams`   the four, ``beta``, ``alpha``, ``rho``, ``eps``, ``eps_w``
``rl.hargo_b1`` :class:`HargoB1Params` the four, ``beta``, ``eps``, ``eps_w`` (B1: alpha = 0)
``rl.hargo_b2`` :class:`HargoParams`   as ``rl.hargo``
``rl.ppo``      :class:`PPOParams`     ``kl_coef``, ``vf_coef``, ``gamma``, ``lam``,
                                       ``cliprange_value``, ``whiten_advantages``
=============== ====================== ============================================================

Which method reads which dataclass is the method's own business: its :class:`hargo.methods.Method`
names it (``params_class``), and a new method may define its dataclass in its own module with
:func:`knob` (:mod:`hargo.config.fields`, shared with every section of the typed config
:mod:`hargo.config`, whose ``rl.<method>`` nodes these dataclasses are). Each field carries its help text, range and source in its metadata;
:func:`read_block` checks type and range and rejects unknown keys, naming
``rl.<method>.<field>``. Pure Python (no torch); imports nothing of hargo's methods (they import
this module).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any, Mapping

from hargo.config.fields import check_value, knob
from hargo.param_values import ParamsError

__all__ = ["GRPOParams", "DrGRPOParams", "UniformParams", "HargoParams", "HargoB1Params",
           "PPOParams", "knob", "read_block", "STD_KINDS", "STD_SCOPES", "AGGREGATION_MODES"]


#: The std conventions of the group advantage (``hargo.advantages.STD_KINDS``; here too so this
#: module stays torch-free; tests/test_advantages.py checks the two agree).
STD_KINDS = ("population", "sample", "none")
#: Over what the std is taken (``hargo.advantages.STD_SCOPES``).
STD_SCOPES = ("group", "batch")
#: The GRPO family's loss aggregations (``hargo.losses.AGGREGATIONS``).
AGGREGATION_MODES = ("response_mean", "token_mean", "constant_length")


def _std(default: str):
    return knob(default, "std convention of the group advantage A = (r - mean) / (std + "
                         "std_eps): population (divide by G), sample (G - 1, TRL's torch.std) or "
                         "none (no scaling, Dr. GRPO)", kind=str, choices=STD_KINDS)


def _std_eps(default: float):
    return knob(default, "added to the std in A (TRL: 1e-4; HARGO: 1e-6, not in the paper)",
                lo=0.0, lo_open=True)


def _aggregation(default: str):
    return knob(default, "how the weighted per-token loss becomes the step's loss: "
                         "response_mean (each completion's token mean, then the mean; GRPO), "
                         "token_mean (every token counts the same; DAPO) or constant_length "
                         "(sum / (completions x max_completion_length); Dr. GRPO)",
                kind=str, choices=AGGREGATION_MODES)


_STD_SCOPE_HELP = ("group: each group's own std (GRPO); batch: one std over the step's rewards, "
                   "centring still per group (Dr. GRPO's suggestion, TRL scale_rewards='batch')")


@dataclass(frozen=True)
class GRPOParams:
    """``rl.grpo``: GRPO (uniform 1/G weights) on hargo's one GRPO-family loss, with TRL 1.16's
    defaults: sample std + 1e-4, per-group std, ``response_mean`` (TRL ``loss_type="grpo"``).
    Every GRPO-family params class derives from it, so each method has the four loss knobs
    below (a method's own defaults: its class); a key left out of the block takes its default."""

    beta: float = knob(0.02, "coefficient of the k3 KL(pi_theta || pi_ref) term in the loss "
                              "(TRL GRPOConfig.beta; paper: 0.02)", lo=0.0)
    std: str = _std("sample")
    std_eps: float = _std_eps(1e-4)
    std_scope: str = knob("group", _STD_SCOPE_HELP, kind=str, choices=STD_SCOPES)
    aggregation: str = _aggregation("response_mean")

    @property
    def kl_coef(self) -> float:
        """The KL coefficient TRL's ``GRPOConfig.beta`` gets."""
        return self.beta

    def estimator_constants(self) -> dict:
        """The keyword arguments of :class:`hargo.advantages.HargoConfig` this block sets: the
        std convention (a subclass adds its own constants)."""
        return {"std": self.std, "std_eps": self.std_eps, "std_scope": self.std_scope}


@dataclass(frozen=True)
class DrGRPOParams(GRPOParams):
    """``rl.dr_grpo``: Dr. GRPO (Liu et al. 2025): no std scaling and a constant
    ``completions x max_completion_length`` denominator (TRL ``loss_type="dr_grpo"``)."""

    std: str = _std("none")
    aggregation: str = _aggregation("constant_length")


@dataclass(frozen=True)
class UniformParams(GRPOParams):
    """``rl.uniform_pop``: the uniform-weight control at HARGO's std convention (population
    std + 1e-6); ``rl.uniform_sample`` uses :class:`GRPOParams` (GRPO's)."""

    std: str = _std("population")
    std_eps: float = _std_eps(1e-6)


@dataclass(frozen=True)
class HargoB1Params(UniformParams):
    """``rl.hargo_b1``: ablation B1, weights from discrimination only (alpha = 0: ``M = A``; no
    reference model, no EMA baseline). Population std + 1e-6 (docs/method.md step 1)."""

    eps: float = knob(1e-6, "added to max|M| in d (not in the paper)", lo=0.0, lo_open=True)
    eps_w: float = knob(1e-6, "a group with sum(d) below this gets uniform 1/G weights (not in "
                               "the paper)", lo=0.0, lo_open=True)

    def estimator_constants(self) -> dict:
        """The keyword arguments of :class:`hargo.advantages.HargoConfig` (the estimator
        constants), alpha = 0 (``rho`` is not read: no confidence, no EMA baseline)."""
        return {**super().estimator_constants(), "alpha": 0.0, "eps": self.eps,
                "eps_w": self.eps_w}


@dataclass(frozen=True)
class HargoParams(HargoB1Params):
    """``rl.hargo`` / ``rl.hargo_b2`` / ``rl.hargo_batch``: HARGO (docs/method.md), ablation B2
    (confidence-only weights) and hargo's batch-normalised variant."""

    alpha: float = knob(0.3, "confidence modulation in M = A (1 + alpha c) (paper: 0.3)", lo=0.0)
    rho: float = knob(0.9, "EMA factor of the reference log-prob baseline g (paper: 0.9)",
                       lo=0.0, hi=1.0, hi_open=True)

    def estimator_constants(self) -> dict:
        """The keyword arguments of :class:`hargo.advantages.HargoConfig` (the estimator
        constants)."""
        return {**super().estimator_constants(), "alpha": self.alpha, "rho": self.rho}


@dataclass(frozen=True)
class PPOParams:
    """``rl.ppo``: PPO with a learned value head (TRL's former ``PPOTrainer`` recipe)."""

    kl_coef: float = knob(0.02, "coefficient of the k1 KL penalty -kl_coef (log pi - log pi_ref) "
                                 "in every token's reward (not in the loss)", lo=0.0)
    vf_coef: float = knob(0.1, "weight of the clipped value loss (TRL's old PPOConfig default)",
                           lo=0.0)
    gamma: float = knob(1.0, "discount over completion tokens", lo=0.0, hi=1.0)
    lam: float = knob(0.95, "GAE lambda (Schulman et al. 2016)", lo=0.0, hi=1.0)
    cliprange_value: float = knob(0.2, "a value may move this far from its rollout value before "
                                        "its loss is clipped", lo=0.0, lo_open=True)
    whiten_advantages: bool = knob(True, "whiten the advantages over the batch's completion "
                                          "tokens", kind=bool)

    def to_dict(self) -> dict:
        return asdict(self)


def _check(key: str, value: Any, meta: Mapping) -> Any:
    """``value`` checked against its knob (:func:`hargo.config.fields.check_value`)."""
    return check_value(key, value, meta)


def read_block(params: Mapping, dotted: str, cls: type):
    """The validated ``cls`` (a dataclass of :func:`knob` fields) of the block ``dotted``
    (e.g. ``"rl.hargo"``) of ``params``. A key the block leaves out takes its field's default,
    and so does every key of an absent block, so a params.yaml written before a method (or a
    knob) was added stays valid; a field without a default must be given.

    Raises:
        ParamsError: a block that is not a mapping, an unknown key, a missing key without a
            default, a value of the wrong type or out of range (the message names
            ``<dotted>.<field>``).
    """
    from dataclasses import MISSING

    block: Any = params
    for key in dotted.split("."):
        block = block.get(key) if isinstance(block, Mapping) else None
    names = [f.name for f in fields(cls)]
    if block is None:
        block = {}
    if not isinstance(block, Mapping):
        raise ParamsError(f"{dotted}: expected a block with {', '.join(names)}, got "
                          f"{type(block).__name__}")
    unknown = sorted(set(block) - set(names))
    if unknown:
        raise ParamsError(f"{dotted}: unknown key(s) {', '.join(unknown)}; valid: "
                          f"{', '.join(names)}")
    kw = {}
    for f in fields(cls):
        key = f"{dotted}.{f.name}"
        if f.name not in block:
            if f.default is MISSING and f.default_factory is MISSING:
                raise ParamsError(f"{key}: missing ({f.metadata['help']})")
            continue
        kw[f.name] = _check(key, block[f.name], f.metadata)
    return cls(**kw)
