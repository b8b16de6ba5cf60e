"""Each RL method's own knobs: one documented dataclass per method family, read once from the
method's block of ``params.yaml`` (``rl.<method>``) and validated there.

The knobs every RL method shares (G, steps, temperature, clip range, learning rate, LoRA, ...)
are the ``rl`` block's own keys; a method's own knobs live in its block, so the DVC stage
``rl@<method>`` depends on ``rl.<method>`` and on the shared keys only: changing HARGO's ``alpha``
re-trains ``rl@hargo``, not ``rl@grpo``.

=============== ====================== ============================================================
block           dataclass              knobs
=============== ====================== ============================================================
``rl.grpo``     :class:`GRPOParams`    ``beta``
``rl.dr_grpo``  :class:`GRPOParams`    ``beta``
``rl.hargo``    :class:`HargoParams`   ``beta``, ``alpha``, ``rho``, ``eps``, ``eps_w``
``rl.hargo_b1`` :class:`HargoB1Params` ``beta``, ``eps``, ``eps_w`` (B1: alpha = 0, no reference)
``rl.hargo_b2`` :class:`HargoParams`   ``beta``, ``alpha``, ``rho``, ``eps``, ``eps_w``
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

__all__ = ["GRPOParams", "HargoParams", "HargoB1Params", "PPOParams", "knob", "read_block"]


@dataclass(frozen=True)
class GRPOParams:
    """``rl.grpo`` / ``rl.dr_grpo``: TRL's GRPO and Dr. GRPO losses (uniform 1/G weights)."""

    beta: float = knob(0.02, "coefficient of the k3 KL(pi_theta || pi_ref) term in the loss "
                              "(TRL GRPOConfig.beta; paper: 0.02)", lo=0.0)

    @property
    def kl_coef(self) -> float:
        """The KL coefficient TRL's ``GRPOConfig.beta`` gets."""
        return self.beta


@dataclass(frozen=True)
class HargoB1Params(GRPOParams):
    """``rl.hargo_b1``: ablation B1, weights from discrimination only (alpha = 0: ``M = A``; no
    reference model, no EMA baseline)."""

    eps: float = knob(1e-6, "added to the group std in A and to max|M| in d (not in the paper)",
                       lo=0.0, lo_open=True)
    eps_w: float = knob(1e-6, "a group with sum(d) below this gets uniform 1/G weights (not in "
                               "the paper)", lo=0.0, lo_open=True)

    def estimator_constants(self) -> dict[str, float]:
        """The keyword arguments of :class:`hargo.advantages.HargoConfig` (the estimator
        constants), alpha = 0 (``rho`` is not read: no confidence, no EMA baseline)."""
        return {"alpha": 0.0, "eps": self.eps, "eps_w": self.eps_w}


@dataclass(frozen=True)
class HargoParams(HargoB1Params):
    """``rl.hargo`` / ``rl.hargo_b2``: HARGO (docs/method.md) and ablation B2 (confidence-only
    weights)."""

    alpha: float = knob(0.3, "confidence modulation in M = A (1 + alpha c) (paper: 0.3)", lo=0.0)
    rho: float = knob(0.9, "EMA factor of the reference log-prob baseline g (paper: 0.9)",
                       lo=0.0, hi=1.0, hi_open=True)

    def estimator_constants(self) -> dict[str, float]:
        """The keyword arguments of :class:`hargo.advantages.HargoConfig` (the estimator
        constants)."""
        return {"alpha": self.alpha, "rho": self.rho, "eps": self.eps, "eps_w": self.eps_w}


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
    (e.g. ``"rl.hargo"``) of ``params``.

    Raises:
        ParamsError: a missing block or key, an unknown key, a value of the wrong type or out of
            range (the message names ``<dotted>.<field>``).
    """
    block: Any = params
    for key in dotted.split("."):
        block = block.get(key) if isinstance(block, Mapping) else None
    names = [f.name for f in fields(cls)]
    if not isinstance(block, Mapping):
        raise ParamsError(f"{dotted}: missing (a block with {', '.join(names)})")
    unknown = sorted(set(block) - set(names))
    if unknown:
        raise ParamsError(f"{dotted}: unknown key(s) {', '.join(unknown)}; valid: "
                          f"{', '.join(names)}")
    kw = {}
    for f in fields(cls):
        key = f"{dotted}.{f.name}"
        if f.name not in block:
            raise ParamsError(f"{key}: missing ({f.metadata['help']})")
        kw[f.name] = _check(key, block[f.name], f.metadata)
    return cls(**kw)
