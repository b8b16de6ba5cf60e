"""Group advantages and per-response loss weights for the GRPO family, HARGO included.

Pure torch functions, no trainer inside (the tensor pieces themselves, re-exported here:
:mod:`hargo.advantage_math`). Every estimator takes the rewards of ``N`` groups of
``G`` responses each, shape ``(N, G)`` (group ``n`` holds the ``G`` responses to prompt ``n``),
and returns, per response, the advantage to put into the clipped surrogate and the weight of
that response's loss term, so one loss serves all of them (docs/method.md step 6)::

    L = (1 / N) * sum_n sum_i w_ni * L_ni        (``hargo.losses.group_weighted_aggregate``)

Estimators (registry ``ESTIMATORS``, filled by :func:`register_estimator`, selected by name
through ``estimate``). Each computes the group advantage ``A = (r - mean) / (std + std_eps)`` by
the std convention of its :class:`HargoConfig` (``std``: population / sample / none,
``std_scope``: group / batch; from the method's ``rl.<method>`` block in training), so two
methods differ only in what they declare:

``grpo``, ``dr_grpo``
    one function, weights ``1/G``; standing alone (no config) ``grpo`` uses GRPO's std convention
    and ``dr_grpo`` none. At ``rl.grpo``'s defaults (sample std, ``std_eps = 1e-4``) this is TRL 1.16
    ``GRPOTrainer``'s group advantage (``scale_rewards="group"``); at ``rl.dr_grpo``'s (no std)
    Dr. GRPO's ``r - mean`` (Liu et al. 2025, "Understanding R1-Zero-Like Training").
``hargo``
    docs/method.md steps 1-5: population-std advantage ``A``, reference-model confidence ``c``
    with an EMA baseline, modulated advantage ``M = A (1 + alpha c)``, discrimination ``d`` and
    weights ``w = d / sum d`` (``1/G`` when the group carries no contrast).
``hargo_b1``
    Ablation B1, discrimination only: ``alpha = 0`` so ``M = A``; no reference model needed.
``hargo_b2``
    Ablation B2, confidence only: ``w`` proportional to ``alpha * c`` inside the group.
``hargo_uniform``
    the uniform-weight control: B1's computation with weights ``1/G``.
``hargo_batch``, ``hargo_contrast``
    hargo's own variants (not the paper's) whose weights are normalised over the batch, so they
    move weight between groups (and so between tasks): :func:`batch_normalised_weights`.

Every GRPO-family method trains on one loss (``hargo.training.grpo``): these advantages and
weights in the method's policy loss plus ``beta`` x its KL estimator, aggregated by
:func:`hargo.losses.group_weighted_aggregate`. Adding an estimator: a function with the
signature of ``_grpo`` under :func:`register_estimator` (``needs_reference=True`` when it reads
the reference model's log-probs), named by a :class:`hargo.methods.Method`'s ``estimator``.
Adding a method: docs/development.md, "Add a method".

Numerics: estimators compute in float64 whatever the input dtype (float32, bfloat16, ...) and
return float32, so no finite input can overflow (``|A| <= sqrt(G - 1)`` with the std, ``0 <= d
<= 1``; per-group weights lie in [0, 1], batch-normalised ones in [0, N]).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from hargo.advantage_math import (STD_SCOPES, batch_normalised_weights, confidence,
                                  discrimination_weights, group_advantage, group_rewards)
from hargo.estimators import (ESTIMATORS, estimator_defaults, get_estimator, needs_reference,
                              register_estimator)

__all__ = [
    "HargoConfig",
    "STD_KINDS",
    "STD_SCOPES",
    "EMABaseline",
    "EstimatorOutput",
    "ESTIMATORS",
    "register_estimator",
    "default_config",
    "batch_normalised_weights",
    "estimate",
    "needs_reference",
    "group_rewards",
    "group_advantage",
    "confidence",
    "discrimination_weights",
]

#: TRL 1.16 ``GRPOTrainer``: ``advantages = advantages / (std_rewards + 1e-4)``.
TRL_STD_EPS = 1e-4
#: The std conventions of the group advantage (:class:`HargoConfig` ``std``).
STD_KINDS: tuple[str, ...] = ("population", "sample", "none")


@dataclass
class HargoConfig:
    """HARGO's estimator constants (docs/method.md; paper values as defaults). The pipeline
    builds them from ``rl.hargo`` / ``rl.hargo_b1`` / ``rl.hargo_b2``
    (:mod:`hargo.method_config`, read through :func:`hargo.methods.method_params`).

    Attributes:
        alpha: confidence modulation strength in ``M = A (1 + alpha c)`` (paper: 0.3).
        rho: EMA factor of the log-prob baseline, ``g <- rho g + (1 - rho) mean(l)`` (paper: 0.9).
        eps: added to ``max |M|`` in ``d`` (not given by the paper).
        eps_w: when ``sum d < eps_w`` the group's weights fall back to ``1/G`` (not in the paper).
        std: the advantage's std convention (:data:`STD_KINDS`): ``"population"`` (divide by G;
            docs/method.md's worked example, HARGO's default), ``"sample"`` (G - 1; TRL's
            ``torch.std``, GRPO's default) or ``"none"`` (no scaling: Dr. GRPO).
        std_eps: added to the std in ``A = (r - mean) / (std + std_eps)`` (TRL: 1e-4; HARGO:
            1e-6, the paper gives none).
        std_scope: ``"group"`` (each group's own std, GRPO) or ``"batch"`` (one std over every
            reward of the gathered batch, still centred per group: Dr. GRPO's suggestion, TRL's
            ``scale_rewards="batch"``).
        params: the method's params block (its dataclass, ``hargo.methods.method_params``) that
            :meth:`of` built this from, for an estimator with knobs of its own; None standing
            alone.
    """

    alpha: float = 0.3
    rho: float = 0.9
    eps: float = 1e-6
    eps_w: float = 1e-6
    std: str = "population"
    std_eps: float = 1e-6
    std_scope: str = "group"
    params: Any = field(default=None, compare=False, repr=False)

    @classmethod
    def of(cls, method_params, estimator: str | None = None) -> "HargoConfig":
        """The constants of a method's params dataclass (``hargo.methods.method_params``): the
        registered defaults of ``estimator`` (:func:`default_config`; none: ``HargoConfig()``'s)
        updated by the block's ``estimator_constants()`` when it has them (every built-in
        GRPO-family block: the std convention, and HARGO's alpha, rho, eps, eps_w). PPO's
        block has none."""
        base = estimator_defaults(estimator) if estimator is not None else {}
        constants = getattr(method_params, "estimator_constants", None)
        return cls(**{**base, **(constants() if constants is not None else {})},
                   params=method_params)

    def __post_init__(self):
        if not (self.alpha >= 0 and math.isfinite(self.alpha)):
            raise ValueError(f"HargoConfig.alpha must be finite and >= 0, got {self.alpha!r}")
        if not 0.0 <= self.rho < 1.0:
            raise ValueError(f"HargoConfig.rho must lie in [0, 1), got {self.rho!r}")
        for name in ("eps", "eps_w", "std_eps"):
            v = getattr(self, name)
            if not (v > 0 and math.isfinite(v)):
                raise ValueError(f"HargoConfig.{name} must be finite and > 0, got {v!r}")
        if self.std not in STD_KINDS:
            raise ValueError(f"HargoConfig.std must be one of {', '.join(STD_KINDS)}, got "
                             f"{self.std!r}")
        if self.std_scope not in STD_SCOPES:
            raise ValueError(f"HargoConfig.std_scope must be one of {', '.join(STD_SCOPES)}, "
                             f"got {self.std_scope!r}")

    def advantage(self, rewards: torch.Tensor) -> torch.Tensor:
        """:func:`group_advantage` of ``rewards`` (N, G) with this config's std convention.
        Returns (N, G) float64."""
        return group_advantage(rewards, eps=self.std_eps, unbiased=self.std == "sample",
                               scale=self.std != "none", scope=self.std_scope)


class EMABaseline:
    """Running baseline ``g`` of the reference log-prob ``l`` (docs/method.md step 2).

    ``g <- rho * g + (1 - rho) * mean_batch(l)``, initialised to the first batch's mean. Explicit
    trainer state: save ``state_dict()`` in checkpoints and ``load_state_dict`` on resume.

    Attributes:
        rho: EMA factor in [0, 1).
        value: current ``g`` (float), or ``None`` before the first update.
    """

    def __init__(self, rho: float = 0.9):
        if not 0.0 <= float(rho) < 1.0:
            raise ValueError(f"EMABaseline rho must lie in [0, 1), got {rho!r}")
        self.rho = float(rho)
        self.value: float | None = None

    def update(self, batch_mean: float) -> float:
        """Fold one batch's mean ``l`` into ``g`` and return the new ``g``.

        The first call sets ``g = batch_mean``. Raises ValueError for a non-finite mean (it would
        poison every later step).
        """
        m = float(batch_mean)
        if not math.isfinite(m):
            raise ValueError(f"EMABaseline.update: batch mean must be finite, got {m!r}")
        if self.value is None:
            self.value = m
        else:
            self.value = self.rho * self.value + (1.0 - self.rho) * m
        return self.value

    def state_dict(self) -> dict:
        """``{"rho": float, "value": float | None}`` (JSON- and torch.save-friendly)."""
        return {"rho": self.rho, "value": self.value}

    def load_state_dict(self, d: dict) -> None:
        """Restore from ``state_dict()`` output. Raises ValueError on a malformed dict."""
        try:
            rho, value = float(d["rho"]), d["value"]
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"EMABaseline.load_state_dict: expected {{'rho', 'value'}}, got {d!r}") from e
        if not 0.0 <= rho < 1.0:
            raise ValueError(f"EMABaseline.load_state_dict: rho must lie in [0, 1), got {rho!r}")
        if value is not None:
            value = float(value)
            if not math.isfinite(value):
                raise ValueError(f"EMABaseline.load_state_dict: value must be finite, got {value!r}")
        self.rho, self.value = rho, value

    def __repr__(self) -> str:
        return f"EMABaseline(rho={self.rho}, value={self.value})"


@dataclass
class EstimatorOutput:
    """What an estimator returns for ``N`` groups of ``G`` responses.

    Attributes:
        advantages: (N, G) float32, the advantage to put into the surrogate.
        weights: (N, G) float32, the weight of each response's loss term; each row sums to 1.
        confidence: (N, G) float32 ``c`` (hargo, hargo_b2), else None.
        discrimination: (N, G) float32 ``d`` (HARGO family), else None.
        baseline: the EMA baseline ``g`` used for ``c`` (hargo, hargo_b2), else None.
    """

    advantages: torch.Tensor
    weights: torch.Tensor
    confidence: torch.Tensor | None = None
    discrimination: torch.Tensor | None = None
    baseline: float | None = None

    def flat(self) -> dict[str, torch.Tensor]:
        """The (N, G) tensors flattened to (N*G,) in group-major order (TRL's completion order)."""
        return {k: v.reshape(-1) for k, v in
                (("advantages", self.advantages), ("weights", self.weights),
                 ("confidence", self.confidence), ("discrimination", self.discrimination))
                if v is not None}


# ------------------------------------------------------------------------------- estimators

EstimatorFn = Callable[[torch.Tensor, "torch.Tensor | None", "EMABaseline | None", HargoConfig],
                       EstimatorOutput]


def default_config(method: str) -> HargoConfig:
    """The constants ``method``'s estimator uses when none are given (``HargoConfig()`` with
    its registered defaults). Raises ValueError for an unknown estimator."""
    return HargoConfig(**estimator_defaults(method))


def _uniform(rewards: torch.Tensor) -> torch.Tensor:
    return torch.full(rewards.shape, 1.0 / rewards.shape[1], dtype=torch.float32,
                      device=rewards.device)


@register_estimator("dr_grpo", std="none")
@register_estimator("grpo", std="sample", std_eps=TRL_STD_EPS)
def _grpo(rewards, ref_logprob, baseline, config) -> EstimatorOutput:
    """GRPO / Dr. GRPO: the group advantage of ``config``'s std convention
    (:meth:`HargoConfig.advantage`), weights ``1/G``. With ``std="sample"``, ``std_eps=1e-4``
    (the defaults here, and ``rl.grpo``'s) it is TRL 1.16 ``GRPOTrainer``'s
    ``(r - mean) / (std + 1e-4)`` (``scale_rewards="group"``); with ``std="none"`` it is Dr. GRPO's
    ``r - mean`` (Liu et al. 2025; ``rl.dr_grpo``'s default)."""
    adv = config.advantage(rewards)
    return EstimatorOutput(adv.to(torch.float32), _uniform(rewards))


def _confidence_with_baseline(ref_logprob: torch.Tensor, baseline: EMABaseline
                              ) -> tuple[torch.Tensor, float]:
    # c uses g AFTER folding in this batch: on the first batch g is the batch mean ("initialise g
    # from the first batch"), and every batch is centred on a baseline that includes it.
    g = baseline.update(float(ref_logprob.to(torch.float64).mean()))
    return confidence(ref_logprob, g), g


def _hargo_family(rewards, ref_logprob, baseline, config, alpha: float, weights_from: str
                  ) -> EstimatorOutput:
    A = config.advantage(rewards)
    c = g = None
    if ref_logprob is not None:
        c, g = _confidence_with_baseline(ref_logprob, baseline)
        M = A * (1.0 + alpha * c)
    else:
        M = A
    d, w, no_contrast = discrimination_weights(M, config.eps, config.eps_w)
    G = rewards.shape[1]
    if weights_from == "confidence":
        # B2: w proportional to alpha * c inside the group; a group without contrast still gets
        # 1/G (as step 5), so every estimator weights an all-equal group uniformly.
        conf_w = alpha * c
        s = conf_w.sum(dim=1, keepdim=True)
        flat = no_contrast | (s < config.eps_w)
        w = torch.where(flat, torch.full_like(conf_w, 1.0 / G), conf_w / torch.where(flat, 1.0, s))
    elif weights_from == "uniform":
        w = torch.full_like(d, 1.0 / G)
    elif weights_from == "batch":
        m = M.abs()
        d = m / (m.amax() + config.eps)
        w = batch_normalised_weights(d, config.eps_w)
    elif weights_from == "batch_contrast":
        centred = group_advantage(rewards, scale=False).abs()
        d = centred / (centred.amax() + config.eps)
        w = batch_normalised_weights(d, config.eps_w)
    f32 = lambda t: None if t is None else t.to(torch.float32)  # noqa: E731
    return EstimatorOutput(f32(M), f32(w), f32(c), f32(d), g)


@register_estimator("hargo", needs_reference=True)
def _hargo(rewards, ref_logprob, baseline, config) -> EstimatorOutput:
    """Full HARGO (paper's B3), docs/method.md steps 1-5."""
    return _hargo_family(rewards, ref_logprob, baseline, config, config.alpha, "discrimination")


@register_estimator("hargo_b1")
def _hargo_b1(rewards, ref_logprob, baseline, config) -> EstimatorOutput:
    """B1, discrimination only: alpha = 0, so ``M = A``; the reference model is not used (and
    the EMA baseline is not touched)."""
    return _hargo_family(rewards, None, baseline, config, 0.0, "discrimination")


@register_estimator("hargo_b2", needs_reference=True)
def _hargo_b2(rewards, ref_logprob, baseline, config) -> EstimatorOutput:
    """B2, confidence only: ``w_i = alpha c_i / sum_j alpha c_j``; the advantage is HARGO's
    ``M = A (1 + alpha c)`` (only the weighting changes between B2 and B3). Groups without
    contrast (``sum d < eps_w``) and ``alpha = 0`` fall back to 1/G."""
    return _hargo_family(rewards, ref_logprob, baseline, config, config.alpha, "confidence")


@register_estimator("hargo_uniform")
def _hargo_uniform(rewards, ref_logprob, baseline, config) -> EstimatorOutput:
    """The uniform-weight control on HARGO's path: B1's computation (``alpha = 0``, ``M = A`` of
    ``config``'s std convention, ``d`` recorded) with every weight ``1/G``. At GRPO's std
    convention it is GRPO; at HARGO's, HARGO minus it is the weighting alone."""
    return _hargo_family(rewards, None, baseline, config, 0.0, "uniform")


@register_estimator("hargo_batch", needs_reference=True)
def _hargo_batch(rewards, ref_logprob, baseline, config) -> EstimatorOutput:
    """hargo's own variant (not the paper's): HARGO's modulated advantage ``M = A (1 + alpha c)``,
    ``d = |M| / (max_batch |M| + eps)``, the weights normalised over the batch
    (:func:`batch_normalised_weights`): ``w_ni = N |M_ni| / sum |M|``, so a group weighs by its
    ``sum_i |M_ni|`` and all-equal groups drop out."""
    return _hargo_family(rewards, ref_logprob, baseline, config, config.alpha, "batch")


@register_estimator("hargo_contrast")
def _hargo_contrast(rewards, ref_logprob, baseline, config) -> EstimatorOutput:
    """hargo's own variant (not the paper's): ``d`` from the raw contrast
    ``|r - mean_group(r)| / (max_batch |r - mean| + eps)`` (no std), weights normalised over the
    batch (:func:`batch_normalised_weights`): groups whose rewards barely differ get little
    weight, whatever their std. The advantage is ``A`` of ``config``'s std convention."""
    return _hargo_family(rewards, None, baseline, config, 0.0, "batch_contrast")


def estimate(method: str, rewards: torch.Tensor, ref_logprob: torch.Tensor | None = None,
             baseline: EMABaseline | None = None, config: HargoConfig | None = None
             ) -> EstimatorOutput:
    """Advantages and loss weights of one batch by the named estimator.

    Args:
        method: a key of ``ESTIMATORS`` (grpo, hargo, hargo_b1, hargo_b2, hargo_uniform,
            hargo_batch, hargo_contrast, or a registered one).
        rewards: (N, G) rewards, N groups of G >= 2 responses, finite, any float dtype.
        ref_logprob: (N, G) length-normalised sequence log-prob ``l`` of each response under the
            reference model (mean over the response's tokens of log pi_ref, padding masked);
            required by the estimators registered with ``needs_reference`` (hargo, hargo_b2,
            hargo_batch), ignored by the others.
        baseline: the EMA baseline ``g`` (trainer state). It is updated in place with this
            batch's mean ``l`` BEFORE computing ``c``, so ``c = sigmoid(l - g_new)``; on the first
            batch ``g_new = mean(l)``. None: a fresh ``EMABaseline(config.rho)`` (stateless, for
            tests and one-off use; a trainer must pass its persistent one).
        config: the estimator constants and std convention (default
            :func:`default_config` of ``method``).

    Returns:
        EstimatorOutput with float32 (N, G) tensors on the rewards' device.

    Raises:
        ValueError: unknown method (the message lists the valid ones), rewards not 2-D or G < 2,
            non-finite rewards or log-probs, ``ref_logprob`` missing or of another shape when the
            method needs it.
    """
    fn = get_estimator(method)
    config = config or default_config(method)
    if not isinstance(rewards, torch.Tensor) or rewards.dim() != 2:
        raise ValueError(f"estimate({method}): rewards must be a (N, G) tensor, got "
                         f"{getattr(rewards, 'shape', type(rewards))}")
    if rewards.shape[1] < 2:
        raise ValueError(f"estimate({method}): groups need G >= 2 responses, got G={rewards.shape[1]}")
    if not torch.isfinite(rewards).all():
        raise ValueError(f"estimate({method}): rewards contain NaN or inf")
    if needs_reference(method):
        if ref_logprob is None:
            raise ValueError(f"estimate({method}): needs ref_logprob (N, G) from the reference model")
        if tuple(ref_logprob.shape) != tuple(rewards.shape):
            raise ValueError(f"estimate({method}): ref_logprob shape {tuple(ref_logprob.shape)} != "
                             f"rewards shape {tuple(rewards.shape)}")
        if not torch.isfinite(ref_logprob).all():
            raise ValueError(f"estimate({method}): ref_logprob contains NaN or inf")
        if baseline is None:
            baseline = EMABaseline(config.rho)
    return fn(rewards, ref_logprob, baseline, config)
