"""Group advantages and per-response loss weights for the GRPO family, HARGO included.

Pure torch functions, no trainer inside. Every estimator takes the rewards of ``N`` groups of
``G`` responses each, shape ``(N, G)`` (group ``n`` holds the ``G`` responses to prompt ``n``),
and returns, per response, the advantage to put into the clipped surrogate and the weight of
that response's loss term, so one loss serves all of them (docs/method.md step 6)::

    L = (1 / N) * sum_n sum_i w_ni * L_ni        (``hargo.losses.weighted_loss``)

Estimators (registry ``ESTIMATORS``, selected by name through ``estimate``):

``grpo``
    TRL 1.16's own group advantage, ``(r - mean) / (std + 1e-4)`` with the *sample* (unbiased,
    ``G - 1``) std of the group, as ``GRPOTrainer`` computes it with ``scale_rewards="group"``.
    Weights ``1/G``.
``dr_grpo``
    Dr. GRPO (Liu et al. 2025, "Understanding R1-Zero-Like Training"): ``r - mean`` (no std
    scaling). Weights ``1/G``.
``hargo``
    docs/method.md steps 1-5: population-std advantage ``A``, reference-model confidence ``c``
    with an EMA baseline, modulated advantage ``M = A (1 + alpha c)``, discrimination ``d`` and
    weights ``w = d / sum d`` (``1/G`` when the group carries no contrast).
``hargo_b1``
    Ablation B1, discrimination only: ``alpha = 0`` so ``M = A``; no reference model needed.
``hargo_b2``
    Ablation B2, confidence only: ``w`` proportional to ``alpha * c`` inside the group.

Adding an estimator: one function with the signature of ``_grpo``, its ``ESTIMATORS`` entry (and
``_NEEDS_REFERENCE`` when it reads the reference model's log-probs). An estimator runs in
training only through a method that names it: a :class:`hargo.methods.Method` with
``estimator="<name>"`` and ``loss="weighted"`` (``needs_reference`` as here; the trainer checks
the two agree). ``grpo`` and ``dr_grpo`` are named by methods whose ``loss="trl"``: in training
TRL computes those advantages itself, and these estimators are their reference implementations
(tested against TRL's formula). Adding a method: docs/development.md, "Add a method".

Numerics: estimators compute in float64 whatever the input dtype (float32, bfloat16, ...) and
return float32, so no finite input can overflow (``|A| <= sqrt(G - 1)``, ``0 <= d, w <= 1``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch

__all__ = [
    "HargoConfig",
    "EMABaseline",
    "EstimatorOutput",
    "ESTIMATORS",
    "estimate",
    "needs_reference",
    "group_rewards",
    "group_advantage",
    "confidence",
    "discrimination_weights",
]

#: TRL 1.16 ``GRPOTrainer``: ``advantages = advantages / (std_rewards + 1e-4)``.
TRL_STD_EPS = 1e-4


@dataclass
class HargoConfig:
    """HARGO's estimator constants (docs/method.md; paper values as defaults). The pipeline
    builds them from ``rl.hargo`` / ``rl.hargo_b1`` / ``rl.hargo_b2``
    (:mod:`hargo.method_config`, read through :func:`hargo.methods.method_params`).

    Attributes:
        alpha: confidence modulation strength in ``M = A (1 + alpha c)`` (paper: 0.3).
        rho: EMA factor of the log-prob baseline, ``g <- rho g + (1 - rho) mean(l)`` (paper: 0.9).
        eps: added to the group std in ``A`` and to ``max |M|`` in ``d`` (not given by the paper).
        eps_w: when ``sum d < eps_w`` the group's weights fall back to ``1/G`` (not in the paper).
    """

    alpha: float = 0.3
    rho: float = 0.9
    eps: float = 1e-6
    eps_w: float = 1e-6

    @classmethod
    def of(cls, method_params) -> "HargoConfig":
        """The constants of a method's params dataclass (``hargo.methods.method_params``): its
        ``estimator_constants()`` (``rl.hargo``, ``rl.hargo_b1``, ``rl.hargo_b2``), or the
        defaults for a method without any (GRPO, Dr. GRPO, PPO)."""
        constants = getattr(method_params, "estimator_constants", None)
        return cls(**constants()) if constants is not None else cls()

    def __post_init__(self):
        if not (self.alpha >= 0 and math.isfinite(self.alpha)):
            raise ValueError(f"HargoConfig.alpha must be finite and >= 0, got {self.alpha!r}")
        if not 0.0 <= self.rho < 1.0:
            raise ValueError(f"HargoConfig.rho must lie in [0, 1), got {self.rho!r}")
        for name in ("eps", "eps_w"):
            v = getattr(self, name)
            if not (v > 0 and math.isfinite(v)):
                raise ValueError(f"HargoConfig.{name} must be finite and > 0, got {v!r}")


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


# ----------------------------------------------------------------------------- pure math pieces

def group_rewards(flat: torch.Tensor, G: int) -> torch.Tensor:
    """Reshape rewards ``(B,)`` in group-major order (TRL's order: the G completions of a prompt
    are consecutive) to ``(B // G, G)``.

    Raises ValueError when ``flat`` is not 1-D, ``G < 1`` or ``B % G != 0``.
    """
    if flat.dim() != 1:
        raise ValueError(f"group_rewards: expected a 1-D tensor, got shape {tuple(flat.shape)}")
    if int(G) < 1:
        raise ValueError(f"group_rewards: G must be >= 1, got {G}")
    B = flat.shape[0]
    if B % G != 0:
        raise ValueError(f"group_rewards: {B} rewards do not split into groups of G={G} "
                         f"({B} % {G} = {B % G})")
    return flat.reshape(B // G, G)


def group_advantage(rewards: torch.Tensor, eps: float = 1e-6, unbiased: bool = False,
                    scale: bool = True) -> torch.Tensor:
    """Group-normalised advantage, docs/method.md step 1: ``A = (r - mean(r)) / (std(r) + eps)``.

    Args:
        rewards: (N, G), any float dtype; computed in float64.
        eps: added to the std.
        unbiased: False (default): population std (divide by G), as docs/method.md's worked example;
            True: sample std (divide by G - 1), as TRL.
        scale: False: return ``r - mean`` only (Dr. GRPO).

    Returns:
        (N, G) float64. A group whose rewards are all equal gives exactly 0.
    """
    r = rewards.to(torch.float64)
    centred = r - r.mean(dim=1, keepdim=True)
    # Equal rewards: force exact zeros (no rounding residue can turn into fake contrast).
    flat_group = (r.amax(dim=1, keepdim=True) == r.amin(dim=1, keepdim=True))
    centred = torch.where(flat_group, torch.zeros_like(centred), centred)
    if not scale:
        return centred
    std = r.std(dim=1, keepdim=True, correction=1 if unbiased else 0)
    return centred / (std + eps)


def confidence(ref_logprob: torch.Tensor, g: float) -> torch.Tensor:
    """Reference-model confidence, docs/method.md step 2: ``c = sigmoid(l - g)``.

    Args:
        ref_logprob: (N, G) length-normalised sequence log-probs ``l`` (nats per token).
        g: the EMA baseline.

    Returns:
        (N, G) float64 in [0, 1].
    """
    return torch.sigmoid(ref_logprob.to(torch.float64) - float(g))


def discrimination_weights(modulated: torch.Tensor, eps: float = 1e-6, eps_w: float = 1e-6
                           ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """docs/method.md steps 4-5: ``d = |M| / (max_j |M_j| + eps)``, ``w = d / sum_j d_j``.

    Args:
        modulated: (N, G) modulated advantages ``M``.
        eps: added to ``max |M|``.
        eps_w: a group with ``sum d < eps_w`` (no contrast) gets ``w = 1/G``.

    Returns:
        ``(d, w, no_contrast)``: d and w (N, G) float64, no_contrast (N, 1) bool.
    """
    m = modulated.to(torch.float64).abs()
    d = m / (m.amax(dim=1, keepdim=True) + eps)
    s = d.sum(dim=1, keepdim=True)
    no_contrast = s < eps_w
    G = d.shape[1]
    w = torch.where(no_contrast, torch.full_like(d, 1.0 / G), d / torch.where(no_contrast, 1.0, s))
    return d, w, no_contrast


# ------------------------------------------------------------------------------- estimators

EstimatorFn = Callable[[torch.Tensor, "torch.Tensor | None", "EMABaseline | None", HargoConfig],
                       EstimatorOutput]


def _uniform(rewards: torch.Tensor) -> torch.Tensor:
    return torch.full(rewards.shape, 1.0 / rewards.shape[1], dtype=torch.float32,
                      device=rewards.device)


def _grpo(rewards, ref_logprob, baseline, config) -> EstimatorOutput:
    """TRL 1.16 ``GRPOTrainer`` (``scale_rewards="group"``): ``(r - mean) / (std + 1e-4)``,
    sample std (``torch.std`` default, G - 1); weights 1/G. ``config.eps`` is not used: the
    1e-4 is TRL's constant, kept so the stock loss is reproduced."""
    r = rewards.to(torch.float64)
    mean = r.mean(dim=1, keepdim=True)
    std = r.std(dim=1, keepdim=True)
    adv = (r - mean) / (std + TRL_STD_EPS)
    return EstimatorOutput(adv.to(torch.float32), _uniform(rewards))


def _dr_grpo(rewards, ref_logprob, baseline, config) -> EstimatorOutput:
    """Dr. GRPO: ``r - mean`` without std scaling; weights 1/G."""
    adv = group_advantage(rewards, scale=False)
    return EstimatorOutput(adv.to(torch.float32), _uniform(rewards))


def _confidence_with_baseline(ref_logprob: torch.Tensor, baseline: EMABaseline
                              ) -> tuple[torch.Tensor, float]:
    # c uses g AFTER folding in this batch: on the first batch g is the batch mean ("initialise g
    # from the first batch"), and every batch is centred on a baseline that includes it.
    g = baseline.update(float(ref_logprob.to(torch.float64).mean()))
    return confidence(ref_logprob, g), g


def _hargo_family(rewards, ref_logprob, baseline, config, alpha: float, weights_from: str
                  ) -> EstimatorOutput:
    A = group_advantage(rewards, eps=config.eps)
    c = g = None
    if ref_logprob is not None:
        c, g = _confidence_with_baseline(ref_logprob, baseline)
        M = A * (1.0 + alpha * c)
    else:
        M = A
    d, w, no_contrast = discrimination_weights(M, config.eps, config.eps_w)
    if weights_from == "confidence":
        # B2: w proportional to alpha * c inside the group; a group without contrast still gets
        # 1/G (as step 5), so every estimator weights an all-equal group uniformly.
        conf_w = alpha * c
        s = conf_w.sum(dim=1, keepdim=True)
        flat = no_contrast | (s < config.eps_w)
        G = rewards.shape[1]
        w = torch.where(flat, torch.full_like(conf_w, 1.0 / G), conf_w / torch.where(flat, 1.0, s))
    f32 = lambda t: None if t is None else t.to(torch.float32)  # noqa: E731
    return EstimatorOutput(f32(M), f32(w), f32(c), f32(d), g)


def _hargo(rewards, ref_logprob, baseline, config) -> EstimatorOutput:
    """Full HARGO (paper's B3), docs/method.md steps 1-5."""
    return _hargo_family(rewards, ref_logprob, baseline, config, config.alpha, "discrimination")


def _hargo_b1(rewards, ref_logprob, baseline, config) -> EstimatorOutput:
    """B1, discrimination only: alpha = 0, so ``M = A``; the reference model is not used (and
    the EMA baseline is not touched)."""
    return _hargo_family(rewards, None, baseline, config, 0.0, "discrimination")


def _hargo_b2(rewards, ref_logprob, baseline, config) -> EstimatorOutput:
    """B2, confidence only: ``w_i = alpha c_i / sum_j alpha c_j``; the advantage is HARGO's
    ``M = A (1 + alpha c)`` (only the weighting changes between B2 and B3). Groups without
    contrast (``sum d < eps_w``) and ``alpha = 0`` fall back to 1/G."""
    return _hargo_family(rewards, ref_logprob, baseline, config, config.alpha, "confidence")


#: name -> estimator function ``f(rewards, ref_logprob, baseline, config) -> EstimatorOutput``.
ESTIMATORS: dict[str, EstimatorFn] = {
    "grpo": _grpo,
    "dr_grpo": _dr_grpo,
    "hargo": _hargo,
    "hargo_b1": _hargo_b1,
    "hargo_b2": _hargo_b2,
}

_NEEDS_REFERENCE = frozenset({"hargo", "hargo_b2"})


def _check_method(method: str) -> None:
    if method not in ESTIMATORS:
        raise ValueError(f"unknown advantage estimator {method!r}; valid: {sorted(ESTIMATORS)}")


def needs_reference(method: str) -> bool:
    """Whether ``method`` needs the reference model's log-probs (``hargo``, ``hargo_b2``).
    Raises ValueError for an unknown method."""
    _check_method(method)
    return method in _NEEDS_REFERENCE


def estimate(method: str, rewards: torch.Tensor, ref_logprob: torch.Tensor | None = None,
             baseline: EMABaseline | None = None, config: HargoConfig | None = None
             ) -> EstimatorOutput:
    """Advantages and loss weights of one batch by the named estimator.

    Args:
        method: a key of ``ESTIMATORS``: grpo, dr_grpo, hargo, hargo_b1, hargo_b2.
        rewards: (N, G) rewards, N groups of G >= 2 responses, finite, any float dtype.
        ref_logprob: (N, G) length-normalised sequence log-prob ``l`` of each response under the
            reference model (mean over the response's tokens of log pi_ref, padding masked);
            required by ``hargo``/``hargo_b2``, ignored by the others.
        baseline: the EMA baseline ``g`` (trainer state). It is updated in place with this
            batch's mean ``l`` BEFORE computing ``c``, so ``c = sigmoid(l - g_new)``; on the first
            batch ``g_new = mean(l)``. None: a fresh ``EMABaseline(config.rho)`` (stateless, for
            tests and one-off use; a trainer must pass its persistent one).
        config: HARGO constants (default ``HargoConfig()``).

    Returns:
        EstimatorOutput with float32 (N, G) tensors on the rewards' device.

    Raises:
        ValueError: unknown method (the message lists the valid ones), rewards not 2-D or G < 2,
            non-finite rewards or log-probs, ``ref_logprob`` missing or of another shape when the
            method needs it.
    """
    _check_method(method)
    config = config or HargoConfig()
    if not isinstance(rewards, torch.Tensor) or rewards.dim() != 2:
        raise ValueError(f"estimate({method}): rewards must be a (N, G) tensor, got "
                         f"{getattr(rewards, 'shape', type(rewards))}")
    if rewards.shape[1] < 2:
        raise ValueError(f"estimate({method}): groups need G >= 2 responses, got G={rewards.shape[1]}")
    if not torch.isfinite(rewards).all():
        raise ValueError(f"estimate({method}): rewards contain NaN or inf")
    if method in _NEEDS_REFERENCE:
        if ref_logprob is None:
            raise ValueError(f"estimate({method}): needs ref_logprob (N, G) from the reference model")
        if tuple(ref_logprob.shape) != tuple(rewards.shape):
            raise ValueError(f"estimate({method}): ref_logprob shape {tuple(ref_logprob.shape)} != "
                             f"rewards shape {tuple(rewards.shape)}")
        if not torch.isfinite(ref_logprob).all():
            raise ValueError(f"estimate({method}): ref_logprob contains NaN or inf")
        if baseline is None:
            baseline = EMABaseline(config.rho)
    return ESTIMATORS[method](rewards, ref_logprob, baseline, config)
