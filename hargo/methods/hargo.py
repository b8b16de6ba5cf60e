"""``hargo`` and its ablations ``hargo_b1``, ``hargo_b2`` (docs/method.md): per-response weights
from :mod:`hargo.advantages` (the estimator of the same name) in the GRPO family's one loss,
``(1/N) sum_i w_i L_i`` with ``L_i`` the ``clipped_surrogate`` of the modulated advantage plus
``beta`` x the k3 KL term, averaged over the completion's tokens (``response_mean``,
``hargo.losses.group_weighted_aggregate``). ``hargo`` and ``hargo_b2`` read the reference
model's confidence (the trainer's own reference pass, also at beta 0); B1 does not."""
from __future__ import annotations

from hargo.method_config import HargoB1Params, HargoParams
from hargo.methods import Method, register_method

_WEIGHTED = dict(family="grpo_family", loss="weighted", policy_loss="clipped_surrogate", kl="k3")

HARGO = register_method(Method(
    name="hargo", label="HARGO", description="HARGO: discrimination x confidence response weights",
    rank=30, needs_reference=True, estimator="hargo", params_class=HargoParams, **_WEIGHTED))
HARGO_B1 = register_method(Method(
    name="hargo_b1", label="HARGO-B1", description="HARGO ablation B1: discrimination only",
    rank=31, estimator="hargo_b1", params_class=HargoB1Params, **_WEIGHTED))
HARGO_B2 = register_method(Method(
    name="hargo_b2", label="HARGO-B2", description="HARGO ablation B2: confidence only",
    rank=32, needs_reference=True, estimator="hargo_b2", params_class=HargoParams, **_WEIGHTED))
