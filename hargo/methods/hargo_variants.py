"""hargo's own variants of HARGO (not the paper's; docs/method.md "Variants that move weight
between tasks"). The specified HARGO normalises its weights inside each group, so every group
keeps ``1/N`` of the update whatever its task; these normalise over the batch
(``hargo.advantages.batch_normalised_weights``), so a group's share follows its contrast.

``hargo_batch``
    HARGO's modulated advantage ``M = A (1 + alpha c)``, ``w_ni = N |M_ni| / sum |M|``: a group
    weighs by ``sum_i |M_ni|``, all-equal groups drop out (reads the reference model).
``hargo_contrast``
    ``w_ni = N |r_ni - mean_n| / sum |r - mean|`` from the raw rewards (no std): groups whose rewards
    barely differ get little weight, whatever their std.
"""
from __future__ import annotations

from hargo.method_config import HargoB1Params, HargoParams
from hargo.methods import Method, register_method

_WEIGHTED = dict(family="grpo_family", loss="weighted", policy_loss="clipped_surrogate", kl="k3")

HARGO_BATCH = register_method(Method(
    name="hargo_batch", label="HARGO-batch",
    description="hargo's variant: HARGO's |M| weights normalised over the batch", rank=52,
    needs_reference=True, estimator="hargo_batch", params_class=HargoParams, **_WEIGHTED))
HARGO_CONTRAST = register_method(Method(
    name="hargo_contrast", label="HARGO-contrast",
    description="hargo's variant: raw-contrast weights normalised over the batch", rank=53,
    estimator="hargo_contrast", params_class=HargoB1Params, **_WEIGHTED))
